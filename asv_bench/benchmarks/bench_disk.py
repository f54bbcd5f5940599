"""Bytes on disk per record (``track_``): store, offset index and time index files."""
from __future__ import annotations

import os
import tempfile

from .common import build_log, disk_bytes, setup  # noqa: F401

N = 20_000


class DiskUsage:
    params = ([16, 100, 1024], [0, 4096])
    param_names = ["value_size", "index_interval_bytes"]
    timeout = 120

    def setup_cache(self) -> dict[tuple[int, int], dict[str, float]]:
        out = {}
        for size in (16, 100, 1024):
            for interval in (0, 4096):
                with tempfile.TemporaryDirectory(dir=os.getcwd()) as d:
                    path = build_log(os.path.join(d, "log"), N, size, seal=False,
                                     index_interval_bytes=interval)
                    files = os.listdir(path)
                    by = {"store": 0, "index": 0, "other": 0}
                    for f in files:
                        n = os.path.getsize(os.path.join(path, f))
                        if f.endswith(".log"):
                            by["store"] += n
                        elif f.endswith((".index", ".timeindex")):
                            by["index"] += n
                        else:
                            by["other"] += n
                    by["total"] = disk_bytes(path)
                    out[(size, interval)] = {k: v / N for k, v in by.items()}
        return out

    def track_bytes_per_record(self, r, value_size: int, interval: int) -> float:
        return r[(value_size, interval)]["total"]

    track_bytes_per_record.unit = "bytes/record"

    def track_overhead_per_record(self, r, value_size: int, interval: int) -> float:
        """Bytes per record beyond the value itself (frame header + index share + files)."""
        return r[(value_size, interval)]["total"] - value_size

    track_overhead_per_record.unit = "bytes/record"

    def track_index_bytes_per_record(self, r, value_size: int, interval: int) -> float:
        return r[(value_size, interval)]["index"]

    track_index_bytes_per_record.unit = "bytes/record"
