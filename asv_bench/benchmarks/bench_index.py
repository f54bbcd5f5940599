"""Index search: pylog's C binary search vs ``numpy.searchsorted`` vs ``bisect``.

Params follow numpy's ``bench_searchsorted``-style sizes. Every call does 1,000 lookups of
seeded random relative offsets in a sparse offset index of ``n`` entries
(``u32 relative_offset, u32 position``, the on-disk layout).

* ``c``: ``plog_index_lookup`` over the raw entry bytes (what a read does).
* ``numpy``: ``searchsorted`` on a contiguous ``uint32`` column with a numpy scalar.
* ``numpy_u64_np``: a ``uint64`` column searched with ``np.uint64(q)``: fine.
* ``numpy_u64_pyint``: a ``uint64`` column searched with a Python ``int``: the whole array
  is converted on every call (the trap in the baselines; still there on numpy 2.4: ~1.5 ms a
  lookup at n = 1e6, so that case is skipped); kept so the trap stays visible.
* ``bisect``: ``bisect_right`` over a Python list.
"""
from __future__ import annotations

import bisect

import numpy as np

from pylog import format as fmt
from pylog._backend import impl

from .common import setup  # noqa: F401

LOOKUPS = 1000


class IndexSearch:
    params = ([100, 10_000, 1_000_000], ["c", "numpy", "numpy_u64_np", "numpy_u64_pyint", "bisect"])
    param_names = ["n", "method"]

    def setup(self, n: int, method: str) -> None:
        rng = np.random.default_rng(7)
        rel = np.sort(rng.choice(np.arange(1, 40 * n, dtype=np.uint32), n - 1, replace=False))
        rel = np.concatenate([[0], rel]).astype(np.uint32)
        entries = np.empty(n, dtype=fmt.INDEX_DTYPE)
        entries["relative_offset"] = rel
        entries["position"] = np.arange(n, dtype=np.uint32) * 64 + fmt.FILE_HEADER_SIZE
        self.raw = entries.tobytes()
        self.buf = impl.Buffer(self.raw)
        self.n = n
        q = rng.integers(0, 40 * n, LOOKUPS)
        self.queries = q.tolist()
        self.col32 = np.ascontiguousarray(rel)
        self.col64 = rel.astype(np.uint64)
        self.q32 = [np.uint32(x) for x in self.queries]
        self.q64 = [np.uint64(x) for x in self.queries]
        self.lst = rel.tolist()
        if method == "numpy_u64_pyint" and n > 10_000:
            # the trap converts the whole array on every call: ~1.5 ms a lookup at n = 1e6
            raise NotImplementedError("the uint64/int trap takes seconds per sample at this n")

    def time_lookup(self, n: int, method: str) -> None:
        if method == "c":
            lookup, buf = impl.index_lookup, self.buf
            for q in self.queries:
                lookup(buf, n, q)
        elif method == "numpy":
            ss, col = np.searchsorted, self.col32
            for q in self.q32:
                ss(col, q, side="right")
        elif method == "numpy_u64_np":
            ss, col = np.searchsorted, self.col64
            for q in self.q64:
                ss(col, q, side="right")
        elif method == "numpy_u64_pyint":
            ss, col = np.searchsorted, self.col64
            for q in self.queries:
                ss(col, q, side="right")
        else:
            br, lst = bisect.bisect_right, self.lst
            for q in self.queries:
                br(lst, q)


class IndexSearchVectorized:
    """All 1,000 queries in one ``searchsorted`` call (what batch code would do)."""

    params = [100, 10_000, 1_000_000]
    param_names = ["n"]

    def setup(self, n: int) -> None:
        rng = np.random.default_rng(7)
        self.col = np.sort(rng.choice(np.arange(1, 40 * n, dtype=np.uint32), n, replace=False))
        self.queries = rng.integers(0, 40 * n, LOOKUPS).astype(np.uint32)

    def time_searchsorted_many(self, n: int) -> None:
        np.searchsorted(self.col, self.queries, side="right")
