"""The JVM connector's reads through Spark (local[2], the jar on ``spark.jars``), beside a
Parquet copy of the same rows: what a query costs end to end, Spark's fixed costs included.

* ``SparkJvmRead.time_count``: ``count()`` of a 2-partition topic (N x 100 B each), answered
  by the connector's pushed aggregate.
* ``SparkJvmRead.time_sum``: ``sum(length(value))``, every value read.
* ``SparkJvmRead.time_selective``: the same sum over 1% of the records, by ``partition`` and
  ``offset`` (pushed, exact).
* ``SparkJvmRead.time_parquet_sum``: the full sum over the Parquet copy, for the ratio.

Skipped on commits without pyspark, pyarrow or the connector's jar (``pylog.spark.jar_path``).
"""
from __future__ import annotations

import os
import sys

from .common import build_log, optional  # noqa: F401

N = 500_000


class SparkJvmRead:
    timeout = 600

    def setup_cache(self) -> str:
        root = os.path.abspath("spark-jvm-root")
        for p in range(2):
            build_log(os.path.join(root, "t", f"partition-{p}"), N, 100, seal=False)
        return root

    setup_cache.timeout = 300

    def setup(self, root: str) -> None:
        optional("pyspark")
        optional("pyarrow")
        ps = optional("pylog.spark")
        jar = getattr(ps, "jar_path", lambda: None)()
        if jar is None:
            raise NotImplementedError("no JVM connector jar on this commit")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        self.F = F
        self.spark = (SparkSession.builder.master("local[2]").appName("asv-pylog-jvm")
                      .config("spark.jars", jar).config("spark.ui.enabled", "false")
                      .config("spark.ui.showConsoleProgress", "false")
                      .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        self.spark.sparkContext.setLogLevel("ERROR")
        ps.register(self.spark)
        self.root = root
        self.parquet = root + ".parquet"
        if not os.path.isdir(self.parquet):
            self._df().write.mode("overwrite").parquet(self.parquet)
        self.lo = N // 2 - N // 200
        assert self._df().count() == 2 * N  # warm

    def _df(self):  # noqa: ANN202
        return self.spark.read.format("pylog").option("path", self.root).option("topic", "t").load()

    def time_count(self, root: str) -> None:
        self._df().count()

    def time_sum(self, root: str) -> None:
        self._df().agg(self.F.sum(self.F.length("value"))).first()

    def time_selective(self, root: str) -> None:
        F = self.F
        self._df().filter((F.col("partition") == 1) & (F.col("offset") >= self.lo)
                          & (F.col("offset") < self.lo + 2 * N // 100)).agg(F.sum(F.length("value"))).first()

    def time_parquet_sum(self, root: str) -> None:
        self.spark.read.parquet(self.parquet).agg(self.F.sum(self.F.length("value"))).first()
