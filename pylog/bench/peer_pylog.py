"""The pylog peer of the comparison: the system under test."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pylog
from pylog.bench.common import System, latencies

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class PylogSystem(System):
    name = "pylog"
    batch_name = "append_batch"

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        log = pylog.Log(path, fsync="never")
        append = log.append
        t = time.perf_counter()
        for v in values:
            append(v)
        dt = time.perf_counter() - t
        log.roll()
        log.close()
        return dt

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        log = pylog.Log(path, fsync="never")
        ab = log.append_batch
        t = time.perf_counter()
        for b in batches:
            ab(b)
        dt = time.perf_counter() - t
        log.roll()  # everything sealed: reads take the mmap, zero-copy path
        log.close()
        return dt

    def scan(self, path: str, n: int) -> float:
        log = pylog.Log(path, readonly=True)
        t = time.perf_counter()
        c = 0
        for rec in log.scan():
            c += len(rec.value)  # type: ignore[arg-type]  # the benchmark writes no tombstones
        dt = time.perf_counter() - t
        log.close()
        assert c > 0
        return dt

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        log = pylog.Log(path, readonly=True, cached_segments=None)
        read = log.read
        for i in idx:  # warm: maps made, pages faulted in
            read(i)
        out = latencies(read, idx, overhead)
        log.close()
        return out

    def poll(self, path: str, batches: Sequence[Sequence[bytes]], max_records: int = 500) -> tuple[float, int]:
        """``Consumer.poll(max_records)`` over a one-partition topic of sealed segments, from
        the first offset to the end, touching each value (seconds, records)."""
        store = pylog.LogStore(path)
        topic = store.create_topic("bench", 1, fsync="never")
        for b in batches:
            topic.append_batch(b)
        topic.partition(0).roll()  # everything sealed: the zero-copy path
        c = store.consumer("bench")
        poll = c.poll
        n = 0
        t = time.perf_counter()
        while True:
            got = poll(max_records)
            if not got:
                break
            for rec in got:
                n += 1 if rec.value is not None else 0
        dt = time.perf_counter() - t
        c.close()
        store.close()
        return dt, n
