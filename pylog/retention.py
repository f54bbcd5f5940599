"""Retention and truncation: truncate, expiry, size retention, compaction hook.

Split out of pylog/log.py; :class:`pylog.log.Log` inherits :class:`LogRetention`.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from pylog import checkpoint, fileutil, vfs
from pylog import format as fmt
from pylog.appender import _now_ms
from pylog.errors import (
    ArgumentTypeError,
    CorruptRecordError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    PylogError,
    ReadOnlyLogError,
)
from pylog.logstate import LogState
from pylog.reading import _check_offset, _max_timestamp
from pylog.segment import ActiveSegment, SealedSegment, paths

if TYPE_CHECKING:  # the layers above (compaction) and the Log facade: never imported at run time
    from pylog.compaction import CompactionReport
    from pylog.log import Log
    from pylog.tail import TailSegment


def _cut_position(seg: ActiveSegment | SealedSegment, offset: int) -> int:
    """Where ``truncate(offset)`` cuts ``seg``'s store: the frame of ``offset``, or, when
    ``offset`` is the first offset of a damaged region, where the damage starts."""
    try:
        pos: int = seg.find(offset)[1][0]
        return pos
    except CorruptRecordError:
        for d in seg.damage():
            if d.offset == offset:
                return d.position
        raise


class LogRetention(LogState):
    """Retention and truncation of a Log.

    truncate, time and size retention, the compaction hook.

    Mixed into :class:`pylog.log.Log`, which sets up the state. The state it uses, and the
    methods of the other parts it calls, are declared with their types in
    :class:`pylog.logstate.LogState`.
    """

    # ------------------------------------------------------------------------------------
    # truncation and retention
    def _first_uncompacted(self, offset: int) -> int:
        """The base offset of the first segment after ``offset`` that compaction has not
        rewritten (the active one at the latest): where a truncate can cut."""
        for seg in self._sealed:
            if seg.base_offset > offset:
                seg.maps()  # learns seg.gaps
                if not seg.gaps:
                    return seg.base_offset
        return self._active.base_offset

    def truncate(self, offset: int) -> None:
        """Drop ``offset`` and every record after it (``next_offset`` becomes ``offset``).

        Views of dropped records stay readable, in this process and in read-only logs in
        others: the kept part of the segment is copied to a new file renamed over the old
        one (a kernel copy where the file system allows it), never cut in place.
        """
        offset = _check_offset(offset)
        with self._lock:
            active = self._check_writable()
            start, nxt = self.start_offset, active.next_offset
            if not start <= offset <= nxt:
                raise OffsetOutOfRangeError(offset, start, nxt)
            if offset == nxt:
                return
            tseg = self._sealed_for(offset) if offset < active.base_offset else None
            if tseg is not None:
                tseg.maps()  # learns tseg.gaps
                if tseg.gaps:  # the active segment cannot be a compacted one
                    raise PylogError(f"cannot truncate at offset {offset}: it lies in a compacted segment "
                                     f"({tseg.store_path}); the first offset after it outside a compacted "
                                     f"segment is {self._first_uncompacted(offset)}")
            self._write_out(active)
            self._old_mark = checkpoint.read_durable_point(self.path)  # put back if no file changes
            try:
                # the records kept are durable, and recovery must keep them all: a batch the
                # cut splits would otherwise look unfinished past a lagging durable point
                active.sync()
                # From here a crash leaves the truncate to finish at the next open (the
                # point is durable before any file changes), and a failure leaves the log
                # fenced, its view matching the files (_match_files). Written first: from
                # now on readers in other processes stop at it (pylog.loader), before the
                # mark below stops saying what a roll left unfinished.
                checkpoint.write_truncate_point(self.path, offset)
                base = active.base_offset if tseg is None else tseg.base_offset
                checkpoint.write_durable_point(self.path, base, offset, sync=True)
            except OSError as e:
                self._truncate_failed(e, None, 0, [])
                raise
            if offset >= active.base_offset:
                target_base = active.base_offset
                doomed_files: list[int] = []
                cut_at = self._cut_hint.pop(offset, 0) or _cut_position(active, offset)
            else:
                seg = self._sealed_for(offset)
                assert seg is not None
                target_base = seg.base_offset
                cut_at = self._cut_hint.pop(offset, 0) or _cut_position(seg, offset)
                self._cache.discard(seg)
                # newest first: a crash (or a failure) part way leaves a shorter log, never
                # one with a hole in its offsets
                doomed_files = [active.base_offset] + [s.base_offset for s in reversed(self._sealed)
                                                       if s.base_offset > target_base]
            active.close_files()
            target = paths(self.path, target_base)[0]
            target_size = os.path.getsize(target)
            new = None
            try:
                self._delete_files(doomed_files)
                # copied, never cut in place: read-only logs in other processes may map it
                fileutil.shrink_file(target, cut_at, copy=True)
                new, _cut, _damage = ActiveSegment.recover(self.path, target_base, self.config, save_broken=False)
                checkpoint.write_recovery_point(self.path, target_base, truncated=True)
                # the durable point goes down with the log: appends past the cut are new
                checkpoint.write_durable_point(self.path, target_base, new.next_offset, sync=True)
                checkpoint.clear_truncate_point(self.path)
            except OSError as e:
                if new is not None:
                    new.close_files()
                self._truncate_failed(e, target, target_size, doomed_files)
                raise
            keep = [s for s in self._sealed if s.base_offset < target_base]
            for s in self._sealed:
                if s.base_offset >= target_base:
                    self._cache.discard(s)
            self._sealed = keep
            self._sealed_bases = [s.base_offset for s in keep]
            self._active = new
            self._update_writable()
            self._gc.lower(new.next_offset)

    def _truncate_failed(self, e: BaseException, target: str | None, size: int, doomed: list[int]) -> None:
        """A truncate failed: fence (:meth:`_fail`). If it changed no file (every doomed
        store is there and the kept one has its old size), its truncate point goes too, so
        a reopen finds the log as it was; else the point stays and the reopen finishes it.
        The ``durable-point`` mark the truncate rewrote goes back first (durably): it may
        name a write unit a roll split, which the next open must still cut and readers
        must still not show; if it cannot, the point stays."""
        self._fail(e)
        try:
            if (target is None or os.path.getsize(target) == size) and all(
                    os.path.exists(paths(self.path, b)[0]) for b in doomed):
                old = self._old_mark
                if old is not None:
                    checkpoint.write_durable_point(self.path, old[0], old[1], open_unit=old[2], sync=True)
                checkpoint.clear_truncate_point(self.path)
        except OSError:
            pass  # the point stays: the next open finishes the truncate

    def _fail(self, e: BaseException) -> None:
        """A truncate or retention failed part way: fence the log, and make what it shows
        match the files as the failure left them, so every offset it still claims reads."""
        self._fence(e)
        try:
            self._match_files()
        except OSError:
            pass  # the old view stays; reads of what is gone raise OffsetOutOfRangeError

    def _match_files(self) -> None:
        """Rebuild the segment list from the store files now in the directory. The active
        segment is kept while its files are open and it is still the last; otherwise the
        last store is read as a read-only reader would (whole, CRC-valid frames only)."""
        from pylog.tail import TailSegment  # the read-only tail, as in _load_readonly

        bases = self._list_bases()
        if not bases:
            return
        active: ActiveSegment | TailSegment = self._active
        if not (isinstance(active, ActiveSegment) and active.store_fd >= 0 and bases[-1] == active.base_offset):
            if isinstance(active, ActiveSegment):
                active.close_files()
            active = TailSegment(self.path, bases[-1], self.config)
        known = {s.base_offset: s for s in self._sealed}
        sealed = []
        for i, b in enumerate(bases[:-1]):
            s = known.get(b)
            if s is None or s.next_offset != bases[i + 1]:
                s = SealedSegment(self.path, b, bases[i + 1], None, self.config.index_interval_bytes, self._cache)
            sealed.append(s)
        for s in self._sealed:
            if s not in sealed:
                self._cache.discard(s)
        self._sealed = sealed
        self._sealed_bases = [s.base_offset for s in sealed]
        self._active = active  # type: ignore[assignment]  # a TailSegment when the files are gone (LogState._active)

    def _delete_files(self, bases: Iterable[int]) -> None:
        """Delete segments crash-safely, in the order given: rename to .deleted (the store
        first, so a segment is gone as a whole), fsync dir, unlink."""
        renamed = []
        for b in bases:
            for p in paths(self.path, b):
                try:
                    vfs.rename(p, p + fmt.DELETED_SUFFIX)
                    renamed.append(p + fmt.DELETED_SUFFIX)
                except FileNotFoundError:
                    pass
        fileutil.fsync_dir(self.path)
        for p in renamed:
            vfs.unlink(p)
        if renamed:
            fileutil.fsync_dir(self.path)

    def _drop_oldest(self, count: int) -> int:
        if count <= 0:
            return 0
        doomed = self._sealed[:count]
        try:
            # oldest first: a crash part way leaves a log that starts later, never a hole
            self._delete_files([s.base_offset for s in doomed])
        except OSError as e:
            self._fail(e)  # start_offset moves only past the segments really gone
            raise
        for s in doomed:
            self._cache.discard(s)
        self._sealed = self._sealed[count:]
        self._sealed_bases = self._sealed_bases[count:]
        return count

    def remove_before(self, offset: int) -> int:
        """Delete the sealed segments whose every offset is below ``offset``, oldest first
        (never the active segment); returns how many were deleted. The broker's
        DeleteRecords frees disk with it, as Kafka deletes segments below a log start offset."""
        offset = _check_offset(offset)
        with self._lock:
            self._check_writable()
            count = 0
            for s in self._sealed:
                if s.next_offset > offset:
                    break
                count += 1
            return self._drop_oldest(count)

    def delete_records(self, before: int) -> int:
        """Move the log start offset up to ``before`` (Kafka's DeleteRecords): no offset below
        it is served again, by this Log, a read-only Log of the partition in any process
        (from its next refresh), a Consumer, ``pylog consume``, read_arrow or the Spark
        source; returns the new ``start_offset``.

        The records below ``before`` are made durable and then the mark is written durably
        (``log-start-offset``, docs/format.md) before the call returns; then the sealed
        segments wholly below it are deleted (:meth:`remove_before`; retention deletes those
        left by a failure later). ``before`` at or below ``start_offset`` changes nothing; past
        the last stable offset it is :class:`~pylog.errors.OffsetOutOfRangeError`.
        """
        before = _check_offset(before, "before")
        with self._lock:
            active = self._check_writable()
            start, end = self.start_offset, self.stable_offset
            if before > end:
                raise OffsetOutOfRangeError(before, start, end,
                                            f"delete_records(before={before}) is past the log's end "
                                            f"(it holds [{start}, {end}))")
            if before <= start:
                return start
            # the records below the mark are durable before it is: a crash never leaves a
            # mark past the log's end (the open would lower it: see _load_start_mark)
            self._write_out(active)
            try:
                active.sync()
                checkpoint.write_log_start(self.path, before)
            except OSError as e:
                self._fence(e)
                raise
            self._start_mark = before
            self.remove_before(before)
            return self.start_offset

    def remove_expired(self, max_age_ms: int) -> int:
        """Delete sealed segments whose largest timestamp is older than ``max_age_ms``, oldest
        first up to the first one that is not (never the active segment), as Kafka does;
        returns how many were deleted."""
        if isinstance(max_age_ms, bool) or not isinstance(max_age_ms, int):
            raise ArgumentTypeError(f"max_age_ms must be an int, got {type(max_age_ms).__name__}")
        if max_age_ms < 0:
            raise InvalidArgumentError(f"max_age_ms={max_age_ms} must be >= 0")
        with self._lock:
            self._check_writable()
            cutoff = _now_ms() - max_age_ms
            count = 0
            for s in self._sealed:
                last = _max_timestamp(s)  # Kafka: a segment expires by its largest timestamp
                if last is None or last < cutoff:
                    count += 1
                else:
                    break
            return self._drop_oldest(count)

    def enforce_retention(self) -> int:
        """Apply ``retention_ms`` and ``retention_bytes`` (whole sealed segments, oldest
        first, never the active one); returns how many segments were deleted."""
        self._check_open()  # closed or read-only: an error, also with no retention set
        if self.readonly:
            raise ReadOnlyLogError(f"log {self.path} was opened read-only")
        cfg = self.config
        removed = 0
        if self._start_mark:  # what delete_records left (a failure part way): never served
            removed += self.remove_before(self._start_mark)
        if cfg.retention_ms is not None:
            removed += self.remove_expired(cfg.retention_ms)
        if cfg.retention_bytes is not None:
            with self._lock:
                self._check_writable()
                total = sum(s.size for s in self._sealed) + self._active.size
                count = 0
                for s in self._sealed:
                    if total - s.size >= cfg.retention_bytes:
                        total -= s.size
                        count += 1
                    else:
                        break
                removed += self._drop_oldest(count)
        return removed

    # ------------------------------------------------------------------------------------
    # checking
    def compact(self, **options: Any) -> CompactionReport:
        """Compact the sealed segments: keep the latest record of each key (see
        :func:`pylog.compaction.compact`, which takes the same options); returns its
        CompactionReport."""
        from pylog.compaction import compact  # the layer above Log; imported on use

        return compact(cast("Log", self), **options)  # only a Log is a LogRetention
