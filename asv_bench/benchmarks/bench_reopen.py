"""Reopening a 1,000-segment log: after a clean shutdown, and after an unclean one.

Two logs of 1,000 segments each, the second with ten times the data (10 vs 100 records of
100 B per segment): a clean reopen reads no record data, so both should take about as long
(the durability issue's goal: 10x data <= 1.5x the time).

* ``clean``: ``close()`` left its clean-shutdown marker.
* ``unclean``: the marker is removed: the active segment is walked and CRC-checked, and
  sealed segments after the recovery point are verified (none here: the point is recent).
* ``unclean_full``: the recovery point is removed too: every segment is CRC-checked.
"""
from __future__ import annotations

import os

import pylog
from pylog import format as fmt

from .common import build_log, setup  # noqa: F401

SEGMENTS = 1000
PER_SEGMENT = {"1x": 10, "10x": 100}


class Reopen:
    params = (["1x", "10x"], ["clean", "unclean", "unclean_full"])
    param_names = ["data", "shutdown"]
    number = 1
    repeat = (5, 20, 20.0)
    warmup_time = 0.0

    def setup_cache(self) -> dict[str, str]:
        out = {}
        for name, per in PER_SEGMENT.items():
            out[name] = build_log(os.path.abspath(f"reopen-{name}"), SEGMENTS * per, 100,
                                  per_segment=per, seal=False)
        return out

    setup_cache.timeout = 600

    def setup(self, paths: dict[str, str], data: str, shutdown: str) -> None:
        self.log = None
        path = paths[data]
        if shutdown != "clean":
            for name in (fmt.CLEAN_SHUTDOWN_FILE,) + ((fmt.CHECKPOINT_FILE,) if shutdown == "unclean_full" else ()):
                try:
                    os.unlink(os.path.join(path, name))
                except FileNotFoundError:
                    pass

    def teardown(self, paths: dict[str, str], data: str, shutdown: str) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()  # leaves the clean marker and recovery point back in place

    def time_reopen(self, paths: dict[str, str], data: str, shutdown: str) -> None:
        self.log = pylog.Log(paths[data])
