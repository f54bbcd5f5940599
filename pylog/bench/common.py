"""What the comparison's peers share: result rows, speed targets, timing helpers and the
:class:`System` interface each peer module implements."""
from __future__ import annotations

import contextlib
import importlib
import os
import socket
import statistics
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BATCH = 1000
LEN = struct.Struct("<I")
KEY = struct.Struct(">Q")


# ----------------------------------------------------------------------------------------
# results
@dataclass
class Row:
    """One measured figure: a workload of one system on one dataset (medians of the samples)."""

    dataset: str
    workload: str
    system: str
    n: int
    seconds: float | None = None  # median
    rate: float | None = None  # records/s
    mb_s: float | None = None  # value bytes/s / 1e6
    p50_us: float | None = None
    p99_us: float | None = None
    bytes_per_record: float | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list)


@dataclass
class Target:
    """A speed goal and what the run measured. ``skipped`` says why it could not be measured
    (a peer it compares against is not installed or was not selected): neither met nor missed."""

    name: str
    measured: float | None
    goal: float
    kind: str  # ">=" or "<="
    unit: str = "x"
    issue: int = 6
    note: str = ""
    skipped: str = ""

    @property
    def ok(self) -> bool:
        """Whether the goal was met (False when skipped)."""
        if self.measured is None or self.skipped:
            return False
        return self.measured >= self.goal if self.kind == ">=" else self.measured <= self.goal

    def line(self) -> str:
        """``target: NAME: measured M (goal G) PASS|FAIL``, or ``... SKIP (why)``."""
        if self.skipped:
            return f"target: {self.name}: SKIP ({self.skipped})"
        m = "n/a" if self.measured is None else _fmt_num(self.measured, self.unit)
        g = f"{self.kind} {_fmt_num(self.goal, self.unit)}"
        tail = f"  [{self.note}]" if self.note else ""
        return f"target: {self.name}: measured {m} (goal {g}) {'PASS' if self.ok else 'FAIL'}{tail}"


def _fmt_num(x: float, unit: str) -> str:
    if unit == "x":
        return f"{x:.2f}x"
    if unit == "rec/s":
        return f"{x / 1e6:.2f}M rec/s"
    if unit in ("us", "ms"):
        return f"{x:.2f} {unit}"
    if unit == "GB/s":
        return f"{x:.2f} GB/s"
    return f"{x:.3g} {unit}"


def _si(x: float | None) -> str:
    if x is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suf}"
    return f"{x:.0f}"


# ----------------------------------------------------------------------------------------
# helpers
def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def dir_bytes(path: str) -> int:
    """Bytes allocated on disk for everything under ``path`` (what ``du`` counts)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            st = os.stat(os.path.join(root, f))
            total += min(st.st_blocks * 512, max(st.st_size, 4096)) if st.st_blocks else st.st_size
    return total


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """fsync/fdatasync as no-ops while setup data is built (``os`` and ``pylog.vfs``)."""
    targets: list[Any] = [os]
    with contextlib.suppress(ImportError):
        targets.append(importlib.import_module("pylog.vfs"))
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


def timer_overhead_ns() -> float:
    pc = time.perf_counter_ns
    xs = []
    for _ in range(20000):
        t = pc()
        xs.append(pc() - t)
    return float(np.median(xs))


def latencies(get: Callable[[Any], Any], keys: Sequence[Any], overhead: float) -> np.ndarray:
    """Per-call latency (ns) of ``get(k)`` for each key, timer overhead subtracted."""
    pc = time.perf_counter_ns
    out = np.empty(len(keys), dtype=np.float64)
    for j, k in enumerate(keys):
        t = pc()
        get(k)
        out[j] = pc() - t
    return np.maximum(out - overhead, 0.0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------------
# systems: each knows how to write per record, write in batches, scan and read one record.
# Every method times only the work itself and returns seconds (and what it needs).


# ----------------------------------------------------------------------------------------
# systems: each knows how to write per record, write in batches, scan and read one record.
# Every method times only the work itself and returns seconds (and what it needs).
class System:
    name = "?"
    batch_name = "batch"
    each_cap: int | None = None  # most records for the per-record workload (slow peers)
    batch_cap: int | None = None
    read_cap: int | None = None
    can_read = True
    can_batch = True
    disk_note = ""

    def available(self) -> str | None:
        return None  # a reason it is not, or None

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        raise NotImplementedError

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        raise NotImplementedError

    def scan(self, path: str, n: int) -> float:
        raise NotImplementedError

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        raise NotImplementedError

    def disk(self, path: str) -> float:
        return float(dir_bytes(path))

    def close(self) -> None:
        pass


def dataset_values(n: int, size: int) -> list[bytes]:
    """The values of a dataset: ``n`` references to a seeded pool of 1,024 random values
    of ``size`` bytes (so 1,000,000 records do not take 1,000,000 allocations)."""
    rng = np.random.default_rng(1234)
    pool = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(1024)]
    return [pool[i & 1023] for i in range(n)]
