"""The PySpark data source ``pylog``: batch and streaming reads and writes of topics.

Spark finds it by name once pylog is installed (the top-level ``pyspark_pylog`` module
exposes :class:`PylogDataSource` as ``DefaultSource``), or after :func:`register`::

    df = spark.read.format("pylog").option("path", root).option("topic", "events").load()
    df.write.format("pylog").mode("append").option("path", root).option("topic", "out").save()

Needs PySpark >= 4.2 and pyarrow; ``import pylog`` never imports either (this module does).
The user guide is docs/spark.md. How it works:

* **Reads** plan one input partition per segment slice of each topic partition (more with
  ``minPartitions``), with the end offsets fixed at planning time. A task maps the segment's
  store file and decodes its frames with one C call per batch (CRC-checked) that writes the
  columns straight into Arrow's layout (:mod:`pylog.arrow`'s scan): no Python object per
  record.
* **Pushdown** (option ``pushFilters=true``): filters on ``topic``, ``partition``, ``offset``
  and ``timestamp`` narrow the plan to the slices they select (:mod:`pylog.spark.pushdown`).
* **Writes** are store transactions (:mod:`pylog.transactions`). The writer, made where
  Spark plans the job, begins a transaction (``ROOT/~txn/ID/``); each task stages its rows,
  grouped by target partition, into it (a staging Log per task and partition); the driver's
  ``commit()`` commits the tasks' staged records as one transaction, ``abort()`` discards
  them. Every reader of the store, in Spark or not, stops at each partition's last stable
  offset, so it sees a commit entirely or not at all; a crash mid-commit is rolled forward
  (decided) or discarded (not decided) by the store, not by the next Spark job.
* **Streams** keep offsets ``{topic: {partition: next_offset}}`` (string keys, sorted: Spark
  compares offsets as JSON text). The sink writes its batch id in the commit's decision
  (``ROOT/~txn/sinks.json`` keeps the last one per sink), so a replayed batch is skipped.
  A sink id names one query's checkpoint: a random id kept in the checkpoint directory
  (``pylog-sink-id``), so a reset (deleted) checkpoint is a new sink.

The one place that reaches into pylog's internals is :mod:`pylog.spark.reading`'s
``_plan_partition`` (segment positions from the log's segment objects) and ``_read_slice`` (a
C scan of a mapped store file); everything else goes through the public :class:`pylog.Log` API.

The package: :mod:`pylog.spark.options` (option parsing and checking),
:mod:`pylog.spark.pushdown` (pushed filters turned into a plan),
:mod:`pylog.spark.layout` (topics on disk and the ones a read selects),
:mod:`pylog.spark.reading` (planning and batch reads), :mod:`pylog.spark.streaming`
(streaming reads), :mod:`pylog.spark.progress` (a stream's progress in a consumer group,
option ``groupId``), :mod:`pylog.spark.headers` (the ``headers`` column),
:mod:`pylog.spark.writing` (batch writer and streaming sink), and this
module (the data source Spark registers, which hands out those readers and writers).
"""
from __future__ import annotations

from typing import Any

from pylog.errors import require

require("pyspark", "pylog.spark", "spark")
require("pyarrow", "pylog.spark", "spark")
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from pylog.spark.options import BATCH, STREAM, _bool_opt, _err, _options_dict, check_read_options  # noqa: E402

# Besides SCHEMA, also importable from here as they were from the one-module pylog.spark: the
# readers and writers, SINK_ID_FILE, StructType, and the helpers tests and benchmarks call.
from pylog.spark.reading import (  # noqa: E402, F401
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    PylogPushdownReader,
    PylogReader,
    _read_slice,
    _Slice,
)
from pylog.spark.streaming import PylogStreamReader, _canonical, _split_limit  # noqa: E402, F401
from pylog.spark.writing import SINK_ID_FILE, PylogStreamWriter, PylogWriter  # noqa: E402, F401

__all__ = ["PylogDataSource", "PylogPythonDataSource", "register", "jar_path", "SCHEMA"]


def jar_path() -> str | None:
    """The JVM connector's jar (``spark.jars``, ``ADD JAR``, Spark Connect's
    ``addArtifacts``), or None when this install has none (built without ``javac``)."""
    import os

    from pylog.spark.jvm_build import JAR_NAME

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), JAR_NAME)
    return path if os.path.isfile(path) else None


def register(spark: Any) -> None:
    """Register the Python source in ``spark`` (a SparkSession) as ``pylog-python`` and, unless
    the JVM connector answers to ``pylog`` there (its jar on the classpath), as ``pylog``."""
    spark.dataSource.register(PylogPythonDataSource)
    try:
        spark.dataSource.register(PylogDataSource)
    except Exception as e:  # noqa: BLE001 (pyspark's and Spark Connect's error types differ)
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(e):
            raise


class PylogDataSource(DataSource):
    """The ``pylog`` format: topics of a pylog data root, read and written by Spark."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("pylog")``."""
        return "pylog"

    def schema(self) -> str:
        """The columns of a read (:data:`SCHEMA`; :data:`SCHEMA_WITH_HEADERS` with
        ``includeHeaders=true``). Spark calls it at ``load()`` (for reads only), so an
        option no read takes is refused here, with one line naming it."""
        options = _options_dict(self.options)
        check_read_options(options)
        return SCHEMA_WITH_HEADERS if _bool_opt(options, "includeheaders", False) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader; its offsets are fixed here (the snapshot). With the option
        ``pushFilters=true``, one that takes Spark's pushed filters (which needs
        ``spark.sql.python.filterPushdown.enabled=true`` in Spark)."""
        options = _options_dict(self.options)
        check_read_options(options, BATCH)
        if _bool_opt(options, "pushfilters", False):
            return PylogPushdownReader(options)
        return PylogReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader."""
        options = _options_dict(self.options)
        check_read_options(options, STREAM)
        return PylogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> PylogWriter:
        """A transactional batch writer (``mode("append")`` only)."""
        if overwrite:
            raise _err("mode", "pylog topics are append-only: use mode(\"append\")")
        return PylogWriter(_options_dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PylogStreamWriter:
        """A streaming sink, exactly once per batch id."""
        if overwrite:
            raise _err("outputMode", "pylog topics are append-only: use outputMode(\"append\")")
        return PylogStreamWriter(_options_dict(self.options), schema)


class PylogPythonDataSource(PylogDataSource):
    """The Python source under the name ``pylog-python``: reachable beside the JVM connector
    (which answers to ``pylog`` when its jar is on the classpath, and hands writes here)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("pylog-python")``."""
        return "pylog-python"
