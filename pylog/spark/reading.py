"""Reading topics into Spark: partition planning, the batch reader and the micro-batch reader.

A read plans one input partition (:class:`_Slice`) per segment slice of each topic partition
(more with ``minPartitions``), with the end offsets fixed at planning time. A task maps the
segment's store file and decodes its frames with one C call per batch (CRC-checked) that
writes the columns straight into Arrow's layout (:mod:`pylog.arrow`'s scan). The one place in
the data source that reaches into pylog's internals is here: :func:`_plan_partition`
(segment positions from the log's segment objects) and :func:`_read_slice` (a C scan of a
mapped store file).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

import pylog
from pylog import format as fmt
from pylog import transactions
from pylog._backend import impl
from pylog._columns import Columns
from pylog.arrow import binary_array, int64_buffer, scan_buffer
from pylog.errors import CorruptRecordError, PylogError
from pylog.spark.layout import _partition_dir, _partitions_of
from pylog.spark.options import (
    _EARLIEST,
    _LATEST,
    _bool_opt,
    _err,
    _int_opt,
    _offsets_spec,
    _root_opt,
    _topics_opt,
)
from pylog.spark.pushdown import ALL, Pushed, intersect, normalize

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
# Rows per Arrow batch a read yields. Spark's cost per batch is high (a 1M-row scan took
# 2.3 s in 64k-row batches, 1.2 s in 500k-row ones, against 1.2 s for Parquet), so batches
# are large, bounded by the frame bytes they cover.
_BATCH_ROWS = 1 << 19
_BATCH_BYTES = 128 << 20  # of data per binary column
# What the columnar scan collects for a batch (topic, partition, timestampType are constants).
_ARROW_COLUMNS = ("offset", "timestamp", "key", "value", "metadata")


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
    timestamp_type: int = 0

    def __init__(self, topic: str, partition: int, store_path: str, start_offset: int, start_position: int,
                 end_offset: int, end_position: int, fail_on_data_loss: bool = True,
                 timestamp_type: int = 0) -> None:
        self.value = None
        self.topic = topic
        self.partition = partition
        self.store_path = store_path
        self.start_offset = start_offset
        self.start_position = start_position
        self.end_offset = end_offset
        self.end_position = end_position
        self.fail_on_data_loss = fail_on_data_loss
        self.timestamp_type = timestamp_type  # Kafka's: 0 CreateTime, 1 LogAppendTime


_SEGMENT_FILE = re.compile(r"^[0-9]{20}\.(log|index|timeindex)$")
#: read-only logs a process keeps between plans (a Spark planner worker is reused)
_KEEP = 64
_KEPT: OrderedDict[str, tuple[tuple[Any, ...], pylog.Log]] = OrderedDict()
_KEPT_LOCK = threading.Lock()


def _segment_files(d: str) -> tuple[Any, ...] | None:
    """What must not have changed for a kept read-only Log of ``d`` to be refreshed instead
    of opened again: each segment file's name and identity, and for all but the last
    segment (the only one a writer extends) its size and modification time too. Retention,
    compaction, a roll, a truncation (a new file) or a topic made again all change it.
    None if there is no segment."""
    try:
        with os.scandir(d) as it:
            found = sorted((e.name, e) for e in it if _SEGMENT_FILE.match(e.name))
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not found:
        return None
    last = max(name[:20] for name, _e in found)
    out: list[tuple[Any, ...]] = []
    for name, e in found:
        try:
            st = e.stat()
        except FileNotFoundError:
            return ("changing", len(out))  # matches nothing kept: open afresh
        if name[:20] == last:
            out.append((name, st.st_dev, st.st_ino))
        else:
            out.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _open_reader(root: str, topic: str, p: int) -> tuple[tuple[Any, ...] | None, pylog.Log | None]:
    """(the segment files it was opened on, a read-only Log of the partition or None if it
    has no segment yet). A Log kept from an earlier plan is refreshed (a walk of only the
    frames added since) when its segment files are the same; else it is opened again
    (opening walks the whole active segment)."""
    d = _partition_dir(root, topic, p)
    files = _segment_files(d)  # before the open or refresh: a change after it is seen next time
    with _KEPT_LOCK:
        kept = _KEPT.pop(d, None)
    if kept is not None:
        old_files, log = kept
        if files is not None and files == old_files:
            try:
                log.refresh()
                return files, log
            except (OSError, PylogError):
                pass
        log.close()
    try:
        return files, pylog.Log(d, readonly=True)
    except FileNotFoundError:
        return files, None  # a partition directory with no segment yet: empty


def _keep(d: str, files: tuple[Any, ...] | None, log: pylog.Log) -> None:
    """Keep an open read-only Log for the next plan (the oldest beyond :data:`_KEEP` closed)."""
    if files is None:
        log.close()
        return
    with _KEPT_LOCK:
        _KEPT[d] = (files, log)
        _KEPT.move_to_end(d)
        old = [_KEPT.popitem(last=False)[1][1] for _ in range(len(_KEPT) - _KEEP)]
    for o in old:
        o.close()


def _close_kept() -> None:
    """Close every read-only Log kept between plans."""
    with _KEPT_LOCK:
        logs = [log for _files, log in _KEPT.values()]
        _KEPT.clear()
    for log in logs:
        log.close()


# Read-only logs in use while one query is planned, shared by every step of the planning
# (opening one walks its active segment). Planning runs in one thread per process.
_PLAN_LOGS: dict[tuple[str, str, int], tuple[tuple[Any, ...] | None, pylog.Log | None]] | None = None


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
        for (root, topic, p), (files, log) in logs.items():
            if log is not None:
                _keep(_partition_dir(root, topic, p), files, log)


@contextlib.contextmanager
def _reader(root: str, topic: str, p: int) -> Iterator[pylog.Log | None]:
    """A read-only Log of a partition (None if it has no segment yet)."""
    cache = _PLAN_LOGS
    if cache is not None:
        key = (root, topic, p)
        if key not in cache:
            cache[key] = _open_reader(root, topic, p)
        yield cache[key][1]
        return
    files, log = _open_reader(root, topic, p)
    try:
        yield log
    finally:
        if log is not None:
            _keep(_partition_dir(root, topic, p), files, log)


def _bounds(root: str, topics: list[str],
            parts: Mapping[str, list[int]] | None = None) -> dict[str, dict[int, tuple[int, int]]]:
    """{topic: {partition: (start_offset, committed next_offset)}}, one consistent snapshot
    (of the partitions ``parts`` names, else of those the topics have now): every store
    transaction is in all of its partitions read or in none (pylog.transactions.consistent)."""
    tries = [0]

    def snapshot() -> dict[str, dict[int, tuple[int, int]]]:
        tries[0] += 1
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for t in topics:
            m: dict[int, tuple[int, int]] = {}
            for p in (parts[t] if parts is not None else _partitions_of(root, t)):
                with _reader(root, t, p) as log:
                    if log is not None and tries[0] > 1:
                        log.refresh()  # a plan's Log is kept: look again
                    # a transaction's apply in flight: its records are not there yet
                    m[p] = (0, 0) if log is None else (log.start_offset, log.stable_offset)
            out[t] = m
        return out

    return transactions.consistent(root, snapshot)


def _check_spec(spec: Any, name: str, known: Mapping[str, Container[int]]) -> None:
    """Every topic and partition an offsets spec names is one of those read (``known``)."""
    if not isinstance(spec, dict):
        return
    for t in spec:
        if t not in known:
            raise _err(name, f"topic {t!r} is not one of the topics read ({', '.join(known)})")
        for p in spec[t]:
            if p not in known[t]:
                raise _err(name, f"topic {t!r} has no partition {p}")


def _resolve(spec: Any, name: str, bounds: dict[str, dict[int, tuple[int, int]]],
             default: int) -> dict[str, dict[int, int]]:
    """Absolute offsets per partition from an offsets spec (-2/-1 resolved)."""
    out: dict[str, dict[int, int]] = {}
    _check_spec(spec, name, bounds)
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


def _without(spec: Any, name: str, parts: Mapping[str, list[int]], dropped: set[tuple[str, int]]) -> Any:
    """An offsets spec without the partitions in ``dropped``, once its topic and partition
    names are checked against every partition read (``parts``)."""
    if not isinstance(spec, dict):
        return spec
    _check_spec(spec, name, parts)
    return {t: {p: off for p, off in ps.items() if (t, p) not in dropped} for t, ps in spec.items()}


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
        kind = 1 if log.config.timestamps == "append-time" else 0
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
                out.append(_Slice(topic, p, s.store_path, a_off, a_pos, b, b_pos, fail, kind))
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
                  sl.fail_on_data_loss, sl.timestamp_type)
    right = _Slice(sl.topic, sl.partition, sl.store_path, off, pos, sl.end_offset, sl.end_position,
                   sl.fail_on_data_loss, sl.timestamp_type)
    return left, right


def _plan(root: str, starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]],
          fail: bool, min_partitions: int | None) -> list[_Slice]:
    ranges = {t: {p: [(starts[t][p], e)] for p, e in parts.items()} for t, parts in ends.items()}
    return _plan_ranges(root, ranges, fail, min_partitions)


def _plan_ranges(root: str, ranges: dict[str, dict[int, list[tuple[int, int]]]], fail: bool,
                 min_partitions: int | None) -> list[_Slice]:
    """The slices of the offset ranges ``{topic: {partition: [(start, end), ...]}}``, split
    until there are ``min_partitions`` of them (if they can be)."""
    slices: list[_Slice] = []
    for t in sorted(ranges):
        for p in sorted(ranges[t]):
            for a, b in ranges[t][p]:
                slices.extend(_plan_partition(root, t, p, a, b, fail))
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


def _batch(cols: Columns, topic: str, partition: int, timestamp_type: int = 0) -> pa.RecordBatch:
    """A batch in Spark's schema from the columns pylog.arrow's scan filled (no copy)."""
    n = cols.rows
    assert cols.timestamps is not None and cols.offsets is not None  # the scan asked for both
    ts = cols.timestamps[:n]
    ts *= 1000  # ms -> Spark's microseconds, in place
    arrays = [
        binary_array(cols, "key"),
        binary_array(cols, "value"),
        _constant_string(topic, n),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, partition, np.int32))]),
        pa.Array.from_buffers(pa.int64(), n, [None, int64_buffer(cols.offsets, n)]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(ts)]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, timestamp_type, np.int32))]),
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
        _ARROW_COLUMNS, _BATCH_ROWS, lambda cols: _batch(cols, sl.topic, sl.partition, sl.timestamp_type), _BATCH_BYTES)
    if rc != impl.OK:
        raise CorruptRecordError(sl.store_path, int(end), expected, _reason(rc))
    if expected < sl.end_offset and not gaps and sl.fail_on_data_loss:
        raise PylogError(f"pylog: {sl.store_path} ended at offset {expected}, expected records up to "
                         f"{sl.end_offset}: the log changed since the query was planned")


def _reason(rc: int) -> str:
    from pylog.segment import reason

    return reason(rc)


class PylogReader(DataSourceReader):
    """Batch reader. Its options are checked when it is made; the snapshot (offsets per
    partition) and the slices are fixed by :meth:`partitions`, which Spark calls once when it
    plans the query, in the same worker, after :meth:`PylogPushdownReader.pushFilters` and
    after it pickled the reader for its tasks (so the plan is not shipped to every task).
    Each partition's log is opened once for the whole plan."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = _root_opt(options)
        self.topics = _topics_opt(options)
        self.fail = _bool_opt(options, "failondataloss", True)
        self.min_partitions = _int_opt(options, "minpartitions", None, lo=1)
        self.start_spec = _offsets_spec(options, "startingoffsets", "earliest", allow_latest=True)
        self.end_spec = _offsets_spec(options, "endingoffsets", "latest", allow_earliest=False)
        self.start_ts = _int_opt(options, "startingtimestamp", None, lo=0)
        self.end_ts = _int_opt(options, "endingtimestamp", None, lo=0)
        self.parts = {t: _partitions_of(self.root, t) for t in self.topics}  # a missing topic fails here
        self.pushed = Pushed()

    def _snapshot(self, start_spec: Any, end_spec: Any, ts: int | None, end_ts: int | None) -> None:
        """Fix ``self.starts`` and ``self.ends`` (absolute offsets per partition), checked.
        Partitions the pushed filters dropped are not opened (nor checked against the
        offset options beyond their names)."""
        dropped = self.pushed.dropped
        start_spec = _without(start_spec, "startingOffsets", self.parts, dropped)
        end_spec = _without(end_spec, "endingOffsets", self.parts, dropped)
        kept = {t: [p for p in ps if (t, p) not in dropped] for t, ps in self.parts.items()}
        bounds = _bounds(self.root, self.topics, kept)  # the partitions pushFilters saw
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

    def _ranges(self) -> dict[str, dict[int, list[tuple[int, int]]]]:
        """The offset ranges to read per partition: the snapshot's, narrowed by the pushed
        filters (a timestamp range through each partition's time index)."""
        pushed = self.pushed
        out: dict[str, dict[int, list[tuple[int, int]]]] = {}
        for t in sorted(self.ends):
            for p in sorted(self.ends[t]):
                if (t, p) in pushed.dropped:
                    continue
                r = intersect([(self.starts[t][p], self.ends[t][p])], pushed.offsets)
                if r and pushed.millis != ALL:
                    r = intersect(r, self._time_ranges(t, p, pushed.millis))
                if r:
                    out.setdefault(t, {})[p] = r
        return out

    def _time_ranges(self, topic: str, p: int, millis: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Offset ranges holding every record whose timestamp (ms) lies in ``millis``: in a
        log whose timestamps never decrease each time range is exactly one offset range; in
        one that keeps them as given (``timestamps="as-given"``) a record after the first
        one at or past the range's end may still lie in it, so only the start narrows (the
        filters go back to Spark, which drops the rest)."""
        with _reader(self.root, topic, p) as log:
            if log is None:
                return []

            def first_at(ms: int) -> int:  # the first offset with timestamp >= ms
                if ms <= 0:
                    return -(1 << 80)
                if ms > fmt.MAX_TIMESTAMP_MS:
                    return 1 << 80
                off = log.offset_for_time(ms)
                return (1 << 80) if off is None else off

            if log.config.timestamps != "monotonic":  # (an append-time log may have been as-given)
                return normalize((first_at(a), 1 << 80) for a, b in millis)
            return normalize((first_at(a), first_at(b)) for a, b in millis)

    def partitions(self) -> Sequence[InputPartition]:
        """One input partition per segment slice of the offsets to read."""
        with _planning():  # the snapshot and the plan from one read-only open of each partition
            self._snapshot(self.start_spec, self.end_spec, self.start_ts, self.end_ts)
            return list(_plan_ranges(self.root, self._ranges(), self.fail, self.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one slice, as Arrow record batches."""
        return _read_slice(partition)  # type: ignore[arg-type]


class PylogPushdownReader(PylogReader):
    """The batch reader with filter pushdown (option ``pushFilters=true``; Spark must have
    ``spark.sql.python.filterPushdown.enabled=true``, or it refuses every read by a reader
    that has :meth:`pushFilters`). See :mod:`pylog.spark.pushdown`."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what the plan applies exactly; return the rest for Spark to evaluate."""
        return self.pushed.push(list(filters), self.parts)


# ----------------------------------------------------------------------------------------
# streaming read
def _canonical(offsets: Mapping[str, Mapping[Any, int]]) -> dict[str, dict[str, int]]:
    """{topic: {partition: next_offset}} with string keys in sorted order (Spark compares
    offsets as JSON text, so the key order must never change)."""
    return {t: {str(p): int(offsets[t][p]) for p in sorted(offsets[t], key=int)} for t in sorted(offsets)}


def _split_limit(backlog: dict[tuple[str, str], int], limit: int) -> dict[tuple[str, str], int]:
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

    def initialOffset(self) -> dict[str, Any]:
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

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest()

    def _earliest(self, topic: str, p: str) -> int:
        """Where a partition first seen now starts: its earliest offset."""
        with _reader(self.root, topic, int(p)) as log:
            return 0 if log is None else log.start_offset

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        with _planning():
            return self._latest_offset(start, limit)

    def _latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        latest = self.frozen if self.frozen is not None else self._latest()
        begin: dict[tuple[str, str], int] = {}  # (topic, partition as in Spark's JSON offsets)
        backlog: dict[tuple[str, str], int] = {}
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

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        with _planning():
            return self._partitions(start, end)

    def _partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[_Slice]:
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

    def commit(self, end: dict[str, Any]) -> None:
        pass  # Spark's checkpoint is the source of truth; nothing to do

    def stop(self) -> None:
        pass
