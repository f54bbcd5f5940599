"""The plain-file peers: length-prefixed records in one Python file (read + parse, and mmap)."""
from __future__ import annotations

import mmap
import os
import time
from typing import TYPE_CHECKING

from pylog.bench.common import LEN, System, latencies

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class FileSystem(System):
    """A plain Python file of length-prefixed records (no CRC, no index)."""

    name = "file"
    batch_name = "join+write/1000"

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        os.makedirs(path, exist_ok=True)
        pack = LEN.pack
        with open(os.path.join(path, "data"), "wb") as f:
            write = f.write
            t = time.perf_counter()
            for v in values:
                write(pack(len(v)) + v)
            f.flush()
            return time.perf_counter() - t

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        os.makedirs(path, exist_ok=True)
        pack = LEN.pack
        with open(os.path.join(path, "data"), "wb") as f:
            t = time.perf_counter()
            for b in batches:
                f.write(b"".join([pack(len(v)) + v for v in b]))
            f.flush()
            return time.perf_counter() - t

    def scan(self, path: str, n: int) -> float:
        """Read the whole file and parse it (values as bytes slices)."""
        t = time.perf_counter()
        with open(os.path.join(path, "data"), "rb") as f:
            data = f.read()
        unpack = LEN.unpack_from
        pos, end, c = 0, len(data), 0
        while pos < end:
            (k,) = unpack(data, pos)
            v = data[pos + 4 : pos + 4 + k]
            c += len(v)
            pos += 4 + k
        return time.perf_counter() - t

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        """Random reads through an in-memory list of positions (built untimed) over an mmap."""
        with open(os.path.join(path, "data"), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        unpack = LEN.unpack_from
        pos_list, pos = [], 0
        while pos < len(mm):
            pos_list.append(pos)
            pos += 4 + unpack(mm, pos)[0]

        def get(i: int, mm: mmap.mmap = mm, pl: list[int] = pos_list) -> bytes:
            p = pl[i]
            return mm[p + 4 : p + 4 + unpack(mm, p)[0]]

        for i in idx:
            get(i)
        out = latencies(get, idx, overhead)
        mm.close()
        return out


class FileMmapScan(FileSystem):
    """The plain file scanned through mmap + memoryview slices (zero copy)."""

    name = "file (mmap)"

    def write_each(self, path: str, values: Sequence[bytes]) -> float:  # only the scan differs
        raise NotImplementedError

    def scan(self, path: str, n: int) -> float:
        t = time.perf_counter()
        with open(os.path.join(path, "data"), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mv = memoryview(mm)
        unpack = LEN.unpack_from
        pos, end, c = 0, len(mm), 0
        v: memoryview | None
        while pos < end:
            (k,) = unpack(mm, pos)
            v = mv[pos + 4 : pos + 4 + k]
            c += len(v)
            pos += 4 + k
        dt = time.perf_counter() - t
        v = None
        mv.release()
        mm.close()
        return dt
