"""The last segment as a read-only reader sees it: written by another process, followed by
walking (CRC-checking) the frames that appeared since the last look. A reader never sees a
torn or unchecked frame: the walk stops at the first one that is not whole and valid.

The new bytes are first read through ``pread`` copies, and the file is mapped only as far
as whole frames reach. A preallocated writer (``preallocate=True``) leaves zeros after its
last frame and trims them at roll and close; a map that still covered the trimmed pages
would fault (SIGBUS) as soon as the walk touched them, and ``pread`` simply reads less."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from pylog import checkpoint, fileutil, torn, vfs
from pylog import format as fmt
from pylog import store as store_mod
from pylog._backend import impl
from pylog.segment import Damage, _Reader, damage_error, paths, walk, walker

if TYPE_CHECKING:
    from pylog.config import LogConfig
    from pylog.errors import CorruptRecordError

#: the first pread of a refresh; doubled while a frame does not fit
PROBE_BYTES = 64 << 10


def whole_frames_end(fd: int, start: int, size: int, base_offset: int, next_offset: int) -> int:
    """Where the whole, CRC-valid frames from ``start`` (the first holding ``next_offset``)
    end in the first ``size`` bytes of the store file ``fd``, found in ``pread`` copies:
    nothing past the end of the file is ever touched through a map."""
    h = fmt.FILE_HEADER_SIZE  # the copy sits where a walker starts, after a blank header
    end, want = start, PROBE_BYTES
    while end < size:
        n = min(want, size - end)
        buf = bytearray(h + n)
        got = os.preadv(fd, [memoryview(buf)[h:]], end)
        copy_end = end + got  # where the copy ends in the file
        a = walker(base_offset, None)
        a.next_offset = next_offset
        rc, _ = a.recover(impl.Buffer(buf), h + got)
        end += a.position - h
        next_offset = a.next_offset
        if got < n or (rc != impl.OK and rc != impl.E_SHORT):
            break  # the file ended, or a bad frame (a preallocated tail's zeros, a torn write)
        if rc == impl.E_SHORT:
            if copy_end >= size:
                break  # a frame still being written at the end of the file
            if a.position == h:
                want *= 2  # one frame larger than the copy: read more at once
    return end


class TailSegment(_Reader):
    """Read-only view of a log's active segment (see :meth:`pylog.Log.refresh`)."""

    __slots__ = ("dir", "base_offset", "store_path", "config", "app", "_map", "_ino")

    def __init__(self, dirpath: str, base_offset: int, config: LogConfig) -> None:
        self.dir = dirpath
        self.base_offset = base_offset
        self.store_path = paths(dirpath, base_offset)[0]
        self.config = config
        self._map: store_mod.StoreMap | None = None
        self._ino: int | None = None
        self._reset()
        self.refresh()

    def _reset(self) -> None:
        self.app: impl.Appender = walker(self.base_offset, self.config.index_interval_bytes)
        self._map = None

    @property
    def next_offset(self) -> int:
        return self.app.next_offset

    @property
    def size(self) -> int:
        return self.app.position

    @property
    def written(self) -> int:
        return self.app.position

    def replaced(self) -> bool:
        """Whether the writer replaced or deleted this store file since the last refresh
        (a truncate does both: records at offsets this reader knows may now differ). One
        ``stat``."""
        if self._ino is None:
            return False
        try:
            return os.stat(self.store_path).st_ino != self._ino
        except FileNotFoundError:
            return True

    def refresh(self) -> None:
        """Walk the frames the writer added since the last refresh."""
        try:
            fd = vfs.open(self.store_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
            if self._ino is not None and st.st_ino != self._ino:
                self._reset()  # the writer replaced the file (a truncation)
            self._ino = st.st_ino
            app = self.app
            closed = app.position == fmt.FILE_HEADER_SIZE and self._closed_as(st)
            if closed:
                end = st.st_size  # what the writer's close left: whole units, fsynced
            else:
                end = min(st.st_size, whole_frames_end(fd, app.position, st.st_size, self.base_offset, app.next_offset))
            m = self._map
            if m is None or end > m.length:
                m = self._map = store_mod.StoreMap(fd, end)
        finally:
            vfs.close(fd)
        # only whole write units: a batch the writer is still writing out (or failed to)
        # shows none of its records until its last frame is there (pylog.torn)
        if end > app.position and not closed:
            end = torn.readable_end(m.buf, app.position, app.next_offset, end, self._durable)
        self.app.recover(m.buf, end)

    def _closed_as(self, st: os.stat_result) -> bool:
        """Whether the store is as its writer's ``close()`` left it (the clean-shutdown marker
        names this segment, its size and its modification time): then every frame in it
        is whole and ends a write unit, and a first look walks it once (CRC-checking every
        frame) instead of three times. A writer that opens it since deletes the marker
        before it changes the file; what it appends later lies past the marker's size."""
        clean = checkpoint.take_clean(self.dir, remove=False)
        return (clean is not None and clean.active_base == self.base_offset and clean.active_size == st.st_size
                and clean.active_mtime_ns == st.st_mtime_ns)

    def _durable(self) -> int:
        """Every offset of this segment below it is known durable (the recovery point, the
        ``durable-point`` mark about this segment), and shown even where its last write
        unit does not end here. Not past the start of a write unit the writer's roll from
        this segment split (the mark names it: the rest may never be written, and
        recovery then cuts it all), nor past a truncate under way."""
        rp = checkpoint.read_recovery_point(self.dir) or 0
        mark = checkpoint.read_durable_point(self.dir)
        d = max(rp, mark[1] if mark is not None and mark[0] == self.base_offset else 0)
        if mark is not None and mark[2] is not None and mark[0] > self.base_offset:
            d = min(d, mark[2])
        t = checkpoint.read_truncate_point(self.dir)
        return d if t is None else min(d, t)

    def first_timestamp(self) -> int | None:
        if self.app.index_count == 0:
            return None
        import struct

        ts: int = struct.unpack("<q", self.app.timeindex_bytes(0, 1)[:8])[0]
        return ts

    def close_files(self) -> None:
        self._map = None

    def verify(self, expected_next: int | None) -> list[CorruptRecordError]:
        """The checks of :meth:`_Reader.verify` over the frames this reader follows, then
        the bytes after them: a reader stops at the first bad frame, so damage with valid
        frames after it (which no writer has recovered yet) is looked for in ``pread``
        copies (never a map past the whole frames). What a write in progress could show
        (a frame not yet copied whole, valid ones after it) is reported only when a second
        look a moment later finds the same bad bytes."""
        bad = super().verify(expected_next)
        if bad:
            return bad
        first = self._damage_after()
        if first is None:
            return bad
        time.sleep(0.05)
        again = self._damage_after()
        if again is None or again[0] != first[0]:
            return bad
        return bad + [damage_error(self.store_path, d) for d in again[1]]

    def _damage_after(self) -> tuple[bytes, list[Damage]] | None:
        """(the bad bytes, the damage) in the store after the whole frames, or None."""
        try:
            fd = vfs.open(self.store_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            start = self.app.position
            end = fileutil.data_end(fd, start, os.fstat(fd).st_size)
            if end <= start:
                return None
            h = fmt.FILE_HEADER_SIZE  # the copy sits where a walker starts, after a blank header
            buf = bytearray(h + end - start)
            got = os.preadv(fd, [memoryview(buf)[h:]], start)
        finally:
            vfs.close(fd)
        a = walker(self.base_offset, None)
        a.next_offset = self.app.next_offset
        _rc, found = walk(a, impl.Buffer(buf), h + got, self.base_offset)
        if not found:
            return None
        moved = [d._replace(position=d.position - h + start, end=d.end - h + start) for d in found]
        return bytes(buf[found[0].position : found[0].end]), moved

    def _view(self, upto: int | None = None) -> tuple[Any, Any, int, Any]:
        m = self._map
        if m is None:
            self.refresh()
            m = self._map
        app = self.app
        return m, app.index_view(), app.index_count, app.timeindex_view()
