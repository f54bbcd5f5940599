"""Spark on pylog vs Spark on Parquet: 1,000,000 records of 100 bytes, local[2].

    python -m benchmarks.bench_spark [--records N] [--reps R] [--dir DIR] [--no-write]

Read: a full scan touching every value, ``SELECT sum(length(value))``, and a ``count()`` of a
pylog topic (2 partitions) vs the same rows in a Parquet file written by Spark. Pushed: the
same sum over 1% of the records, selected by ``partition``/``offset`` and by
``partition``/``timestamp`` predicates (option ``pushFilters=true``), vs the full read.
Write: the same cached rows (value column) appended to a new pylog topic vs written to
Parquet. Prints the median and min of ``--reps`` interleaved runs after one warm-up run of
each. Targets (issues 5 and 16): pylog read time (sum and count) <= 1.5x Parquet's; a pushed
1% read >= 10x faster than the full read; pylog write speed >= 0.5x Parquet's (and, for
scale, a Python sink that keeps nothing: Spark's own cost of a Python writer).
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

TS0 = 1_700_000_000_000  # record i of a partition has timestamp TS0 + i (ms)


def make_topic(root: str, n: int, size: int, nparts: int) -> None:
    """Topic ``bench`` under ``root`` (made afresh): ``n`` random records of ``size`` bytes
    spread over ``nparts`` partitions, record i of a partition stamped TS0 + i ms."""
    import numpy as np

    import pylog

    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(42)
    per = n // nparts
    for p in range(nparts):
        count = per + (1 if p < n % nparts else 0)
        blob = rng.integers(0, 256, size=count * size, dtype=np.uint8).tobytes()
        with pylog.Log(os.path.join(root, "bench", f"partition-{p}")) as log:
            for a in range(0, count, 100_000):
                b = min(count, a + 100_000)
                log.append_batch([blob[i * size:(i + 1) * size] for i in range(a, b)],
                                 timestamps=list(range(TS0 + a, TS0 + b)))


def null_sink() -> Any:
    """A Python data source (format ``nullsink``) whose writer takes every row and keeps
    nothing: Spark's own cost of a write through the Python data source API (the Arrow
    hand-off to the Python workers, the job, the commit round trip), the floor under any
    Python writer's time."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class NullWriter(DataSourceArrowWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _batch in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any) -> None:
            pass

    class NullSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nullsink"

        def writer(self, schema: Any, overwrite: bool) -> NullWriter:
            return NullWriter()

    return NullSink


def make_session(name: str, jar: str | None = None) -> Any:
    """The benchmarks' SparkSession: local[2], no UI, pushdown of Python sources enabled, and
    the JVM connector's jar on the classpath when ``jar`` is given."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder if jar is None else SparkSession.builder.config("spark.jars", jar)
    spark = (builder.master("local[2]").appName(name)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
             .config("spark.sql.python.filterPushdown.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--no-write", action="store_true", help="skip the write benchmark")
    ap.add_argument("--no-jvm", action="store_true", help="leave the JVM connector out")
    args = ap.parse_args()

    from pyspark.sql import functions as F

    from pylog.spark import jar_path, register

    jar = None if args.no_jvm else jar_path()
    # the Python source keeps its own name beside the JVM connector, which answers to "pylog"
    py_fmt = "pylog" if jar is None else "pylog-python"

    work = args.dir or tempfile.mkdtemp(prefix="pylog-bench-spark-")
    root = os.path.join(work, "root")
    n, size, nparts = args.records, args.value_bytes, args.partitions
    per = n // nparts
    t = time.perf_counter()
    make_topic(root, n, size, nparts)
    print(f"generated {n:,} records of {size} B in {nparts} partitions in {time.perf_counter() - t:.1f} s")

    spark = make_session("pylog-bench", jar)
    try:
        register(spark)
        src = spark.read.format(py_fmt).option("path", root).option("topic", "bench").load()
        parquet = os.path.join(work, "bench.parquet")
        src.write.mode("overwrite").parquet(parquet)

        def load(fmt: str) -> Any:
            return spark.read.format(fmt).option("path", root).option("topic", "bench").load()

        def read_pylog() -> int:
            return load(py_fmt).agg(F.sum(F.length("value"))).first()[0]

        def read_jvm() -> int:
            return load("pylog").agg(F.sum(F.length("value"))).first()[0]

        def count_jvm() -> int:
            return load("pylog").count()

        def all_columns(df: Any) -> None:  # every column of every row, into Spark's no-op sink
            df.write.format("noop").mode("overwrite").save()

        def selective_jvm() -> int:
            return selective(load("pylog"))

        def selective(df: Any) -> int:  # 1% of the records, by partition and offset
            return df.filter((F.col("partition") == 1) & (F.col("offset") >= lo) & (F.col("offset") < lo + sel)) \
                .agg(F.sum(F.length("value"))).first()[0]

        def read_parquet() -> int:
            return spark.read.parquet(parquet).agg(F.sum(F.length("value"))).first()[0]

        def count_pylog() -> int:
            return load(py_fmt).count()

        def count_parquet() -> int:
            return spark.read.parquet(parquet).count()

        sel = n // 100  # 1% of the records: a range of partition 1 (its middle)
        lo = per // 2 - sel // 2

        def pushed(cond: Any) -> int:
            # a new DataFrame per query (Spark 4.3 keeps a pushed plan on the relation)
            df = (spark.read.format(py_fmt).option("path", root).option("topic", "bench")
                  .option("pushFilters", "true").load())
            return df.filter(cond).agg(F.sum(F.length("value"))).first()[0]

        def pushed_offsets() -> int:
            return pushed((F.col("partition") == 1) & (F.col("offset") >= lo) & (F.col("offset") < lo + sel))

        def pushed_timestamps() -> int:
            t_lo = datetime.datetime.fromtimestamp((TS0 + lo) / 1000, tz=datetime.timezone.utc)
            t_hi = datetime.datetime.fromtimestamp((TS0 + lo + sel) / 1000, tz=datetime.timezone.utc)
            return pushed((F.col("partition") == 1) & (F.col("timestamp") >= F.lit(t_lo))
                          & (F.col("timestamp") < F.lit(t_hi)))

        values = spark.read.parquet(parquet).select("value").cache()
        assert values.count() == n
        counter = iter(range(1 << 30))

        def write_pylog() -> None:
            i = next(counter)
            values.write.format("pylog").mode("append").option("path", root).option("topic", f"w{i}") \
                .option("partitions", str(nparts)).save()

        def write_parquet() -> None:
            i = next(counter)
            values.write.mode("overwrite").parquet(os.path.join(work, f"w{i}.parquet"))

        def write_null() -> None:
            values.write.format("nullsink").mode("append").save()

        expected = n * size
        assert read_pylog() == expected and read_parquet() == expected  # warm-up + check
        assert count_pylog() == n and count_parquet() == n
        assert pushed_offsets() == sel * size and pushed_timestamps() == sel * size
        work_fns: list[tuple[str, Callable[[], Any]]] = [
            ("read pylog", read_pylog), ("read parquet", read_parquet), ("count pylog", count_pylog),
            ("count parquet", count_parquet), ("pushed offsets", pushed_offsets),
            ("pushed times", pushed_timestamps),
            ("all pylog", lambda: all_columns(load(py_fmt))),
            ("all parquet", lambda: all_columns(spark.read.parquet(parquet))),
            ("1% parquet", lambda: selective(spark.read.parquet(parquet)))]
        if jar is not None:
            assert read_jvm() == expected and count_jvm() == n and selective_jvm() == sel * size
            work_fns += [("read jvm", read_jvm), ("count jvm", count_jvm), ("1% jvm", selective_jvm),
                         ("all jvm", lambda: all_columns(load("pylog")))]
        if not args.no_write:
            spark.dataSource.register(null_sink())
            write_pylog()
            write_parquet()
            write_null()
            work_fns += [("write pylog", write_pylog), ("write parquet", write_parquet),
                         ("write nullsink", write_null)]
        times: dict[str, list[float]] = {k: [] for k, _fn in work_fns}
        for _ in range(args.reps):
            for name, fn in work_fns:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
            for d in os.listdir(root):
                if d.startswith("w"):
                    shutil.rmtree(os.path.join(root, d))
            for d in os.listdir(work):
                if d.startswith("w") and d.endswith(".parquet"):
                    shutil.rmtree(os.path.join(work, d))
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{n:,} records x {size} B, local[2], {args.reps} runs each (after a warm-up)\n")
    print(f"{'operation':<15} {'median s':>9} {'min s':>7} {'M rows/s':>9}")
    for k, v in times.items():
        print(f"{k:<15} {med[k]:>9.3f} {min(v):>7.3f} {n / med[k] / 1e6:>9.2f}")
    r = med["read pylog"] / med["read parquet"]
    c = med["count pylog"] / med["count parquet"]
    print(f"\nread:  pylog takes {r:.2f}x Parquet's time (target <= 1.5x): {'OK' if r <= 1.5 else 'MISSED'}")
    print(f"count: pylog takes {c:.2f}x Parquet's time (target <= 1.5x): {'OK' if c <= 1.5 else 'MISSED'}")
    for k in ("pushed offsets", "pushed times"):
        x = med["read pylog"] / med[k]
        print(f"{k + ':':<15} 1% of the records read {x:.1f}x faster than the full read (target >= 10x): "
              f"{'OK' if x >= 10 else 'MISSED'}")
    a = med["all pylog"] / med["all parquet"]
    print(f"all columns: pylog takes {a:.2f}x Parquet's time")
    if jar is not None:
        print("\nthe JVM connector against Parquet (targets: count <= 0.5x, the others <= 0.7x):")
        for k, ref, goal in (("count jvm", "count parquet", 0.5), ("read jvm", "read parquet", 0.7),
                             ("all jvm", "all parquet", 0.7), ("1% jvm", "1% parquet", 0.7)):
            x = med[k] / med[ref]
            print(f"{k + ':':<15} {x:.2f}x {ref}'s time: {'OK' if x <= goal else 'MISSED'}")
    if not args.no_write:
        w = med["write parquet"] / med["write pylog"]
        print(f"write: pylog runs at {w:.2f}x Parquet's speed (target >= 0.5x): {'OK' if w >= 0.5 else 'MISSED'}")
        f = med["write parquet"] / med["write nullsink"]
        print(f"write: a Python sink that keeps nothing runs at {f:.2f}x Parquet's speed (Spark's floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
