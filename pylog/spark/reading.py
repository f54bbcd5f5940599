"""Reading topics into Spark: partition planning and the batch reader (the micro-batch
reader, :mod:`pylog.spark.streaming`, plans its batches with the same functions).

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
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

import pylog
from pylog import format as fmt
from pylog import transactions
from pylog._backend import impl
from pylog._columns import Columns
from pylog.arrow import binary_array, int64_buffer, scan_buffer
from pylog.errors import CorruptRecordError, PylogError
from pylog.spark.headers import HEADERS_DDL, HEADERS_TYPE, headers_array
from pylog.spark.layout import _partition_dir, _partitions_of, _selected
from pylog.spark.options import (
    _EARLIEST,
    _LATEST,
    _assign_opt,
    _bool_opt,
    _choice_opt,
    _err,
    _int_opt,
    _offsets_spec,
    _pattern_opt,
    _root_opt,
    _timestamps_spec,
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
#: The columns of a read with ``includeHeaders=true``: :data:`SCHEMA` and Kafka's ``headers``.
SCHEMA_WITH_HEADERS = f"{SCHEMA}, {HEADERS_DDL}"
_ARROW_SCHEMA_WITH_HEADERS = _ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))
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
    ino: int = 0
    headers: bool = False

    def __init__(self, topic: str, partition: int, store_path: str, start_offset: int, start_position: int,
                 end_offset: int, end_position: int, fail_on_data_loss: bool = True,
                 timestamp_type: int = 0, ino: int = 0, headers: bool = False) -> None:
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
        self.ino = ino  # the store file's inode when planned (0: not known); compaction replaces it
        self.headers = headers  # add the headers column (includeHeaders)


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


def _selection(options: dict[str, str], root: str, *, strict: bool = True) -> dict[str, list[int]]:
    """``{topic: [partition, ...]}`` of a read's ``topic``/``topics``/``subscribe``,
    ``subscribePattern`` or ``assign`` option (see :func:`pylog.spark.layout._selected`)."""
    pattern, assign = _pattern_opt(options), _assign_opt(options)
    topics = _topics_opt(options) if pattern is None and assign is None else None
    return _selected(root, topics, pattern, assign, strict=strict)


def _without(spec: Any, name: str, parts: Mapping[str, list[int]], dropped: set[tuple[str, int]]) -> Any:
    """An offsets spec without the partitions in ``dropped``, once its topic and partition
    names are checked against every partition read (``parts``)."""
    if not isinstance(spec, dict):
        return spec
    _check_spec(spec, name, parts)
    return {t: {p: off for p, off in ps.items() if (t, p) not in dropped} for t, ps in spec.items()}


def _by_timestamp(root: str, bounds: dict[str, dict[int, tuple[int, int]]], ts: int | dict[str, dict[int, int]],
                  name: str = "startingTimestamp", strict: bool = False) -> dict[str, dict[int, int]]:
    """Per partition (every one for a single ``ts``; those a ``{topic: {partition: ts}}``
    names, checked against ``bounds``, otherwise), the first offset with timestamp >= its
    time: the latest offset if there is none, or with ``strict`` an error naming option
    ``name`` (Kafka's ``startingOffsetsByTimestampStrategy=error``)."""
    if isinstance(ts, dict):
        _check_spec(ts, name, bounds)
    out: dict[str, dict[int, int]] = {}
    for t, parts in bounds.items():
        m = out.setdefault(t, {})
        for p, (lo, hi) in parts.items():
            when = ts if isinstance(ts, int) else ts.get(t, {}).get(p)
            if when is None:
                continue
            off = None
            with _reader(root, t, p) as log:
                if log is not None:
                    off = log.offset_for_time(when)
            if off is None and strict:
                raise _err(name, f"topic {t!r} partition {p} has no record at or after {when} ms "
                           "(startingOffsetsByTimestampStrategy=error)")
            m[p] = hi if off is None else max(lo, min(off, hi))
    return out


class _Positions:
    """Where a read starts (and a batch read ends): the offset and timestamp options of a
    read, resolved against a snapshot's bounds. Precedence as in Kafka's source: a single
    timestamp, then per-partition timestamps, then offsets."""

    def __init__(self, options: dict[str, str], stream: bool) -> None:
        self.start_spec = _offsets_spec(options, "startingoffsets", "latest" if stream else "earliest",
                                        allow_latest=stream)
        self.start_ts = _int_opt(options, "startingtimestamp", None, lo=0)
        self.start_by_ts = _timestamps_spec(options, "startingoffsetsbytimestamp")
        self.strict = _choice_opt(options, "startingoffsetsbytimestampstrategy", ("latest", "error"),
                                  "latest") == "error"
        self.end_spec = _offsets_spec(options, "endingoffsets", "latest", allow_earliest=False)
        self.end_ts = _int_opt(options, "endingtimestamp", None, lo=0)
        self.end_by_ts = _timestamps_spec(options, "endingoffsetsbytimestamp")

    def starts(self, root: str, bounds: dict[str, dict[int, tuple[int, int]]], start_spec: Any,
               start_by_ts: Any, default: int) -> dict[str, dict[int, int]]:
        """The start offsets of every partition in ``bounds``."""
        if self.start_ts is not None:
            return _by_timestamp(root, bounds, self.start_ts, "startingTimestamp", self.strict)
        out = _resolve(start_spec, "startingOffsets", bounds, default)
        if start_by_ts:
            for t, m in _by_timestamp(root, bounds, start_by_ts, "startingOffsetsByTimestamp", self.strict).items():
                out[t].update(m)
        return out

    def ends(self, root: str, bounds: dict[str, dict[int, tuple[int, int]]], end_spec: Any,
             end_by_ts: Any) -> dict[str, dict[int, int]]:
        """The end offsets (exclusive) of every partition in ``bounds`` (a batch read's)."""
        if self.end_ts is not None:
            return _by_timestamp(root, bounds, self.end_ts, "endingTimestamp")
        out = _resolve(end_spec, "endingOffsets", bounds, _LATEST)
        if end_by_ts:
            for t, m in _by_timestamp(root, bounds, end_by_ts, "endingOffsetsByTimestamp").items():
                out[t].update(m)
        return out


def _locate(s: Any, off: int) -> tuple[int, int]:
    """(position, offset) of the first record at or after ``off`` in segment ``s``; in a
    compacted segment whose records all lie before ``off``: (its size, ``off``)."""
    try:
        _m, f = s.find(off)
    except CorruptRecordError:
        if not s.gaps or _last_offset(s) >= off:
            raise  # damage, not the end of a compacted segment
        return int(s.size), off
    return int(f[0]), int(f[1])


def _last_offset(s: Any) -> int:
    """The offset of the last record of segment ``s`` (-1 if none): a CRC-checked walk."""
    m = s.maps().store
    pos, expected, last = fmt.FILE_HEADER_SIZE, s.base_offset, -1
    while True:
        rc, frames, end = impl.scan(m.buf, m.length, pos, expected, 4096, 1 << 63, s.gaps)
        if len(frames):
            last = int(frames[-1]["offset"])
            expected = last + 1
        if rc != impl.OK or not len(frames) or int(end) >= m.length:
            return last
        pos = int(end)


def _inode(s: Any) -> int:
    """The inode of segment ``s``'s store file, as the positions found in it are of that
    file (0 if unknown)."""
    ino = getattr(s, "ino", None)  # a mapped sealed segment's
    if ino is None:
        ino = getattr(s, "_ino", None)  # a read-only log's tail segment (pylog.tail)
    if ino is None and getattr(s, "store_fd", -1) >= 0:  # a writer's active one
        ino = os.fstat(s.store_fd).st_ino
    return int(ino or 0)


def _plan_partition(root: str, topic: str, p: int, start: int, end: int, fail: bool,
                    headers: bool = False) -> list[_Slice]:
    """Segment slices covering [start, end) of one partition (pylog internals: segment
    objects and their positions). A compacted segment may hold no record of its range, or
    none at its ends (its records were superseded): that is no loss."""
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
            if a >= b or s.size <= fmt.FILE_HEADER_SIZE:  # (compaction emptied it)
                continue
            a_pos, a_off = _locate(s, a)
            b_pos = _locate(s, b)[0] if b < s.next_offset else int(s.size)
            if a_pos < b_pos:
                ino = _inode(s)  # (a compaction may replace the file once it is sealed)
                out.append(_Slice(topic, p, s.store_path, a_off, a_pos, b, b_pos, fail, kind, ino, headers))
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
        pos, off = _locate(seg, mid)
    if not sl.start_position < pos < sl.end_position:
        return None
    left = _Slice(sl.topic, sl.partition, sl.store_path, sl.start_offset, sl.start_position, off, pos,
                  sl.fail_on_data_loss, sl.timestamp_type, sl.ino, sl.headers)
    right = _Slice(sl.topic, sl.partition, sl.store_path, off, pos, sl.end_offset, sl.end_position,
                   sl.fail_on_data_loss, sl.timestamp_type, sl.ino, sl.headers)
    return left, right


def _plan(root: str, starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]],
          fail: bool, min_partitions: int | None, max_records: int | None = None,
          headers: bool = False) -> list[_Slice]:
    ranges = {t: {p: [(starts[t][p], e)] for p, e in parts.items()} for t, parts in ends.items()}
    return _plan_ranges(root, ranges, fail, min_partitions, max_records, headers)


def _plan_ranges(root: str, ranges: dict[str, dict[int, list[tuple[int, int]]]], fail: bool,
                 min_partitions: int | None, max_records: int | None = None,
                 headers: bool = False) -> list[_Slice]:
    """The slices of the offset ranges ``{topic: {partition: [(start, end), ...]}}``, each
    split until it spans at most ``max_records`` offsets, then until there are
    ``min_partitions`` of them (if they can be)."""
    slices: list[_Slice] = []
    for t in sorted(ranges):
        for p in sorted(ranges[t]):
            for a, b in ranges[t][p]:
                slices.extend(_plan_partition(root, t, p, a, b, fail, headers))
    if max_records:
        todo, slices = slices, []
        while todo:
            sl = todo.pop()
            halves = _split(root, sl) if sl.end_offset - sl.start_offset > max_records else None
            if halves is None:
                slices.append(sl)
            else:
                todo.extend(halves)
        slices.sort(key=lambda x: (x.topic, x.partition, x.start_offset))
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


def _batch(cols: Columns, topic: str, partition: int, timestamp_type: int = 0, headers: bool = False) -> pa.RecordBatch:
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
    if headers:
        arrays.append(headers_array(arrays[-1]))
        return pa.RecordBatch.from_arrays(arrays, schema=_ARROW_SCHEMA_WITH_HEADERS)
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
        st = os.fstat(fd)
        size = st.st_size
        if sl.ino and st.st_ino != sl.ino:  # the file was replaced since the plan
            yield from _read_replaced(sl, fd, size)
            return
        if size < sl.end_position:
            if sl.fail_on_data_loss:
                raise PylogError(f"pylog: {sl.store_path} is shorter than when the query was planned "
                                 f"({size} < {sl.end_position} bytes): the log was truncated meanwhile. Set option "
                                 "failOnDataLoss=false to skip the records gone")
            return
        mm = mmap.mmap(fd, sl.end_position, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    buf = impl.Buffer(mm)
    rc, _b, flags = impl.header_check(memoryview(mm)[: fmt.FILE_HEADER_SIZE], fmt.STORE_MAGIC)
    gaps = bool(rc == impl.OK and flags & fmt.HEADER_COMPACTED)
    rc, end, expected = yield from scan_buffer(
        buf, sl.end_position, sl.start_position, sl.start_offset, sl.end_offset, sl.end_offset, gaps,
        _ARROW_COLUMNS, _BATCH_ROWS, lambda cols: _batch(cols, sl.topic, sl.partition, sl.timestamp_type, sl.headers),
        _BATCH_BYTES)
    if rc != impl.OK:
        raise CorruptRecordError(sl.store_path, int(end), expected, _reason(rc))
    if expected < sl.end_offset and not gaps and sl.fail_on_data_loss:
        raise PylogError(f"pylog: {sl.store_path} ended at offset {expected}, expected records up to "
                         f"{sl.end_offset}: the log changed since the query was planned")


def _read_replaced(sl: _Slice, fd: int, size: int) -> Iterator[pa.RecordBatch]:
    """A slice whose segment file was replaced after the plan. Compaction does that (its
    swap renames a compacted copy over the file): the copy holds the latest record of every
    key the slice's range held, at other positions, so they are read from the copy (the
    records it dropped were superseded: no loss). Any other replacement (the topic deleted
    and made again) is a loss: the planned records are gone."""
    mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
    rc, _b, flags = impl.header_check(memoryview(mm)[: fmt.FILE_HEADER_SIZE] if mm else b"", fmt.STORE_MAGIC)
    if mm is None or rc != impl.OK or not flags & fmt.HEADER_COMPACTED:
        if sl.fail_on_data_loss:
            raise PylogError(f"pylog: {sl.store_path} was replaced since the query was planned (not by a compaction): "
                             f"records {sl.start_offset}..{sl.end_offset - 1} of topic {sl.topic!r} partition "
                             f"{sl.partition} are gone. Set option failOnDataLoss=false to skip them")
        return
    buf = impl.Buffer(mm)
    pos, expected = fmt.FILE_HEADER_SIZE, int(os.path.basename(sl.store_path)[:20])
    while pos < size:  # the position of the slice's first record in the copy
        rc, frames, end = impl.scan(buf, size, pos, expected, 4096, 1 << 63, True)
        offs = [int(o) for o in frames["offset"]] if len(frames) else []
        i = next((k for k, o in enumerate(offs) if o >= sl.start_offset), None)
        if i is not None:
            pos = int(frames[i].tolist()[0])
            break
        if rc != impl.OK or not offs:
            raise CorruptRecordError(sl.store_path, int(end), expected, _reason(rc))
        pos, expected = int(end), offs[-1] + 1
    rc, end, expected = yield from scan_buffer(
        buf, size, pos, sl.start_offset, sl.end_offset, sl.end_offset, True, _ARROW_COLUMNS, _BATCH_ROWS,
        lambda cols: _batch(cols, sl.topic, sl.partition, sl.timestamp_type, sl.headers), _BATCH_BYTES)
    if rc != impl.OK:
        raise CorruptRecordError(sl.store_path, int(end), expected, _reason(rc))


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
        self.fail = _bool_opt(options, "failondataloss", True)
        self.min_partitions = _int_opt(options, "minpartitions", None, lo=1)
        self.max_records = _int_opt(options, "maxrecordsperpartition", None, lo=1)
        self.headers = _bool_opt(options, "includeheaders", False)
        self.positions = _Positions(options, stream=False)
        self.parts = _selection(options, self.root)  # a missing topic fails here
        self.topics = sorted(self.parts)
        self.pushed = Pushed()

    def _snapshot(self) -> None:
        """Fix ``self.starts`` and ``self.ends`` (absolute offsets per partition), checked.
        Partitions the pushed filters dropped are not opened (nor checked against the
        offset options beyond their names)."""
        dropped, pos = self.pushed.dropped, self.positions
        kept = {t: [p for p in ps if (t, p) not in dropped] for t, ps in self.parts.items()}
        bounds = _bounds(self.root, self.topics, kept)  # the partitions pushFilters saw
        self.starts = pos.starts(self.root, bounds, _without(pos.start_spec, "startingOffsets", self.parts, dropped),
                                 _without(pos.start_by_ts, "startingOffsetsByTimestamp", self.parts, dropped),
                                 _EARLIEST)
        self.ends = pos.ends(self.root, bounds, _without(pos.end_spec, "endingOffsets", self.parts, dropped),
                             _without(pos.end_by_ts, "endingOffsetsByTimestamp", self.parts, dropped))
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
            self._snapshot()
            return list(_plan_ranges(self.root, self._ranges(), self.fail, self.min_partitions, self.max_records,
                                     self.headers))

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
