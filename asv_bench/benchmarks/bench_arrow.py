"""Columnar read: a whole sealed log as Arrow (skipped until pylog has a columnar reader).

Goal (issue 6): >= 20 million records/s on sealed segments, 100 B values.
"""
from __future__ import annotations

import os

import pylog

from .common import arrow_reader, build_log, optional, setup  # noqa: F401

N = 200_000


class ArrowRead:
    def setup_cache(self) -> str:
        return build_log(os.path.abspath("arrow-log"), N, 100, segment_bytes=16 << 20)

    setup_cache.timeout = 300

    def setup(self, path: str) -> None:
        optional("pyarrow")
        self.read = arrow_reader()
        self.log = pylog.Log(path, readonly=True, cached_segments=None)
        self.read(self.log)  # warm: maps made, pages faulted in

    def teardown(self, path: str) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()

    def time_read_arrow(self, path: str) -> None:
        self.read(self.log)

    def peakmem_read_arrow(self, path: str) -> None:
        self.read(self.log)
