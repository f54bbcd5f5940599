"""Retention and truncation: deleting whole sealed segments, and cutting the log.

Each repeat works on a fresh copy (made in ``setup``) of a 200-segment log built once in
``setup_cache``.
"""
from __future__ import annotations

import os

import pylog

from .common import BaseIO, build_log, copy_log, setup  # noqa: F401

SEGMENTS = 200
PER_SEGMENT = 500


class Retention(BaseIO):
    params = [10, 100, 199]
    param_names = ["segments_deleted"]
    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0.0

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("retention-log"), SEGMENTS * PER_SEGMENT, 100,
                         per_segment=PER_SEGMENT, seal=True)

    setup_cache.timeout = 600

    def setup(self, path: str, deleted: int) -> None:
        work = copy_log(path, os.path.join(self.tmpdir(), "log"))
        probe = pylog.Log(work)
        seg = probe.segments()
        keep = sum(s["size_bytes"] for s in seg[deleted:])
        probe.close()
        self.log = self.keep_log(pylog.Log(work, retention_bytes=keep))

    def time_enforce_retention(self, path: str, deleted: int) -> None:
        self.log.enforce_retention()


class Truncate(BaseIO):
    params = [0.5, 0.99]
    param_names = ["keep_fraction"]
    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0.0

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("truncate-log"), SEGMENTS * PER_SEGMENT, 100,
                         per_segment=PER_SEGMENT, seal=False)

    setup_cache.timeout = 600

    def setup(self, path: str, keep: float) -> None:
        work = copy_log(path, os.path.join(self.tmpdir(), "log"))
        self.log = self.keep_log(pylog.Log(work))
        self.target = int(self.log.next_offset * keep) + 7

    def time_truncate(self, path: str, keep: float) -> None:
        self.log.truncate(self.target)


class Compaction(BaseIO):
    """Compaction of a keyed log (skipped until ``Log.compact`` exists)."""

    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0.0

    def setup(self) -> None:
        if not hasattr(pylog.Log, "compact"):
            raise NotImplementedError("Log.compact does not exist yet")
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="never", cleanup_policy="compact",
                                            segment_bytes=1 << 20))
        vals = [b"v" * 100] * 1000
        for i in range(20):
            self.log.append_batch(vals, keys=[b"k%d" % (j % 100) for j in range(1000)])
        self.log.roll()

    def time_compact(self) -> None:
        self.log.compact()  # type: ignore[attr-defined]
