"""Writer processes for the SIGKILL suite (tests/test_crash_kill.py).

Run as ``python crash_writer.py`` it is a *zygote*: it imports pylog once, then reads
commands on stdin and forks one writer per command, so each kill costs a ``fork`` and not
a fresh interpreter. Protocol (one line each, every line written with one ``os.write``
so lines from the zygote and its children never interleave):

stdin   ``RUN <id> <dir> <seed> <segment_bytes> <index_interval_bytes> <preallocate 0|1>``
        fork a writer
        ``QUIT``
stdout  ``P <id> <pid>``        the zygote forked writer <id> as <pid>
        ``R <id> <next>``       writer <id> opened the log (after recovery); next_offset
        ``A <id> <off> <crc>``  offset <off> is acknowledged (append returned under
                                fsync="always"); crc is zlib.crc32 of its value
        ``D <id> <status>``     writer <id> is gone (waitpid status)

A writer appends forever, with a mix of ``append`` and ``append_batch`` (and sometimes
several threads), until it is killed. Every value carries a digest of itself
(:func:`make_value`), so a reader can tell a record from garbage.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_value(r: random.Random) -> bytes:
    """A self-checking value: 1 to 400 random bytes, then 8 bytes of their BLAKE2b digest."""
    body = r.randbytes(r.randint(1, 400))
    return body + hashlib.blake2b(body, digest_size=8).digest()


def value_ok(value: bytes) -> bool:
    """Whether ``value`` is one that :func:`make_value` made (not garbage, not torn)."""
    body, tag = value[:-8], value[-8:]
    return len(value) > 8 and hashlib.blake2b(body, digest_size=8).digest() == tag


def _say(line: str) -> None:
    data = (line + "\n").encode()
    while data:
        n = os.write(1, data)
        data = data[n:]


def writer(wid: str, path: str, seed: int, segment_bytes: int, interval: int, preallocate: bool) -> None:
    import pylog

    rng = random.Random(seed)
    log = pylog.Log(path, fsync="always", segment_bytes=segment_bytes, index_interval_bytes=interval,
                    preallocate=preallocate)
    _say(f"R {wid} {log.next_offset}")

    def loop(r: random.Random) -> None:
        while True:
            if r.random() < 0.5:
                v = make_value(r)
                off = log.append(v, key=b"k" if r.random() < 0.3 else None)
                # append returned under fsync="always": the record is durable
                _say(f"A {wid} {off} {zlib.crc32(v)}")
            else:
                vs = [make_value(r) for _ in range(r.randint(2, 20))]
                first = log.append_batch(vs)
                _say("\n".join(f"A {wid} {first + i} {zlib.crc32(v)}" for i, v in enumerate(vs)))

    # Most writers run one thread; some run 4, which share fsyncs (group commit).
    if rng.random() < 0.75:
        loop(rng)
    for i in range(4):
        threading.Thread(target=loop, args=(random.Random(seed * 31 + i),), daemon=True).start()
    threading.Event().wait()


def zygote() -> None:
    import pylog  # noqa: F401  (imported once, before any fork)

    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "QUIT":
            return
        _, wid, path, seed, seg, interval, pre = parts
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                writer(wid, path, int(seed), int(seg), int(interval), pre == "1")
            except BaseException as e:  # a writer never ends on its own: report why it did
                _say(f"E {wid} {type(e).__name__}: {e}".replace("\n", " "))
                code = 3
            finally:
                os._exit(code)
        _say(f"P {wid} {pid}")
        _, status = os.waitpid(pid, 0)
        _say(f"D {wid} {status}")


if __name__ == "__main__":
    zygote()
