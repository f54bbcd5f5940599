"""The read paths of pylog._speedups (issue 16) against the Python paths they replace.

Each benchmark runs twice: ``path="c"`` (the extension: Records made in C, a sealed
segment's read in one C call) and ``path="python"`` (the same operation with the extension
switched off in this process: Records built in Python over the cffi scan). The log is the
same: 200,000 records of 100 B in sealed segments of 4 MiB, warm (pages faulted in).

* read: 1,000 random ``Log.read(offset)``;
* scan: every record, touching each value; and (SpeedupsScanViews) the same scan with the
  extension's two ways of making a value's view (without a slice object, or by slicing);
* poll: ``Consumer.poll(500)`` from the first offset to the end of a one-partition topic;
* poll held: the same as a user's loop writes it (``got = poll(500)``, so the previous batch
  is alive while the next is made) in a process holding 200,000 other containers: what the
  collector costs a fetch (the Record pool of the extension keeps it from running at all).

Without the extension (pure backend, or not built) only ``path="python"`` runs.
"""
from __future__ import annotations

import os

import pylog
import pylog.reading
import pylog.segment
from pylog._backend import speedups

from .common import build_log, random_offsets, setup  # noqa: F401

N = 200_000
SIZE = 100
READS_PER_CALL = 1000


def _use(path: str) -> None:
    """Switch the extension on (``c``) or off (``python``) for maps opened from now on."""
    if path == "c" and speedups is None:
        raise NotImplementedError("pylog._speedups is not in use")  # asv: skipped
    sp = speedups if path == "c" else None
    pylog.segment._sp = sp
    pylog.reading._sp = sp


def _restore() -> None:
    pylog.segment._sp = speedups
    pylog.reading._sp = speedups


class _WarmLog:
    """A warm read-only log of N records, with the extension on or off (``path``)."""

    params = ["c", "python"]
    param_names = ["path"]

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("speedups-log"), N, SIZE, segment_bytes=4 << 20)

    setup_cache.timeout = 300

    def setup(self, path_: str, path: str) -> None:
        _use(path)
        self.log = pylog.Log(path_, readonly=True, cached_segments=None)
        for rec in self.log.scan():
            rec.value[-1]

    def teardown(self, path_: str, path: str) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()
        _restore()


class SpeedupsRead(_WarmLog):
    """1,000 random ``Log.read(offset)`` on a warm log."""

    def setup(self, path_: str, path: str) -> None:
        super().setup(path_, path)
        self.offsets = random_offsets(READS_PER_CALL, 0, N)
        for o in self.offsets:
            self.log.read(o)

    def time_read(self, path_: str, path: str) -> None:
        read = self.log.read
        for o in self.offsets:
            read(o)


class SpeedupsScan(_WarmLog):
    """``Log.scan()`` of every record, touching each value."""

    def time_scan(self, path_: str, path: str) -> None:
        n = 0
        for rec in self.log.scan():
            n += len(rec.value)


class SpeedupsScanViews:
    """``Log.scan()`` touching each value, with the extension, its views made without a slice
    object (``views="fast"``: where the import-time memoryview layout check passed, the
    default) or by slicing the map's view (``views="sliced"``: the way before it)."""

    params = ["fast", "sliced"]
    param_names = ["views"]

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("speedups-log-views"), N, SIZE, segment_bytes=4 << 20)

    setup_cache.timeout = 300

    def setup(self, path_: str, views: str) -> None:
        if speedups is None or (views == "fast" and not speedups.FAST_VIEWS):
            raise NotImplementedError("no views made without a slice here")  # asv: skipped
        self.was = speedups._set_fast_views(views == "fast")
        self.log = pylog.Log(path_, readonly=True, cached_segments=None)
        for rec in self.log.scan():
            rec.value[-1]

    def teardown(self, path_: str, views: str) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()
        if speedups is not None and hasattr(self, "was"):
            speedups._set_fast_views(self.was)

    def time_scan(self, path_: str, views: str) -> None:
        n = 0
        for rec in self.log.scan():
            n += len(rec.value)


class SpeedupsPoll:
    """``Consumer.poll(500)`` over a one-partition topic of sealed segments, start to end."""

    params = ["c", "python"]
    param_names = ["path"]
    number = 1

    def setup_cache(self) -> str:
        root = os.path.abspath("speedups-store")
        store = pylog.LogStore(root)
        topic = store.create_topic("t", 1, fsync="never", segment_bytes=4 << 20)
        values = [os.urandom(SIZE) for _ in range(256)]
        for i in range(0, N, 1000):
            topic.append_batch([values[j & 255] for j in range(i, i + 1000)])
        topic.partition(0).roll()
        store.close()
        return root

    setup_cache.timeout = 300

    def setup(self, root: str, path: str) -> None:
        _use(path)
        self.store = pylog.LogStore(root, readonly=True)

    def teardown(self, root: str, path: str) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()
        _restore()

    def time_poll(self, root: str, path: str) -> None:
        c = self.store.consumer("t")
        poll = c.poll
        while poll(500):
            pass
        c.close()


class SpeedupsPollHeld(SpeedupsPoll):
    """``got = poll(500)`` until empty, touching each value, with 200,000 lists alive: each
    young collection a fetch sets off promotes live batches, and their promotion sets off full
    collections over the whole heap (issue 16: half a poll's time in the comparison)."""

    def setup(self, root: str, path: str) -> None:
        super().setup(root, path)
        self.heap = [[] for _ in range(200_000)]

    def teardown(self, root: str, path: str) -> None:
        self.heap = None
        super().teardown(root, path)

    def time_poll_held(self, root: str, path: str) -> None:
        c = self.store.consumer("t")
        poll = c.poll
        n = 0
        while True:
            got = poll(500)
            if not got:
                break
            for rec in got:
                n += 1 if rec.value is not None else 0
        c.close()
