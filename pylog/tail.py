"""The last segment as a read-only reader sees it: written by another process, followed by
walking (CRC-checking) the frames that appeared since the last look. A reader never sees a
torn or unchecked frame: the walk stops at the first one that is not whole and valid."""
from __future__ import annotations

import os

from pylog import vfs
from pylog import store as store_mod
from pylog.segment import _Reader, paths, walker


class TailSegment(_Reader):
    """Read-only view of a log's active segment (see :meth:`pylog.Log.refresh`)."""

    __slots__ = ("dir", "base_offset", "store_path", "config", "app", "_map", "_ino", "tracker")

    def __init__(self, dirpath: str, base_offset: int, config) -> None:
        self.dir = dirpath
        self.base_offset = base_offset
        self.store_path = paths(dirpath, base_offset)[0]
        self.config = config
        self._map: store_mod.StoreMap | None = None
        self._ino: int | None = None
        self.tracker = store_mod.MapTracker()
        self._reset()
        self.refresh()

    def _reset(self) -> None:
        self.app = walker(self.base_offset, self.config.index_interval_bytes)
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
            m = self._map
            if m is None or st.st_size > m.length:
                m = self._map = store_mod.StoreMap(fd, st.st_size)
                self.tracker.add(m)
        finally:
            vfs.close(fd)
        self.app.recover(m.buf, m.length)

    def first_timestamp(self) -> int | None:
        if self.app.index_count == 0:
            return None
        import struct

        return struct.unpack("<q", self.app.timeindex_bytes(0, 1)[:8])[0]

    def close_files(self) -> None:
        self._map = None

    def _view(self, upto: int | None = None):
        m = self._map
        if m is None:
            self.refresh()
            m = self._map
        app = self.app
        return m, app.index_view(), app.index_count, app.timeindex_view()
