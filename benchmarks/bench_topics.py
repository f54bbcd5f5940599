"""Speed of the layer above Log: topics, consumers and the `pylog` command.

Run: ``python benchmarks/bench_topics.py [--lines N]``. Prints one figure per line, with
the target from issue 4:

1. ``Topic.append`` with a key vs ``Log.append`` of the same record (target <= 1.3x).
2. ``Consumer.poll(500)`` from sealed segments, records/s (target >= 2,000,000).
3. ``pylog produce`` of an N-line file vs a Python loop that only reads and splits the
   lines from stdin (target >= 0.5x as fast).
4. ``pylog consume`` of them vs a loop that only writes them to stdout (target >= 0.5x).

Each timing is the best of a few runs. On a shared machine wall-clock time is noisy, so the
figures are CPU time (user + system, of this process or of the child processes), which is
what the code costs; ``--wall`` reports wall-clock time instead.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import pylog


WALL = False


def _clock() -> float:
    if WALL:
        return time.perf_counter()
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t = _clock()
        fn()
        times.append(_clock() - t)
    return min(times)


def bench_append(tmp: str, n: int) -> None:
    value = b"v" * 100
    keys = [b"key-%d" % (i % 1000) for i in range(n)]
    with pylog.Log(os.path.join(tmp, "log"), fsync="never") as log:
        def plain():
            for k in keys:
                log.append(value, k)
        t_log = best(plain)
    with pylog.LogStore(os.path.join(tmp, "store")) as store:
        t = store.create_topic("t", 1, fsync="never")
        def topic():
            for k in keys:
                t.append(value, k)
        t_topic = best(topic)
        t8 = store.create_topic("t8", 8, fsync="never")
        def topic8():
            for k in keys:
                t8.append(value, k)
        t_topic8 = best(topic8)
        distinct = [b"unique-key-%d" % i for i in range(n)]
        t9 = store.create_topic("t9", 8, fsync="never")
        def topic_distinct():
            for k in distinct:
                t9.append(value, k)
        t_distinct = best(topic_distinct, repeat=1)
    print(f"Log.append with key:            {t_log / n * 1e6:7.2f} us/record")
    print(f"Topic.append with key (1 part): {t_topic / n * 1e6:7.2f} us/record  ratio {t_topic / t_log:.2f}x (target <= 1.3x)")
    print(f"Topic.append with key (8 part): {t_topic8 / n * 1e6:7.2f} us/record  ratio {t_topic8 / t_log:.2f}x")
    print(f"Topic.append, all keys distinct (8 part, murmur2 not cached): {t_distinct / n * 1e6:7.2f} us/record  "
          f"ratio {t_distinct / t_log:.2f}x")


def bench_poll(tmp: str, n: int) -> None:
    with pylog.LogStore(os.path.join(tmp, "pollstore")) as store:
        t = store.create_topic("p", 1, segment_bytes=16 << 20, fsync="never")
        for i in range(0, n, 10_000):
            t.append_batch([b"x" * 100] * 10_000, partition=0)
        t.partition(0).roll()

        def run():
            c = store.consumer("p", group=None, auto_offset_reset="earliest")
            c.seek_to_beginning()
            got = 0
            while True:
                r = c.poll(500)
                if not r:
                    break
                got += len(r)
            c.close()
            assert got == n, got
        el = best(run)
        keyed = store.create_topic("pk", 1, segment_bytes=16 << 20, fsync="never")
        for i in range(0, n, 10_000):
            keyed.append_batch([b"x" * 100] * 10_000, keys=[b"key-%d" % j for j in range(10_000)], partition=0)
        keyed.partition(0).roll()

        def run_keyed():
            c = store.consumer("pk", group=None, auto_offset_reset="earliest")
            c.seek_to_beginning()
            got = 0
            while True:
                r = c.poll(500)
                if not r:
                    break
                got += len(r)
            c.close()
        el_k = best(run_keyed)
        log = t.partition(0)

        def raw():
            off = 0
            while off < n:
                off = log.read_batch(off, 8 << 20, 500)[-1].offset + 1
        el_raw = best(raw)
    print(f"poll(500), sealed, no keys:     {n / el / 1e6:7.2f} M records/s (target >= 2)")
    print(f"poll(500), sealed, with keys:   {n / el_k / 1e6:7.2f} M records/s")
    print(f"Log.read_batch(500) alone:      {n / el_raw / 1e6:7.2f} M records/s (the floor poll is built on)")


READ_SPLIT = "import sys\nn = 0\nfor line in sys.stdin.buffer:\n    line.rstrip(b'\\n').split(b':', 1)\n    n += 1\n"
WRITE_ONLY = ("import sys\nw = sys.stdout.buffer.write\nfor line in open(sys.argv[1], 'rb'):\n    w(line)\n"
              "sys.stdout.flush()\n")


def bench_cli(tmp: str, lines: int) -> None:
    path = os.path.join(tmp, "lines.txt")
    with open(path, "wb") as f:
        for i in range(0, lines, 10_000):
            f.write(b"".join(b"record number %08d with some payload text\n" % j for j in range(i, min(i + 10_000, lines))))
    root = os.path.join(tmp, "cliroot")
    py = sys.executable
    subprocess.run([py, "-m", "pylog.cli", "--root", root, "topic", "create", "lines", "-c", "fsync=never"],
                   check=True, capture_output=True)

    def timed(argv, stdin_path=None):
        with open(stdin_path or os.devnull, "rb") as fin, open(os.devnull, "wb") as fout:
            t = _clock()
            subprocess.run(argv, stdin=fin, stdout=fout, check=True)
            return _clock() - t

    base_read = min(timed([py, "-c", READ_SPLIT], path) for _ in range(3))
    produce_times = []
    for _ in range(3):
        subprocess.run([py, "-m", "pylog.cli", "--root", root, "topic", "delete", "lines"], check=True, capture_output=True)
        subprocess.run([py, "-m", "pylog.cli", "--root", root, "topic", "create", "lines", "-c", "fsync=never"],
                       check=True, capture_output=True)
        produce_times.append(timed([py, "-m", "pylog.cli", "--root", root, "produce", "lines"], path))
    prod = min(produce_times)
    base_write = min(timed([py, "-c", WRITE_ONLY, path]) for _ in range(3))
    cons = min(timed([py, "-m", "pylog.cli", "--root", root, "consume", "lines", "--from-beginning"]) for _ in range(3))
    print(f"read+split loop ({lines} lines): {base_read:6.2f} s   pylog produce: {prod:6.2f} s   "
          f"speed ratio {base_read / prod:.2f}x (target >= 0.5x)")
    print(f"write-only loop ({lines} lines): {base_write:6.2f} s   pylog consume: {cons:6.2f} s   "
          f"speed ratio {base_write / cons:.2f}x (target >= 0.5x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines for the CLI benchmarks")
    ap.add_argument("--records", type=int, default=200_000, help="records for the append/poll benchmarks")
    ap.add_argument("--only", choices=["append", "poll", "cli"], default=None)
    ap.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    a = ap.parse_args()
    global WALL
    WALL = a.wall
    print(f"pylog {pylog.__version__}, backend {pylog.backend}, python {sys.version.split()[0]}, "
          f"{'wall-clock' if a.wall else 'CPU'} time")
    with tempfile.TemporaryDirectory(prefix="pylog-bench-") as tmp:
        if a.only in (None, "append"):
            bench_append(tmp, a.records)
        if a.only in (None, "poll"):
            bench_poll(tmp, a.records * 5)
        if a.only in (None, "cli"):
            bench_cli(tmp, a.lines)


if __name__ == "__main__":
    main()
