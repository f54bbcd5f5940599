"""`pylog serve` keeps its bounds against hostile clients (docs/serve.md, "Limits and defaults").

Memory: zip bombs in every codec the broker accepts, a Fetch naming partitions many times,
unfinished frames on many connections; each attack runs against a broker subprocess with
its default limits and the test reads the broker's peak RSS (VmHWM in /proc/PID/status,
reset before each attack through /proc/PID/clear_refs). Connections: max.connections and
max.connections.per.ip refused at accept and logged once per interval, a frame-size header
held by the request timeout, the soft RLIMIT_NOFILE raised to the hard limit. Shutdown:
requests that arrive while the broker stops are answered or closed, never a traceback.
"""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

pytest.importorskip("kio")

from conftest import ROOT, py_env  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    api_versions_ok,
    batch,
    call,
    connect,
    create_topic,
    frame,
    produce,
    recv_exact,
    wait_for,
)

import pylog  # noqa: E402
from pylog import crc32c  # noqa: E402

MiB = 1 << 20
#: The documented bound of the broker's RSS under every attack here, with default limits
#: (docs/serve.md, "Limits and defaults").
RSS_BOUND = 512 * MiB


# -- measuring the broker -----------------------------------------------------------------------
def peak_rss(pid: int) -> int:
    """The peak resident set (VmHWM) of process ``pid`` since it started or since
    :func:`reset_peak`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def reset_peak(pid: int) -> None:
    """Reset VmHWM to the current RSS (Linux: ``5`` written to /proc/PID/clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


# -- building the attacks -------------------------------------------------------------------------
HEADER = struct.Struct(">qiibIhiqqqhii")
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def compress(codec: str, data: bytes) -> bytes:
    """``data`` compressed as a Kafka producer does it for ``codec``."""
    if codec == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == "snappy":
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data))
    if codec == "lz4":
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    import zstandard

    return bytes(zstandard.ZstdCompressor(level=3).compress(data))


def bomb(codec: str, size: int) -> bytes:
    """A valid RecordBatch v2 of one record whose value is ``size`` zero bytes, its records
    section compressed with ``codec``: a few KB on the wire that decompress to ``size``."""
    plain = batch([bytes(size)])
    section = compress(codec, plain[61:])
    (base, _len, epoch, magic, _crc, _attrs, last, ts, mts, pid, pep, seq, count) = HEADER.unpack_from(plain)
    head = bytearray(HEADER.pack(base, 49 + len(section), epoch, magic, 0, CODECS[codec], last, ts, mts, pid, pep,
                                 seq, count))
    body = bytes(head[21:]) + section
    head[17:21] = struct.pack(">I", crc32c(body))
    return bytes(head[:21]) + body


def produce_many(topic: str, parts: dict[int, bytes]) -> bytes:
    """A Produce v9 frame of ``parts`` (partition -> record batches) of ``topic``."""
    return frame(0, 9, {"acks": -1, "timeout": 30000, "topic_data": [
        {"name": topic, "partition_data": [{"index": i, "records": r} for i, r in parts.items()]}]})


def fetch_many(topic: str, partitions: list[int], max_bytes: int = 0x7FFFFFFF,
               partition_max_bytes: int = 0x7FFFFFFF) -> bytes:
    """A Fetch v12 frame naming ``partitions`` of ``topic`` (repeats kept), from offset 0."""
    return frame(1, 12, {"max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
                         "topics": [{"topic": topic, "partitions": [
                             {"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes}
                             for p in partitions]}]})


def read_response(sock: socket.socket) -> bytes | None:
    """One whole response frame (after its size), or None when the broker closed."""
    head = recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">i", head)
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            return None
        got += k
    return bytes(out)


def decode_response(data: bytes, key: int, version: int):  # type: ignore[no-untyped-def]
    """The kio entity of a response frame's bytes (after its size)."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    cls = load_response_schema(key, version)
    _hdr, used = entity_reader(cls.__header_schema__)(data, 0)
    return entity_reader(cls)(data, used)[0]
