"""One segment: a store file plus its offset index and time index.

* :class:`SealedSegment`: immutable. Its files are mapped read-only on first use and kept
  in the log's LRU (:mod:`pylog.cache`); record values are memoryviews over the map.
* :class:`ActiveSegment`: the one segment taking writes. Appends are framed by the C core
  into a user-space write buffer and handed to the OS in whole-buffer ``pwrite`` calls;
  its index entries live in memory (and are appended to the index files). Reads go through
  a read-only map of the written bytes, made anew when the file has grown.

This module is the one place that turns the C core's status codes into exceptions
(:func:`corrupt_error`).
"""
from __future__ import annotations

import errno
import gc
import os
import struct
from collections.abc import Iterable
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from pylog import fileutil, index, torn, vfs
from pylog import format as fmt
from pylog import store as store_mod
from pylog._backend import impl, speedups
from pylog.errors import CorruptRecordError, OffsetRemovedError
from pylog.record import Record, new_record

if TYPE_CHECKING:
    from pylog.cache import SegmentCache
    from pylog.config import LogConfig

    #: what a segment's _view() gives: (store map, index Buffer, index entries, time index Buffer)
    _View = tuple[store_mod.StoreMap, impl.Buffer | None, int, impl.Buffer | None]

_REASONS = {
    impl.E_SHORT: "torn frame: the file ends inside it",
    impl.E_CRC: "CRC32C mismatch",
    impl.E_LENGTH: "impossible length field",
    impl.E_OFFSET: "unexpected offset (offsets must be consecutive)",
    impl.E_ATTRIBUTES: "unknown attribute bits or inconsistent null flags",
    impl.E_ARG: "bad argument",
}
_TIX_TS = struct.Struct("<q")
_find = impl.find
#: (length, offset, timestamp, attributes, key_length, metadata_length) of a frame header
_HEAD = struct.Struct("<I4xQqIII").unpack_from
# the write-out's C path (Framer.write_out) is taken only while vfs.pwrite is this (a test's
# or a fault injector's replacement sees every write)
_os_pwrite = os.pwrite
_U64_MAX = (1 << 64) - 1
_SCAN_CHUNK = 4096
_sp = speedups
if _sp is not None:
    _sp.set_record_type(Record)


def _preallocate(store_path: str, config: LogConfig, end: int) -> None:
    """With ``preallocate=True``, reserve ``segment_bytes`` for a reopened active store.
    Best effort: a full disk (or a file system without fallocate) must not stop a log from
    opening, if only to read it or free space by retention; appends then grow the file."""
    if config.preallocate and vfs.posix_fallocate is not None:
        fd = vfs.open(store_path, os.O_RDWR)
        try:
            vfs.posix_fallocate(fd, 0, max(config.segment_bytes, end))
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        finally:
            vfs.close(fd)


def walker(base_offset: int, index_interval: int | None, gaps: bool = False) -> impl.Appender:
    """An appender that only walks an existing store from its first frame (recovery,
    verification, index rebuilds): no write buffer; with ``index_interval`` None it keeps
    no index entries."""
    i = (1 << 31) if index_interval is None else index_interval
    a = impl.Appender(base_offset, next_offset=base_offset, position=fmt.FILE_HEADER_SIZE,
                      max_position=fmt.MAX_SEGMENT_BYTES, max_timestamp=None, index_interval=i,
                      bytes_since_index=0 if index_interval is None else i,
                      index_cap=1 if index_interval is None else 64, buffer_bytes=0)
    a.gaps = gaps
    return a


def reason(rc: int) -> str:
    return _REASONS.get(rc, f"status {rc}")


def corrupt_error(path: str, position: int, offset: int | None, rc: int) -> CorruptRecordError:
    """The exception for a bad frame found by the C core."""
    return CorruptRecordError(path, position, offset, reason(rc))


class Damage(NamedTuple):
    """A bad region stepped over by :func:`walk`: bytes ``[position, end)`` of a store hold
    no valid frame, and the offsets ``[offset, end_offset)`` that should be there are lost
    (unreadable); the valid frame at ``end`` holds ``end_offset``. ``rc`` is why the frame at
    ``position`` is bad."""

    position: int
    end: int
    offset: int
    end_offset: int
    rc: int


def damage_error(path: str, d: Damage, offset: int | None = None) -> CorruptRecordError:
    """The CorruptRecordError of a damaged region, naming ``offset``, one of its offsets
    (default the first; None when the region lost no offset: junk between two frames)."""
    lost = (f"offset {d.offset} unreadable" if d.end_offset == d.offset + 1 else
            f"offsets {d.offset}..{d.end_offset - 1} unreadable" if d.end_offset > d.offset else
            "no offset lost")
    if offset is None and d.end_offset > d.offset:
        offset = d.offset
    return CorruptRecordError(path, d.position, offset,
                              f"{reason(d.rc)}; {lost} ({d.end - d.position} bytes), "
                              f"intact again from offset {d.end_offset} at position {d.end}")


def walk(app: impl.Appender, buf: impl.Buffer, length: int, base_offset: int, gaps: bool = False,
         search_end: int | None = None) -> tuple[int, list[Damage]]:
    """``app.recover`` over ``buf[:length]``, stepping over interior damage: at a bad frame,
    the walk goes on at the next whole, CRC-valid frame whose offset can follow it
    (:func:`impl.resync`), which gets an index entry. Returns ``(status, damage)``: status
    OK, or why the walk stopped at ``app.position`` with no valid frame after it (a torn
    tail), and the regions stepped over. ``search_end``: no frame starts after it (only
    zeros follow: a preallocated store's reserved space), so the search stops there."""
    damage: list[Damage] = []
    while True:
        rc, _n = app.recover(buf, length)
        if rc == impl.OK:
            return rc, damage
        pos, expected = app.position, app.next_offset
        rrc, f = impl.resync(buf, length, pos, expected, base_offset, gaps, search_end)
        if rrc != impl.OK:
            return rc, damage
        damage.append(Damage(pos, f[0], expected, f[1], rc))
        app.resume_at(f[0], f[1])


def paths(dirpath: str, base: int) -> tuple[str, str, str]:
    """(store, offset index, time index) paths of a segment."""
    return (
        os.path.join(dirpath, fmt.segment_name(base, fmt.STORE_SUFFIX)),
        os.path.join(dirpath, fmt.segment_name(base, fmt.INDEX_SUFFIX)),
        os.path.join(dirpath, fmt.segment_name(base, fmt.TIMEINDEX_SUFFIX)),
    )


def build_records(mv: memoryview, frames: np.ndarray, lazy: bool = False) -> Any:
    """Records for scanned frames, with zero-copy slices of ``mv`` (no per-record C call).

    A list, or with ``lazy`` an iterator that makes each Record as it is consumed. The
    collector is paused while the lists fill: thousands of new objects that all survive
    would set off young-generation collections over and over, none of which can free
    anything (measured: a scan runs 1.5x faster)."""
    if gc.isenabled():
        gc.disable()
        try:
            return _build_records(mv, frames, lazy)
        finally:
            gc.enable()
    return _build_records(mv, frames, lazy)


def _build_records(mv: memoryview, frames: np.ndarray, lazy: bool) -> Any:
    n = len(frames)
    if n == 0:
        return iter(()) if lazy else []
    # offsets are consecutive unless compaction removed some; timestamps are often all equal
    # (a batch append): then no list of ints is made for them
    offs = frames["offset"]
    first = int(offs[0])
    offsets: Iterable[Any] = range(first, first + n) if int(offs[-1]) - first == n - 1 else offs.tolist()
    ts = frames["timestamp"]
    stamps: Iterable[Any] = repeat(int(ts[0]), n) if ts.min() == ts.max() else ts.tolist()
    attrs = frames["attributes"]
    start = frames["position"] + fmt.FRAME_HEADER_SIZE
    klen = frames["key_length"].astype(np.uint64)
    mlen = frames["metadata_length"].astype(np.uint64)
    getitem = mv.__getitem__
    mstart = start + klen
    vstart = mstart + mlen
    vend = vstart + frames["value_length"]
    null_k = (attrs & fmt.ATTR_NULL_KEY) != 0
    null_m = (attrs & fmt.ATTR_NULL_METADATA) != 0
    null_v = (attrs & fmt.ATTR_NULL_VALUE) != 0
    plain = not null_v.any()
    # A comprehension slices about twice as fast as map(getitem, map(slice, ...)).
    values: Iterable[Any] = [mv[a:b] for a, b in zip(vstart.tolist(), vend.tolist())]
    if not plain:
        for i in np.flatnonzero(null_v).tolist():
            values[i] = None  # type: ignore[index]
    if null_k.all():
        keys: Iterable[Any] = repeat(None)
    else:
        keys = list(map(getitem, map(slice, start.tolist(), mstart.tolist())))
        for i in np.flatnonzero(null_k).tolist():
            keys[i] = None
    if null_m.all():
        metas: Iterable[Any] = repeat(None)
    else:
        metas = list(map(getitem, map(slice, mstart.tolist(), vstart.tolist())))
        for i in np.flatnonzero(null_m).tolist():
            metas[i] = None
    records = map(new_record, repeat(Record, n), zip(offsets, stamps, keys, values, metas))
    return records if lazy else list(records)


def record_at(mv: memoryview, pos: int, target: int) -> Record:
    """The Record of the CRC-checked frame at ``pos``, which must hold offset ``target``
    (a compacted segment may hand back the next record instead: OffsetRemovedError)."""
    body, off, ts, attrs, klen, mlen = _HEAD(mv, pos)
    if off != target:
        raise OffsetRemovedError(target)
    p = pos + fmt.FRAME_HEADER_SIZE
    end = pos + fmt.FRAME_PREFIX_SIZE + body
    if attrs == 3:  # the common record: no key, no metadata
        return new_record(Record, (off, ts, None, mv[p:end], None))
    key = None if attrs & 1 else mv[p : p + klen]
    p += klen
    meta = None if attrs & 2 else mv[p : p + mlen]
    value = None if attrs & 4 else mv[p + mlen : end]
    return new_record(Record, (off, ts, key, value, meta))


class _Reader:
    """What both kinds of segment share: finding, reading and scanning frames of a map."""

    __slots__ = ()
    base_offset: int
    store_path: str
    gaps: bool = False  # a compacted segment: offsets may skip

    # subclasses provide _view(): (StoreMap, index Buffer, n_index, timeindex Buffer)
    def _view(self, upto: int | None = None) -> _View:  # pragma: no cover - abstract
        raise NotImplementedError

    def _locate_slow(self, m: store_mod.StoreMap, target: int) -> tuple[Any, ...]:
        """Find ``target`` by a CRC-checked walk: the index was no help, or a frame on the
        way is bad. Damage before ``target`` is stepped over (:func:`impl.resync`); when
        ``target`` lies in damage, the CorruptRecordError names it and where the damage is."""
        pos, expected = self._slow_start(m, target)
        gaps = self.gaps
        while True:
            rc, frames, end = impl.scan(m.buf, m.length, pos, expected, _SCAN_CHUNK, _U64_MAX, gaps)
            for f in frames:
                if int(f["offset"]) == target or (gaps and int(f["offset"]) > target):
                    return tuple(f.tolist())
            if len(frames):
                expected = int(frames[-1]["offset"]) + 1
            pos = int(end)
            if rc == impl.OK:
                if pos >= m.length:  # the store ends before target
                    raise corrupt_error(self.store_path, pos, target, impl.E_SHORT)
                continue
            rrc, g = impl.resync(m.buf, m.length, pos, expected, self.base_offset, gaps)
            if rrc != impl.OK:  # nothing valid after the bad frame
                raise corrupt_error(self.store_path, pos, expected if expected <= target else target, rc)
            if target < g[1]:  # target lies in the damage
                d = Damage(pos, g[0], expected, g[1], rc)
                raise damage_error(self.store_path, d, target if target >= expected else None)
            pos, expected = g[0], g[1]

    def _slow_start(self, m: store_mod.StoreMap, target: int) -> tuple[int, int]:
        """(position, offset) of a CRC-valid frame at or before ``target`` to walk from: the
        nearest index entry's when its frame is valid and holds the offset the entry names,
        else the first frame."""
        _m, ibuf, n, _t = self._view(target)
        if ibuf is not None and n and target >= self.base_offset:
            slot = impl.index_lookup(ibuf, n, min(target - self.base_offset, 0xFFFFFFFF))
            if slot >= 0:
                rel, ipos = impl.index_entry(ibuf, slot)
                rc, f, _e = impl.scan(m.buf, m.length, ipos, self.base_offset + rel, 1, _U64_MAX, self.gaps)
                if len(f) and int(f["offset"][0]) == self.base_offset + rel:
                    return ipos, self.base_offset + rel
        return fmt.FILE_HEADER_SIZE, self.base_offset

    def find(self, target: int) -> tuple[store_mod.StoreMap, tuple[Any, ...]]:
        """(map, frame tuple) of the record at ``target`` (which must lie in this segment;
        in a compacted segment, the first record at or after it)."""
        m, ibuf, n, _ = self._view(target)
        rc, f = impl.find(m.buf, m.length, ibuf, n, self.base_offset, target, self.gaps)
        if rc:
            f = self._locate_slow(m, target)
        return m, f

    def read(self, target: int) -> Record:
        m, f = self.find(target)
        return record_at(m.mv, f[0], target)

    def read_batch(self, target: int, max_bytes: int, max_records: int) -> tuple[list[Record], int, int]:
        """Records from ``target``: ``(records, status, bad_position)``. ``status`` is OK, or
        why the scan stopped before the budget ran out (records before it are returned)."""
        m, f = self.find(target)
        if _sp is not None:
            recs, _n, _last, rc, end, _used, _first = _sp.scan(m.mv, m.addr, m.length, f[0], f[1], max_records,
                                                              max_bytes, self.gaps, False)
            return recs, rc, end
        rc, frames, end = impl.scan(m.buf, m.length, f[0], f[1], max_records, max_bytes, self.gaps)
        return build_records(m.mv, frames), rc, int(end)

    def find_time(self, ts: int) -> int | None:
        """First offset in this segment with timestamp >= ts, or None."""
        m, _, n, tbuf = self._view(None)
        rc, f = impl.find_time(m.buf, m.length, tbuf, n, ts)
        if rc == impl.E_NOT_FOUND:
            return None
        if rc:
            raise corrupt_error(self.store_path, fmt.FILE_HEADER_SIZE, None, rc)
        off: int = f[1]
        return off

    def damage(self) -> list[Damage]:
        """The bad regions of the store, the last one a torn tail (``end`` = the store's
        length, ``end_offset`` = ``offset``) when bad bytes end it."""
        m, *_ = self._view(None)
        a = walker(self.base_offset, None, self.gaps)
        rc, found = walk(a, m.buf, m.length, self.base_offset, self.gaps)
        if rc != impl.OK:
            found.append(Damage(a.position, m.length, a.next_offset, a.next_offset, rc))
        return found

    def verify(self, expected_next: int | None) -> list[CorruptRecordError]:
        """CRC-check every frame of the segment: the file header's own check, then one
        error per damaged region stepped over (:func:`walk`) and one for bad bytes at the end
        with no valid frame after them. A last segment (``expected_next`` None) shorter than
        a file header is a roll begun or torn by a crash: no record, no damage."""
        m, *_ = self._view(None)
        if expected_next is None and m.length < fmt.FILE_HEADER_SIZE:
            return []
        bad: list[CorruptRecordError] = []
        rc, hbase, hflags = impl.header_check(m.mv[: fmt.FILE_HEADER_SIZE], fmt.STORE_MAGIC)
        if rc != impl.OK or hbase != self.base_offset or bool(hflags & fmt.HEADER_COMPACTED) != self.gaps:
            why = reason(rc) if rc != impl.OK else f"header names base offset {hbase}, flags {hflags}"
            bad.append(CorruptRecordError(self.store_path, 0, None, f"bad file header: {why}"))
        a = walker(self.base_offset, None, self.gaps)
        rc, damage = walk(a, m.buf, m.length, self.base_offset, self.gaps)
        bad += [damage_error(self.store_path, d) for d in damage]
        if rc != impl.OK:
            return bad + [corrupt_error(self.store_path, a.position, a.next_offset, rc)]
        if expected_next is not None and (
                a.next_offset > expected_next or (not self.gaps and a.next_offset != expected_next)):
            why = f"segment ends at offset {a.next_offset}, the next one starts at {expected_next}"
            return bad + [CorruptRecordError(self.store_path, a.position, a.next_offset, why)]
        return bad


class _SealedMaps:
    __slots__ = ("store", "index", "timeindex", "mv", "locate", "fast_read")

    def __init__(self, store: store_mod.StoreMap, idx: index.MappedIndex, tidx: index.MappedIndex,
                 base_offset: int, gaps: bool, count: int = 0) -> None:
        self.store = store
        self.index = idx
        self.timeindex = tidx
        self.mv = store.mv
        #: locate(offset) -> position of its CRC-checked frame, or a negative status
        self.locate = impl.locator(store.buf, store.length, idx.buf, idx.n, base_offset, gaps)
        #: fast_read(offset) -> the Record (index lookup, CRC-checked frame and Record in one
        #: C call), or None: the checked slow path finds out why. None without pylog._speedups.
        self.fast_read: Any = None
        if _sp is not None:  # keeps the maps C reads (store, idx) as long as the reader
            self.fast_read = _sp.Reader(store.mv, store.addr, store.length, idx.buf.addr, idx.n, base_offset, gaps,
                                        (store, idx), count).read


class SealedSegment(_Reader):
    """An immutable segment: ``[base_offset, next_offset)`` in ``size`` bytes of store."""

    __slots__ = ("dir", "base_offset", "next_offset", "_size", "store_path", "index_interval",
                 "_maps", "_cache", "gaps", "readonly", "ino")

    def __init__(self, dirpath: str, base_offset: int, next_offset: int, size: int | None,
                 index_interval: int, cache: SegmentCache, readonly: bool = False) -> None:
        self.dir = dirpath
        #: a read-only log's segment: a rebuilt index stays in memory, no file is written
        self.readonly = readonly
        self.base_offset = base_offset
        self.next_offset = next_offset
        self._size = size  # None: stat the store file when first asked
        self.store_path = os.path.join(dirpath, fmt.segment_name(base_offset, fmt.STORE_SUFFIX))
        self.index_interval = index_interval
        self._maps: _SealedMaps | None = None
        self._cache = cache
        self.gaps = False  # learnt from the store header when mapped
        #: the inode of the store file the maps are of (None until mapped): a read-only log
        #: tells by it that another process replaced the file (a truncate, see Log.refresh)
        self.ino: int | None = None

    def __repr__(self) -> str:
        return f"<SealedSegment [{self.base_offset}, {self.next_offset}) {self.size} B>"

    @property
    def size(self) -> int:
        """Bytes of the store file (once another process deleted it, as retention does:
        what this reader maps of it, else 0)."""
        s = self._size
        if s is None:
            try:
                s = self._size = os.path.getsize(self.store_path)
            except FileNotFoundError:  # deleted since the listing that found it
                m = self._maps
                return m.store.length if m is not None else 0
        return s

    @size.setter
    def size(self, value: int) -> None:
        self._size = value

    @property
    def is_mapped(self) -> bool:
        return self._maps is not None

    def maps(self) -> _SealedMaps:
        m = self._maps
        if m is None:
            return self._open()
        self._cache.touch(self)
        return m

    def _view(self, upto: int | None = None) -> _View:
        m = self._maps
        if m is None:
            m = self._open()
        else:
            self._cache.touch(self)
        return m.store, m.index.buf, m.index.n, m.timeindex.buf

    def read(self, target: int) -> Record:
        m = self._maps
        if m is None:
            m = self._open()
        else:
            self._cache.touch(self)
        fast = m.fast_read
        if fast is not None:
            r: Record | None = fast(target)
            if r is not None:
                return r
        pos = m.locate(target)
        if pos < 0:  # the index was no help, or the frame is bad: the checked slow walk
            pos = self._locate_slow(m.store, target)[0]
        return record_at(m.mv, pos, target)

    def _open(self) -> _SealedMaps:
        sp, ip, tp = paths(self.dir, self.base_offset)
        fd = vfs.open(sp, os.O_RDONLY)
        try:
            fst = os.fstat(fd)
            st = store_mod.StoreMap(fd, fst.st_size)
        finally:
            vfs.close(fd)
        self.ino = fst.st_ino
        rc, _base, flags = impl.header_check(st.mv[: fmt.FILE_HEADER_SIZE], fmt.STORE_MAGIC)
        self.gaps = bool(rc == impl.OK and flags & fmt.HEADER_COMPACTED)
        idx = index.open_mapped(ip, fmt.INDEX_SUFFIX, self.base_offset, st.length)
        tidx = index.open_mapped(tp, fmt.TIMEINDEX_SUFFIX, self.base_offset, st.length)
        if (idx is None or tidx is None or idx.n != tidx.n or (st.length > fmt.FILE_HEADER_SIZE and idx.n == 0)
                or not index.agree(idx.array, tidx.array, self.next_offset - self.base_offset)):
            idx, tidx = self._rebuild_index(st)
        m = _SealedMaps(st, idx, tidx, self.base_offset, self.gaps, self.next_offset - self.base_offset)
        self._maps = m
        self._cache.add(self)
        return m

    def _rebuild_index(self, st: store_mod.StoreMap) -> tuple[index.MappedIndex, index.MappedIndex]:
        """Rebuild both index files from the store (they are hints), atomically; for a
        read-only log, in memory only (nothing is written)."""
        a = walker(self.base_offset, self.index_interval, self.gaps)
        walk(a, st.buf, st.length, self.base_offset, self.gaps)  # entries after damage too
        n = a.index_count
        if self.readonly:
            return (index.in_memory(fmt.INDEX_SUFFIX, self.base_offset, a.index_bytes(0, n)),
                    index.in_memory(fmt.TIMEINDEX_SUFFIX, self.base_offset, a.timeindex_bytes(0, n)))
        sp, ip, tp = paths(self.dir, self.base_offset)
        index.write(ip, fmt.INDEX_SUFFIX, self.base_offset, a.index_bytes(0, n))
        index.write(tp, fmt.TIMEINDEX_SUFFIX, self.base_offset, a.timeindex_bytes(0, n))
        idx = index.open_mapped(ip, fmt.INDEX_SUFFIX, self.base_offset, st.length)
        tidx = index.open_mapped(tp, fmt.TIMEINDEX_SUFFIX, self.base_offset, st.length)
        assert idx is not None and tidx is not None
        return idx, tidx

    def unmap(self) -> None:
        """Drop this segment's maps. Never unmaps under a live view or a running C call:
        the maps go when their last reference does."""
        self._maps = None

    def first_timestamp(self) -> int | None:
        m = self.maps()
        if m.timeindex.n == 0:
            return None
        return int(m.timeindex.array[0]["timestamp"])

    def last_timestamp(self) -> int | None:
        """Timestamp of the segment's last record (its largest: timestamps never decrease)."""
        if self.next_offset == self.base_offset:
            return None
        _m, f = self.find(self.next_offset - 1)
        ts: int = f[2]
        return ts

    def index_array(self) -> np.ndarray:
        """The offset index as a read-only numpy structured array (a view of the map)."""
        return self.maps().index.array

    def timeindex_array(self) -> np.ndarray:
        """The time index as a read-only numpy structured array (a view of the map)."""
        return self.maps().timeindex.array


class ActiveSegment(_Reader):
    """The segment taking appends.

    ``written`` bytes of the store file are with the OS; the appender's write buffer holds
    framed records after them. ``app.next_offset`` counts both; ``written_next`` only the
    written ones.
    """

    __slots__ = ("dir", "base_offset", "store_path", "index_path", "timeindex_path", "app",
                 "store_fd", "index_fd", "timeindex_fd", "written", "written_next",
                 "index_written", "_map", "preallocated", "broken")

    def __init__(self, dirpath: str, base_offset: int, app: impl.Appender, written: int, index_written: int,
                 preallocated: bool = False) -> None:
        self.dir = dirpath
        self.base_offset = base_offset
        self.store_path, self.index_path, self.timeindex_path = paths(dirpath, base_offset)
        self.app = app
        self.written = written
        self.written_next = app.next_offset
        self.index_written = index_written
        self.preallocated = preallocated
        #: set when a write or fsync failed (the log is fenced): what was framed but not
        #: written is dropped from view, and reads never retry the write
        self.broken = False
        self._map: store_mod.StoreMap | None = None
        self.store_fd = vfs.open(self.store_path, os.O_RDWR)
        try:
            self.index_fd = vfs.open(self.index_path, os.O_RDWR)
            self.timeindex_fd = vfs.open(self.timeindex_path, os.O_RDWR)
        except BaseException:
            vfs.close(self.store_fd)
            raise

    def __repr__(self) -> str:
        return f"<ActiveSegment [{self.base_offset}, {self.app.next_offset}) {self.app.position} B>"

    # -- construction ----------------------------------------------------------------------
    @staticmethod
    def _appender(base: int, config: LogConfig, *, next_offset: int, position: int, max_ts: int | None,
                  bytes_since: int) -> impl.Appender:
        return impl.Appender(
            base, next_offset=next_offset, position=position, max_position=config.segment_bytes,
            max_timestamp=max_ts, index_interval=config.index_interval_bytes,
            bytes_since_index=bytes_since, index_cap=min(64, config.index_max_entries),
            buffer_bytes=config.write_buffer_bytes, as_given=config.timestamps == "as-given",
        )

    @classmethod
    def create(cls, dirpath: str, base: int, config: LogConfig) -> ActiveSegment:
        """New, empty segment files (the caller fsyncs the directory)."""
        sp, ip, tp = paths(dirpath, base)
        for p, suffix in ((ip, fmt.INDEX_SUFFIX), (tp, fmt.TIMEINDEX_SUFFIX)):
            vfs.close(index.create(p, suffix, base))
        fd = store_mod.create(sp, base, config.segment_bytes if config.preallocate else 0)
        try:
            vfs.fsync(fd)
        finally:
            vfs.close(fd)
        app = cls._appender(base, config, next_offset=base, position=fmt.FILE_HEADER_SIZE,
                            max_ts=None, bytes_since=config.index_interval_bytes)
        return cls(dirpath, base, app, fmt.FILE_HEADER_SIZE, 0, preallocated=config.preallocate)

    @classmethod
    def open_clean(cls, dirpath: str, base: int, config: LogConfig, *, next_offset: int, size: int,
                   max_timestamp: int | None) -> ActiveSegment | None:
        """Reopen after a clean shutdown from the index files alone (no record data read).
        None when the index files do not fit the recorded state (the caller recovers)."""
        sp, ip, tp = paths(dirpath, base)
        ib = index.read_entries(ip, fmt.INDEX_SUFFIX, base)
        tb = index.read_entries(tp, fmt.TIMEINDEX_SUFFIX, base)
        if ib is None or tb is None:
            return None
        n = len(ib) // fmt.INDEX_ENTRY_SIZE
        if len(tb) // fmt.TIMEINDEX_ENTRY_SIZE != n or (n == 0) != (next_offset == base):
            return None
        if n and not (index.check(fmt.INDEX_SUFFIX, impl.Buffer(ib), n, size)
                      and index.check(fmt.TIMEINDEX_SUFFIX, impl.Buffer(tb), n, size)):
            return None
        if n and not index.agree(np.frombuffer(ib, fmt.INDEX_DTYPE), np.frombuffer(tb, fmt.TIMEINDEX_DTYPE),
                                 next_offset - base):
            return None
        if n:
            # The recorded next_offset must fit the index: the records from the last indexed
            # one on (at least one) each take at least a frame header of the bytes after it.
            last_rel, last_pos = struct.unpack_from("<II", ib, len(ib) - fmt.INDEX_ENTRY_SIZE)
            after = next_offset - base - last_rel
            if not 1 <= after <= (size - last_pos) // fmt.FRAME_HEADER_SIZE:
                return None
            last_ts = struct.unpack_from("<q", tb, len(tb) - fmt.TIMEINDEX_ENTRY_SIZE)[0]
            if max_timestamp is None or max_timestamp < last_ts:
                return None
        elif size != fmt.FILE_HEADER_SIZE:
            return None
        last_pos = struct.unpack_from("<I", ib, len(ib) - 4)[0] if n else None
        app = cls._appender(
            base, config, next_offset=next_offset, position=size, max_ts=max_timestamp,
            bytes_since=(size - last_pos) if last_pos is not None else config.index_interval_bytes,
        )
        app.load_index(ib, tb, config.index_max_entries)
        _preallocate(sp, config, size)
        return cls(dirpath, base, app, size, n, preallocated=config.preallocate)

    @classmethod
    def recover(cls, dirpath: str, base: int, config: LogConfig, *, save_broken: bool = True,
                reserved: bool | None = None, durable: int | None = None) -> tuple[ActiveSegment, int, list[Damage]]:
        """Reopen by walking every frame (CRC-checked) and rebuild both indexes. Damage with a
        whole, valid frame of a following offset after it is stepped over and kept (indexes
        rebuilt around it); a torn tail (no valid frame after it) is cut, saved to ``.broken``,
        and so is, past ``durable`` (offsets below it known durable), all from a bad frame on
        and an unfinished write unit (:func:`pylog.torn.walk_active`). Returns (segment, bytes
        cut, damage kept). ``reserved`` (default: ``preallocate``): the store was written with
        ``preallocate=True``: the zeros of its reserved space at the end are then cut but not
        counted (nor saved), also when the log is now reopened without preallocation."""
        reserved = config.preallocate if reserved is None else reserved
        sp, ip, tp = paths(dirpath, base)
        fd = vfs.open(sp, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, fmt.FILE_HEADER_SIZE, 0)
            rc, hbase, hflags = impl.header_check(head, fmt.STORE_MAGIC)
            if rc != impl.OK or hbase != base:
                # torn at creation (or a bad header): the name is the truth
                fileutil.pwrite_all(fd, impl.header_encode(fmt.STORE_MAGIC, base), 0)
                size = max(size, fmt.FILE_HEADER_SIZE)
            st = store_mod.StoreMap(fd, size)
        finally:
            vfs.close(fd)
        new_app = partial(cls._appender, base, config, next_offset=base, position=fmt.FILE_HEADER_SIZE,
                          max_ts=None, bytes_since=config.index_interval_bytes)
        data_end = None
        if reserved and size > fmt.FILE_HEADER_SIZE:
            # the reserved space's zeros start no frame: the search for one after a bad
            # frame stops where they begin (SEEK_DATA), not at the end of the reservation
            fd = vfs.open(sp, os.O_RDONLY)
            try:
                data_end = fileutil.data_end(fd, fmt.FILE_HEADER_SIZE, size)
            finally:
                vfs.close(fd)
        app, damage = torn.walk_active(new_app, walk, st.buf, st.length, base, durable, data_end)
        end = app.position
        cut = size - end
        if cut and reserved:
            # the zeros of space preallocated and never written are not torn bytes
            fd = vfs.open(sp, os.O_RDONLY)
            try:
                cut = fileutil.data_end(fd, end, size) - end
            finally:
                vfs.close(fd)
        if size > end:
            if cut and save_broken:
                with open(sp + fmt.BROKEN_SUFFIX, "wb") as f:
                    f.write(st.mv[end : end + min(cut, 16 << 20)])
            del st
            fileutil.shrink_file(sp, end, copy=False)
        else:
            del st
        n = app.index_count
        index.write(ip, fmt.INDEX_SUFFIX, base, app.index_bytes(0, n))
        index.write(tp, fmt.TIMEINDEX_SUFFIX, base, app.timeindex_bytes(0, n))
        _preallocate(sp, config, end)
        seg = cls(dirpath, base, app, end, n, preallocated=config.preallocate)
        return seg, cut, damage

    # -- state ---------------------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        return self.written_next if self.broken else self.app.next_offset

    @property
    def size(self) -> int:
        return self.written if self.broken else self.app.position

    def first_timestamp(self) -> int | None:
        if self.app.index_count == 0:
            return None
        ts: int = _TIX_TS.unpack(self.app.timeindex_bytes(0, 1)[:8])[0]
        return ts

    # -- writing --------------------------------------------------------------------------
    def write_pending(self) -> None:
        """Hand the write buffer and new index entries to the OS (no fsync)."""
        app = self.app
        fr = getattr(app, "_framer", None)
        if fr is not None and vfs.pwrite is _os_pwrite and fr.write_out(self.store_fd):
            pass  # pylog._speedups: pwrite and drain in one C call, the same way as below
        elif app.used:
            # Where the buffer goes is derived from the appender (its first frame sits at
            # position - used), so a write-out interrupted at any step (a signal handler's
            # exception) and done again, even after more frames joined the buffer, writes
            # the same bytes to the same place, and a written buffer only once counted.
            fileutil.pwrite_all(self.store_fd, app.pending(), app.position - app.used)
            app.drain()
        self.written = app.position
        self.written_next = app.next_offset
        c = app.index_count
        if c > self.index_written:
            h = fmt.FILE_HEADER_SIZE
            fileutil.pwrite_all(self.index_fd, app.index_bytes(self.index_written, c),
                                h + self.index_written * fmt.INDEX_ENTRY_SIZE)
            fileutil.pwrite_all(self.timeindex_fd, app.timeindex_bytes(self.index_written, c),
                                h + self.index_written * fmt.TIMEINDEX_ENTRY_SIZE)
            self.index_written = c

    def write_direct(self, data: bytes | bytearray | memoryview, at: int) -> None:
        """Write frames made outside the write buffer (framed in place, the write buffer
        empty) at store position ``at``, where the appender put the first of them. Their
        index entries go out with the next ``write_pending``. Safe to call again."""
        fileutil.pwrite_all(self.store_fd, data, at)
        self.wrote_direct(at + len(data))

    def wrote_direct(self, end: int) -> None:
        """Frames made outside the write buffer were written, up to store position ``end``
        (the appender's position: the write buffer is empty)."""
        self.written = end
        self.written_next = self.app.next_offset

    def sync(self, *, indexes: bool = False) -> None:
        """fdatasync the store (and the index files). A failure raises the OSError with the
        file's path as its ``filename``, so the message says which file failed."""
        syncs = [(self.store_fd, self.store_path)]
        if indexes:
            syncs += [(self.index_fd, self.index_path), (self.timeindex_fd, self.timeindex_path)]
        for fd, path in syncs:
            try:
                vfs.fdatasync(fd)
            except OSError as e:
                if e.filename is not None:
                    raise
                raise OSError(e.errno, e.strerror, path) from None

    def seal(self, config: LogConfig, cache: SegmentCache) -> SealedSegment:
        """Write out, fsync and close: the segment becomes a SealedSegment."""
        self.write_pending()
        if self.preallocated and os.fstat(self.store_fd).st_size != self.written:
            vfs.ftruncate(self.store_fd, self.written)
        self.sync(indexes=True)
        self.close_files()
        return SealedSegment(self.dir, self.base_offset, self.app.next_offset, self.written,
                             config.index_interval_bytes, cache)

    def close_files(self) -> None:
        for fd in (self.store_fd, self.index_fd, self.timeindex_fd):
            try:
                vfs.close(fd)
            except OSError:
                pass
        self.store_fd = self.index_fd = self.timeindex_fd = -1
        self._map = None

    # -- reading ---------------------------------------------------------------------------
    def _view(self, upto: int | None = None) -> tuple[store_mod.StoreMap, impl.Buffer, int, impl.Buffer]:
        if not self.broken and (upto is None or upto >= self.written_next):
            self.write_pending()
        m = self._map
        if m is None or m.length < self.written:
            if self.store_fd >= 0:
                m = store_mod.StoreMap(self.store_fd, self.written)
            else:  # files closed by a roll that then failed: map through a read-only fd
                fd = vfs.open(self.store_path, os.O_RDONLY)
                try:
                    m = store_mod.StoreMap(fd, self.written)
                finally:
                    vfs.close(fd)
            self._map = m
        app = self.app
        return m, app.index_view(), app.index_count, app.timeindex_view()

    def read(self, target: int) -> Record:
        """The record at ``target`` (the caller holds the log lock)."""
        m = self._map
        if target >= self.written_next or m is None or m.length < self.written:
            m, ibuf, n, _ = self._view(target)
        else:
            app = self.app
            ibuf, n = app.index_view(), app.index_count
        if _sp is not None:
            r: Record | None = _sp.read(m.mv, m.addr, m.length, ibuf.addr, n, self.base_offset, False, target)
            if r is not None:
                return r
        rc, f = _find(m.buf, m.length, ibuf, n, self.base_offset, target, False)
        if rc:
            f = self._locate_slow(m, target)
        return record_at(m.mv, f[0], target)
