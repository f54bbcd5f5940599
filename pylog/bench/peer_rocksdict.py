"""The RocksDB peer through ``rocksdict`` (from the ``bench`` extra)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from pylog.bench.common import KEY, System, latencies

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class RocksdictSystem(System):
    """rocksdict (RocksDB) in raw mode, default options (WAL on, no sync)."""

    name = "rocksdict"
    batch_name = "WriteBatch/1000"

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def available(self) -> str | None:
        try:
            import rocksdict  # noqa: F401
        except ImportError:
            return "the rocksdict package is not installed"
        return None

    def _keys(self, n: int) -> list[bytes]:
        if len(self.keys) < n:
            self.keys = [KEY.pack(i) for i in range(n)]
        return self.keys

    def _db(self, path: str) -> Any:
        from rocksdict import Options, Rdict

        os.makedirs(os.path.dirname(path), exist_ok=True)
        return Rdict(path, Options(raw_mode=True))

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        keys = self._keys(len(values))
        db = self._db(path)
        put = db.put
        t = time.perf_counter()
        for k, v in zip(keys, values):
            put(k, v)
        dt = time.perf_counter() - t
        db.flush()
        db.close()
        return dt

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        from rocksdict import WriteBatch

        keys = self._keys(sum(map(len, batches)))
        db = self._db(path)
        t = time.perf_counter()
        i = 0
        for b in batches:
            wb = WriteBatch(raw_mode=True)
            put = wb.put
            for k, v in zip(keys[i : i + len(b)], b):
                put(k, v)
            db.write(wb)
            i += len(b)
        dt = time.perf_counter() - t
        db.flush()
        db.close()
        return dt

    def scan(self, path: str, n: int) -> float:
        db = self._db(path)
        t = time.perf_counter()
        c = 0
        for v in db.values():
            c += len(v)
        dt = time.perf_counter() - t
        db.close()
        return dt

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        db = self._db(path)
        keys = self._keys(max(idx) + 1)
        ks = [keys[i] for i in idx]
        get = db.get
        for k in ks:
            get(k)
        out = latencies(get, ks, overhead)
        db.close()
        return out
