"""A `pylog serve` process for the broker tests: real process, loopback, a free port."""
from __future__ import annotations

import io
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
from conftest import ROOT, py_env


class BrokerProcess:
    """``pylog serve --port 0`` over ``root`` in a child process; ``bootstrap`` is host:port.
    ``prefix``: a command that runs it (e.g. strace with fault injection)."""

    def __init__(self, root: str, *args: str, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None) -> None:
        self.root = root
        cmd = [*(prefix or []), sys.executable, "-m", "pylog.cli", "--root", root, "serve", "--host", "127.0.0.1",
               "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**py_env(), **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded: the child exits (EOF) if it cannot start
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"pylog serve did not start: {line!r} {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
        self.port = int(m.group(2))
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.line = line  # the ready line (it names the metrics endpoint when there is one)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the broker and wait for it to exit; returns its exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise
        finally:
            self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self._err = self.proc.stderr.read()
            self.proc.stderr.close()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def stderr(self) -> str:
        """What the broker wrote to stderr (after it stopped)."""
        self._close_pipes()
        return getattr(self, "_err", "")


def wait_for(pred, timeout: float = 20.0, step: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``pred`` until it returns something true or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)


# -- raw protocol helpers (kio builds the frames; the broker is the thing under test) --------
def frame(key: int, version: int, body: dict, correlation: int = 7) -> bytes:  # type: ignore[type-arg]
    """A request frame (size, header, payload) of API ``key`` at ``version``."""
    from kio.index import load_request_schema
    from kio.serial import entity_writer

    from pylog.serve.protocol import build

    cls = load_request_schema(key, version)
    hdr_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(hdr_cls)(buf, hdr_cls(request_api_key=key, request_api_version=version,
                                        correlation_id=correlation, client_id="t"))
    entity_writer(cls)(buf, build(cls, body))
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


def call(sock: socket.socket, data: bytes, key: int, version: int):  # type: ignore[no-untyped-def]
    """Send ``data``, read one response of ``key``/``version``; None if the broker closed."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    sock.sendall(data)
    head = recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">i", head)
    body = recv_exact(sock, n)
    assert body is not None
    cls = load_response_schema(key, version)
    hdr, used = entity_reader(cls.__header_schema__)(body, 0)
    return entity_reader(cls)(body, used)[0]


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``sock``, or None when it closes first."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def connect(b: BrokerProcess) -> socket.socket:
    """A socket to the broker (20 s timeout on every operation)."""
    s = socket.create_connection(("127.0.0.1", b.port), timeout=20)
    return s


def api_versions_ok(b: BrokerProcess) -> bool:
    """The broker answers ApiVersions on a new connection."""
    with connect(b) as s:
        r = call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
        return r is not None and r.error_code == 0 and any(k.api_key == 0 for k in r.api_keys)


def batch(values: list[bytes], corrupt: bool = False) -> bytes:
    """A RecordBatch v2 of ``values`` (optionally with a broken CRC)."""
    from pylog import _backend

    n = len(values)
    lens = np.array([len(v) for v in values], np.uint32)
    rc, out = _backend.impl.kafka_encode(np.arange(n), np.full(n, 1000), b"", np.full(n, 0xFFFFFFFF, np.uint32),
                                         b"".join(values), lens)
    assert rc == 0
    out = bytearray(out)
    if corrupt:
        out[-1] ^= 0xFF
    return bytes(out)


def produce(topic: str, records: bytes, acks: int = -1, partition: int = 0) -> bytes:
    """A Produce v9 frame of ``records`` for one partition."""
    return frame(0, 9, {"acks": acks, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": records}]}]})


def fetch(topic: str, offset: int, max_wait: int = 0, min_bytes: int = 0, max_bytes: int = 1 << 20,
          partition_max_bytes: int = 1 << 20, isolation: int = 0) -> bytes:
    """A Fetch v12 frame for partition 0 of ``topic``."""
    return frame(1, 12, {"max_wait": max_wait, "min_bytes": min_bytes, "max_bytes": max_bytes,
                         "isolation_level": isolation, "topics": [{"topic": topic, "partitions": [
                             {"partition": 0, "fetch_offset": offset, "partition_max_bytes": partition_max_bytes}]}]})


def create_topic(sock: socket.socket, name: str, partitions: int = 1, **configs: str) -> None:
    """CreateTopics v7 of one topic (Kafka config names with dots as underscores)."""
    r = call(sock, frame(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                             "configs": [{"name": k.replace("_", "."), "value": v}
                                                         for k, v in configs.items()]}],
                                 "timeout": 5000}), 19, 7)
    assert r.topics[0].error_code == 0, r


def fetched_values(resp) -> list[tuple[int, bytes]]:  # type: ignore[no-untyped-def]
    """(offset, value) of every record in a Fetch response's first partition."""
    from kafka.record.memory_records import MemoryRecords

    data = resp.responses[0].partitions[0].records or b""
    out = []
    recs = MemoryRecords(bytes(data))
    while recs.has_next():
        for r in recs.next_batch():
            out.append((r.offset, r.value))
    return out


def init_producer_id(s: socket.socket) -> tuple[int, int]:
    """InitProducerId v4 without a transactional id: (producer id, epoch) of a new idempotent producer."""
    r = call(s, frame(22, 4, {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
                              "producer_epoch": -1}), 22, 4)
    assert r.error_code == 0 and r.producer_id >= 0
    return r.producer_id, r.producer_epoch


def produce_result(r):  # type: ignore[no-untyped-def]
    """(error code, base offset) of a Produce response's first partition."""
    p = r.responses[0].partition_responses[0]
    return p.error_code, p.base_offset
