"""Shared helpers of the asv suite (modelled on pandas' ``pandas_vb_common.py``).

* :func:`setup` seeds the random generators; each benchmark module imports it, so asv runs
  it before every benchmark of that module.
* :class:`BaseIO` gives a benchmark private temp directories and removes them in
  ``teardown``.
* :func:`build_log` writes a log quickly (fsync switched off while it builds: durability of
  setup data is not what is measured).

Conventions of the suite: big logs are built once per class in ``setup_cache`` (defined on
each concrete class, never on a shared base: asv#880) in asv's temp working directory;
``time_*`` methods hold only the measured work; "warm" benchmarks fault every page in during
``setup``, "cold" ones drop the files from the page cache (``posix_fadvise(DONTNEED)``) and
open a fresh ``Log`` in ``setup``, with ``number = 1`` and ``warmup_time = 0``.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np

import pylog

SEED = 1234

#: Records per call of the per-record and batch append benchmarks, by value size: about
#: the same amount of work per call, whatever the size.
RECORDS_PER_CALL = {16: 1000, 100: 1000, 1024: 1000, 65536: 100}


def setup(*args: object, **kwargs: object) -> None:
    """Seed every generator the benchmarks use (asv calls this before each benchmark)."""
    np.random.seed(SEED)
    random.seed(SEED)


def make_values(n: int, size: int, seed: int = SEED, distinct: int = 256) -> list[bytes]:
    """``n`` values of ``size`` random bytes (``distinct`` different ones, cycled, so large
    ``n`` costs no memory)."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(min(n, distinct))]
    return [pool[i % len(pool)] for i in range(n)]


def random_offsets(n: int, lo: int, hi: int, seed: int = SEED) -> list[int]:
    """``n`` seeded random offsets in ``[lo, hi)`` as Python ints."""
    rng = np.random.default_rng(seed)
    return rng.integers(lo, hi, n).tolist()


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Make fsync/fdatasync no-ops (``os`` and ``pylog.vfs``, if present) while a benchmark
    builds its data: setup data need not be durable, and 1,000 rolls would cost seconds."""
    targets = [os]
    try:
        from pylog import vfs  # the fault-injection seam, where it exists

        targets.append(vfs)
    except ImportError:
        pass
    saved = []
    for mod in targets:
        for name in ("fsync", "fdatasync"):
            if hasattr(mod, name):
                saved.append((mod, name, getattr(mod, name)))
                setattr(mod, name, lambda fd: None)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def build_log(path: str, n: int, size: int, *, batch: int = 1000, per_segment: int | None = None,
              seal: bool = True, **config: object) -> str:
    """Write ``n`` records of ``size`` bytes into a new log at ``path`` and close it.

    ``per_segment``: roll after this many records (a log of ``n / per_segment`` segments).
    ``seal``: roll at the end, so every record is in a sealed (mapped, zero-copy) segment.
    """
    config.setdefault("fsync", "never")
    values = make_values(min(batch, n), size)
    step = min(batch, per_segment or batch)
    with no_fsync():
        log = pylog.Log(path, **config)
        try:
            done = 0
            since_roll = 0
            while done < n:
                k = min(step, n - done)
                log.append_batch(values[:k])
                done += k
                since_roll += k
                if per_segment is not None and since_roll >= per_segment:
                    log.roll()
                    since_roll = 0
            if seal:
                log.roll()
        finally:
            log.close()
    return path


def drop_cache(path: str) -> None:
    """Evict a directory's files from the page cache (no root needed): written back first,
    since ``DONTNEED`` leaves dirty pages alone."""
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_bytes(path: str) -> int:
    """Bytes the files under ``path`` take (apparent sizes, all files)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def copy_log(src: str, dst: str) -> str:
    """A private copy of a log directory (for benchmarks that change or destroy it)."""
    shutil.copytree(src, dst)
    return dst


def optional(module: str):
    """Import ``module`` or raise NotImplementedError, which makes asv skip the benchmark."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise NotImplementedError(f"{module} is not available: {e}") from None


class BaseIO:
    """Gives each benchmark fresh temp directories; ``teardown`` closes logs and removes them."""

    def tmpdir(self) -> str:
        d = tempfile.mkdtemp(prefix="pylog-asv-", dir=os.getcwd())
        self.__dict__.setdefault("_dirs", []).append(d)
        return d

    def keep_log(self, log: pylog.Log) -> pylog.Log:
        self.__dict__.setdefault("_logs", []).append(log)
        return log

    def teardown(self, *args: object, **kwargs: object) -> None:
        for log in self.__dict__.pop("_logs", []):
            try:
                log.close()
            except Exception:
                pass
        for d in self.__dict__.pop("_dirs", []):
            shutil.rmtree(d, ignore_errors=True)


def batches(values: Sequence[bytes], size: int) -> list[Sequence[bytes]]:
    return [values[i : i + size] for i in range(0, len(values), size)]


#: Where a columnar (Arrow) reader of a log may live, in the order they are tried:
#: (module, function taking a Log) or (None, Log method name).
ARROW_READERS = [
    (None, "read_arrow"), (None, "to_arrow"), (None, "read_columns"),
    ("pylog.arrow", "read_table"), ("pylog.arrow", "to_table"), ("pylog.arrow", "read_log"),
    ("pylog.arrow", "read_arrow"), ("pylog.columnar", "read_table"),
]


def arrow_reader():
    """A function ``f(log) -> pyarrow.Table | RecordBatch`` reading a whole log, or
    NotImplementedError (asv skips) when pylog has no columnar reader yet."""
    import importlib

    for mod, name in ARROW_READERS:
        if mod is None:
            if hasattr(pylog.Log, name):
                return lambda log, _n=name: getattr(log, _n)()
            continue
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, name):
            return getattr(m, name)
    try:  # the Arrow path of the Spark data source: a C scan of each sealed segment
        spark = importlib.import_module("pylog.spark")
        read_slice, slice_cls = spark._read_slice, spark._Slice
    except (ImportError, AttributeError):
        raise NotImplementedError("pylog has no columnar (Arrow) reader without pyspark") from None

    def read(log: pylog.Log) -> list:
        out: list = []
        for s in log.segments():
            if s["sealed"] and s["next_offset"] > s["base_offset"]:
                sl = slice_cls("bench", 0, s["path"], s["base_offset"], 32, s["next_offset"], s["size_bytes"])
                out.extend(read_slice(sl))
        return out

    return read
