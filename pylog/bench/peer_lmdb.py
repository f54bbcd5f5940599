"""The lmdb peer (the ``lmdb`` package, from the ``bench`` extra)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from pylog.bench.common import KEY, System, latencies

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class LmdbSystem(System):
    """lmdb, sync off; 8-byte big-endian keys precomputed (untimed), ``append=True``."""

    name = "lmdb"
    batch_name = "putmulti/1000"

    def __init__(self, n_max: int, size: int) -> None:
        self.map_size = max(64 << 20, n_max * (size + 64) * 3)
        self.keys: list[bytes] = []

    def available(self) -> str | None:
        try:
            import lmdb  # noqa: F401
        except ImportError:
            return "the lmdb package is not installed"
        return None

    def _keys(self, n: int) -> list[bytes]:
        if len(self.keys) < n:
            self.keys = [KEY.pack(i) for i in range(n)]
        return self.keys

    def _env(self, path: str, **kw: Any) -> Any:
        import lmdb

        os.makedirs(path, exist_ok=True)
        return lmdb.open(path, map_size=self.map_size, sync=False, metasync=False, **kw)

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        keys = self._keys(len(values))
        env = self._env(path)
        t = time.perf_counter()
        with env.begin(write=True) as txn:
            put = txn.put
            for k, v in zip(keys, values):
                put(k, v, append=True)
        dt = time.perf_counter() - t
        env.close()
        return dt

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        keys = self._keys(sum(map(len, batches)))
        env = self._env(path)
        t = time.perf_counter()
        i = 0
        for b in batches:
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(zip(keys[i : i + len(b)], b), append=True)
            i += len(b)
        dt = time.perf_counter() - t
        env.close()
        return dt

    def scan(self, path: str, n: int) -> float:
        """Zero-copy cursor scan (``buffers=True``: values are memoryviews of the map)."""
        env = self._env(path, readonly=True, lock=False)
        t = time.perf_counter()
        c = 0
        with env.begin(buffers=True) as txn:
            for v in txn.cursor().iternext(keys=False, values=True):
                c += len(v)
        dt = time.perf_counter() - t
        env.close()
        return dt

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        env = self._env(path, readonly=True, lock=False)
        keys = self._keys(max(idx) + 1)
        ks = [keys[i] for i in idx]
        with env.begin(buffers=True) as txn:
            get = txn.get
            for k in ks:
                get(k)
            out = latencies(get, ks, overhead)
        env.close()
        return out
