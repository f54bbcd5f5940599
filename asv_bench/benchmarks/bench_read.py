"""Reading: random ``read(offset)`` warm and cold, ``read_batch`` and ``scan``.

The logs are built once per class in ``setup_cache``: 200,000 records of 100 B (and 20,000
of 1 KiB) in sealed segments of 4 MiB, so reads go through the sealed-segment path (mmap,
zero-copy values). Logs are opened ``readonly`` so benchmarks never change the cached files.

* warm: the log is open, every segment mapped and every page faulted in during ``setup``.
* cold: ``setup`` drops the files from the page cache and opens a fresh ``Log``: the timed
  reads map segments, read index files and fault pages from disk.
"""
from __future__ import annotations

import os

import pylog

from .common import BaseIO, build_log, drop_cache, random_offsets, setup  # noqa: F401

N = {100: 200_000, 1024: 20_000}
READS_PER_CALL = 1000


def _build_read_logs() -> dict[int, str]:
    out = {}
    for size, n in N.items():
        out[size] = build_log(os.path.abspath(f"read-log-{size}"), n, size, segment_bytes=4 << 20)
    return out


def _fault_in(log: pylog.Log) -> None:
    total = 0
    for rec in log.scan():
        total += rec.value[-1]
    return None


class ReadRandomWarm:
    """1,000 random ``read(offset)`` calls on a warm log."""

    params = [100, 1024]
    param_names = ["value_size"]

    def setup_cache(self) -> dict[int, str]:
        return _build_read_logs()

    setup_cache.timeout = 300

    def setup(self, paths: dict[int, str], value_size: int) -> None:
        self.log = pylog.Log(paths[value_size], readonly=True, cached_segments=None)
        _fault_in(self.log)
        self.offsets = random_offsets(READS_PER_CALL, 0, N[value_size])
        for o in self.offsets:
            self.log.read(o)

    def teardown(self, paths: dict[int, str], value_size: int) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()

    def time_read_random_warm(self, paths: dict[int, str], value_size: int) -> None:
        read = self.log.read
        for o in self.offsets:
            read(o)

    def time_read_random_warm_copy(self, paths: dict[int, str], value_size: int) -> None:
        """The same, copying each value to ``bytes`` (what a caller keeping it pays)."""
        read = self.log.read
        for o in self.offsets:
            bytes(read(o).value)


class ReadRandomCold:
    """1,000 random ``read(offset)`` calls on a log just opened, files not in the page cache."""

    params = [100, 1024]
    param_names = ["value_size"]
    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0.0

    def setup_cache(self) -> dict[int, str]:
        return _build_read_logs()

    setup_cache.timeout = 300

    def setup(self, paths: dict[int, str], value_size: int) -> None:
        drop_cache(paths[value_size])
        self.log = pylog.Log(paths[value_size], readonly=True)
        self.offsets = random_offsets(READS_PER_CALL, 0, N[value_size], seed=os.getpid())

    def teardown(self, paths: dict[int, str], value_size: int) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()

    def time_read_random_cold(self, paths: dict[int, str], value_size: int) -> None:
        read = self.log.read
        for o in self.offsets:
            read(o)


class ReadBatch:
    """``read_batch`` (a fetch) from random offsets, by byte budget (warm)."""

    params = [4096, 65536, 1 << 20]
    param_names = ["max_bytes"]

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("read-batch-log"), N[100], 100, segment_bytes=4 << 20)

    setup_cache.timeout = 300

    def setup(self, path: str, max_bytes: int) -> None:
        self.log = pylog.Log(path, readonly=True, cached_segments=None)
        _fault_in(self.log)
        self.offsets = random_offsets(100, 0, N[100] - 10_000)

    def teardown(self, path: str, max_bytes: int) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()

    def time_read_batch(self, path: str, max_bytes: int) -> None:
        rb = self.log.read_batch
        for o in self.offsets:
            rb(o, max_bytes=max_bytes)


class Scan:
    """``scan()`` of the whole log (200,000 x 100 B or 20,000 x 1 KiB), warm, touching
    every value: zero-copy views, or copied to bytes."""

    params = [100, 1024]
    param_names = ["value_size"]

    def setup_cache(self) -> dict[int, str]:
        return _build_read_logs()

    setup_cache.timeout = 300

    def setup(self, paths: dict[int, str], value_size: int) -> None:
        self.log = pylog.Log(paths[value_size], readonly=True, cached_segments=None)
        _fault_in(self.log)

    def teardown(self, paths: dict[int, str], value_size: int) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()

    def time_scan_view(self, paths: dict[int, str], value_size: int) -> None:
        n = 0
        for rec in self.log.scan():
            n += len(rec.value)

    def time_scan_copy(self, paths: dict[int, str], value_size: int) -> None:
        for rec in self.log.scan():
            bytes(rec.value)

    def peakmem_scan(self, paths: dict[int, str], value_size: int) -> None:
        n = 0
        for rec in self.log.scan():
            n += len(rec.value)


class ScanCold:
    """``scan()`` of the whole 100 B log just after dropping it from the page cache."""

    number = 1
    repeat = (3, 5, 20.0)
    warmup_time = 0.0

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("scan-cold-log"), N[100], 100, segment_bytes=4 << 20)

    setup_cache.timeout = 300

    def setup(self, path: str) -> None:
        drop_cache(path)
        self.log = pylog.Log(path, readonly=True)

    def teardown(self, path: str) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()

    def time_scan_cold(self, path: str) -> None:
        n = 0
        for rec in self.log.scan():
            n += len(rec.value)
