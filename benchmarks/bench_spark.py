"""Spark on pylog vs Spark on Parquet: 1,000,000 records of 100 bytes, local[2].

    python benchmarks/bench_spark.py [--records N] [--reps R] [--dir DIR]

Read: a full scan touching every value, ``SELECT sum(length(value))``, of a pylog topic
(2 partitions) vs the same rows in a Parquet file written by Spark. Write: the same cached
rows (value column) appended to a new pylog topic vs written to Parquet. Prints the median
and min of ``--reps`` interleaved runs after one warm-up run of each. Targets (issue 5):
pylog read time <= 1.5x Parquet's; pylog write speed >= 0.5x Parquet's.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import numpy as np

    import pylog
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pylog.spark import register

    work = args.dir or tempfile.mkdtemp(prefix="pylog-bench-spark-")
    root = os.path.join(work, "root")
    shutil.rmtree(root, ignore_errors=True)
    n, size, nparts = args.records, args.value_bytes, args.partitions
    rng = np.random.default_rng(42)
    t = time.perf_counter()
    per = n // nparts
    for p in range(nparts):
        count = per + (1 if p < n % nparts else 0)
        blob = rng.integers(0, 256, size=count * size, dtype=np.uint8).tobytes()
        with pylog.Log(os.path.join(root, "bench", f"partition-{p}")) as log:
            for a in range(0, count, 100_000):
                b = min(count, a + 100_000)
                log.append_batch([blob[i * size:(i + 1) * size] for i in range(a, b)])
    print(f"generated {n:,} records of {size} B in {nparts} partitions in {time.perf_counter() - t:.1f} s")

    spark = (SparkSession.builder.master("local[2]").appName("pylog-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        register(spark)
        src = spark.read.format("pylog").option("path", root).option("topic", "bench").load()
        parquet = os.path.join(work, "bench.parquet")
        src.write.mode("overwrite").parquet(parquet)

        def read_pylog() -> int:
            df = spark.read.format("pylog").option("path", root).option("topic", "bench").load()
            return df.agg(F.sum(F.length("value"))).first()[0]

        def read_parquet() -> int:
            return spark.read.parquet(parquet).agg(F.sum(F.length("value"))).first()[0]

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

        expected = n * size
        assert read_pylog() == expected and read_parquet() == expected  # warm-up + check
        write_pylog()
        write_parquet()
        times: dict[str, list[float]] = {k: [] for k in ("read pylog", "read parquet", "write pylog", "write parquet")}
        for _ in range(args.reps):
            for name, fn in (("read pylog", read_pylog), ("read parquet", read_parquet),
                             ("write pylog", write_pylog), ("write parquet", write_parquet)):
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
    w = med["write parquet"] / med["write pylog"]
    print(f"\nread:  pylog takes {r:.2f}x Parquet's time (target <= 1.5x): {'OK' if r <= 1.5 else 'MISSED'}")
    print(f"write: pylog runs at {w:.2f}x Parquet's speed (target >= 0.5x): {'OK' if w >= 0.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
