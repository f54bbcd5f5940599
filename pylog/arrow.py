"""Columnar reads: a log's records as Arrow tables and record batches.

Needs pyarrow (``pip install "pylog-commitlog[arrow]"``); ``import pylog`` never imports it, only
``import pylog.arrow`` (or :meth:`pylog.Log.read_arrow`) does.

::

    import pylog.arrow
    table = pylog.arrow.read_table(log)                  # every record
    for batch in pylog.arrow.iter_batches(log, start=1000, batch_rows=50_000):
        ...

Columns (:data:`SCHEMA`): ``offset`` int64, ``timestamp`` timestamp[ms, UTC] (the record's
milliseconds since the epoch, as stored: no conversion), ``key``, ``value`` and
``metadata`` binary, null where the record has none (a tombstone's ``value`` is null).

How it works: one C call per batch (``plog_scan_columns``) walks the segment's mapped store
file, checks every frame's CRC32C, and writes the columns straight into Arrow's layout:
int64 arrays, int32 offsets plus one data buffer per binary column, validity bitmaps. The
Arrow arrays are then made over those buffers without a copy and without any per-record
Python work. Sealed and active segments are read alike (queued appends are framed and
written out first, as :meth:`pylog.Log.read_batch` does), compacted segments too. A frame
that fails its CRC is never returned: the read raises :class:`pylog.errors.CorruptRecordError`
(:func:`iter_batches` yields the batches before the bad frame first). Big buffers of
batches that were dropped are reused by the next read (:func:`release_buffers`). The user
guide is docs/arrow.md.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pylog.errors import ArgumentTypeError, InvalidArgumentError, require

require("pyarrow", "pylog.arrow (read_arrow)", "arrow")
import pyarrow as pa  # noqa: E402

from pylog import columnar
from pylog._backend import impl
from pylog._columns import MAX_DATA, Columns

__all__ = ["SCHEMA", "COLUMNS", "read_table", "iter_batches", "release_buffers", "BUFFER_CACHE_BYTES"]

#: The schema of a read: offset, timestamp (ms since the epoch, UTC), key, value, metadata.
SCHEMA = pa.schema([
    ("offset", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")), ("key", pa.binary()),
    ("value", pa.binary()), ("metadata", pa.binary()),
])
#: Column names, in schema order.
COLUMNS = tuple(SCHEMA.names)

#: Rows per batch :func:`iter_batches` yields unless told.
DEFAULT_BATCH_ROWS = 1 << 17
_MAX_THREADS = 8
# ... and into this many parts per thread. More parts let a thread that a busy neighbour
# slows take fewer of them (with a busy loop beside the read, 1,000,000 x 100 B: 14-18 M rec/s
# with one part per thread, 22-31 M with four), but on a quiet machine each part costs: in the
# same process, alternating, 56.1-56.4 M rec/s with one part per thread, 47.1-47.8 M with four
# (1 is what a user with the CPUs to themselves gets; the same figures in docs/arrow.md).
_PARTS_PER_THREAD = 1


class _BufferCache:
    """Big buffers of batches nobody holds any more, kept for the next read.

    Fresh memory costs page faults: ~13 ms per 100 MB of 4 KiB pages, and on a VM whose
    host backs guest memory lazily, several ms per 2 MiB huge page the first time it is
    touched (measured: reads of 1M records taking 140-250 ms instead of 30 ms until the
    allocator's pages had all been touched once). A buffer handed to Arrow comes back here
    when the last array over it is gone (a finalizer on the numpy view Arrow holds), up to
    :data:`BUFFER_CACHE_BYTES` in all; :func:`release_buffers` frees them."""

    def __init__(self) -> None:
        self._free: list[pa.Buffer] = []
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> pa.Buffer | None:
        """The smallest free buffer of ``nbytes`` to ``1.5 * nbytes + 1 MiB``, or None."""
        with self._lock:
            best = -1
            hi = nbytes + nbytes // 2 + (1 << 20)
            for i, b in enumerate(self._free):
                if nbytes <= b.size <= hi and (best < 0 or b.size < self._free[best].size):
                    best = i
            if best < 0:
                return None
            b = self._free.pop(best)
            self._bytes -= b.size
            return b

    def put(self, buf: pa.Buffer) -> None:
        with self._lock:
            if self._bytes + buf.size <= BUFFER_CACHE_BYTES:
                self._free.append(buf)
                self._bytes += buf.size

    def clear(self) -> int:
        with self._lock:
            freed, self._free, self._bytes = self._bytes, [], 0
            return freed

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._free, self._bytes = [], 0


#: Bytes of dropped read buffers kept for the next read (see :func:`release_buffers`); set
#: it to 0 to keep none.
BUFFER_CACHE_BYTES = 256 << 20
_cache = _BufferCache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_cache.reset_after_fork)
_RECYCLE_MIN = 1 << 20


def _alloc(nbytes: int) -> Any:
    """A writable buffer of at least ``nbytes`` from pyarrow's memory pool (whose freed
    pages are reused: a fresh 100 MB numpy array costs ~13 ms of page faults every time),
    recycled through the buffer cache when it is big."""
    if nbytes < _RECYCLE_MIN:
        return pa.allocate_buffer(nbytes)
    buf = _cache.get(nbytes)
    if buf is None:
        buf = pa.allocate_buffer(nbytes)
    view = np.frombuffer(buf, np.uint8)  # every array made over the buffer keeps this alive
    weakref.finalize(view, _cache.put, buf).atexit = False
    return view


def release_buffers() -> int:
    """Free the read buffers kept for reuse (buffers of tables and batches that were
    dropped, at most :data:`BUFFER_CACHE_BYTES`); returns the bytes freed."""
    return _cache.clear()


# ----------------------------------------------------------------------------------------
# the scan shared with pylog.spark and pylog.serve (pylog.columnar's, with pyarrow's allocator)
def scan_buffer(buf: Any, length: int, pos: int, expected: int, stop: int, buffer_next: int, gaps: bool,
                want: Collection[str], batch_rows: int | None, convert: Callable[[Columns], Any],
                batch_bytes: int = MAX_DATA) -> Generator[Any, None, tuple[int, int, int]]:
    """:func:`pylog.columnar.scan_buffer` with the columns in pyarrow's memory (see
    :func:`_alloc`)."""
    return (yield from columnar.scan_buffer(buf, length, pos, expected, stop, buffer_next, gaps, want,
                                            batch_rows, convert, batch_bytes, alloc=_alloc))


def _shrunk(data: np.ndarray, used: int) -> np.ndarray:
    """``data[:used]``; copied when that would keep most of a buffer (over 64 KiB of it)
    alive for nothing: a log without keys leaves its key buffers empty."""
    if len(data) - used > (64 << 10) and used < len(data) // 2:
        out = np.frombuffer(_alloc(used), np.uint8, count=used) if used else np.empty(0, np.uint8)
        out[:] = data[:used]
        return out
    return data[:used]


def binary_array(cols: Columns, name: str) -> pa.Array:
    """The Arrow binary array of one binary column of ``cols`` (no copy of the data, unless
    most of its buffer went unused)."""
    c = getattr(cols, name)
    n = cols.rows
    validity = pa.py_buffer(c.validity[: (n + 7) // 8]) if c.null_count else None
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(c.offsets[: n + 1]),
                                                  pa.py_buffer(_shrunk(c.data, c.used(n)))], c.null_count)


def int64_buffer(arr: np.ndarray, n: int) -> pa.Buffer:
    """An Arrow buffer over the first ``n`` int64s of ``arr`` (no copy)."""
    return pa.py_buffer(arr[:n])


def _record_batch(cols: Columns, names: Sequence[str]) -> pa.RecordBatch:
    n = cols.rows
    arrays = []
    for name in names:
        if name == "offset":
            assert cols.offsets is not None  # a column asked for is filled
            arrays.append(pa.Array.from_buffers(pa.int64(), n, [None, int64_buffer(cols.offsets, n)]))
        elif name == "timestamp":
            assert cols.timestamps is not None
            arrays.append(pa.Array.from_buffers(SCHEMA.field("timestamp").type, n,
                                                [None, int64_buffer(cols.timestamps, n)]))
        else:
            arrays.append(binary_array(cols, name))
    return pa.RecordBatch.from_arrays(arrays, schema=_schema(names))


def _schema(names: Sequence[str]) -> pa.Schema:
    return pa.schema([SCHEMA.field(n) for n in names])


def _names(columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        return list(COLUMNS)
    if isinstance(columns, str):
        raise ArgumentTypeError("columns must be a sequence of column names, not a str")
    names = list(columns)
    bad = [c for c in names if c not in COLUMNS]
    if bad:
        raise InvalidArgumentError(f"unknown columns {bad}: the columns are {list(COLUMNS)}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"columns {names} name a column twice")
    return names


# ----------------------------------------------------------------------------------------
# a Log's segments (pylog.columnar's)
_Part = columnar.Part
_segment_view = columnar.segment_view
_parts = columnar.parts


def _scan_part(p: _Part, names: list[str], batch_rows: int | None) -> Generator[pa.RecordBatch, None, None]:
    """Record batches of one part; raises CorruptRecordError (after the batches before it)."""
    yield from columnar.scan_part(p, names, batch_rows, lambda cols: _record_batch(cols, names), alloc=_alloc)


def _collect(p: _Part, names: list[str]) -> tuple[list[pa.RecordBatch], BaseException | None]:
    out: list[pa.RecordBatch] = []
    try:
        out.extend(_scan_part(p, names, None))
    except Exception as e:  # re-raised in order by read_table
        return out, e
    return out, None


def _batches(log: Any, start: int, stop: int, names: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    for p in _parts(log, start, stop, 1):
        yield from _scan_part(p, names, batch_rows)


def _threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, _MAX_THREADS))


def iter_batches(log: Any, start: int | None = None, stop: int | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS,
                 columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of the records of ``log`` in ``[start, stop)``, in offset order.

    ``start`` defaults to ``log.start_offset``, ``stop`` (exclusive) to ``log.next_offset``
    when called; ``batch_rows`` bounds the rows of a batch (a batch never spans two
    segments, so some are shorter); ``columns`` picks and orders columns of :data:`SCHEMA`
    (default: all). A compacted segment's removed offsets are simply absent.

    The bounds are checked when this is called; the records are read as the batches are
    taken, in the calling thread. Raises :class:`~pylog.errors.OffsetOutOfRangeError` for
    bounds outside the log and :class:`~pylog.errors.CorruptRecordError` at a frame that
    fails its CRC or checks, after yielding the batches before it.
    """
    names = _names(columns)
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise InvalidArgumentError(f"batch_rows={batch_rows!r} must be an int >= 1")
    start, stop = log._range(start, stop)
    return _batches(log, start, stop, names, batch_rows)


def read_table(log: Any, start: int | None = None, stop: int | None = None,
               columns: Sequence[str] | None = None, use_threads: bool = True) -> pa.Table:
    """The records of ``log`` in ``[start, stop)`` as one Arrow table.

    Same bounds and columns as :func:`iter_batches`. With ``use_threads`` (as in pyarrow's
    readers) segments, and parts of big segments, are scanned in parallel, one thread per
    CPU (at most 8), each taking the next part as it finishes one: the C scan runs without
    the GIL.
    The table has a chunk per part, so at least one per segment. A corrupt frame anywhere in the range raises
    :class:`~pylog.errors.CorruptRecordError` and no table is returned.
    """
    names = _names(columns)
    start, stop = log._range(start, stop)
    threads = _threads() if use_threads and impl.NAME == "native" else 1
    batches: list[pa.RecordBatch] = []

    def take(result: tuple[list[pa.RecordBatch], BaseException | None]) -> None:
        got, err = result
        if err is not None:
            raise err
        batches.extend(got)

    parts = _parts(log, start, stop, threads * _PARTS_PER_THREAD if threads > 1 else 1)
    if threads == 1:
        for p in parts:
            take(_collect(p, names))
    else:
        # a bounded window of parts in flight: their maps stay alive only while needed
        with ThreadPoolExecutor(threads) as ex:
            window: deque[Any] = deque()
            for p in parts:
                window.append(ex.submit(_collect, p, names))
                if len(window) > threads:
                    take(window.popleft().result())
            while window:
                take(window.popleft().result())
    return pa.Table.from_batches(batches, schema=_schema(names))
