"""Reads: by offset, in batches, scans, lookups by timestamp, verify.

Split out of pylog/log.py; :class:`pylog.log.Log` inherits :class:`LogReading`.
"""
from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from itertools import chain
from typing import Any

import numpy as np

from pylog import format as fmt
from pylog._backend import impl, speedups
from pylog.errors import (
    ArgumentTypeError,
    CorruptRecordError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    OffsetRemovedError,
)
from pylog.logstate import LogState
from pylog.record import Record
from pylog.segment import SealedSegment, corrupt_error

_sp = speedups  # pylog._speedups, or None (the pure backend; not built)

_bisect_right = bisect.bisect_right

#: _segment_batch status: a compacted segment holds nothing at or after the offset asked
#: for; the fetch continues at the segment's next_offset.
_GAP_END = -1000


def _past_last(seg: Any, offset: int) -> bool:
    """Whether ``offset`` lies after the last record kept in compacted segment ``seg``."""
    if not seg.gaps:
        return False
    m, ibuf, n, _ = seg._view(offset)
    rc, _f = impl.find(m.buf, m.length, ibuf, n, seg.base_offset, offset, True)
    return rc == impl.E_NOT_FOUND


#: (store path, next offset, inode) of a sealed segment -> its largest timestamp
_MAX_TS: dict[tuple[str, int, int | None], int | None] = {}


def _max_timestamp(seg: SealedSegment) -> int | None:
    """A sealed segment's largest timestamp (None when empty), compacted segments too: the
    time index's last entry holds the largest up to its record (the running maximum), and
    the frames after it are scanned. With timestamps that never decrease it is the last
    record's. Remembered per segment file (a sealed segment does not change; compaction
    writes a new file, a new inode), so a search over many segments maps none twice."""
    if seg.ino is not None and (seg.store_path, seg.next_offset, seg.ino) in _MAX_TS:
        return _MAX_TS[(seg.store_path, seg.next_offset, seg.ino)]
    m = seg.maps()  # also learns seg.gaps and seg.ino
    key = (seg.store_path, seg.next_offset, seg.ino)
    t = m.timeindex
    pos = int(t.array[-1]["position"]) if t.n else fmt.FILE_HEADER_SIZE
    top = int(t.array[-1]["timestamp"]) if t.n else None
    while True:
        _rc, frames, end = impl.scan(m.store.buf, m.store.length, pos, None, 4096, (1 << 64) - 1, True)
        if not len(frames):
            break
        most = int(frames["timestamp"].max())
        top = most if top is None else max(top, most)
        pos = int(end)
    if len(_MAX_TS) >= 1 << 16:
        _MAX_TS.clear()
    _MAX_TS[key] = top
    return top


def _check_offset(offset: Any, what: str = "offset") -> int:
    if type(offset) is not int:
        if isinstance(offset, (int, np.integer)) and not isinstance(offset, bool):
            return int(offset)
        raise ArgumentTypeError(f"{what} must be an int, got {type(offset).__name__}")
    return offset


class LogReading(LogState):
    """The read side of a Log.

    Read by offset, read_batch, scan, lookup by timestamp, verify.

    Mixed into :class:`pylog.log.Log`, which sets up the state. The state it uses, and the
    methods of the other parts it calls, are declared with their types in
    :class:`pylog.logstate.LogState`.
    """

    # ------------------------------------------------------------------------------------
    # reading
    def _out_of_range(self, offset: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(offset, self.start_offset, self.stable_offset)

    def _sealed_for(self, offset: int) -> SealedSegment | None:
        i = bisect.bisect_right(self._sealed_bases, offset) - 1
        return self._sealed[i] if i >= 0 else None

    def read(self, offset: int) -> Record:
        """The record at ``offset``.

        Raises
        ------
        OffsetOutOfRangeError
            ``offset`` is below ``start_offset`` or at/after ``next_offset``.
        CorruptRecordError
            The record's frame fails its CRC (its bytes are never returned).
        """
        if type(offset) is not int:
            offset = _check_offset(offset)
        if offset < self._start_mark and not self._closed:  # below delete_records' start
            raise self._out_of_range(offset)
        if self._cap is not None and offset >= self._cap and not self._closed:
            if self.readonly:
                self.refresh()
            if self._cap is not None and offset >= self._cap:
                raise self._out_of_range(offset)
        bases = self._sealed_bases
        if bases and offset < self._active.base_offset and not self._closed:
            i = _bisect_right(bases, offset) - 1
            if i >= 0:
                try:
                    seg = self._sealed[i]
                    # the list may have changed since `bases` was read (retention, truncate)
                    if seg.base_offset <= offset < seg.next_offset:
                        m = seg._maps
                        if m is not None and m.fast_read is not None:
                            # pylog._speedups: one C call (no frame for seg.read)
                            r: Record | None = m.fast_read(offset)
                            if r is not None:
                                try:
                                    seg._cache.touch_key(seg.base_offset)
                                except KeyError:  # evicted meanwhile: nothing to mark
                                    pass
                                return r
                        return seg.read(offset)
                except FileNotFoundError:  # retention removed it meanwhile
                    raise self._out_of_range(offset) from None
                except OffsetOutOfRangeError:
                    raise
                except CorruptRecordError:
                    if _past_last(seg, offset):  # compaction removed the segment's last records
                        raise OffsetRemovedError(offset) from None
                    raise
                except IndexError:  # the list shrank under us: take the slow path
                    pass
            if offset < self.start_offset:
                raise self._out_of_range(offset)
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            active = self._active
            if offset >= active.base_offset:
                if offset >= active.next_offset:
                    if self.readonly:
                        self.refresh()
                        if offset < self._active.next_offset and (self._cap is None or offset < self._cap):
                            act = self._active
                            return act.read(offset) if offset >= act.base_offset else self.read(offset)
                    raise self._out_of_range(offset)
                return active.read(offset)
        sealed = self._sealed_for(offset)
        if sealed is None or offset < sealed.base_offset:
            raise self._out_of_range(offset)
        try:
            return sealed.read(offset)
        except FileNotFoundError:
            raise self._out_of_range(offset) from None
        except CorruptRecordError:
            if _past_last(sealed, offset):
                raise OffsetRemovedError(offset) from None
            raise

    def read_batch(self, offset: int, max_bytes: int = 1 << 20, max_records: int | None = None) -> list[Record]:
        """Records from ``offset`` on (a fetch): at least one record when ``offset`` is below
        ``next_offset`` (even if it alone is larger than ``max_bytes``), then as many as fit
        in ``max_bytes`` of frames and ``max_records``. ``[]`` at ``next_offset``.
        """
        offset = _check_offset(offset)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise ArgumentTypeError(f"max_bytes must be an int, got {type(max_bytes).__name__}")
        if max_bytes < 0:
            raise InvalidArgumentError(f"max_bytes={max_bytes} must be >= 0")
        if max_records is not None:
            if isinstance(max_records, bool) or not isinstance(max_records, int):
                raise ArgumentTypeError(f"max_records must be an int or None, got {type(max_records).__name__}")
            if max_records < 1:
                raise InvalidArgumentError(f"max_records={max_records} must be >= 1")
        self._check_open()
        if self.readonly and (offset >= self.stable_offset or self._active.replaced()):  # type: ignore[attr-defined]
            self.refresh()  # past the end, or a truncate elsewhere: the records known here may be gone
        if offset < self._start_mark:  # below delete_records' start
            raise self._out_of_range(offset)
        end = self._cap  # records at or after the last stable offset are not returned
        if end is not None and offset >= end:
            if offset > self.next_offset:
                raise self._out_of_range(offset)
            return []
        out: list[Record] = []
        left = max_records if max_records is not None else 1 << 62
        if end is not None:
            left = min(left, end - offset)
        budget = max_bytes
        while left > 0:
            recs, rc, bad, used = self._read_segment(offset, budget, left, bool(out))
            if rc == _GAP_END:  # nothing left in a compacted segment: on to the next one
                offset = bad
                if offset >= self._active.next_offset:
                    break
                continue
            if recs:
                out.extend(recs)
                offset = recs[-1][0] + 1  # compacted segments skip offsets
                left -= len(recs)
                budget -= used
            if rc != impl.OK:
                if not out:
                    seg = self._sealed_for(offset)
                    path = seg.store_path if seg is not None and offset < seg.next_offset else self._active.store_path
                    raise corrupt_error(path, bad, offset, rc)
                break
            if not recs or budget <= 0 or offset >= self._active.next_offset:
                break
        if end is not None and out and out[-1][0] >= end:  # compacted segments skip offsets
            out = [r for r in out if r[0] < end]
        return out

    def _read_segment(self, offset: int, budget: int, left: int, have: bool,
                      lazy: bool = False) -> tuple[Any, int, int, int]:
        """One segment's part of a fetch: (records, status, bad position, bytes used).
        With ``lazy``, records is ``(iterator, count, last offset)``."""
        active = self._active
        if offset >= active.base_offset or self._q:
            with self._lock:
                if self._q:
                    self._drain_locked()
                active = self._active
                if offset >= active.base_offset:
                    if offset > active.next_offset or (offset == active.next_offset and not have):
                        if offset == active.next_offset:
                            return ((iter(()), 0, offset - 1) if lazy else []), impl.OK, 0, 0
                        raise self._out_of_range(offset)
                    if offset == active.next_offset:
                        return ((iter(()), 0, offset - 1) if lazy else []), impl.OK, 0, 0
                    return self._segment_batch(active, offset, budget, left, have, lazy)
        seg = self._sealed_for(offset)
        if seg is None or offset < seg.base_offset:
            raise self._out_of_range(offset)
        try:
            return self._segment_batch(seg, offset, budget, left, have, lazy)
        except FileNotFoundError:
            raise self._out_of_range(offset) from None

    @staticmethod
    def _segment_batch(seg: Any, offset: int, budget: int, left: int, have: bool,
                       lazy: bool = False) -> tuple[Any, int, int, int]:
        try:
            m, f = seg.find(offset)
        except CorruptRecordError:
            if _past_last(seg, offset):
                return ((iter(()), 0, offset - 1) if lazy else []), _GAP_END, seg.next_offset, 0
            raise
        n = min(left, seg.next_offset - offset)
        if _sp is not None:  # the scan and its Records in one C call
            recs, count, last, rc, end, used, first = _sp.scan(m.mv, m.addr, m.length, f[0], f[1], n,
                                                               max(budget, 0), seg.gaps, lazy)
            if have and count and first > budget:
                return [], impl.OK, 0, 0
            if lazy:
                return (recs, count, last if count else offset - 1), rc, end, used
            return recs, rc, end, used
        rc, frames, end = impl.scan(m.buf, m.length, f[0], f[1], n, max(budget, 0), seg.gaps)
        if have and len(frames) and int(frames[0]["frame_size"]) > budget:
            return [], impl.OK, 0, 0
        from pylog.segment import build_records

        used = int(frames["frame_size"].sum()) if len(frames) else 0
        if lazy:
            last = int(frames["offset"][-1]) if len(frames) else offset - 1
            return (build_records(m.mv, frames, lazy=True), len(frames), last), rc, int(end), used
        return build_records(m.mv, frames), rc, int(end), used

    def scan(self, start: int | None = None, stop: int | None = None) -> Iterator[Record]:
        """Iterate records from ``start`` (default ``start_offset``) up to ``stop``
        (exclusive; default the ``next_offset`` when iteration starts)."""
        start, stop = self._range(start, stop)
        # The records of each chunk come from a C-level iterator (map over zip): chaining
        # them, rather than re-yielding each record from a generator, keeps the Python frame
        # out of the per-record path.
        return chain.from_iterable(self._scan_chunks(start, stop))

    def _range(self, start: int | None, stop: int | None) -> tuple[int, int]:
        """Checked ``[start, stop)`` of a read (defaults: ``start_offset``, ``next_offset``):
        ValueError when start is after stop, OffsetOutOfRangeError outside the log."""
        self._check_open()
        if self.readonly and self._active.replaced():  # type: ignore[attr-defined]
            self.refresh()  # a truncate elsewhere: the records known here may be gone
        first, nxt = self.start_offset, self.stable_offset
        start = first if start is None else _check_offset(start, "start")
        stop = nxt if stop is None else _check_offset(stop, "stop")
        if start > stop:
            raise InvalidArgumentError(f"start={start} is after stop={stop}")
        if start < first or stop > nxt:
            raise OffsetOutOfRangeError(start if start < first else stop, first, nxt)
        return start, stop

    def _scan_chunks(self, offset: int, stop: int) -> Iterator[Iterator[Record]]:
        """Iterators over consecutive chunks of records in [offset, stop)."""
        while offset < stop:
            (recs, n, last), rc, bad, _used = self._read_segment(
                offset, 8 << 20, min(8192, stop - offset), False, lazy=True)
            if rc == _GAP_END:  # nothing left in a compacted segment: on to the next one
                offset = bad
                continue
            if n == 0:
                if rc != impl.OK:
                    seg = self._sealed_for(offset)
                    path = seg.store_path if seg is not None and offset < seg.next_offset else self._active.store_path
                    raise corrupt_error(path, bad, offset, rc)
                return
            if last >= stop:  # compacted segments skip offsets
                yield (r for r in recs if r[0] < stop)
                return
            yield recs
            offset = last + 1

    def __iter__(self) -> Iterator[Record]:
        return self.scan()

    def __contains__(self, offset: object) -> bool:
        """``offset in log``: whether :meth:`read` finds a record at ``offset`` (False below
        ``start_offset``, at or past the end, or where compaction removed the record).
        ArgumentTypeError for anything but an int offset; CorruptRecordError as read raises it."""
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise ArgumentTypeError(f"`in` on a log takes an int offset, got {type(offset).__name__}")
        try:
            self.read(int(offset))
        except (OffsetOutOfRangeError, OffsetRemovedError):
            return False
        return True

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first offset whose timestamp is >= ``timestamp_ms``, or None if there is none
        (below the last stable offset), at or after ``start_offset``."""
        off = self._offset_for_time(timestamp_ms)
        mark = self._start_mark
        if off is not None and off < mark:  # found below delete_records' start: look from it
            off = self._offset_for_time(timestamp_ms, mark)
        if off is not None and self._cap is not None and off >= self._cap:
            return None
        return off

    def max_timestamp(self) -> int | None:
        """The largest timestamp of the log's records (None when it holds none): the last
        record's when timestamps never decrease, else the largest of every segment's."""
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            sealed = list(self._sealed)
            top = self._active.app.max_timestamp
        ordered = self.config.timestamps == "monotonic"
        for seg in reversed(sealed):
            if ordered and top is not None:
                break
            m = _max_timestamp(seg)
            if m is not None and (top is None or m > top):
                top = m
        return top

    def _offset_for_time(self, timestamp_ms: int, start: int = 0) -> int | None:
        """:meth:`offset_for_time` over the offsets from ``start`` on (the records of the
        segment holding ``start`` that lie at or after it are walked; the segments after
        it are searched as usual)."""
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, (int, np.integer)):
            raise ArgumentTypeError(f"timestamp_ms must be an int, got {type(timestamp_ms).__name__}")
        ts = int(timestamp_ms)
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            segs: list[Any] = [*self._sealed, self._active]
            active_max = self._active.app.max_timestamp
        if start:
            while len(segs) > 1 and segs[0].next_offset <= start:
                del segs[0]
            if segs[0].base_offset < start:  # the records of its part from `start` on
                stop = segs[0].next_offset if len(segs) > 1 else self.stable_offset
                for r in self.scan(max(start, self.start_offset), max(stop, start)):
                    if r.timestamp >= ts:
                        return int(r.offset)
                segs = segs[1:]
                if not segs:
                    return None
        def newest(i: int) -> int | None:
            # largest timestamp of segment i, or of the first non-empty one after it (compaction
            # can empty a segment)
            while i < len(segs):
                seg = segs[i]
                last = active_max if seg is segs[-1] else _max_timestamp(seg)
                if last is not None:
                    return last
                i += 1
            return None

        # the first record at or after ts is in the first segment whose largest timestamp
        # is >= ts. Timestamps that never decrease make the largest non-decreasing in i, so
        # it can be bisected; a log that may hold them as given (or did before it was
        # switched to append-time) is searched in order.
        lo, hi = 0, len(segs)
        if self.config.timestamps != "monotonic":
            while lo < hi and ((m := newest(lo)) is None or m < ts):
                lo += 1
            hi = lo
        while lo < hi:
            mid = (lo + hi) // 2
            last = newest(mid)
            if last is not None and last >= ts:
                hi = mid
            else:
                lo = mid + 1
        for s in segs[lo:]:
            if s is segs[-1]:
                with self._lock:
                    found: int | None = s.find_time(ts)
                    return found
            off: int | None = s.find_time(ts)
            if off is not None:
                return off
        return None

    def verify(self, progress: Any = None) -> list[CorruptRecordError]:
        """CRC-check every frame of every segment. Returns the bad frames, one
        CorruptRecordError each (an empty list, so falsy, when all is well), then what the
        persisted recovery report holds and the walk did not find again (what recovery cut,
        or found in a segment since removed) until :meth:`clear_recovery_report`. A damaged
        region with valid frames after it is stepped over (one error for the region).
        ``progress``, if given, is called with the bytes checked after each segment.

        A read-only log reports only what a second look, after :meth:`refresh`, finds
        again: a truncate in the writer's process replaces and deletes files under the walk
        (a segment then seems to end short of the next one's base)."""
        bad = self._verify_walk(progress)
        if bad and self.readonly:
            self.refresh()
            again = {(e.path, e.position, e.offset) for e in self._verify_walk(None)}
            bad = [e for e in bad if (e.path, e.position, e.offset) in again]
        seen = {(os.path.basename(e.path), e.position) for e in bad}
        return bad + [e for e in self.saved_recovery_report() if (os.path.basename(e.path), e.position) not in seen]

    def _verify_walk(self, progress: Any) -> list[CorruptRecordError]:
        """The bad frames :meth:`verify` finds in the segments as this log knows them."""
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            segs: list[Any] = [*self._sealed, self._active]
        bad: list[CorruptRecordError] = []
        for i, s in enumerate(segs):
            expected = segs[i + 1].base_offset if i + 1 < len(segs) else None
            if s is segs[-1]:
                with self._lock:
                    bad.extend(s.verify(None))
            else:
                try:
                    bad.extend(s.verify(expected))
                except FileNotFoundError:
                    continue
            if progress is not None:
                progress(s.size)
        return bad
