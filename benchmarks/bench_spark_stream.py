"""Streaming reads: the JVM connector vs the Python source vs a Parquet file stream, local[2].

    python -m benchmarks.bench_spark_stream [--records N] [--reps R] [--idle S] [--dir DIR]

Three figures per reader (issue 27), every query writing to Spark's ``noop`` sink:

* **start**: a new query (fresh checkpoint) with ``availableNow`` over an empty topic, from
  ``writeStream.start()`` to its end: what a stream costs before it reads anything.
* **empty trigger**: a query on the empty topic with a 100 ms processing-time trigger, kept
  running ``--idle`` seconds with ``spark.sql.streaming.noDataProgressEventInterval=0``;
  the median ``triggerExecution`` (and its ``latestOffset`` part) of the triggers that found
  nothing, from the query's progress reports.
* **availableNow**: a new query with ``availableNow`` over ``--records`` records of 100 B (2
  partitions; one micro-batch), start to end, against the same rows as a Parquet file stream
  (``readStream.parquet``) read the same way. Target: <= 1.5x the Parquet stream's time.

Needs the connector's jar (``pylog.spark.jar_path()``); without it only the Python source runs.
Prints medians and minimums of ``--reps`` interleaved runs after one warm-up run of each.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.bench_spark import make_session, make_topic


def run_available_now(spark: Any, reader: Any, ck: str) -> float:
    """Seconds from start() to the end of an ``availableNow`` query of ``reader`` into noop."""
    shutil.rmtree(ck, ignore_errors=True)
    t = time.perf_counter()
    q = reader.load().writeStream.format("noop").option("checkpointLocation", ck) \
        .trigger(availableNow=True).start()
    q.awaitTermination()
    took = time.perf_counter() - t
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return took


def empty_triggers(spark: Any, reader: Any, ck: str, idle: float) -> tuple[list[int], list[int]]:
    """(triggerExecution ms, latestOffset ms) of each trigger that found nothing in ``idle`` s."""
    shutil.rmtree(ck, ignore_errors=True)
    q = reader.load().writeStream.format("noop").option("checkpointLocation", ck) \
        .trigger(processingTime="100 milliseconds").start()
    try:
        time.sleep(idle)
    finally:
        q.stop()
    trig, latest = [], []
    for p in q.recentProgress:
        if p["numInputRows"] == 0 and p.get("batchId", 0) >= 0:
            d = p["durationMs"]
            if "triggerExecution" in d:
                trig.append(d["triggerExecution"])
                latest.append(d.get("latestOffset", 0))
    return trig[1:], latest[1:]  # the first is the query's own start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds an idle query runs")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()

    import pylog
    from pylog.spark import jar_path, register

    jar = jar_path()
    fmts = ["pylog-python"] + (["pylog"] if jar is not None else [])
    names = {"pylog-python": "python", "pylog": "jvm"}
    work = args.dir or tempfile.mkdtemp(prefix="pylog-bench-stream-")
    root = os.path.join(work, "root")
    n, size = args.records, args.value_bytes
    t = time.perf_counter()
    make_topic(root, n, size, 2)
    with pylog.LogStore(root) as store:
        store.create_topic("empty", partitions=2)
    print(f"generated {n:,} records of {size} B in 2 partitions in {time.perf_counter() - t:.1f} s")

    spark = make_session("pylog-bench-stream", jar)
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    times: dict[str, list[float]] = {}
    idle: dict[str, tuple[list[int], list[int]]] = {}
    try:
        register(spark)
        parquet = os.path.join(work, "pq")
        spark.read.format("pylog-python").option("path", root).option("topic", "bench").load() \
            .write.mode("overwrite").parquet(parquet)
        pq_schema = spark.read.parquet(parquet).schema

        def stream(fmt: str, topic: str) -> Any:
            return spark.readStream.format(fmt).option("path", root).option("topic", topic) \
                .option("startingOffsets", "earliest")

        ck = os.path.join(work, "ck")
        work_fns: list[tuple[str, Callable[[], float]]] = []
        for fmt in fmts:
            work_fns.append((f"start {names[fmt]}", lambda f=fmt: run_available_now(spark, stream(f, "empty"), ck)))
        for fmt in fmts:
            work_fns.append((f"availableNow {names[fmt]}",
                             lambda f=fmt: run_available_now(spark, stream(f, "bench"), ck)))
        work_fns.append(("availableNow parquet",
                         lambda: run_available_now(spark, spark.readStream.schema(pq_schema).format("parquet")
                                                   .option("path", parquet), ck)))
        for name, fn in work_fns:  # warm-up
            fn()
        times = {name: [] for name, _fn in work_fns}
        for _ in range(args.reps):
            for name, fn in work_fns:
                times[name].append(fn())
        for fmt in fmts:
            idle[names[fmt]] = empty_triggers(spark, stream(fmt, "empty"), ck, args.idle)
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nstreaming reads, {n:,} records x {size} B, local[2], {args.reps} runs each (after a warm-up)\n")
    print(f"{'query':<22} {'median s':>9} {'min s':>7}")
    for k, v in times.items():
        print(f"{k:<22} {statistics.median(v):>9.3f} {min(v):>7.3f}")
    print(f"\n{'empty trigger':<22} {'triggers':>8} {'median ms':>10} {'latestOffset ms':>16}")
    for k, (trig, latest) in idle.items():
        if trig:
            print(f"{k:<22} {len(trig):>8} {statistics.median(trig):>10.0f} {statistics.median(latest):>16.0f}")
        else:
            print(f"{k:<22} {0:>8} {'-':>10} {'-':>16}")
    pq = statistics.median(times["availableNow parquet"])
    for fmt in fmts:
        x = statistics.median(times[f"availableNow {names[fmt]}"]) / pq
        print(f"availableNow {names[fmt]}: {x:.2f}x the Parquet file stream's time (target <= 1.5x): "
              f"{'OK' if x <= 1.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
