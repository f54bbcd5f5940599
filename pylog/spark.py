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

The one place that reaches into pylog's internals is :func:`_plan_partition` (segment
positions from the log's segment objects) and :func:`_read_slice` (a C scan of a mapped
store file); everything else goes through the public :class:`pylog.Log` API.
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pylog.errors import require

require("pyspark", "pylog.spark", "spark")
require("pyarrow", "pylog.spark", "spark")
import pyarrow as pa  # noqa: E402
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    ByteType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

import pylog
from pylog import format as fmt
from pylog import topics as topics_mod
from pylog import transactions
from pylog._backend import impl
from pylog._columns import Columns
from pylog.arrow import binary_array, int64_buffer, scan_buffer
from pylog.log import PackedBytes
from pylog.errors import ConfigError, CorruptRecordError, InvalidNameError, PylogError, UnknownTopicError

__all__ = ["PylogDataSource", "register", "SCHEMA"]

#: The columns of a read (Spark's Kafka source, plus ``metadata``).
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, metadata binary"
)
_ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("metadata", pa.binary()),
])
#: What a write task stages per target partition (one Arrow IPC stream file).
_STAGED_SCHEMA = pa.schema([  # a write's rows, in the columns a partition takes
    ("value", pa.binary()), ("key", pa.binary()), ("metadata", pa.binary()), ("timestamp", pa.int64()),
])

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_PARTITION_RE = re.compile(r"^partition-(0|[1-9][0-9]*)$")
#: The file in a streaming query's checkpoint directory that holds the sink's id.
SINK_ID_FILE = "pylog-sink-id"
# Rows per Arrow batch a read yields. Spark's cost per batch is high (a 1M-row scan took
# 2.3 s in 64k-row batches, 1.2 s in 500k-row ones, against 1.2 s for Parquet), so batches
# are large, bounded by the frame bytes they cover.
_BATCH_ROWS = 1 << 19
_BATCH_BYTES = 128 << 20  # of data per binary column
# What the columnar scan collects for a batch (topic, partition, timestampType are constants).
_ARROW_COLUMNS = ("offset", "timestamp", "key", "value", "metadata")
_U64_MAX = (1 << 64) - 1
_EARLIEST, _LATEST = -2, -1


def register(spark: Any) -> None:
    """Register the ``pylog`` format in ``spark`` (a SparkSession)."""
    spark.dataSource.register(PylogDataSource)


# ----------------------------------------------------------------------------------------
# options
_OPTION_NAMES = {n.lower(): n for n in (
    "path", "topic", "topics", "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "failOnDataLoss", "minPartitions", "maxOffsetsPerTrigger", "createTopic", "partitions", "lateTimestamps",
    "sinkId")}


def _err(option: str, msg: str) -> ConfigError:
    """The error for a bad option value: one line that names the option."""
    return ConfigError(f"pylog option {_OPTION_NAMES.get(option.lower(), option)}: {msg}")


def _bool_opt(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise _err(name, f"expected true or false, got {raw!r}")


def _int_opt(options: Mapping[str, str], name: str, default: int | None, lo: int = 0) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise _err(name, f"expected an integer, got {raw!r}") from None
    if v < lo:
        raise _err(name, f"must be >= {lo}, got {v}")
    return v


def _root_opt(options: Mapping[str, str], *, must_exist: bool = True) -> str:
    root = options.get("path")
    if not root:
        raise _err("path", "required: the pylog data root (a directory of topics)")
    root = os.path.abspath(str(root))
    if must_exist and not os.path.isdir(root):
        raise _err("path", f"no such directory: {root}")
    return root


def _check_topic_name(name: str, option: str) -> str:
    if not _TOPIC_RE.match(name) or name in (".", ".."):
        raise InvalidNameError(f"pylog option {option}: invalid topic name {name!r} "
                               "(allowed: [A-Za-z0-9._-]{1,249}, not . or ..)")
    return name


def _topics_opt(options: Mapping[str, str]) -> list[str]:
    raw = options.get("topic") if options.get("topic") is not None else options.get("topics")
    if raw is None:
        raw = options.get("subscribe")
    if raw is None or not str(raw).strip():
        raise _err("topic", "required: the topic to read (or topics=a,b,c)")
    names = [t.strip() for t in str(raw).split(",") if t.strip()]
    return sorted(dict.fromkeys(_check_topic_name(t, "topic") for t in names))


def _offsets_spec(options: Mapping[str, str], name: str, default: str, *,
                  allow_latest: bool = True, allow_earliest: bool = True) -> Any:
    """"earliest" | "latest" | {topic: {partition: offset (-2 earliest, -1 latest)}}."""
    raw = options.get(name)
    if raw is None:
        return default
    s = str(raw).strip()
    if s.lower() in ("earliest", "latest"):
        s = s.lower()
        if (s == "latest" and not allow_latest) or (s == "earliest" and not allow_earliest):
            raise _err(name, f"{s!r} is not allowed here")
        return s
    try:
        data = json.loads(s)
    except ValueError:
        raise _err(name, f"expected earliest, latest or JSON like {{\"topic\": {{\"0\": 42}}}}, got {s!r}") from None
    if not isinstance(data, dict):
        raise _err(name, f"expected a JSON object of topics, got {s!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise _err(name, f"topic {topic!r}: expected an object of partition: offset")
        m = out.setdefault(str(topic), {})
        for p, off in parts.items():
            try:
                pi = int(p)
            except ValueError:
                raise _err(name, f"topic {topic!r}: partition {p!r} is not an integer") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < -2:
                raise _err(name, f"topic {topic!r} partition {p}: offset {off!r} is not an integer >= -2")
            if off == _LATEST and not allow_latest:
                raise _err(name, f"topic {topic!r} partition {p}: -1 (latest) is not allowed here")
            if off == _EARLIEST and not allow_earliest:
                raise _err(name, f"topic {topic!r} partition {p}: -2 (earliest) is not allowed here")
            m[pi] = off
    return out


def _options_dict(options: Any) -> dict[str, str]:
    """Case-insensitive options as a plain lower-case dict (picklable, no pyspark type)."""
    return {str(k).lower(): v for k, v in dict(options).items()}


# ----------------------------------------------------------------------------------------
# topics on disk: ROOT/TOPIC/partition-N/
def _topic_dir(root: str, topic: str) -> str:
    return os.path.join(root, topic)


def _partition_dir(root: str, topic: str, p: int) -> str:
    return os.path.join(root, topic, f"partition-{p}")


def _partitions_of(root: str, topic: str) -> list[int]:
    """The partition numbers of a topic (from its topic.json, as LogStore keeps it; for a
    bare directory of ``partition-N`` logs, those found); UnknownTopicError if none."""
    d = _topic_dir(root, topic)
    try:
        n, _cfg = topics_mod._read_topic_file(d, topic)  # noqa: SLF001
        return list(range(n))
    except UnknownTopicError:
        pass
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        raise UnknownTopicError(f"pylog option topic: no topic {topic!r} under {root}") from None
    parts = sorted(int(m.group(1)) for n in names if (m := _PARTITION_RE.match(n)))
    if not parts:
        raise UnknownTopicError(f"pylog option topic: no topic {topic!r} under {root}")
    return parts


# ----------------------------------------------------------------------------------------
# reading
@dataclass
class _Slice(InputPartition):
    """One task's work: records [start_offset, end_offset) of one segment, which lie at
    store positions [start_position, end_position)."""

    topic: str
    partition: int
    store_path: str
    start_offset: int
    start_position: int
    end_offset: int
    end_position: int
    fail_on_data_loss: bool = True

    def __init__(self, topic: str, partition: int, store_path: str, start_offset: int, start_position: int,
                 end_offset: int, end_position: int, fail_on_data_loss: bool = True) -> None:
        self.value = None
        self.topic = topic
        self.partition = partition
        self.store_path = store_path
        self.start_offset = start_offset
        self.start_position = start_position
        self.end_offset = end_offset
        self.end_position = end_position
        self.fail_on_data_loss = fail_on_data_loss


def _open_reader(root: str, topic: str, p: int) -> pylog.Log | None:
    try:
        return pylog.Log(_partition_dir(root, topic, p), readonly=True)
    except FileNotFoundError:
        return None  # a partition directory with no segment yet: empty


# Read-only logs opened while one query is planned, shared by every step of the planning
# (opening one walks its active segment). Planning runs in one thread per process.
_PLAN_LOGS: dict[tuple[str, str, int], pylog.Log | None] | None = None


@contextlib.contextmanager
def _planning() -> Iterator[None]:
    global _PLAN_LOGS
    if _PLAN_LOGS is not None:
        yield
        return
    _PLAN_LOGS = {}
    try:
        yield
    finally:
        logs, _PLAN_LOGS = _PLAN_LOGS, None
        for log in logs.values():
            if log is not None:
                log.close()


@contextlib.contextmanager
def _reader(root: str, topic: str, p: int) -> Iterator[pylog.Log | None]:
    """A read-only Log of a partition (None if it has no segment yet)."""
    cache = _PLAN_LOGS
    if cache is not None:
        key = (root, topic, p)
        if key not in cache:
            cache[key] = _open_reader(root, topic, p)
        yield cache[key]
        return
    log = _open_reader(root, topic, p)
    try:
        yield log
    finally:
        if log is not None:
            log.close()


def _bounds(root: str, topics: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """{topic: {partition: (start_offset, committed next_offset)}}, one consistent snapshot."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for t in topics:
        m: dict[int, tuple[int, int]] = {}
        for p in _partitions_of(root, t):
            with _reader(root, t, p) as log:
                # a transaction's apply in flight: its records are not there yet
                m[p] = (0, 0) if log is None else (log.start_offset, log.stable_offset)
        out[t] = m
    return out


def _resolve(spec: Any, name: str, bounds: dict[str, dict[int, tuple[int, int]]], default: int) -> dict[str, dict[int, int]]:
    """Absolute offsets per partition from an offsets spec (-2/-1 resolved)."""
    out: dict[str, dict[int, int]] = {}
    if isinstance(spec, dict):
        for t in spec:
            if t not in bounds:
                raise _err(name, f"topic {t!r} is not one of the topics read ({', '.join(bounds)})")
            for p in spec[t]:
                if p not in bounds[t]:
                    raise _err(name, f"topic {t!r} has no partition {p}")
    for t, parts in bounds.items():
        m = out.setdefault(t, {})
        for p, (lo, hi) in parts.items():
            v = default
            if isinstance(spec, str):
                v = _EARLIEST if spec == "earliest" else _LATEST
            elif isinstance(spec, dict) and p in spec.get(t, {}):
                v = spec[t][p]
            m[p] = lo if v == _EARLIEST else hi if v == _LATEST else v
    return out


def _by_timestamp(root: str, bounds: dict[str, dict[int, tuple[int, int]]], ts: int) -> dict[str, dict[int, int]]:
    """Per partition, the first offset with timestamp >= ts (the latest offset if none)."""
    out: dict[str, dict[int, int]] = {}
    for t, parts in bounds.items():
        m = out.setdefault(t, {})
        for p, (lo, hi) in parts.items():
            off = None
            with _reader(root, t, p) as log:
                if log is not None:
                    off = log.offset_for_time(ts)
            m[p] = hi if off is None else max(lo, min(off, hi))
    return out


def _plan_partition(root: str, topic: str, p: int, start: int, end: int, fail: bool) -> list[_Slice]:
    """Segment slices covering [start, end) of one partition (pylog internals: segment
    objects and their positions)."""
    if start >= end:
        return []
    with _reader(root, topic, p) as log:
        if log is None:
            return []
        if start < log.start_offset:
            if fail:
                raise _data_loss(topic, p, start, log.start_offset)
            start = log.start_offset
        segs: list[Any] = [*log._sealed, log._active]  # noqa: SLF001 (internals, see module doc)
        out = []
        for s in segs:
            a, b = max(start, s.base_offset), min(end, s.next_offset)
            if a >= b:
                continue
            _m, f = s.find(a)
            a_pos, a_off = int(f[0]), int(f[1])
            if b < s.next_offset:
                _m, g = s.find(b)
                b_pos = int(g[0])
            else:
                b_pos = int(s.size)
            if a_pos < b_pos:
                out.append(_Slice(topic, p, s.store_path, a_off, a_pos, b, b_pos, fail))
        return out


def _split(root: str, sl: _Slice) -> tuple[_Slice, _Slice] | None:
    """Split a slice in two at its middle offset (a find in the segment)."""
    n = sl.end_offset - sl.start_offset
    if n < 2:
        return None
    mid = sl.start_offset + n // 2
    with _reader(root, sl.topic, sl.partition) as log:
        if log is None:
            return None
        segs: list[Any] = [*log._sealed, log._active]  # noqa: SLF001
        seg = next((s for s in segs if s.store_path == sl.store_path), None)
        if seg is None:
            return None
        _m, f = seg.find(mid)
        pos, off = int(f[0]), int(f[1])
    if not sl.start_position < pos < sl.end_position:
        return None
    left = _Slice(sl.topic, sl.partition, sl.store_path, sl.start_offset, sl.start_position, off, pos,
                  sl.fail_on_data_loss)
    right = _Slice(sl.topic, sl.partition, sl.store_path, off, pos, sl.end_offset, sl.end_position,
                   sl.fail_on_data_loss)
    return left, right


def _plan(root: str, starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]],
          fail: bool, min_partitions: int | None) -> list[_Slice]:
    slices: list[_Slice] = []
    for t in sorted(ends):
        for p in sorted(ends[t]):
            slices.extend(_plan_partition(root, t, p, starts[t][p], ends[t][p], fail))
    if min_partitions and len(slices) < min_partitions:
        while len(slices) < min_partitions:
            i = max(range(len(slices)), key=lambda k: slices[k].end_offset - slices[k].start_offset, default=None)
            if i is None:
                break
            parts = _split(root, slices[i])
            if parts is None:
                break
            slices[i : i + 1] = list(parts)
    return slices


def _data_loss(topic: str, p: int, offset: int, start: int) -> PylogError:
    return PylogError(
        f"pylog: offset {offset} of topic {topic!r} partition {p} is no longer in the log (it starts at "
        f"{start}; retention removed it). Set option failOnDataLoss=false to skip to the earliest offset"
    )


def _constant_string(s: str, n: int) -> pa.Array:
    b = s.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(b)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b * n)])


def _batch(cols: Columns, topic: str, partition: int) -> pa.RecordBatch:
    """A batch in Spark's schema from the columns pylog.arrow's scan filled (no copy)."""
    n = cols.rows
    ts = cols.timestamps[:n]
    ts *= 1000  # ms -> Spark's microseconds, in place
    arrays = [
        binary_array(cols, "key"),
        binary_array(cols, "value"),
        _constant_string(topic, n),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, partition, np.int32))]),
        pa.Array.from_buffers(pa.int64(), n, [None, int64_buffer(cols.offsets, n)]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(ts)]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.zeros(n, np.int32))]),
        binary_array(cols, "metadata"),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_ARROW_SCHEMA)


def _read_slice(sl: _Slice) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of one slice: the C columnar scan (CRC-checked) of the mapped
    store file that :mod:`pylog.arrow` uses, batch by batch."""
    if not isinstance(sl, _Slice):  # Spark's placeholder when there is nothing to read
        return
    try:
        fd = os.open(sl.store_path, os.O_RDONLY)
    except FileNotFoundError:
        if sl.fail_on_data_loss:
            raise _data_loss(sl.topic, sl.partition, sl.start_offset, -1) from None
        return
    try:
        size = os.fstat(fd).st_size
        if size < sl.end_position:
            if sl.fail_on_data_loss:
                raise PylogError(f"pylog: {sl.store_path} is shorter than when the query was planned "
                                 f"({size} < {sl.end_position} bytes): the log was truncated meanwhile")
            return
        mm = mmap.mmap(fd, sl.end_position, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    buf = impl.Buffer(mm)
    rc, _b, flags = impl.header_check(memoryview(mm)[: fmt.FILE_HEADER_SIZE], fmt.STORE_MAGIC)
    gaps = bool(rc == impl.OK and flags & fmt.HEADER_COMPACTED)
    rc, end, expected = yield from scan_buffer(
        buf, sl.end_position, sl.start_position, sl.start_offset, sl.end_offset, sl.end_offset, gaps,
        _ARROW_COLUMNS, _BATCH_ROWS, lambda cols: _batch(cols, sl.topic, sl.partition), _BATCH_BYTES)
    if rc != impl.OK:
        raise CorruptRecordError(sl.store_path, int(end), expected, _reason(rc))
    if expected < sl.end_offset and not gaps and sl.fail_on_data_loss:
        raise PylogError(f"pylog: {sl.store_path} ended at offset {expected}, expected records up to "
                         f"{sl.end_offset}: the log changed since the query was planned")


def _reason(rc: int) -> str:
    from pylog.segment import reason

    return reason(rc)


class PylogReader(DataSourceReader):
    """Batch reader: the snapshot (offsets per partition) is fixed when it is created."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = _root_opt(options)
        self.topics = _topics_opt(options)
        self.fail = _bool_opt(options, "failondataloss", True)
        self.min_partitions = _int_opt(options, "minpartitions", None, lo=1)
        start_spec = _offsets_spec(options, "startingoffsets", "earliest", allow_latest=True)
        end_spec = _offsets_spec(options, "endingoffsets", "latest", allow_earliest=False)
        ts = _int_opt(options, "startingtimestamp", None, lo=0)
        end_ts = _int_opt(options, "endingtimestamp", None, lo=0)
        with _planning():  # the whole plan from one read-only open of each partition
            self.slices = self._plan(start_spec, end_spec, ts, end_ts)

    def _plan(self, start_spec: Any, end_spec: Any, ts: int | None, end_ts: int | None) -> list[_Slice]:
        bounds = _bounds(self.root, self.topics)
        self.starts = (_by_timestamp(self.root, bounds, ts) if ts is not None
                       else _resolve(start_spec, "startingOffsets", bounds, _EARLIEST))
        self.ends = _resolve(end_spec, "endingOffsets", bounds, _LATEST)
        if end_ts is not None:
            self.ends = _by_timestamp(self.root, bounds, end_ts)
        for t, parts in self.ends.items():
            for p, e in parts.items():
                lo, hi = bounds[t][p]
                s = self.starts[t][p]
                if e > hi:
                    raise _err("endingOffsets", f"topic {t!r} partition {p}: {e} is past the latest offset {hi}")
                if s > hi:
                    raise _err("startingOffsets", f"topic {t!r} partition {p}: {s} is past the latest offset {hi}")
                if s > e:
                    raise _err("startingOffsets", f"topic {t!r} partition {p}: {s} is after the ending offset {e}")
                if s < lo:
                    if self.fail:
                        raise _data_loss(t, p, s, lo)
                    self.starts[t][p] = lo
        return _plan(self.root, self.starts, self.ends, self.fail, self.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        return list(self.slices)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_slice(partition)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# streaming read
def _canonical(offsets: Mapping[str, Mapping[Any, int]]) -> dict[str, dict[str, int]]:
    """{topic: {partition: next_offset}} with string keys in sorted order (Spark compares
    offsets as JSON text, so the key order must never change)."""
    return {t: {str(p): int(offsets[t][p]) for p in sorted(offsets[t], key=int)} for t in sorted(offsets)}


def _split_limit(backlog: dict[tuple[str, int], int], limit: int) -> dict[tuple[str, int], int]:
    """Share ``limit`` records among partitions in proportion to their backlog."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    take = {k: (v * limit) // total for k, v in backlog.items()}
    left = limit - sum(take.values())
    for k in sorted(backlog, key=lambda k: (-(backlog[k] - take[k]), k)):
        if left <= 0:
            break
        if take[k] < backlog[k]:
            take[k] += 1
            left -= 1
    return take


class PylogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets: ``{topic: {partition: next_offset}}``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = _root_opt(options)
        self.topics = _topics_opt(options)
        self.fail = _bool_opt(options, "failondataloss", True)
        self.max_per_trigger = _int_opt(options, "maxoffsetspertrigger", None, lo=1)
        self.min_partitions = _int_opt(options, "minpartitions", None, lo=1)
        self.start_spec = _offsets_spec(options, "startingoffsets", "latest")
        self.start_ts = _int_opt(options, "startingtimestamp", None, lo=0)
        for t in self.topics:
            _partitions_of(self.root, t)  # fail at once on a missing topic
        self.frozen: dict[str, dict[str, int]] | None = None

    def initialOffset(self) -> dict:
        bounds = _bounds(self.root, self.topics)
        if self.start_ts is not None:
            start = _by_timestamp(self.root, bounds, self.start_ts)
        else:
            start = _resolve(self.start_spec, "startingOffsets", bounds, _EARLIEST)
        return _canonical(start)

    def _latest(self) -> dict[str, dict[str, int]]:
        bounds = _bounds(self.root, self.topics)
        return _canonical({t: {p: hi for p, (_lo, hi) in parts.items()} for t, parts in bounds.items()})

    def prepareForTriggerAvailableNow(self) -> None:
        self.frozen = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return self._latest()

    def _earliest(self, topic: str, p: str) -> int:
        """Where a partition first seen now starts: its earliest offset."""
        with _reader(self.root, topic, int(p)) as log:
            return 0 if log is None else log.start_offset

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        with _planning():
            return self._latest_offset(start, limit)

    def _latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self.frozen if self.frozen is not None else self._latest()
        begin: dict[tuple[str, int], int] = {}
        backlog: dict[tuple[str, int], int] = {}
        for t, parts in latest.items():
            for p, hi in parts.items():
                s = start.get(t, {}).get(p)
                if s is None:
                    s = min(self._earliest(t, p), int(hi))  # a new partition
                begin[(t, p)] = int(s)
                backlog[(t, p)] = max(0, int(hi) - int(s))
        if isinstance(limit, ReadMaxRows):
            take = _split_limit(backlog, int(limit.max_rows))
        else:
            take = backlog
        end: dict[str, dict[str, int]] = {}
        for (t, p), s in begin.items():
            end.setdefault(t, {})[p] = s + take[(t, p)]
        for t, parts in start.items():  # never move backwards, never drop a partition
            for p, s in parts.items():
                e = end.setdefault(t, {})
                e[p] = max(int(e.get(p, s)), int(s))
        return _canonical(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        with _planning():
            return self._partitions(start, end)

    def _partitions(self, start: dict, end: dict) -> list[_Slice]:
        starts: dict[str, dict[int, int]] = {}
        ends: dict[str, dict[int, int]] = {}
        for t, parts in end.items():
            for p, e in parts.items():
                s = start.get(t, {}).get(p)
                if s is None:  # a partition first seen in this batch: from its earliest offset
                    s = min(self._earliest(t, p), int(e))
                if int(e) > int(s):
                    starts.setdefault(t, {})[int(p)] = int(s)
                    ends.setdefault(t, {})[int(p)] = int(e)
        if not ends:
            return []
        return _plan(self.root, starts, ends, self.fail, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_slice(partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        pass  # Spark's checkpoint is the source of truth; nothing to do

    def stop(self) -> None:
        pass


# ----------------------------------------------------------------------------------------
# writing
@dataclass
class _Staged(WriterCommitMessage):
    """What one write task staged into transaction ``txn``: ``parts`` as
    :meth:`pylog.transactions.Stager.prepare` returns them."""

    txn: str = ""
    parts: list[tuple[str, int, str, int]] = field(default_factory=list)


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def _as_binary(col: pa.Array | None, n: int) -> pa.Array:
    if col is None:
        return pa.nulls(n, pa.binary())
    if pa.types.is_binary(col.type):
        return col
    return col.cast(pa.binary())  # string / large types


def _check_write_schema(schema: StructType) -> None:
    names = {f.name.lower(): f for f in schema.fields}
    if "value" not in names:
        raise _err("(columns)", "a write needs a value column (binary or string)")
    for col, ok in (("value", (BinaryType, StringType)), ("key", (BinaryType, StringType)),
                    ("metadata", (BinaryType, StringType)), ("partition", (IntegerType, LongType, ShortType, ByteType)),
                    ("timestamp", (TimestampType, TimestampNTZType, LongType))):
        f = names.get(col)
        if f is not None and not isinstance(f.dataType, ok):
            raise _err("(columns)", f"column {col} has type {f.dataType.simpleString()}, expected one of "
                       + ", ".join(t().simpleString() for t in ok))


def _timestamps_ms(col: pa.Array | None, n: int) -> pa.Array:
    if col is None:
        return pa.nulls(n, pa.int64())
    if pa.types.is_timestamp(col.type):
        import pyarrow.compute as pc  # only writes need it (its import costs 60 ms)

        unit = col.type.unit
        div = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        raw = col.cast(pa.int64())
        if div is None:
            return pc.multiply(raw, 1000)
        return pc.divide(raw, div) if div != 1 else raw
    return col.cast(pa.int64())


class _StagingWriter:
    """Task side of a write: rows grouped by target partition, staged into the job's
    transaction (a :class:`pylog.transactions.Stager` per task attempt)."""

    def __init__(self, root: str, txn: str, topic: str, n_partitions: int, late: str,
                 max_record_bytes: int | None) -> None:
        self.root = root
        self.txn = txn
        self.topic = topic
        self.n = n_partitions
        self.late = late
        self.max_record_bytes = max_record_bytes

    def write(self, batches: Iterator[pa.RecordBatch]) -> _Staged:
        # fails (TransactionError) instead of recreating a transaction the driver discarded
        stager = transactions.Stager(self.root, self.txn)
        sticky = int.from_bytes(os.urandom(2), "little")  # keyless rows: a whole batch per partition
        try:
            for batch in batches:
                n = batch.num_rows
                if n == 0:
                    continue
                batch = pa.RecordBatch.from_arrays([batch.column(i) for i in range(batch.num_columns)],
                                                   names=[nm.lower() for nm in batch.schema.names])
                value = _as_binary(_column(batch, "value"), n)
                key = _as_binary(_column(batch, "key"), n)
                meta = _as_binary(_column(batch, "metadata"), n)
                ts = _timestamps_ms(_column(batch, "timestamp"), n)
                pcol = _column(batch, "partition")
                parts = np.empty(n, np.int64)
                have = np.zeros(n, np.bool_)
                if pcol is not None:
                    pv = pcol.cast(pa.int64())
                    valid = np.asarray(pv.is_valid())
                    vals = np.asarray(pv.fill_null(0))
                    bad = valid & ((vals < 0) | (vals >= self.n))
                    if bad.any():
                        raise _err("(columns)", f"partition {int(vals[bad][0])} is out of range: the topic "
                                   f"has {self.n} partitions")
                    parts[valid] = vals[valid]
                    have |= valid
                if key.null_count < n:
                    kvalid = np.asarray(key.is_valid()) & ~have
                    if kvalid.any():
                        idx = np.flatnonzero(kvalid)
                        keys = key.take(pa.array(idx)).to_pylist()
                        parts[idx] = [topics_mod.partition_for_key(k, self.n) for k in keys]
                        have[idx] = True
                if not have.all():
                    parts[~have] = sticky % self.n  # Kafka's sticky partitioner
                    sticky += 1
                table = pa.RecordBatch.from_arrays([value, key, meta, ts], schema=_STAGED_SCHEMA)
                if self.n == 1 or (parts == parts[0]).all():
                    groups = [(int(parts[0]), table)]
                else:
                    order = np.argsort(parts, kind="stable")
                    sp = parts[order]
                    cuts = np.flatnonzero(np.diff(sp)) + 1
                    bounds = np.concatenate([[0], cuts, [n]])
                    taken = table.take(pa.array(order))
                    groups = [(int(sp[a]), taken.slice(a, b - a)) for a, b in zip(bounds[:-1], bounds[1:])]
                for p, g in groups:
                    log = stager.log_for(self.topic, p, self.max_record_bytes)
                    _append_table(log, pa.Table.from_batches([g]), self.late, self.topic, p)
            return _Staged(self.txn, stager.prepare())
        except BaseException:
            stager.discard()
            raise


def _packed(col: pa.ChunkedArray | pa.Array) -> Any:
    """A binary column as :class:`pylog.log.PackedBytes` (its Arrow buffers, no copy when it
    is one chunk), or None when it is all nulls."""
    if isinstance(col, pa.ChunkedArray):
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    n = len(arr)
    if arr.null_count == n:
        return None
    _validity, off_buf, data = arr.buffers()
    offs = np.frombuffer(off_buf, np.int32, n + 1, arr.offset * 4)
    lens = np.diff(offs).astype(np.uint32)
    if arr.null_count:
        nulls = np.asarray(arr.is_null())
        if lens[nulls].any():  # nulls that occupy bytes: rare; copy
            return arr.to_pylist()
        lens[nulls] = fmt.NULL_LEN
    data_mv = memoryview(data)[int(offs[0]):int(offs[-1])] if data is not None else b""
    return PackedBytes(data_mv, lens)


def _append_table(log: pylog.Log, table: pa.Table, late: str, topic: str, p: int) -> None:
    """Append staged rows to one partition (timestamps sorted, never below the log's)."""
    n = table.num_rows
    if n == 0:
        return
    ts_col = table.column("timestamp")
    timestamps = None
    if ts_col.null_count < n:
        now = time.time_ns() // 1_000_000
        ts = np.asarray(ts_col.fill_null(now).to_numpy(), dtype=np.int64)
        order = np.argsort(ts, kind="stable")
        if (np.diff(ts) < 0).any():
            table = table.take(pa.array(order))
            ts = ts[order]
        last = log._active.app.max_timestamp if not log.readonly else None  # noqa: SLF001
        if last is not None and int(ts[0]) < last:
            if late == "error":
                raise _err("lateTimestamps", f"topic {topic!r} partition {p}: timestamp {int(ts[0])} is below the "
                           f"partition's latest timestamp {last} (pylog timestamps never decrease); "
                           "set lateTimestamps=clamp to raise such timestamps to the latest one")
            ts = np.maximum(ts, last)
        if int(ts.min()) < 0:
            raise _err("(columns)", f"timestamp {int(ts.min())} is before 1970")
        timestamps = ts
    table = table.combine_chunks()
    step = 1 << 18  # bounds the write buffer a single append_batch call needs
    for a in range(0, n, step):
        part = table.slice(a, step)
        values = _packed(part.column("value"))
        if values is None:  # all tombstones
            values = [None] * part.num_rows
        log.append_batch(values, keys=_packed(part.column("key")),
                         timestamps=None if timestamps is None else timestamps[a:a + step],
                         metadata=_packed(part.column("metadata")))


class _Committer:
    """Driver side of a write: begins the job's transaction (where Spark plans the job) and
    commits or discards what the tasks staged into it."""

    def __init__(self, root: str, topic: str, options: dict[str, str], tag: str = "") -> None:
        self.root = root
        self.topic = topic
        self.create = _bool_opt(options, "createtopic", True)
        self.new_partitions = _int_opt(options, "partitions", 1, lo=1) or 1
        self.late = str(options.get("latetimestamps", "error")).lower()
        if self.late not in ("error", "clamp"):
            raise _err("lateTimestamps", f"expected error or clamp, got {options.get('latetimestamps')!r}")
        self.tag = tag
        self.max_record_bytes: int | None = None
        self.txn = ""

    def begin(self) -> None:
        """Begin the job's transaction (after every option was checked)."""
        self.txn = transactions.begin_external(self.root, self.tag)

    def partition_count(self) -> int:
        try:
            n, cfg = topics_mod._read_topic_file(_topic_dir(self.root, self.topic), self.topic)  # noqa: SLF001
            self.max_record_bytes = cfg.max_record_bytes
            return n
        except UnknownTopicError:
            pass
        try:
            parts = _partitions_of(self.root, self.topic)
        except UnknownTopicError:
            if not self.create:
                raise UnknownTopicError(f"pylog option topic: no topic {self.topic!r} under {self.root} "
                                        "(set createTopic=true to create it)") from None
            return self.new_partitions
        if not parts:
            return self.new_partitions
        if parts != list(range(len(parts))):
            raise PylogError(f"pylog: topic {self.topic!r} has partitions {parts}, expected 0..{len(parts) - 1}")
        return len(parts)

    def _txns(self, messages: Iterable[Any]) -> set[str]:
        """The transactions named: the tasks' (a streaming commit runs on a fresh writer,
        whose own transaction is not the one the tasks staged into) and this writer's."""
        out = {m.txn for m in messages if isinstance(m, _Staged) and m.txn}
        if self.txn:
            out.add(self.txn)
        return out

    def commit(self, messages: Iterable[Any], n_partitions: int, sink: tuple[str, int] | None = None) -> None:
        messages = list(messages)
        staged = [m for m in messages if isinstance(m, _Staged) and m.txn]
        task_txns = {m.txn for m in staged}
        if len(task_txns) > 1:
            raise PylogError(f"pylog: the tasks of one write staged into {len(task_txns)} transactions")
        txn = task_txns.pop() if task_txns else self.txn
        try:
            self._ensure_topic(n_partitions)
            with pylog.LogStore(self.root) as store:  # its open finishes what crashed commits left
                if sink is not None:
                    done = transactions.last_batch_id(self.root, sink[0])
                    if done is not None and done >= sink[1]:
                        return  # a replayed batch: already committed
                tx = transactions.Transaction(store, txn_id=txn)
                tx._late_error = self.late == "error"  # noqa: SLF001
                tx.add_staged([p for m in staged for p in m.parts])
                if sink is not None:
                    tx.set_sink(sink[0], sink[1])
                try:
                    tx.commit()
                except pylog.InvalidTimestampError as e:
                    raise _err("lateTimestamps", f"{e}; set lateTimestamps=clamp to raise such timestamps to "
                               "the latest one") from None
        finally:
            self.cleanup(messages)

    def _ensure_topic(self, n_partitions: int) -> None:
        """Create the topic (LogStore layout) if it does not exist yet: only now, when the
        job commits, so a failed job leaves no trace."""
        try:
            _partitions_of(self.root, self.topic)
            return
        except UnknownTopicError:
            pass
        with pylog.LogStore(self.root) as store:
            try:
                store.create_topic(self.topic, partitions=n_partitions)
            except pylog.TopicExistsError:
                pass

    def cleanup(self, messages: Iterable[Any] = ()) -> None:
        """Discard this write's undecided transactions (a committed one is gone already); a
        sink's also every other undecided one of the same sink (left by aborted batches and
        by the fresh writers Spark makes to commit)."""
        for txn in self._txns(messages):
            transactions.discard(self.root, txn)
        if self.tag:
            transactions.discard_tagged(self.root, self.tag)


def _writer_parts(options: dict[str, str], schema: StructType,
                  tag: str = "") -> tuple["_Committer", int, "_StagingWriter"]:
    """What the batch writer and the streaming sink both start from: the checked schema and
    topic, the driver-side committer (its transaction begun), and the task-side staging
    writer."""
    _check_write_schema(schema)
    root = _root_opt(options)
    topic = options.get("topic")
    if not topic:
        raise _err("topic", "required: the topic to write")
    committer = _Committer(root, _check_topic_name(str(topic), "topic"), options, tag)
    n_partitions = committer.partition_count()
    committer.begin()
    return committer, n_partitions, _StagingWriter(root, committer.txn, committer.topic, n_partitions,
                                                   committer.late, committer.max_record_bytes)


def _local_dir(location: str) -> str:
    """A checkpoint location as a local directory (``file:`` URIs too); ConfigError for
    another file system, whose checkpoint this module cannot read."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", location)
    if m and len(m.group(1)) > 1:
        if m.group(1).lower() != "file":
            raise _err("checkpointLocation", f"{location!r} is not on the local file system: the pylog sink "
                       "keeps its id in the checkpoint directory (set sinkId to name the query instead)")
        location = re.sub(r"^//(localhost)?(?=/)", "", m.group(2))
    return location


def _sink_id(options: dict[str, str]) -> str:
    """The sink's id: a random id kept in the query's checkpoint directory (written the
    first time), so it names that checkpoint and nothing else, and a deleted (reset)
    checkpoint makes a new sink. Without a checkpointLocation option (e.g. a location from
    the SQL conf spark.sql.streaming.checkpointLocation, which sinks are not told), the
    ``sinkId`` option, or one clear error."""
    where = options.get("checkpointlocation")
    if not where:
        explicit = options.get("sinkid")
        if explicit:
            return "id-" + str(explicit)
        raise _err("checkpointLocation", "the pylog sink needs the query's checkpoint to tell its batches apart "
                   "from another query's: set .option(\"checkpointLocation\", ...) on writeStream (a location "
                   "from spark.sql.streaming.checkpointLocation is not passed to sinks), or a sinkId option "
                   "that names this query and its checkpoint")
    d = _local_dir(str(where))
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, SINK_ID_FILE)
    try:
        with open(path, "rb") as f:
            sid = f.read().decode().strip()
    except FileNotFoundError:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(uuid.uuid4().hex.encode())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # exclusive: the first writer's id wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        with open(path, "rb") as f:
            sid = f.read().decode().strip()
    if not re.fullmatch(r"[0-9a-f]{32}", sid):
        raise _err("checkpointLocation", f"{path} does not hold a pylog sink id")
    return "ck-" + sid


class PylogWriter(DataSourceArrowWriter):
    """Batch writer (mode "append"): nothing is visible unless the job commits."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.committer, self.n_partitions, self.stager = _writer_parts(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.stager.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.committer.commit(messages, self.n_partitions)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.committer.cleanup(messages)


class PylogStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: exactly once per batch id (replays are skipped)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.sink_id = _sink_id(options)
        self.committer, self.n_partitions, self.stager = _writer_parts(options, schema, tag=self.sink_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.stager.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.committer.commit(messages, self.n_partitions, sink=(self.sink_id, int(batchId)))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.committer.cleanup(messages)


# ----------------------------------------------------------------------------------------
class PylogDataSource(DataSource):
    """The ``pylog`` format: topics of a pylog data root, read and written by Spark."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("pylog")``."""
        return "pylog"

    def schema(self) -> str:
        """The columns of a read (:data:`SCHEMA`)."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader; its offsets are fixed here (the snapshot)."""
        return PylogReader(_options_dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader."""
        return PylogStreamReader(_options_dict(self.options))

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
