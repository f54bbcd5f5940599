"""`pylog serve` throughput with a real Kafka client, against Redis Streams in the same run.

    python -m benchmarks.bench_serve [--records 1000000] [--size 100] [--runs 3] [--profile FILE]

For each run: a fresh broker process (``pylog serve`` on a free loopback port, fresh root),
confluent-kafka producing ``--records`` x ``--size`` B (acks=1, librdkafka batching) into
one partition, then one confluent-kafka consumer reading them all (and kcat, librdkafka's C
tool, reading them again, where it is installed: the read without Python per record); and a private
redis-server (no persistence) fed the same records by pipelined XADD (1,000 per pipeline)
and read back by XREAD (pages of 10,000). Prints the median records/s of each and the
targets of issue 18 (producer >= 300k/s, consumer >= 1M/s, both >= 3x Redis).
The consumers set librdkafka's ``queued.min.messages`` to 10,000,000 (``--queued-min N``; 100,000,
librdkafka's default, pauses every fetch for a second: see run_kafka).
``--profile FILE``: the broker runs under cProfile and its stats go to FILE (the top
entries are printed). ``--quick``: 100,000 records, one run (benchmarks/ci.sh).
"""
from __future__ import annotations

import argparse
import cProfile  # noqa: F401  (the broker's child imports it)
import json
import os
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: the consumers' queued.min.messages (librdkafka's upper bound; see run_kafka)
QUEUED_MIN = 10_000_000
ROOT = os.path.dirname(HERE)


def start_broker(root: str, profile: str | None) -> tuple[subprocess.Popen, str]:  # type: ignore[type-arg]
    code = ("import sys, cProfile; from pylog.serve import serve\n"
            "ready = lambda s: print('listening on %s:%d' % (s.host, s.port), flush=True)\n"
            "args = (sys.argv[1], '127.0.0.1', 0, ready)\n"
            "if len(sys.argv) > 2: cProfile.runctx('serve(*args)', globals(), locals(), sys.argv[2])\n"
            "else: serve(*args)\n")
    argv = [sys.executable, "-c", code, root] + ([profile] if profile else [])
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    m = re.search(r"listening on ([\d.]+):(\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"the broker did not start: {line!r}")
    return proc, f"127.0.0.1:{m.group(2)}"


def run_kafka(n: int, size: int, profile: str | None) -> tuple[float, float, float]:
    import confluent_kafka as ck

    root = tempfile.mkdtemp(prefix="pylog-bench-serve-")
    proc, bootstrap = start_broker(root, profile)
    try:
        value = b"x" * size
        p = ck.Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2 << 20,
                         "compression.type": "none"})
        p.produce("bench", b"warm")
        p.flush(30)
        t0 = time.perf_counter()
        for _ in range(n):
            try:
                p.produce("bench", value)
            except BufferError:
                p.poll(0.01)
                p.produce("bench", value)
        left = p.flush(600)
        produce_s = time.perf_counter() - t0
        assert left == 0, f"{left} records not delivered"
        # queued.min.messages: librdkafka stops fetching a partition while its local queue holds
        # that many records (default 100,000) and fetches again only after fetch.queue.backoff.ms
        # (1 s), however fast the application drains it; a 16 MiB Fetch brings ~150,000 records
        # of 100 B, so at the default every Fetch is followed by a 1 s pause (~150k rec/s,
        # whatever the broker; the same against Kafka: librdkafka #1377, #2879, #4275).
        # The queue is bounded by queued.max.messages.kbytes instead (1 GiB).
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
                         "queued.max.messages.kbytes": 1 << 20, "queued.min.messages": QUEUED_MIN})
        c.assign([ck.TopicPartition("bench", 0, 1)])
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + 600
        while got < n and time.perf_counter() < deadline:
            msgs = c.consume(10_000, 1.0)
            for m in msgs:
                if m.error() is None:
                    got += 1
        consume_s = time.perf_counter() - t0
        c.close()
        assert got == n, f"consumed {got} of {n}"
        kcat = float("nan")
        if shutil.which("kcat"):  # the same read by librdkafka's own C tool, no Python per record
            t0 = time.perf_counter()
            subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", "bench", "-o", "1", "-c", str(n), "-q", "-f", "",
                            "-X", "fetch.max.bytes=67108864", "-X", "max.partition.fetch.bytes=16777216",
                            "-X", f"queued.min.messages={QUEUED_MIN}"],
                           check=True, timeout=600, stdout=subprocess.DEVNULL)
            kcat = n / (time.perf_counter() - t0)
        return n / produce_s, n / consume_s, kcat
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def run_redis(n: int, size: int) -> tuple[float, float]:
    from pylog.bench.peer_redis import RedisSystem

    r = RedisSystem(quick=True)
    if r.available():
        raise RuntimeError(r.available())
    r.start()
    try:
        cl = r.client
        value = b"x" * size
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            pipe = cl.pipeline(transaction=False)
            for _ in range(min(1000, n - start)):
                pipe.xadd("bench", {"v": value})
            pipe.execute()
        add_s = time.perf_counter() - t0
        got, last = 0, "0-0"
        t0 = time.perf_counter()
        while got < n:
            res = cl.xread({"bench": last}, count=10_000)
            entries = res[0][1]
            got += len(entries)
            last = entries[-1][0]
        read_s = time.perf_counter() - t0
        return n / add_s, n / read_s
    finally:
        r.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", metavar="FILE")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--queued-min", type=int, default=QUEUED_MIN, help="the consumers' queued.min.messages")
    a = ap.parse_args()
    globals()["QUEUED_MIN"] = a.queued_min
    if a.quick:
        a.records, a.runs = 100_000, 1
    kp, kc, kk, rp, rc = [], [], [], [], []
    for i in range(a.runs):
        p, c, k = run_kafka(a.records, a.size, a.profile if i == 0 else None)
        x, y = run_redis(a.records, a.size)
        kp.append(p); kc.append(c); kk.append(k); rp.append(x); rc.append(y)
        print(f"run {i + 1}: pylog serve produce {p:,.0f}/s consume {c:,.0f}/s (kcat {k:,.0f}/s) | "
              f"redis XADD {x:,.0f}/s XREAD {y:,.0f}/s", flush=True)
    med = {k: statistics.median(v) for k, v in
           (("produce", kp), ("consume", kc), ("consume_kcat", kk), ("redis_xadd", rp), ("redis_xread", rc))}
    targets = [("producer >= 300,000 rec/s", med["produce"] >= 300_000),
               ("consumer >= 1,000,000 rec/s", med["consume"] >= 1_000_000),
               ("producer >= 3x Redis XADD", med["produce"] >= 3 * med["redis_xadd"]),
               ("consumer >= 3x Redis XREAD", med["consume"] >= 3 * med["redis_xread"])]
    print(f"medians of {a.runs} run(s), {a.records:,} x {a.size} B:")
    for k, v in med.items():
        print(f"  {k:14s} {v:>12,.0f} rec/s")
    print(f"  ratios: produce {med['produce'] / med['redis_xadd']:.2f}x redis, "
          f"consume {med['consume'] / med['redis_xread']:.2f}x redis")
    for name, ok in targets:
        print(f"  [{'met' if ok else 'MISSED'}] {name}")
    if a.profile:
        print(f"broker profile (first run) in {a.profile}; top 25 by cumulative time:")
        pstats.Stats(a.profile).sort_stats("tottime").print_stats(25)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"records": a.records, "size": a.size, "runs": a.runs, "queued_min": a.queued_min, "medians": med,
                       "all": {"produce": kp, "consume": kc, "consume_kcat": kk, "redis_xadd": rp, "redis_xread": rc}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
