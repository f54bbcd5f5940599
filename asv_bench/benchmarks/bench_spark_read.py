"""The Spark data source's planning and reading, in this process (no JVM): what a Spark
query costs pylog itself, apart from Spark's own fixed costs (see docs/benchmarks.md).

* ``SparkPlanRead.time_full``: plan a read of a 2-partition topic (N x 100 B each) and decode
  every slice into Arrow batches, as Spark's tasks do.
* ``SparkPlanRead.time_pushed``: the same with pushed filters selecting 1% of the records
  (``partition = 1 AND offset >= a AND offset < b``): one slice of 1% planned and read.
* ``SparkPlanRead.time_plan``: planning alone (logs kept between plans, so a refresh).

Skipped on commits without pyspark, pyarrow or the pushdown reader.
"""
from __future__ import annotations

import os

from .common import build_log, optional, setup  # noqa: F401

N = 500_000


class SparkPlanRead:
    def setup_cache(self) -> str:
        root = os.path.abspath("spark-root")
        for p in range(2):
            build_log(os.path.join(root, "t", f"partition-{p}"), N, 100, seal=False)
        return root

    setup_cache.timeout = 300

    def setup(self, root: str) -> None:
        optional("pyspark")
        optional("pyarrow")
        spark = optional("pylog.spark")
        if not hasattr(spark, "PylogPushdownReader"):
            raise NotImplementedError("no filter pushdown on this commit")
        from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

        self.spark = spark
        lo = N // 2 - N // 100
        self.filters = [EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), lo),
                        LessThan(("offset",), lo + 2 * N // 100)]
        self.options = {"path": root, "topic": "t"}
        self._run(False)  # warm: pages faulted in, logs kept

    def _run(self, pushed: bool) -> int:
        reader = self.spark.PylogPushdownReader(dict(self.options))
        if pushed:
            list(reader.pushFilters(list(self.filters)))
        return sum(b.num_rows for sl in reader.partitions() for b in reader.read(sl))

    def time_full(self, root: str) -> None:
        self._run(False)

    def time_pushed(self, root: str) -> None:
        self._run(True)

    def time_plan(self, root: str) -> None:
        self.spark.PylogReader(dict(self.options)).partitions()
