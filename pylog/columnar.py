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
from pylog.errors import CorruptRecordError, OffsetOutOfRangeError
from pylog.segment import corrupt_error

__all__ = ["Part", "parts", "segment_view", "scan_buffer", "scan_part", "RECORD_COLUMNS", "PackedRows",
           "same", "lengths", "packed", "packed_slice", "Slice", "Merged", "packed_rows", "merged_by_timestamp",
           "packed_chunks", "merged_logs"]

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


def lengths(col: BinaryColumn, n: int, start: int = 0) -> np.ndarray:
    """The lengths of rows ``[start, n)`` of a scanned binary column, NULL_LEN for a null."""
    lens = np.diff(col.offsets[start:n + 1]).astype(np.uint32)
    if col.null_count:
        bits = np.unpackbits(col.validity[start >> 3:(n + 7) >> 3], bitorder="little")
        lens[bits[start & 7:(start & 7) + n - start] == 0] = fmt.NULL_LEN
    return lens


def packed(col: BinaryColumn | None, n: int, none_if_null: bool) -> PackedBytes | None:
    """The first ``n`` rows of a scanned binary column as PackedBytes; None for a column not
    scanned, or (``none_if_null``) when every row is null."""
    if col is None or (none_if_null and col.null_count >= n):
        return None
    return PackedBytes(col.data[:int(col.offsets[n])], lengths(col, n))


#: Rows ``[a, b)`` of a scan.
Slice = tuple[Columns, int, int]


class Merged:
    """One binary column of several scanned Columns (or :data:`Slice` s of them), as one
    buffer, for taking rows in any order: a run of rows that lie together is one slice."""

    def __init__(self, chunks: list[Columns] | list[Slice], name: str) -> None:
        lens, starts, datas = [], [], []
        base = 0
        for chunk in chunks:
            c, a, b = (chunk, 0, chunk.rows) if isinstance(chunk, Columns) else chunk
            col = getattr(c, name)
            lens.append(lengths(col, b, a))
            offs = col.offsets[a:b + 1].astype(np.int64)
            lo, hi = int(offs[0]), int(offs[-1])
            starts.append(offs[:-1] + (base - lo))
            datas.append(col.data[lo:hi])
            base += hi - lo
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


def packed_slice(c: Columns, a: int, b: int) -> PackedRows:
    """Rows ``[a, b)`` of a scan of :data:`RECORD_COLUMNS` as :func:`packed_rows` gives
    them, with no copy of their data."""
    assert c.timestamps is not None  # scanned

    def col(x: BinaryColumn | None, none_if_null: bool) -> PackedBytes | None:
        if x is None:
            return None
        lens = lengths(x, b, a)
        if none_if_null and (lens == fmt.NULL_LEN).all():
            return None
        return PackedBytes(x.data[int(x.offsets[a]):int(x.offsets[b])], lens)

    value = col(c.value, False)
    assert value is not None
    return value, col(c.key, True), col(c.metadata, True), c.timestamps[a:b]


#: :func:`merged_by_timestamp` takes whole runs of its spans, with no copy, when its rows
#: make runs of at least this many rows on average; else one sort and a copy of them all.
MIN_RUN_ROWS = 256


def _runs(spans: list[Slice]) -> list[Slice] | None:
    """The rows of ``spans`` (each span's timestamps never decrease) in the order of one
    stable sort of them all by timestamp, as runs of consecutive rows of one span; None
    when that takes more than one run per :data:`MIN_RUN_ROWS` rows. A k-way merge: the
    span whose next row sorts first (timestamp, then span) gives every row that sorts
    before the next row of any other span."""
    k = len(spans)
    total = sum(b - a for _c, a, b in spans)
    limit = max(k, total // MIN_RUN_ROWS)
    ts = [c.timestamps for c, _a, _b in spans]
    pos = [a for _c, a, _b in spans]
    end = [b for _c, _a, b in spans]
    live = [i for i in range(k) if pos[i] < end[i]]
    out: list[Slice] = []
    while live:
        heads = sorted((int(ts[i][pos[i]]), i) for i in live)  # type: ignore[index]
        i = heads[0][1]
        if len(heads) == 1:
            stop = end[i]
        else:
            t, j = heads[1]
            rest = ts[i][pos[i]:end[i]]  # type: ignore[index]
            stop = pos[i] + int(np.searchsorted(rest, t, side="right" if i < j else "left"))
        out.append((spans[i][0], pos[i], stop))
        if len(out) > limit:
            return None
        pos[i] = stop
        if stop == end[i]:
            live.remove(i)
    return out


def merged_by_timestamp(chunks: list[Columns] | list[Slice], rows: int) -> Iterator[PackedRows]:
    """The rows of ``chunks`` (scans of :data:`RECORD_COLUMNS`, or :data:`Slice` s of them,
    in order; each one's timestamps never decrease) stably sorted by timestamp, at most
    ``rows`` at a time: one sorted batch of them all. Long runs of one chunk (a Spark
    task's batches, each stamped when it was staged) are given as they lie, with no copy;
    rows that interleave finely are copied into one buffer per column and gathered."""
    if not chunks:
        return
    spans = [(c, 0, c.rows) if isinstance(c, Columns) else c for c in chunks]
    runs = _runs(spans)
    if runs is not None:
        for c, a, b in runs:
            for x in range(a, b, rows):
                yield packed_slice(c, x, min(b, x + rows))
        return
    ts = np.concatenate([c.timestamps[a:b] for c, a, b in spans if c.timestamps is not None])
    order = np.argsort(ts, kind="stable") if len(ts) > 1 and (np.diff(ts) < 0).any() else None
    cols = {name: Merged(spans, name) for name in ("value", "key", "metadata")}
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


def _ordered_chunks(log: Any, rows: int, nbytes: int) -> Iterator[Columns]:
    """Scans of :data:`RECORD_COLUMNS` of ``log``'s records, as :func:`packed_chunks`
    reads them; CorruptRecordError if its timestamps ever decrease (a Log's never do)."""
    last = -1
    for part in parts(log, log.start_offset, log.stable_offset, 1):
        for c in scan_part(part, RECORD_COLUMNS, rows, same, batch_bytes=nbytes):
            assert c.timestamps is not None and c.offsets is not None  # scanned
            ts = c.timestamps[:c.rows]
            down = np.flatnonzero(np.diff(ts, prepend=np.int64(last)) < 0)
            if len(down):
                raise CorruptRecordError(part.seg.store_path, 0, int(c.offsets[down[0]]),
                                         f"timestamp {int(ts[down[0]])} is below the one before it")
            last = int(ts[-1])
            yield c


#: Rows of a chunk that :func:`merged_logs` reads from one log, however many logs it
#: merges (unless ``rows`` is fewer): ~28 bytes of arrays each, beside the data.
_MERGE_MIN_ROWS = 1024


def merged_logs(logs: list[Any], rows: int, nbytes: int) -> Iterator[PackedRows]:
    """The records of ``logs`` (read-only, up to their stable offsets) as one stable sort of
    them all by timestamp would order them (ties: ``logs`` in order, each log in its
    order), at most ``rows`` at a time, with bounded memory: each log is read in chunks of
    ``rows // len(logs)`` rows (at least :data:`_MERGE_MIN_ROWS`, fewer rounds) and
    ``nbytes // len(logs)`` bytes per column (more only for a single record), and each
    round takes every row read that no row still unread can
    precede. A log's timestamps never decrease, so no unread row of log ``k`` precedes
    ``(its last read timestamp, k)``; the least of these bounds the round, and the log
    that holds it has all its chunk taken. Rounds are merged (one stable sort by
    timestamp: a round's rows all precede the next round's) once they hold ``rows`` rows
    or ``nbytes`` bytes."""
    k = len(logs)
    share = max(rows // k, min(rows, _MERGE_MIN_ROWS))
    its = [_ordered_chunks(log, share, max(1, nbytes // k)) for log in logs]
    heads: list[Any] = [None] * k  # each log's chunk read, and its first row not taken
    pos = [0] * k
    done = np.iinfo(np.int64).max
    first = np.full(k, done, np.int64)  # timestamp of each log's first row not taken
    last = np.full(k, done, np.int64)  # of its last row read

    def fill(i: int) -> None:
        c = heads[i] = next((c for c in its[i] if c.rows), None)
        pos[i] = 0
        if c is not None:
            assert c.timestamps is not None  # scanned
            first[i], last[i] = c.timestamps[0], c.timestamps[c.rows - 1]
        else:
            first[i] = last[i] = done

    def size(c: Columns, a: int, b: int) -> int:
        return sum(int(col.offsets[b]) - int(col.offsets[a]) for _name, col in c.binary())

    for i in range(k):
        fill(i)
    spans: list[Slice] = []
    held = held_bytes = 0
    while True:
        b = int(np.argmin(last))  # the least (last timestamp read, log)
        bound = int(last[b])
        if bound == done:
            break
        took = np.flatnonzero(first <= bound).tolist()  # the logs with rows to take, in order
        for i in took:
            c, p = heads[i], pos[i]
            if i == b:
                n = c.rows
            else:  # rows before (bound, b): ties go to the earlier log
                ts = c.timestamps[p:c.rows]
                n = p + int(np.searchsorted(ts, bound, side="right") if i < b
                            else np.searchsorted(ts, bound, side="left"))
            if n > p:
                spans.append((c, p, n))
                held += n - p
                held_bytes += size(c, p, n)
                pos[i] = n
                if n < c.rows:
                    first[i] = c.timestamps[n]
        if held >= rows or held_bytes >= nbytes:
            yield from merged_by_timestamp(spans, rows)
            spans, held, held_bytes = [], 0, 0
        for i in took:
            if pos[i] == heads[i].rows:
                fill(i)
    yield from merged_by_timestamp(spans, rows)
