"""Where the time of a Spark query on a pylog topic goes, phase by phase, and Spark's floors.

    python -m benchmarks.spark_phases [--records N] [--reps R] [--dir DIR]

The same data and session as benchmarks/bench_spark.py (1,000,000 x 100 B in 2 partitions,
local[2]). The pylog queries run through ``pylog_traced``: the ``pylog`` data source with
readers that write a timestamp to a file at each step, in whichever process Spark runs the
step (the planning worker, the tasks' Python workers); the driver marks each query's start
and end. Per query, the medians of ``--reps`` runs (after one warm-up) of:

1. start -> ``reader()``: Spark's analysis and its planning workers (``create_data_source``,
   then ``plan_data_source_read`` or, with pushdown, ``data_source_pushdown_filters``);
2. ``reader()`` -> ``partitions()`` returned: pylog's planning (options, snapshot, pushed
   filters, slices);
3. -> the first task's Python worker has unpickled the reader: Spark's physical planning,
   job submission and task launch;
4. -> ``read()`` called: that worker receiving its input partition;
5. pylog's C scan, per task (the time spent making the Arrow batches);
6. per task, the time a yielded batch takes to come back (Spark's worker writing it to the
   JVM as Arrow IPC, and the JVM reading it);
7. the last ``read()`` done -> the result: the JVM turning Arrow into rows (every column:
   a Python source gets no column pruning), the aggregation, its second stage.

Then the floors, untraced: ``spark.range(1).count()`` (a job and nothing else); a Python data
source with two partitions and no rows (its ``count()``, and the sum without a filter, with
the 1% filter evaluated by Spark, and with it pushed to the source, which takes it all); one
that yields two prebuilt 500,000-row batches in pylog's schema (no work of its own: what any
Python source pays to hand those rows to Spark); Spark's Parquet reader on the same rows.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from benchmarks.bench_spark import make_session, make_topic
from pylog.spark import SCHEMA, PylogDataSource
from pylog.spark.reading import _ARROW_SCHEMA, PylogPushdownReader, PylogReader

_TRACE_ENV = "PYLOG_PHASES_TRACE"
_PREBUILT: dict[int, pa.RecordBatch] = {}


def _mark(event: str) -> None:
    path = os.environ.get(_TRACE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {event}\n")


class _Traced:
    """Marks each step of a pylog reader (module level: pickled by reference, as pylog's are)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        _mark("reader unpickled")
        self.__dict__.update(state)

    def partitions(self) -> Any:
        out = super().partitions()  # type: ignore[misc]
        _mark(f"partitions end {len(out)}")
        return out

    def read(self, partition: Any) -> Iterator[Any]:
        _mark("read start")
        t = time.perf_counter()
        for batch in super().read(partition):  # type: ignore[misc]
            _mark(f"batch made {time.perf_counter() - t:.6f}")
            t = time.perf_counter()
            yield batch
            _mark(f"batch taken {time.perf_counter() - t:.6f}")
            t = time.perf_counter()
        _mark("read end")

class TracedReader(_Traced, PylogReader):
    """pylog's batch reader, traced."""


class TracedPushdownReader(_Traced, PylogPushdownReader):
    """pylog's reader with pushdown, traced."""


class TracedSource(PylogDataSource):
    """The ``pylog`` source with traced readers, as ``pylog_traced``."""

    @classmethod
    def name(cls) -> str:
        return "pylog_traced"

    def reader(self, schema: Any) -> Any:
        _mark("reader()")
        r = super().reader(schema)
        cls = TracedPushdownReader if isinstance(r, PylogPushdownReader) else TracedReader
        traced = cls.__new__(cls)
        traced.__dict__.update(r.__dict__)
        return traced


class EmptyReader(DataSourceReader):
    """Two partitions, no rows."""

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: Any) -> Iterator[Any]:
        return iter(())


class EmptySource(DataSource):
    """A Python source in pylog's schema with no rows: Spark's floor for one."""

    @classmethod
    def name(cls) -> str:
        return "floor_empty"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> EmptyReader:
        return EmptyReader()


class EmptyPushdownReader(EmptyReader):
    """Two partitions, no rows, and every filter taken (as pylog takes its pushed ones)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        return iter(())


class EmptyPushdownSource(EmptySource):
    """:class:`EmptySource` with pushdown: Spark's floor for a query with pushed filters."""

    @classmethod
    def name(cls) -> str:
        return "floor_empty_pushdown"

    def reader(self, schema: Any) -> EmptyPushdownReader:
        return EmptyPushdownReader()


class PrebuiltReader(DataSourceReader):
    """Two partitions, each one prebuilt batch of ``rows`` rows."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0), InputPartition(1)]

    def read(self, partition: Any) -> Iterator[Any]:
        n = self.rows
        if n not in _PREBUILT:  # made once per Python worker
            values = np.random.default_rng(1).integers(0, 256, n * 100, dtype=np.uint8)
            empty = pa.py_buffer(np.zeros(n + 1, np.int32))
            arrays = [
                pa.Array.from_buffers(pa.binary(), n, [None, empty, pa.py_buffer(b"")]),
                pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * 100),
                                                       pa.py_buffer(values)]),
                pa.array(["bench"] * n, pa.string()),
                pa.array(np.ones(n, np.int32)),
                pa.array(np.arange(n, dtype=np.int64)),
                pa.array(np.arange(n, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                pa.array(np.zeros(n, np.int32)),
                pa.Array.from_buffers(pa.binary(), n, [None, empty, pa.py_buffer(b"")]),
            ]
            _PREBUILT[n] = pa.RecordBatch.from_arrays(arrays, schema=_ARROW_SCHEMA)
        yield _PREBUILT[n]


class PrebuiltSource(DataSource):
    """A Python source in pylog's schema that does no work of its own (option ``rows`` per partition)."""

    @classmethod
    def name(cls) -> str:
        return "floor_prebuilt"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> PrebuiltReader:
        return PrebuiltReader(int(self.options["rows"]))


PHASES = [
    "1 start -> reader() (Spark: analysis, planning workers)",
    "2 reader() -> partitions() returned (pylog)",
    "3 -> a task's worker has the reader (Spark: plan, job, task)",
    "4 -> read() called (Spark: the input partition)",
    "5 C scan, per task (pylog)",
    "6 batches handed to the JVM, per task (Spark: Arrow IPC)",
    "  (first read() -> last read() done)",
    "7 last read() done -> result (Spark JVM: rows, aggregate)",
]


def _phases(lines: list[str], driver: int) -> dict[str, dict[str, list[float]]]:
    """{query: {phase: [ms per run]}} from the trace file's lines (``driver``: the pid
    that marked each query's start and end)."""
    out: dict[str, dict[str, list[float]]] = {}
    cur: dict[str, Any] | None = None
    for line in lines:
        ts, who, event = line.rstrip("\n").split(None, 2)
        t = float(ts) * 1000
        if who == str(driver) and event.startswith("start "):
            cur = {"name": event[6:], "t0": t, "ev": []}
        elif who == str(driver) and event.startswith("end ") and cur is not None:
            ev, end = cur["ev"], t - cur["t0"]
            ph = out.setdefault(cur["name"], {})
            ph.setdefault("total", []).append(end)
            cur = None

            def at(prefix: str, f: Callable[..., float], ev: list[tuple[float, str, str]] = ev) -> float:
                return f(t for t, _w, e in ev if e.startswith(prefix))

            tasks = max(1, len({w for _t, w, e in ev if e == "read start"}))
            rows = [
                at("reader()", min),
                at("partitions end", max) - at("reader()", min),
                at("reader unpickled", min) - at("partitions end", max),
                at("read start", min) - at("reader unpickled", min),
                sum(float(e.split()[2]) for _t, _w, e in ev if e.startswith("batch made")) * 1000 / tasks,
                sum(float(e.split()[2]) for _t, _w, e in ev if e.startswith("batch taken")) * 1000 / tasks,
                at("read end", max) - at("read start", min),
                end - at("read end", max),
            ]
            for name, v in zip(PHASES, rows):
                ph.setdefault(name, []).append(v)
        elif cur is not None:
            cur["ev"].append((t - cur["t0"], who, event))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()

    work = args.dir or tempfile.mkdtemp(prefix="pylog-spark-phases-")
    root = os.path.join(work, "root")
    n, nparts = args.records, 2
    make_topic(root, n, 100, nparts)
    trace = os.path.join(work, "trace.txt")
    open(trace, "w").close()
    os.environ[_TRACE_ENV] = trace  # before the JVM starts: its Python workers inherit it

    from pyspark.sql import functions as F

    from pylog.spark import register

    spark = make_session("pylog-spark-phases")
    try:
        register(spark)
        # by reference, as benchmarks.spark_phases (not __main__, which is pickled by value)
        from benchmarks import spark_phases as mod

        for s in (mod.TracedSource, mod.EmptySource, mod.EmptyPushdownSource, mod.PrebuiltSource):
            spark.dataSource.register(s)
        parquet = os.path.join(work, "bench.parquet")
        spark.read.format("pylog").option("path", root).option("topic", "bench").load().write.parquet(parquet)
        per = n // nparts
        sel = n // 100
        lo = per // 2 - sel // 2

        def pylog_df(**opts: str) -> Any:
            r = spark.read.format("pylog_traced").option("path", root).option("topic", "bench")
            for k, v in opts.items():
                r = r.option(k, v)
            return r.load()

        def total(df: Any) -> int:
            return df.agg(F.sum(F.length("value"))).first()[0]

        def where(df: Any) -> Any:  # the 1%: a range of partition 1's offsets (its middle)
            return df.filter((F.col("partition") == 1) & (F.col("offset") >= lo) & (F.col("offset") < lo + sel))

        def one(a: int, b: int) -> str:  # an offsets spec: partition 0 at a, partition 1 at b
            return json.dumps({"bench": {"0": a, "1": b}})

        traced_q: dict[str, Callable[[], Any]] = {
            "pylog sum(length(value))": lambda: total(pylog_df()),
            "pylog count()": lambda: pylog_df().count(),
            "pylog 1% pushed (partition, offset)": lambda: total(where(pylog_df(pushFilters="true"))),
            "pylog 1% by startingOffsets/endingOffsets": lambda: total(
                pylog_df(startingOffsets=one(-1, lo), endingOffsets=one(-1, lo + sel))),
        }
        floor_q: dict[str, Callable[[], Any]] = {
            "parquet sum(length(value))": lambda: total(spark.read.parquet(parquet)),
            "parquet count()": lambda: spark.read.parquet(parquet).count(),
            "spark.range(1).count()": lambda: spark.range(1).count(),
            "Python source, no rows: count()": lambda: spark.read.format("floor_empty").load().count(),
            "Python source, no rows: sum, no filter": lambda: total(spark.read.format("floor_empty").load()),
            "Python source, no rows: 1% filter, not pushed": lambda: total(
                where(spark.read.format("floor_empty").load())),
            "Python source, no rows: 1% filter, pushed": lambda: total(
                where(spark.read.format("floor_empty_pushdown").load())),
            "Python source, prebuilt batches: count()":
                lambda: spark.read.format("floor_prebuilt").option("rows", str(per)).load().count(),
            "Python source, prebuilt batches: sum": lambda: total(
                spark.read.format("floor_prebuilt").option("rows", str(per)).load()),
        }
        assert traced_q["pylog count()"]() == n and floor_q["parquet count()"]() == n
        assert floor_q["Python source, prebuilt batches: count()"]() == 2 * per
        for fn in [*traced_q.values(), *floor_q.values()]:  # warm-up
            fn()
        open(trace, "w").close()
        times: dict[str, list[float]] = {k: [] for k in floor_q}
        for _ in range(args.reps):
            for name, fn in traced_q.items():
                _mark(f"start {name}")  # this process's pid stands for "driver" below
                fn()
                _mark(f"end {name}")
            for name, fn in floor_q.items():
                t = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t) * 1000)
        with open(trace) as f:
            phases = _phases(list(f), os.getpid())
    finally:
        spark.stop()
        os.environ.pop(_TRACE_ENV, None)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{n:,} records x 100 B, local[2], medians (min) of {args.reps} runs in ms\n")
    for name, ph in phases.items():
        t = ph.pop("total")
        print(f"{name}: {statistics.median(t):.0f} ({min(t):.0f})")
        for k, v in ph.items():
            print(f"    {k:<62} {statistics.median(v):7.1f} ({min(v):.1f})")
    print()
    for name, v in times.items():
        print(f"{name:<45} {statistics.median(v):7.0f} ({min(v):.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
