"""An LRU of mapped sealed segments (laminarmq's ``num_index_cached_read_segments``).

Not ``functools.lru_cache``: that never closes what it evicts. Eviction calls the segment's
``unmap()``, which drops the segment's references to its maps; the OS mapping and its file
descriptor go when the last reference does, so a record view or a C call still using the
map keeps it alive.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol


class _Unmappable(Protocol):
    base_offset: int

    def unmap(self) -> None: ...


class SegmentCache:
    """At most ``capacity`` mapped segments (None: no limit; 0: none stay mapped)."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._od: OrderedDict[int, _Unmappable] = OrderedDict()
        self._lock = threading.Lock()
        #: touch_key(base_offset): :meth:`touch` without a Python frame (a hot read's), but
        #: raising KeyError when that segment is not in the cache
        self.touch_key = self._od.move_to_end

    def __len__(self) -> int:
        return len(self._od)

    def touch(self, seg: _Unmappable) -> None:
        """Mark ``seg`` as just used."""
        try:
            self._od.move_to_end(seg.base_offset)
        except KeyError:
            pass

    def add(self, seg: _Unmappable) -> None:
        """``seg`` was just mapped: remember it, evicting the least recently used."""
        evicted = []
        with self._lock:
            self._od[seg.base_offset] = seg
            self._od.move_to_end(seg.base_offset)
            cap = self.capacity
            if cap is not None:
                while len(self._od) > cap:
                    evicted.append(self._od.popitem(last=False)[1])
        for old in evicted:
            old.unmap()

    def discard(self, seg: _Unmappable) -> None:
        with self._lock:
            if self._od.get(seg.base_offset) is seg:
                del self._od[seg.base_offset]
        seg.unmap()

    def clear(self) -> None:
        with self._lock:
            segs = list(self._od.values())
            self._od.clear()
        for s in segs:
            s.unmap()
