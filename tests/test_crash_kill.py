"""SIGKILL a writer at random points; every acknowledged record must survive.

A zygote process (tests/crash_writer.py) imports pylog once and forks one writer per
kill; each writer opens the log (recovering from the previous kill), appends with
``fsync="always"`` (``append`` and ``append_batch``, one or four threads, 4 KiB segments so
it rolls all the time, every other writer with ``preallocate=True``) and prints every
acknowledged offset with the CRC of its value.
The test SIGKILLs it after a random delay (sometimes before it even finished opening),
sometimes adds a torn or garbage tail to the active segment as a crash in the middle of a
write would leave it, then reopens the log in this process and checks:

* every acknowledged record is there with the same value (records lost must be 0);
* every record in the log is whole and one a writer made (values carry their own digest);
  in particular nothing of the garbage tail is visible and offsets are dense;
* sealed segments pass their CRC check (``recovery_report`` is empty);
* appends resume at ``next_offset``.

At least 200 kills in CI, 1,000 with PYLOG_LONG=1.
"""
from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest
from conftest import scaled, store_frames

import pylog
from pylog import format as fmt
from pylog.testing import simulate_crash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crash_writer import make_value, value_ok  # noqa: E402

pytestmark = pytest.mark.crash

HERE = os.path.dirname(os.path.abspath(__file__))


class Zygote:
    """The forking writer server, and a thread that reads its output into a queue."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "crash_writer.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)
        self.lines: queue.Queue[str] = queue.Queue()
        self.pushback: list[str] = []  # lines read early by start(), in order
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put("EOF")

    def next_line(self, timeout: float = 30.0) -> str:
        if self.pushback:
            return self.pushback.pop(0)
        line = self.lines.get(timeout=timeout)
        if line == "EOF":
            raise RuntimeError("the zygote died")
        return line

    def start(self, wid: int, path: str, seed: int, segment_bytes: int, interval: int, preallocate: bool) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"RUN {wid} {path} {seed} {segment_bytes} {interval} {int(preallocate)}\n".encode())
        self.proc.stdin.flush()
        # The forked writer may speak ("R", "A" lines) before the zygote reports its pid:
        # keep those lines, in order, for next_line().
        early = []
        while True:
            line = self.lines.get(timeout=30.0)
            if line == "EOF":
                raise RuntimeError("the zygote died")
            kind, got, *rest = line.split()
            if kind == "P" and int(got) == wid:
                self.pushback.extend(early)
                return int(rest[0])
            early.append(line)

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"QUIT\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


JUNK_KINDS = ("random", "zeros", "torn-frame", "lying-length", "zero-length")


def junk_tail(kind: str, rng: random.Random) -> bytes:
    """Bytes a crash in the middle of a write could leave after the last whole frame."""
    if kind == "random":
        return rng.randbytes(rng.randint(1, 300))
    if kind == "zeros":
        return bytes(512)
    if kind == "lying-length":  # a frame header claiming far more bytes than the file has
        return (1 << 30).to_bytes(4, "little") + rng.randbytes(60)
    if kind == "zero-length":
        return bytes(4) + rng.randbytes(40)
    # a whole, valid frame cut short: frame one with pylog's own code in a scratch log
    return rng.randbytes(8) + b"\x00" * 28  # replaced below by a real prefix when possible


def test_sigkill_loop(zygote, tmp_path, capsys):
    kills = scaled(200, 1000)
    rng = random.Random(int(os.environ.get("PYLOG_SEED", "0")) or random.randrange(1 << 30))
    seed0 = rng.randrange(1 << 30)
    path = str(tmp_path / "log")
    segment_bytes = 4096
    interval = rng.choice([0, 256, 4096])
    acked: dict[int, int] = {}        # offset -> crc32 of the value, everything ever acknowledged
    lost: list[str] = []
    stats = {"kills": 0, "acked": 0, "killed_before_open": 0, "junk_tails": 0, "cut_bytes": 0,
             "max_next": 0, "clean_reopens": 0}
    checked_upto = 0
    t0 = time.monotonic()
    for k in range(kills):
        wid = k
        # every other writer preallocates its segments: its store files then end in zeros
        # (trimmed at roll and close, but not when it is killed)
        preallocate = k % 2 == 1
        pid = zygote.start(wid, path, seed0 + k, segment_bytes, interval, preallocate)
        wait_ready = rng.random() < 0.9
        opened = False
        if wait_ready:
            while True:
                line = zygote.next_line()
                if line.startswith(f"R {wid} "):
                    opened = True
                    break
                assert not line.startswith(("E ", "D ")), line
        time.sleep(rng.choice([0, rng.uniform(0, 0.005), rng.uniform(0, 0.05), rng.uniform(0.05, 0.15)]))
        os.kill(pid, signal.SIGKILL)
        stats["kills"] += 1
        # everything the writer printed is in the pipe before the zygote reports it dead
        while True:
            line = zygote.next_line()
            kind, got, *rest = line.split()
            assert kind != "E", f"writer {wid} failed: {line}"
            if int(got) != wid:
                continue
            if kind == "R":
                opened = True
            elif kind == "A":
                off, crc = int(rest[0]), int(rest[1])
                assert off not in acked, f"offset {off} acknowledged twice"
                acked[off] = crc
                stats["acked"] += 1
            elif kind == "D":
                assert os.WIFSIGNALED(int(rest[0])) and os.WTERMSIG(int(rest[0])) == signal.SIGKILL, line
                break
        if not opened:
            stats["killed_before_open"] += 1

        junk = b""
        head_missing = 0
        if os.path.isdir(path) and rng.random() < 0.3:
            stores = sorted(n for n in os.listdir(path) if fmt.parse_segment_name(n, fmt.STORE_SUFFIX) is not None)
            if stores:
                kind = rng.choice(JUNK_KINDS)
                junk = junk_tail(kind, rng)
                last = os.path.join(path, stores[-1])
                if kind == "torn-frame":
                    # the prefix of a real frame: copy the last frame's header and cut it short
                    with open(last, "rb") as f:
                        data = f.read()
                    if len(data) > fmt.FILE_HEADER_SIZE:
                        junk = data[fmt.FILE_HEADER_SIZE : fmt.FILE_HEADER_SIZE + rng.randint(1, 40)]
                # a store killed before its header was written: recovery rewrites the header
                size = os.path.getsize(last)
                head_missing = max(0, fmt.FILE_HEADER_SIZE - size)
                at = size
                if preallocate and not head_missing:
                    # a torn write lands right after the last whole frame, inside the zeros
                    # of the reserved space (not after them)
                    whole = store_frames(last)
                    at = whole[-1][0] + whole[-1][1] if whole else fmt.FILE_HEADER_SIZE
                with open(last, "r+b") as f:
                    f.seek(at)
                    f.write(junk)
                stats["junk_tails"] += 1

        # the store was written with preallocation if the config stored says so (a writer
        # killed before its open stored its own): its end may be reserved zeros
        stored_pre = False
        if os.path.exists(os.path.join(path, fmt.CONFIG_FILE)):
            with open(os.path.join(path, fmt.CONFIG_FILE)) as f:
                stored_pre = bool(json.load(f).get("preallocate"))
        log = pylog.Log(path, fsync="always", segment_bytes=segment_bytes, index_interval_bytes=interval,
                        preallocate=preallocate)
        try:
            assert log.recovery_report == [], log.recovery_report
            if junk:
                # the junk never becomes records; it was cut (and kept aside in .broken). A
                # store written with preallocation does not count zeros at the end as torn bytes.
                counted = len(junk.rstrip(b"\0") if preallocate or stored_pre else junk)
                assert log.truncated_bytes >= counted - head_missing, (log.truncated_bytes, counted, head_missing)
            stats["cut_bytes"] += log.truncated_bytes
            nxt = log.next_offset
            stats["max_next"] = max(stats["max_next"], nxt)
            # Every acknowledged record: those of this round and of the last one always, a
            # sample of older ones each round, all of them every 25 kills and at the end.
            full = k % 25 == 24
            recent = [o for o in acked if o >= checked_upto - 64]
            older = [o for o in acked if o < checked_upto - 64]
            todo = recent + (older if full else rng.sample(older, min(100, len(older))))
            for off in todo:
                crc = acked[off]
                if off >= nxt:
                    lost.append(f"kill {k}: acknowledged offset {off} missing (next_offset {nxt})")
                    continue
                v = bytes(log.read(off).value)
                if zlib.crc32(v) != crc:
                    lost.append(f"kill {k}: offset {off} reads back different bytes")
            # every record present is whole and a real one, offsets dense
            first = log.start_offset if full else max(log.start_offset, min(checked_upto - 64, nxt))
            expect = first
            for rec in log.scan(first):
                assert rec.offset == expect
                assert value_ok(bytes(rec.value)), f"kill {k}: garbage record at offset {rec.offset}"
                expect += 1
            assert expect == nxt
            checked_upto = nxt
            # appends resume
            v = make_value(rng)
            off = log.append(v, expected_offset=nxt)
            assert off == nxt and bytes(log.read(off).value) == v
            acked[off] = zlib.crc32(v)  # fsync="always": acknowledged
        finally:
            if rng.random() < 0.5:
                log.close()
                stats["clean_reopens"] += 1
            else:
                log.flush()
                simulate_crash(log)
    # a final full CRC check of everything
    with pylog.Log(path) as log:
        assert log.verify() == []
        for off, crc in acked.items():
            if off >= log.next_offset or zlib.crc32(bytes(log.read(off).value)) != crc:
                lost.append(f"at the end: acknowledged offset {off} lost")
        segments = len(log.segments())
    elapsed = time.monotonic() - t0
    summary = (f"crash-kill: {stats['kills']} kills ({stats['killed_before_open']} before the log was open), "
               f"{len(acked)} records acknowledged, {len(lost)} lost, {stats['junk_tails']} torn/garbage tails "
               f"({stats['cut_bytes']} bytes cut), {segments} segments, {elapsed:.1f} s")
    with capsys.disabled():
        print("\n" + summary)
    assert kills >= 200
    assert not lost, "\n".join(lost[:20])
