"""Columnar scans of a log's segments into numpy column buffers, with no Python object per
record and no pyarrow: the C scan (``plog_scan_columns``) checks every frame's CRC32C and
writes offsets, timestamps and the binary columns in Arrow's layout (:mod:`pylog._columns`).

:mod:`pylog.arrow` makes Arrow arrays over these buffers (and the Spark reader and the
broker scan through it, with pyarrow's allocator); :mod:`pylog.transactions` applies
staged records from them as :class:`pylog.log.PackedBytes`, so a commit makes no
``Record`` per record either.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterator
from typing import Any, NamedTuple

import numpy as np

from pylog import format as fmt
from pylog._backend import impl
from pylog._columns import MAX_DATA, Alloc, BinaryColumn, Columns
from pylog.appender import PackedBytes
from pylog.errors import OffsetOutOfRangeError
from pylog.segment import corrupt_error

__all__ = ["Part", "parts", "segment_view", "scan_buffer", "scan_part", "RECORD_COLUMNS", "PackedRows",
           "same", "lengths", "packed", "Merged", "packed_rows", "merged_by_timestamp", "packed_chunks",
           "scan_logs", "merged_records"]

# Key and metadata data buffers start this small and grow (most logs have neither).
_SMALL_DATA = 1 << 20
_HDR = fmt.FRAME_HEADER_SIZE
# parts() cuts a segment only into parts of at least this many records.
MIN_PART_ROWS = 1 << 17


# ----------------------------------------------------------------------------------------
# one buffer range -> filled Columns, batch by batch
def scan_buffer(buf: Any, length: int, pos: int, expected: int, stop: int, buffer_next: int, gaps: bool,
                want: Collection[str], batch_rows: int | None, convert: Callable[[Columns], Any],
                batch_bytes: int = MAX_DATA, alloc: Alloc | None = None) -> Generator[Any, None, tuple[int, int, int]]:
    """Yield ``convert(columns)`` for each batch of the frames of ``buf[pos:length]`` with
    offsets in ``[expected, stop)``; return ``(status, end position, next offset)``.

    ``buffer_next`` is the offset after the buffer's last record (it sizes the data
    buffers); ``want`` names the columns to collect (offsets always are). A batch holds at
    most ``batch_rows`` rows and ``batch_bytes`` of data per binary column (more only for a
    single record; never 2 GiB, an Arrow binary array's limit). ``alloc(nbytes)`` gives the
    columns' memory (default: numpy's). The status is OK when the scan reached ``stop`` or
    the end of the buffer, else why a frame was refused (the batches before it were
    yielded)."""
    keys, metas, values = "key" in want, "metadata" in want, "value" in want
    stamps = "timestamp" in want
    rc = impl.OK
    while expected < stop and pos < length:
        left = length - pos
        rows = max(1, min(stop - expected, left // _HDR, batch_rows or (1 << 62)))
        # Data bytes of the next `rows` records: exact when they are all the buffer holds,
        # else a share of it with some slack (a column that fills grows).
        remaining = max(buffer_next - expected, rows)
        if rows >= remaining:
            est = left - _HDR * rows
        else:
            est = int(left * (rows / remaining) * 1.125) - _HDR * rows + 4096
        est = max(0, min(est, left, batch_bytes))
        small = min(est, _SMALL_DATA)
        cols = Columns(rows, timestamps=stamps, key=small if keys else None,
                       metadata=small if metas else None, value=est if values else None, alloc=alloc)
        while True:
            rc, n, pos = impl.scan_columns(buf, length, pos, expected, stop, cols, gaps)
            if n:
                assert cols.offsets is not None  # asked for (Columns' default)
                expected = int(cols.offsets[cols.rows - 1]) + 1
            if rc == impl.E_SPACE and cols.grow_for_space(batch_bytes):
                continue
            break
        if cols.rows:
            yield convert(cols)
        if rc == impl.E_SPACE:
            if cols.rows:
                rc = impl.OK
                continue  # a column is full: the next batch takes the rest
            rc = impl.E_LENGTH
        if rc != impl.OK or cols.rows < cols.capacity:
            break
    return rc, pos, expected


# ----------------------------------------------------------------------------------------
# a Log's segments
class Part(NamedTuple):
    """One range of one segment to scan: records ``[off, stop)`` from store position ``pos``."""

    seg: Any
    map: Any
    pos: int
    off: int
    stop: int
    buffer_next: int


def segment_view(log: Any, seg: Any) -> tuple[Any, Any, int]:
    """(store map, offset index Buffer, entries) of a segment: for the active one, after the
    records queued or in the write buffer were handed to the OS (under the log's lock)."""
    if seg is log._active:
        with log._lock:
            if log._q:
                log._drain_locked()
            m, ibuf, n, _ = seg._view(None)
    else:
        m, ibuf, n, _ = seg._view(None)
    return m, ibuf, n


def parts(log: Any, start: int, stop: int, split: int) -> Iterator[Part]:
    """The ranges to scan for ``[start, stop)``, in offset order: one per segment, or with
    ``split`` > 1 up to that many per segment (cut at records found through the index)."""
    with log._lock:
        if log._q:
            log._drain_locked()
        segs = [s for s in [*log._sealed, log._active] if s.base_offset < stop and s.next_offset > start]
    split = max(1, split // max(len(segs), 1))
    for seg in segs:
        seg_next = seg.next_offset
        a, b = max(start, seg.base_offset), min(stop, seg_next)
        if a >= b:
            continue
        try:
            m, ibuf, n = segment_view(log, seg)
        except FileNotFoundError:  # retention removed the segment meanwhile
            raise OffsetOutOfRangeError(a, log.start_offset, log.next_offset) from None
        rc, f = impl.find(m.buf, m.length, ibuf, n, seg.base_offset, a, seg.gaps)
        if rc == impl.E_NOT_FOUND and seg.gaps:
            continue  # a compacted segment keeps nothing from `a` on
        if rc:
            f = seg._locate_slow(m, a)  # the index was no help: a CRC-checked walk (raises if bad)
        cuts = [(int(f[0]), int(f[1]))]
        k = min(split, (b - a) // MIN_PART_ROWS)
        for i in range(1, k):
            rc, g = impl.find(m.buf, m.length, ibuf, n, seg.base_offset, a + i * (b - a) // k, seg.gaps)
            if rc:
                cuts = cuts[:1]  # no cut where the index does not lead straight to a good frame
                break
            if cuts[-1][1] < g[1] < b:
                cuts.append((int(g[0]), int(g[1])))
        stops = [c[1] for c in cuts[1:]] + [b]
        for (pos, off), end in zip(cuts, stops):
            if off < end:
                yield Part(seg, m, pos, off, end, seg_next)


def scan_part(p: Part, want: Collection[str], batch_rows: int | None, convert: Callable[[Columns], Any],
              alloc: Alloc | None = None, batch_bytes: int = MAX_DATA) -> Generator[Any, None, None]:
    """``convert(columns)`` for each batch of one part (as :func:`scan_buffer` makes them);
    raises CorruptRecordError (after the batches before it) at a frame that fails its CRC
    or checks, or when the store ends before the records the segment should hold."""
    rc, end, nxt = yield from scan_buffer(p.map.buf, p.map.length, p.pos, p.off, p.stop, p.buffer_next,
                                          p.seg.gaps, want, batch_rows, convert, batch_bytes, alloc=alloc)
    if rc == impl.OK and nxt < p.stop and not p.seg.gaps:
        rc = impl.E_SHORT  # the store ends before the records the segment should hold
    if rc != impl.OK:
        raise corrupt_error(p.seg.store_path, end, nxt, rc)


# ----------------------------------------------------------------------------------------
# scanned rows as what Log.append_batch takes (pylog.transactions applies staged records so)
#: The columns of a record (offsets come along with any scan).
RECORD_COLUMNS = ("timestamp", "key", "metadata", "value")
#: Values, keys and metadata as PackedBytes (keys and metadata None when all are null) and
#: the timestamps: the arguments of one ``Log.append_batch`` call.
PackedRows = tuple[Any, Any, Any, np.ndarray]


def same(cols: Columns) -> Columns:
    """``cols`` itself: the ``convert`` of a scan that keeps the Columns."""
    return cols


def lengths(col: BinaryColumn, n: int) -> np.ndarray:
    """The lengths of the first ``n`` rows of a scanned binary column, NULL_LEN for a null."""
    lens = np.diff(col.offsets[:n + 1]).astype(np.uint32)
    if col.null_count:
        valid = np.unpackbits(col.validity[:(n + 7) // 8], count=n, bitorder="little")
        lens[valid == 0] = fmt.NULL_LEN
    return lens


def packed(col: BinaryColumn | None, n: int, none_if_null: bool) -> PackedBytes | None:
    """The first ``n`` rows of a scanned binary column as PackedBytes; None for a column not
    scanned, or (``none_if_null``) when every row is null."""
    if col is None or (none_if_null and col.null_count >= n):
        return None
    return PackedBytes(col.data[:int(col.offsets[n])], lengths(col, n))


class Merged:
    """One binary column of several scanned Columns, as one buffer, for taking rows in any
    order: a run of rows that lie together is one slice."""

    def __init__(self, chunks: list[Columns], name: str) -> None:
        lens, starts, datas = [], [], []
        base = 0
        for c in chunks:
            col = getattr(c, name)
            lens.append(lengths(col, c.rows))
            starts.append(col.offsets[:c.rows].astype(np.int64) + base)
            used = int(col.offsets[c.rows])
            datas.append(col.data[:used])
            base += used
        self.lens = np.concatenate(lens)
        self.starts = np.concatenate(starts)
        self.sizes = np.where(self.lens == fmt.NULL_LEN, 0, self.lens).astype(np.int64)
        self.data = np.concatenate(datas).data
        self.all_null = bool((self.lens == fmt.NULL_LEN).all())

    def take(self, rows: np.ndarray, first: np.ndarray, last: np.ndarray,
             none_if_null: bool) -> PackedBytes | None:
        """Rows ``rows`` (runs ``rows[first[i]:last[i] + 1]`` lie together) as PackedBytes."""
        if none_if_null and self.all_null:
            return None
        lens = self.lens[rows]
        if none_if_null and (lens == fmt.NULL_LEN).all():
            return None
        a = self.starts[rows[first]].tolist()
        b = (self.starts[rows[last]] + self.sizes[rows[last]]).tolist()
        data = self.data
        return PackedBytes(b"".join([data[x:y] for x, y in zip(a, b)]), lens)


def packed_rows(c: Columns) -> PackedRows:
    """The rows of a scan of :data:`RECORD_COLUMNS` as what ``Log.append_batch`` takes."""
    n = c.rows
    assert c.timestamps is not None  # scanned
    return packed(c.value, n, False), packed(c.key, n, True), packed(c.metadata, n, True), c.timestamps[:n]


def merged_by_timestamp(chunks: list[Columns], rows: int) -> Iterator[PackedRows]:
    """The rows of ``chunks`` (scans of :data:`RECORD_COLUMNS`, in order) stably sorted by
    timestamp, at most ``rows`` at a time: one sorted batch of them all."""
    if not chunks:
        return
    ts = np.concatenate([c.timestamps[:c.rows] for c in chunks if c.timestamps is not None])
    order = np.argsort(ts, kind="stable") if len(ts) > 1 and (np.diff(ts) < 0).any() else None
    cols = {name: Merged(chunks, name) for name in ("value", "key", "metadata")}
    for a in range(0, len(ts), rows):
        take = np.arange(a, min(a + rows, len(ts))) if order is None else order[a:a + rows]
        # runs: rows that follow each other in the merged buffers, each taken as one slice
        cut = np.flatnonzero(np.diff(take) != 1) + 1
        first = np.concatenate([[0], cut])
        last = np.concatenate([cut - 1, [len(take) - 1]])
        yield (cols["value"].take(take, first, last, False), cols["key"].take(take, first, last, True),
               cols["metadata"].take(take, first, last, True), ts[take])


# ----------------------------------------------------------------------------------------
# whole logs (read-only, their records up to the stable offset) as append_batch arguments
def packed_chunks(log: Any, rows: int, nbytes: int) -> Iterator[PackedRows]:
    """The records of ``log`` in chunks of at most ``rows`` rows and ``nbytes`` per column
    (more only for a single record), as :func:`packed_rows`."""
    for part in parts(log, log.start_offset, log.stable_offset, 1):
        for c in scan_part(part, RECORD_COLUMNS, rows, same, batch_bytes=nbytes):
            yield packed_rows(c)


def scan_logs(logs: list[Any]) -> list[Columns]:
    """The records of ``logs``, in order, as scans of :data:`RECORD_COLUMNS` (their data
    copied into memory: for :func:`merged_by_timestamp`)."""
    return [c for log in logs for part in parts(log, log.start_offset, log.stable_offset, 1)
            for c in scan_part(part, RECORD_COLUMNS, None, same)]


def merged_records(logs: list[Any], rows: int) -> Iterator[PackedRows]:
    """:func:`merged_by_timestamp` of ``logs`` with no copy of the data: the values, keys
    and metadata as lists of views over the logs' maps (a Record per record; for merges too
    big to hold in memory)."""
    recs = [r for log in logs for r in log.scan(log.start_offset, log.stable_offset)]
    ts = np.array([r.timestamp for r in recs], np.int64)
    if len(ts) > 1 and (np.diff(ts) < 0).any():
        recs = [recs[i] for i in np.argsort(ts, kind="stable").tolist()]
    for a in range(0, len(recs), rows):
        chunk = recs[a:a + rows]
        yield ([r.value for r in chunk], [r.key for r in chunk], [r.metadata for r in chunk],
               np.array([r.timestamp for r in chunk], np.int64))
