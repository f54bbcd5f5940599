"""The sqlite3 peer (standard library; WAL journal)."""
from __future__ import annotations

import os
import sqlite3
import time
from typing import TYPE_CHECKING, Any

from pylog.bench.common import System, latencies

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class SqliteSystem(System):
    """sqlite3, WAL journal, synchronous=OFF (no fsync, like the others), one transaction
    for the per-record loop, executemany + commit per 1,000 records."""

    name = "sqlite3 (WAL)"
    batch_name = "executemany/1000"

    def _open(self, path: str) -> sqlite3.Connection:
        os.makedirs(path, exist_ok=True)
        conn = sqlite3.connect(os.path.join(path, "db.sqlite"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("CREATE TABLE IF NOT EXISTS log (offset INTEGER PRIMARY KEY, v BLOB)")
        return conn

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        conn = self._open(path)
        ex = conn.execute
        sql = "INSERT INTO log(v) VALUES (?)"
        t = time.perf_counter()
        ex("BEGIN")
        for v in values:
            ex(sql, (v,))
        ex("COMMIT")
        dt = time.perf_counter() - t
        conn.close()
        return dt

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        conn = self._open(path)
        sql = "INSERT INTO log(v) VALUES (?)"
        t = time.perf_counter()
        for b in batches:
            conn.execute("BEGIN")
            conn.executemany(sql, [(v,) for v in b])
            conn.execute("COMMIT")
        dt = time.perf_counter() - t
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        return dt

    def scan(self, path: str, n: int) -> float:
        conn = self._open(path)
        t = time.perf_counter()
        c = 0
        for (v,) in conn.execute("SELECT v FROM log ORDER BY offset"):
            c += len(v)
        dt = time.perf_counter() - t
        conn.close()
        return dt

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        conn = self._open(path)
        ex = conn.execute
        sql = "SELECT v FROM log WHERE offset = ?"

        def get(i: int) -> Any:
            return ex(sql, (i + 1,)).fetchone()

        for i in idx:
            get(i)
        out = latencies(get, idx, overhead)
        conn.close()
        return out
