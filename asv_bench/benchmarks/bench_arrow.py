"""Columnar read: a whole sealed log as Arrow.

Goal (issue 6): >= 20 million records/s on sealed segments, 100 B values.

* ``ArrowRead``: whichever columnar reader pylog has (``Log.read_arrow`` today, which is
  ``read_table`` with threads; on older commits ``pylog.arrow`` or the Spark data source's
  Arrow path; skipped with none): the one line to follow across the history.
* ``ArrowReadTable``: ``pylog.arrow.read_table`` itself, with and without threads, and one
  column only (skipped on commits without ``pylog.arrow``).
* ``ArrowReadTableCPU``: the same reads timed in CPU time of all threads
  (``time.process_time``): what a read costs, which a busy neighbour on a shared host
  disturbs far less than the wall clock (the wall clock of a threaded read also depends on
  how its parts spread over the threads).
* ``ArrowIterBatches``: ``pylog.arrow.iter_batches`` (one thread by design).
"""
from __future__ import annotations

import inspect
import os
import time

import pylog

from .common import arrow_reader, build_log, optional, setup  # noqa: F401

N = 200_000


class _SealedLog:
    """A sealed log of N x 100 B built once (one setup_cache, shared by the classes below)
    and opened read-only by each benchmark's setup as ``self.log``."""

    def setup_cache(self) -> str:
        return build_log(os.path.abspath("arrow-log"), N, 100, segment_bytes=16 << 20)

    setup_cache.timeout = 300

    def teardown(self, path: str, *params: object) -> None:
        if getattr(self, "log", None) is not None:
            self.log.close()


class ArrowRead(_SealedLog):
    def setup(self, path: str) -> None:
        optional("pyarrow")
        self.read = arrow_reader()
        self.log = pylog.Log(path, readonly=True, cached_segments=None)
        self.read(self.log)  # warm: maps made, pages faulted in

    def time_read_arrow(self, path: str) -> None:
        self.read(self.log)

    def peakmem_read_arrow(self, path: str) -> None:
        self.read(self.log)


class ArrowReadTable(_SealedLog):
    params = [True, False]
    param_names = ["use_threads"]

    def setup(self, path: str, use_threads: bool) -> None:
        optional("pyarrow")
        self.arrow = optional("pylog.arrow")
        if "use_threads" not in inspect.signature(self.arrow.read_table).parameters:
            raise NotImplementedError("this pylog.arrow.read_table has no use_threads")
        self.log = pylog.Log(path, readonly=True, cached_segments=None)
        self.kw = {"use_threads": use_threads}
        table = self.arrow.read_table(self.log, **self.kw)  # warm: maps made, pages faulted in
        assert table.num_rows == N

    def time_read_table(self, path: str, use_threads: bool) -> None:
        self.arrow.read_table(self.log, **self.kw)

    def time_read_table_value_only(self, path: str, use_threads: bool) -> None:
        self.arrow.read_table(self.log, columns=["value"], **self.kw)

    def peakmem_read_table(self, path: str, use_threads: bool) -> None:
        self.arrow.read_table(self.log, **self.kw)


class ArrowReadTableCPU(_SealedLog):
    params = [True, False]
    param_names = ["use_threads"]
    timer = time.process_time
    setup = ArrowReadTable.setup

    def time_read_table_cpu(self, path: str, use_threads: bool) -> None:
        self.arrow.read_table(self.log, **self.kw)


class ArrowIterBatches(_SealedLog):
    def setup(self, path: str) -> None:
        optional("pyarrow")
        self.arrow = optional("pylog.arrow")
        self.log = pylog.Log(path, readonly=True, cached_segments=None)
        assert sum(b.num_rows for b in self.arrow.iter_batches(self.log)) == N  # warm

    def time_iter_batches(self, path: str) -> None:
        for _batch in self.arrow.iter_batches(self.log):
            pass
