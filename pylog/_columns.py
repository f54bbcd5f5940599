"""Caller-owned column buffers for a columnar scan (``scan_columns`` of either backend).

A :class:`Columns` is what the C function ``plog_scan_columns`` appends rows to, held as
numpy arrays in Arrow's layout, so :mod:`pylog.arrow` and :mod:`pylog.spark` turn them
into Arrow arrays without a copy. It knows nothing of Arrow or cffi: :mod:`pylog._native`
points the C struct at these arrays, :mod:`pylog._pure` fills them in Python.

Memory comes from ``alloc(nbytes)`` (default: ``numpy.empty``), any writable buffer. The
Arrow reader passes pyarrow's allocator: its pool keeps freed pages, where a fresh numpy
array of 100 MB costs ~13 ms of page faults every time.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: Arrow binary arrays have int32 offsets: a column's data stays below 2 GiB.
MAX_DATA = 0x7FFFFFFF

Alloc = Callable[[int], Any]


def _np_alloc(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


def _array(alloc: Alloc, n: int, dtype: Any) -> np.ndarray:
    dt = np.dtype(dtype)
    return np.frombuffer(alloc(max(n, 1) * dt.itemsize), dtype=dt, count=n)


class BinaryColumn:
    """One binary column: row i is ``data[offsets[i]:offsets[i + 1]]``; bit i of
    ``validity`` (LSB first) is 0 for a null. ``need`` is set by a scan that stopped with
    E_SPACE: the data capacity the refused row needs."""

    __slots__ = ("offsets", "data", "validity", "null_count", "need", "_alloc")

    def __init__(self, capacity: int, data_cap: int, alloc: Alloc) -> None:
        self._alloc = alloc
        self.offsets = _array(alloc, capacity + 1, np.int32)
        self.offsets[0] = 0
        self.data = _array(alloc, min(max(data_cap, 0), MAX_DATA), np.uint8)
        self.validity = _array(alloc, (capacity + 7) // 8, np.uint8)
        self.null_count = 0
        self.need = 0

    @property
    def data_cap(self) -> int:
        return len(self.data)

    def used(self, rows: int) -> int:
        """Bytes of data the first ``rows`` rows take."""
        return int(self.offsets[rows])

    def grow(self, need: int, rows: int, limit: int = MAX_DATA) -> bool:
        """Make room for ``need`` bytes of data (keeping the first ``rows`` rows' bytes),
        doubling, up to ``limit`` bytes (past it only for the first row). False when it
        cannot: ``need`` is over ``limit`` (rows > 0) or over what an Arrow binary array
        holds."""
        limit = min(limit, MAX_DATA)
        if need > MAX_DATA or (need > limit and rows > 0):
            return False
        cap = max(need, min(max(2 * len(self.data), 4096), limit))
        new = _array(self._alloc, cap, np.uint8)
        used = self.used(rows)
        new[:used] = self.data[:used]
        self.data = new
        return True


class Columns:
    """Column buffers with room for ``capacity`` rows; ``rows`` are filled so far.

    ``offsets`` and ``timestamps`` are int64 arrays, ``attributes`` a uint8 array (each
    None when not wanted); ``key``, ``metadata`` and ``value`` are :class:`BinaryColumn`
    (None when not wanted), created with the data capacities given.
    """

    __slots__ = ("rows", "capacity", "offsets", "timestamps", "attributes", "key", "metadata", "value")

    def __init__(self, capacity: int, *, offsets: bool = True, timestamps: bool = True,
                 attributes: bool = False, key: int | None = 0, metadata: int | None = 0,
                 value: int | None = 0, alloc: Alloc | None = None) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        a = alloc or _np_alloc
        self.rows = 0
        self.capacity = capacity
        self.offsets = _array(a, capacity, np.int64) if offsets else None
        self.timestamps = _array(a, capacity, np.int64) if timestamps else None
        self.attributes = _array(a, capacity, np.uint8) if attributes else None
        self.key = BinaryColumn(capacity, key, a) if key is not None else None
        self.metadata = BinaryColumn(capacity, metadata, a) if metadata is not None else None
        self.value = BinaryColumn(capacity, value, a) if value is not None else None

    def binary(self) -> list[tuple[str, BinaryColumn]]:
        """The binary columns collected, by name."""
        return [(n, c) for n, c in (("key", self.key), ("metadata", self.metadata), ("value", self.value))
                if c is not None]

    def grow_for_space(self, limit: int = MAX_DATA) -> bool:
        """After a scan stopped with E_SPACE: grow every column that refused the row, up to
        ``limit`` bytes each. False when one cannot (the caller ends the batch there)."""
        ok = True
        for _name, c in self.binary():
            if c.need:
                ok = c.grow(c.need, self.rows, limit) and ok
        return ok
