"""The broker's peak memory under each attack of docs/serve.md "Limits and defaults".

    python -m benchmarks.serve_attacks [ATTACK ...] [-- SERVE-FLAGS ...]

ATTACKS: ``gzip``, ``snappy``, ``lz4``, ``zstd`` (twelve batches of 63 MiB of zeros in one
Produce), ``concurrent`` (six 4-partition gzip bombs on six connections at once), ``fetch``
(a Fetch naming two 40 MiB partitions ten times, max_bytes 2 GiB), ``frames`` (eight
connections each sending all but the last byte of a 90 MiB frame), ``unread`` (ten
connections asking for both 40 MiB partitions and never reading); all of them by default.
Each runs against a fresh ``pylog serve`` (default limits, or the flags after ``--``) over
a fresh root, and prints the broker's peak RSS (VmHWM) during the attack, its idle RSS and
how the broker answered. The attacks are built by tests/test_serve_limits.py's helpers.
"""
from __future__ import annotations

import os
import select
import socket
import struct
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from serve_util import BrokerProcess, api_versions_ok, connect, create_topic  # noqa: E402
from test_serve_limits import (  # noqa: E402
    MiB,
    bomb,
    decode_response,
    fetch_many,
    peak_rss,
    produce_many,
    read_response,
    reset_peak,
)

import pylog  # noqa: E402

ATTACKS = ["gzip", "snappy", "lz4", "zstd", "concurrent", "fetch", "frames", "unread"]


def _codes(got: bytes | None) -> Any:
    if got is None:
        return "closed"
    return [int(p.error_code) for p in decode_response(got, 0, 9).responses[0].partition_responses]


def _produce(b: BrokerProcess, req: bytes) -> Any:
    with connect(b) as s:
        s.settimeout(300)
        s.sendall(req)
        return _codes(read_response(s))


def run(attack: str, flags: list[str]) -> None:
    """One attack against a fresh broker; prints its peak RSS."""
    root = os.path.join(tempfile.mkdtemp(prefix="pylog-attack-"), "root")
    if attack in ("fetch", "unread"):
        store = pylog.LogStore(root)
        t = store.create_topic("big", partitions=2)
        for p in range(2):
            for _ in range(40):
                t.append(bytes(MiB), partition=p)
        store.close()
    b = BrokerProcess(root, *flags)
    try:
        with connect(b) as s:
            create_topic(s, "z", 4)
        idle = peak_rss(b.proc.pid)
        reset_peak(b.proc.pid)
        start = time.monotonic()
        if attack in ("gzip", "snappy", "lz4", "zstd"):
            req = produce_many("z", {0: bomb(attack, 63 * MiB) * 12})
            note = f"request {len(req)} B, answered {_produce(b, req)}"
        elif attack == "concurrent":
            req = produce_many("z", {p: bomb("gzip", 63 * MiB) * 3 for p in range(4)})
            answers: list[Any] = []
            threads = [threading.Thread(target=lambda: answers.append(_produce(b, req))) for _ in range(6)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            note = f"answered {answers}"
        elif attack == "fetch":
            with connect(b) as s:
                s.settimeout(300)
                s.sendall(fetch_many("big", [0, 1] * 10))
                got = read_response(s)
            note = f"response {len(got) if got else 0} B"
        elif attack == "frames":
            socks = [connect(b) for _ in range(8)]
            sent = [0] * 8

            def push(i: int) -> None:
                socks[i].settimeout(2)
                try:
                    socks[i].sendall(struct.pack(">i", 90 * MiB))
                    while sent[i] < 89 * MiB:
                        socks[i].sendall(bytes(MiB))
                        sent[i] += MiB
                    socks[i].sendall(bytes(MiB - 1))
                    sent[i] += MiB - 1
                except TimeoutError:
                    pass
            threads = [threading.Thread(target=push, args=(i,)) for i in range(8)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            note = f"MiB sent per connection {[x // MiB for x in sent]}, others served: {api_versions_ok(b)}"
            for s in socks:
                s.close()
            time.sleep(1)
        else:  # unread
            socks = [connect(b) for _ in range(10)]
            for s in socks:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
                s.sendall(fetch_many("big", [0, 1]))
            time.sleep(5)
            ready = select.select(socks, [], [], 0)[0]
            sizes = [struct.unpack(">i", s.recv(4, socket.MSG_PEEK))[0] // MiB for s in ready]
            note = f"response MiB per connection {sizes}"
            for s in socks:
                s.close()
        peak = peak_rss(b.proc.pid)
        print(f"{attack:11s} peak {peak // MiB:5d} MiB (idle {idle // MiB} MiB), {time.monotonic() - start:.1f} s; "
              f"{note}", flush=True)
    finally:
        b.stop()


def main(argv: list[str]) -> None:
    """Run the attacks named in ``argv`` (all by default); flags after ``--`` go to pylog serve."""
    flags: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1 :]
    for attack in argv or ATTACKS:
        if attack not in ATTACKS:
            raise SystemExit(f"unknown attack {attack!r} (one of {', '.join(ATTACKS)})")
        run(attack, flags)


if __name__ == "__main__":
    main(sys.argv[1:])
