"""pylog against the peers a user would pick, on the same workloads, in one run.

    python -m benchmarks.compare [--quick] [--records N] [--value-size B] [--json FILE]

Peers: a plain Python file (per-record ``f.write(struct.pack(...) + v)`` and a joined write
per 1,000 records), sqlite3 (WAL), lmdb, rocksdict, queuelib, and Redis Streams when a
``redis-server`` binary and the ``redis`` client are present (a private server on 127.0.0.1,
a free port and a temp dir, stopped at the end). A missing peer is reported and skipped.

Workloads, ``fsync="never"`` (no fsync anywhere) unless named otherwise, page cache warm:

* append (each): one record per call; append (batch): 1,000 records per call;
* scan: every record read back in order, touching each value (``len``);
* random read: latency of single reads at random offsets (p50 / p99);
* bytes on disk per record after the batch append;
* durability: ``fsync="always"`` one writer (by default, and with ``preallocate=True``) vs
  ``os.write`` + ``os.fdatasync`` per record,
  16 threads with ``fsync="always"`` (group commit) vs one writer; reopen of a 1,000-segment
  log after a clean shutdown, and with 10x the data; the C verify-scan of a sealed segment of
  1 KiB records; CRC32C vs the ``crc32c`` package.

Every figure is the median of several repetitions, systems interleaved within each
repetition, and every ratio compares figures of the same run. It prints a table and one
``target: <name>: measured <value> (goal <goal>) PASS|FAIL`` line per speed target of
issues 2, 3 and 6. The exit status is 0 whatever the targets say (speed is reported, not
gated: machines are noisy) unless ``--fail-on-miss`` is given; a crash exits non-zero.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import mmap
import os
import platform
import shutil
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import pylog

BATCH = 1000
LEN = struct.Struct("<I")
KEY = struct.Struct(">Q")


# ----------------------------------------------------------------------------------------
# results
@dataclass
class Row:
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
    name: str
    measured: float | None
    goal: float
    kind: str  # ">=" or "<="
    unit: str = "x"
    issue: int = 6
    note: str = ""

    @property
    def ok(self) -> bool:
        if self.measured is None:
            return False
        return self.measured >= self.goal if self.kind == ">=" else self.measured <= self.goal

    def line(self) -> str:
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


class PylogSystem(System):
    name = "pylog"
    batch_name = "append_batch"

    def write_each(self, path, values):
        log = pylog.Log(path, fsync="never")
        append = log.append
        t = time.perf_counter()
        for v in values:
            append(v)
        dt = time.perf_counter() - t
        log.roll()
        log.close()
        return dt

    def write_batches(self, path, batches):
        log = pylog.Log(path, fsync="never")
        ab = log.append_batch
        t = time.perf_counter()
        for b in batches:
            ab(b)
        dt = time.perf_counter() - t
        log.roll()  # everything sealed: reads take the mmap, zero-copy path
        log.close()
        return dt

    def scan(self, path, n):
        log = pylog.Log(path, readonly=True)
        t = time.perf_counter()
        c = 0
        for rec in log.scan():
            c += len(rec.value)
        dt = time.perf_counter() - t
        log.close()
        assert c > 0
        return dt

    def read_latencies(self, path, idx, overhead):
        log = pylog.Log(path, readonly=True, cached_segments=None)
        read = log.read
        for i in idx:  # warm: maps made, pages faulted in
            read(i)
        out = latencies(read, idx, overhead)
        log.close()
        return out


class FileSystem(System):
    """A plain Python file of length-prefixed records (no CRC, no index)."""

    name = "file"
    batch_name = "join+write/1000"

    def write_each(self, path, values):
        os.makedirs(path, exist_ok=True)
        pack = LEN.pack
        with open(os.path.join(path, "data"), "wb") as f:
            write = f.write
            t = time.perf_counter()
            for v in values:
                write(pack(len(v)) + v)
            f.flush()
            return time.perf_counter() - t

    def write_batches(self, path, batches):
        os.makedirs(path, exist_ok=True)
        pack = LEN.pack
        with open(os.path.join(path, "data"), "wb") as f:
            t = time.perf_counter()
            for b in batches:
                f.write(b"".join([pack(len(v)) + v for v in b]))
            f.flush()
            return time.perf_counter() - t

    def scan(self, path, n):
        """Read the whole file and parse it (values as bytes slices)."""
        t = time.perf_counter()
        with open(os.path.join(path, "data"), "rb") as f:
            data = f.read()
        unpack = LEN.unpack_from
        pos, end, c = 0, len(data), 0
        while pos < end:
            (k,) = unpack(data, pos)
            v = data[pos + 4 : pos + 4 + k]
            c += len(v)
            pos += 4 + k
        return time.perf_counter() - t

    def read_latencies(self, path, idx, overhead):
        """Random reads through an in-memory list of positions (built untimed) over an mmap."""
        with open(os.path.join(path, "data"), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        unpack = LEN.unpack_from
        pos_list, pos = [], 0
        while pos < len(mm):
            pos_list.append(pos)
            pos += 4 + unpack(mm, pos)[0]

        def get(i, mm=mm, pl=pos_list):
            p = pl[i]
            return mm[p + 4 : p + 4 + unpack(mm, p)[0]]

        for i in idx:
            get(i)
        out = latencies(get, idx, overhead)
        mm.close()
        return out


class FileMmapScan(FileSystem):
    """The plain file scanned through mmap + memoryview slices (zero copy)."""

    name = "file (mmap)"

    def write_each(self, path, values):  # only the scan differs
        raise NotImplementedError

    def scan(self, path, n):
        t = time.perf_counter()
        with open(os.path.join(path, "data"), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mv = memoryview(mm)
        unpack = LEN.unpack_from
        pos, end, c = 0, len(mm), 0
        while pos < end:
            (k,) = unpack(mm, pos)
            v = mv[pos + 4 : pos + 4 + k]
            c += len(v)
            pos += 4 + k
        dt = time.perf_counter() - t
        v = None
        mv.release()
        mm.close()
        return dt


class SqliteSystem(System):
    """sqlite3, WAL journal, synchronous=OFF (no fsync, like the others), one transaction
    for the per-record loop, executemany + commit per 1,000 records."""

    name = "sqlite3 (WAL)"
    batch_name = "executemany/1000"

    def _open(self, path):
        os.makedirs(path, exist_ok=True)
        conn = sqlite3.connect(os.path.join(path, "db.sqlite"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("CREATE TABLE IF NOT EXISTS log (offset INTEGER PRIMARY KEY, v BLOB)")
        return conn

    def write_each(self, path, values):
        conn = self._open(path)
        ex = conn.execute
        sql = "INSERT INTO log(v) VALUES (?)"
        t = time.perf_counter()
        ex("BEGIN")
        for v in values:
            ex(sql, (v,))
        ex("COMMIT")
        dt = time.perf_counter() - t
        conn.close()
        return dt

    def write_batches(self, path, batches):
        conn = self._open(path)
        sql = "INSERT INTO log(v) VALUES (?)"
        t = time.perf_counter()
        for b in batches:
            conn.execute("BEGIN")
            conn.executemany(sql, [(v,) for v in b])
            conn.execute("COMMIT")
        dt = time.perf_counter() - t
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        return dt

    def scan(self, path, n):
        conn = self._open(path)
        t = time.perf_counter()
        c = 0
        for (v,) in conn.execute("SELECT v FROM log ORDER BY offset"):
            c += len(v)
        dt = time.perf_counter() - t
        conn.close()
        return dt

    def read_latencies(self, path, idx, overhead):
        conn = self._open(path)
        ex = conn.execute
        sql = "SELECT v FROM log WHERE offset = ?"

        def get(i):
            return ex(sql, (i + 1,)).fetchone()

        for i in idx:
            get(i)
        out = latencies(get, idx, overhead)
        conn.close()
        return out


class LmdbSystem(System):
    """lmdb, sync off; 8-byte big-endian keys precomputed (untimed), ``append=True``."""

    name = "lmdb"
    batch_name = "putmulti/1000"

    def __init__(self, n_max: int, size: int) -> None:
        self.map_size = max(64 << 20, n_max * (size + 64) * 3)
        self.keys: list[bytes] = []

    def available(self):
        try:
            import lmdb  # noqa: F401
        except ImportError:
            return "the lmdb package is not installed"
        return None

    def _keys(self, n):
        if len(self.keys) < n:
            self.keys = [KEY.pack(i) for i in range(n)]
        return self.keys

    def _env(self, path, **kw):
        import lmdb

        os.makedirs(path, exist_ok=True)
        return lmdb.open(path, map_size=self.map_size, sync=False, metasync=False, **kw)

    def write_each(self, path, values):
        keys = self._keys(len(values))
        env = self._env(path)
        t = time.perf_counter()
        with env.begin(write=True) as txn:
            put = txn.put
            for k, v in zip(keys, values):
                put(k, v, append=True)
        dt = time.perf_counter() - t
        env.close()
        return dt

    def write_batches(self, path, batches):
        keys = self._keys(sum(map(len, batches)))
        env = self._env(path)
        t = time.perf_counter()
        i = 0
        for b in batches:
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(zip(keys[i : i + len(b)], b), append=True)
            i += len(b)
        dt = time.perf_counter() - t
        env.close()
        return dt

    def scan(self, path, n):
        """Zero-copy cursor scan (``buffers=True``: values are memoryviews of the map)."""
        env = self._env(path, readonly=True, lock=False)
        t = time.perf_counter()
        c = 0
        with env.begin(buffers=True) as txn:
            for v in txn.cursor().iternext(keys=False, values=True):
                c += len(v)
        dt = time.perf_counter() - t
        env.close()
        return dt

    def read_latencies(self, path, idx, overhead):
        env = self._env(path, readonly=True, lock=False)
        keys = self._keys(max(idx) + 1)
        ks = [keys[i] for i in idx]
        with env.begin(buffers=True) as txn:
            get = txn.get
            for k in ks:
                get(k)
            out = latencies(get, ks, overhead)
        env.close()
        return out


class RocksdictSystem(System):
    """rocksdict (RocksDB) in raw mode, default options (WAL on, no sync)."""

    name = "rocksdict"
    batch_name = "WriteBatch/1000"

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def available(self):
        try:
            import rocksdict  # noqa: F401
        except ImportError:
            return "the rocksdict package is not installed"
        return None

    def _keys(self, n):
        if len(self.keys) < n:
            self.keys = [KEY.pack(i) for i in range(n)]
        return self.keys

    def _db(self, path):
        from rocksdict import Options, Rdict

        os.makedirs(os.path.dirname(path), exist_ok=True)
        return Rdict(path, Options(raw_mode=True))

    def write_each(self, path, values):
        keys = self._keys(len(values))
        db = self._db(path)
        put = db.put
        t = time.perf_counter()
        for k, v in zip(keys, values):
            put(k, v)
        dt = time.perf_counter() - t
        db.flush()
        db.close()
        return dt

    def write_batches(self, path, batches):
        from rocksdict import WriteBatch

        keys = self._keys(sum(map(len, batches)))
        db = self._db(path)
        t = time.perf_counter()
        i = 0
        for b in batches:
            wb = WriteBatch(raw_mode=True)
            put = wb.put
            for k, v in zip(keys[i : i + len(b)], b):
                put(k, v)
            db.write(wb)
            i += len(b)
        dt = time.perf_counter() - t
        db.flush()
        db.close()
        return dt

    def scan(self, path, n):
        db = self._db(path)
        t = time.perf_counter()
        c = 0
        for v in db.values():
            c += len(v)
        dt = time.perf_counter() - t
        db.close()
        return dt

    def read_latencies(self, path, idx, overhead):
        db = self._db(path)
        keys = self._keys(max(idx) + 1)
        ks = [keys[i] for i in idx]
        get = db.get
        for k in ks:
            get(k)
        out = latencies(get, ks, overhead)
        db.close()
        return out


class QueuelibSystem(System):
    """queuelib.FifoDiskQueue: push per record; the scan pops everything (no batch API,
    no random read)."""

    name = "queuelib"
    can_batch = False
    can_read = False

    def available(self):
        try:
            import queuelib  # noqa: F401
        except ImportError:
            return "the queuelib package is not installed"
        return None

    def write_each(self, path, values):
        from queuelib import FifoDiskQueue

        os.makedirs(os.path.dirname(path), exist_ok=True)
        q = FifoDiskQueue(path)
        push = q.push
        t = time.perf_counter()
        for v in values:
            push(v)
        dt = time.perf_counter() - t
        q.close()
        return dt

    def scan(self, path, n):
        from queuelib import FifoDiskQueue

        q = FifoDiskQueue(path)
        pop = q.pop
        t = time.perf_counter()
        c = 0
        while True:
            v = pop()
            if v is None:
                break
            c += len(v)
        dt = time.perf_counter() - t
        q.close()
        return dt


class RedisSystem(System):
    """Redis Streams on a private ``redis-server`` (127.0.0.1, free port, temp dir, no
    persistence): XADD per record (one round trip each), pipelined XADD per 1,000, XRANGE
    scan in pages of 10,000, XRANGE of one id per random read. Held in RAM: its bytes per
    record is ``used_memory`` growth."""

    name = "redis streams"
    batch_name = "pipelined XADD/1000"
    disk_note = "RAM"

    def __init__(self, quick: bool) -> None:
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None
        self.client = None
        self.each_cap = 2_000 if quick else 20_000
        self.batch_cap = 10_000 if quick else 200_000
        self.read_cap = 500 if quick else 5_000
        self.ids: dict[str, list] = {}
        self.mem: dict[str, float] = {}
        self.counter = 0

    def available(self):
        if shutil.which("redis-server") is None:
            return "no redis-server binary"
        try:
            import redis  # noqa: F401
        except ImportError:
            return "the redis client is not installed (pip install redis)"
        return None

    def start(self) -> None:
        import redis

        self.tmp = tempfile.mkdtemp(prefix="pylog-redis-")
        port = free_port()
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--dir", self.tmp,
             "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _stream(self, path: str) -> str:
        return "s:" + path

    def _used(self) -> float:
        return float(self.client.info("memory")["used_memory"])

    def write_each(self, path, values):
        r, s = self.client, self._stream(path)
        r.delete(s)
        xadd = r.xadd
        t = time.perf_counter()
        for v in values:
            xadd(s, {"v": v})
        return time.perf_counter() - t

    def write_batches(self, path, batches):
        r, s = self.client, self._stream(path)
        r.delete(s)
        before = self._used()
        ids: list = []
        t = time.perf_counter()
        for b in batches:
            p = r.pipeline(transaction=False)
            for v in b:
                p.xadd(s, {"v": v})
            ids.extend(p.execute())
        dt = time.perf_counter() - t
        self.ids[path] = ids
        self.mem[path] = self._used() - before
        return dt

    def scan(self, path, n):
        r, s = self.client, self._stream(path)
        t = time.perf_counter()
        c = 0
        start = "-"
        while True:
            page = r.xrange(s, min=start, max="+", count=10_000)
            if not page:
                break
            for _id, fields in page:
                c += len(fields[b"v"])
            start = b"(" + page[-1][0]
        return time.perf_counter() - t

    def read_latencies(self, path, idx, overhead):
        r, s = self.client, self._stream(path)
        ids = self.ids[path]
        ks = [ids[i] for i in idx if i < len(ids)]

        def get(k):
            return r.xrange(s, min=k, max=k)

        for k in ks[:200]:
            get(k)
        return latencies(get, ks, overhead)

    def disk(self, path):
        return self.mem.get(path, float("nan"))


# ----------------------------------------------------------------------------------------
# the run
class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.rows: list[Row] = []
        self.targets: list[Target] = []
        self.root = tempfile.mkdtemp(prefix="pylog-compare-", dir=args.tmpdir)
        self.overhead = timer_overhead_ns()
        self.t0 = time.perf_counter()
        self.commit = _git_commit()  # taken at the start: the code that is measured
        self._say = print if not args.silent else (lambda *a, **k: None)

    def log(self, msg: str, **kw: Any) -> None:
        self._say(f"{time.perf_counter() - self.t0:6.1f}s {msg}", **kw)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def find(self, dataset: str, workload: str, system: str) -> Row | None:
        for r in self.rows:
            if r.dataset == dataset and r.workload == workload and r.system == system:
                return r
        return None

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # -- throughput workloads on one dataset -----------------------------------------
    def dataset(self, label: str, n: int, size: int, systems: list[System], reps: int) -> None:
        self.log(f"[{label}] {n:,} records x {size} B, {reps} repetitions ...", flush=True)
        values = dataset_values(n, size)
        each_t: dict[str, list[float]] = {s.name: [] for s in systems}
        batch_t: dict[str, list[float]] = {s.name: [] for s in systems}
        scan_t: dict[str, list[float]] = {s.name: [] for s in systems}
        counts: dict[str, tuple[int, int]] = {}
        last_dirs: dict[str, str] = {}
        mmap_scan = FileMmapScan()
        for rep in range(reps):
            order = systems[rep % len(systems):] + systems[: rep % len(systems)]
            for s in order:
                ne = min(n, s.each_cap or n)
                nb = min(n, s.batch_cap or n)
                nb -= nb % BATCH if nb >= BATCH else 0
                counts[s.name] = (ne, nb)
                d_each = self.path(label, s.name.split()[0], f"each-{rep}")
                d_batch = self.path(label, s.name.split()[0], f"batch-{rep}")
                each_t[s.name].append(s.write_each(d_each, values[:ne]))
                if s.can_batch:
                    batches = [values[i : i + BATCH] for i in range(0, nb, BATCH)]
                    batch_t[s.name].append(s.write_batches(d_batch, batches))
                    scan_dir = d_batch
                else:
                    scan_dir = d_each
                scan_t[s.name].append(s.scan(scan_dir, nb if s.can_batch else ne))
                if isinstance(s, FileSystem):
                    scan_t.setdefault(mmap_scan.name, []).append(mmap_scan.scan(scan_dir, nb))
                if s.can_batch:
                    shutil.rmtree(d_each, ignore_errors=True)
                if rep > 0 and s.name in last_dirs:
                    shutil.rmtree(last_dirs[s.name], ignore_errors=True)
                last_dirs[s.name] = scan_dir
        for s in systems:
            ne, nb = counts[s.name]
            t = median(each_t[s.name])
            self.add(Row(label, "append (each)", s.name, ne, t, ne / t, ne * size / t / 1e6, samples=each_t[s.name]))
            if s.can_batch:
                t = median(batch_t[s.name])
                self.add(Row(label, "append (batch)", s.name, nb, t, nb / t, nb * size / t / 1e6,
                             note=s.batch_name, samples=batch_t[s.name]))
            t = median(scan_t[s.name])
            ns = nb if s.can_batch else ne
            note = {"pylog": "zero-copy views", "lmdb": "zero-copy cursor", "file": "read + parse",
                    "queuelib": "pop (destructive)"}.get(s.name, "")
            self.add(Row(label, "scan", s.name, ns, t, ns / t, ns * size / t / 1e6, note=note, samples=scan_t[s.name]))
            if isinstance(s, FileSystem):
                t = median(scan_t[mmap_scan.name])
                self.add(Row(label, "scan", mmap_scan.name, nb, t, nb / t, nb * size / t / 1e6,
                             note="mmap + memoryview", samples=scan_t[mmap_scan.name]))
        # random reads, interleaved repetitions
        nread = 10_000 if self.quick else 100_000
        lat: dict[str, list[np.ndarray]] = {s.name: [] for s in systems if s.can_read}
        for rep in range(reps):
            for s in systems:
                if not s.can_read:
                    continue
                ne, nb = counts[s.name]
                k = min(nread, s.read_cap or nread)
                idx = np.random.default_rng(rep).integers(0, nb, k).tolist()
                lat[s.name].append(s.read_latencies(last_dirs[s.name], idx, self.overhead))
        for s in systems:
            if not s.can_read:
                continue
            p50s = [float(np.percentile(a, 50)) / 1e3 for a in lat[s.name]]
            p99s = [float(np.percentile(a, 99)) / 1e3 for a in lat[s.name]]
            p50, p99 = median(p50s), median(p99s)
            self.add(Row(label, "random read", s.name, len(lat[s.name][0]), None, 1e6 / p50 if p50 else None,
                         None, p50, p99, note="warm", samples=p50s))
        # bytes on disk per record (after the batch append, or per-record for queuelib)
        for s in systems:
            ne, nb = counts[s.name]
            per = nb if s.can_batch else ne
            if not s.can_batch:  # queuelib's scan popped it: write it again to measure
                d = self.path(label, s.name.split()[0], "disk")
                s.write_each(d, values[:ne])
                last_dirs[s.name] = d
            b = s.disk(last_dirs[s.name])
            self.add(Row(label, "bytes on disk", s.name, per, bytes_per_record=b / per,
                         note=s.disk_note or f"{size} B values"))
        for s in systems:
            shutil.rmtree(self.path(label, s.name.split()[0]), ignore_errors=True)

    # -- durability -----------------------------------------------------------------------
    def durability(self) -> None:
        q = self.quick
        k = 100 if q else 400
        reps = 3
        value = os.urandom(100)
        self.log(f"[durability] fsync='always' one writer vs write+fdatasync, {k} records x {reps} ...", flush=True)
        pl, pre, plain = [], [], []
        for rep in range(reps):
            # the default (files grow with each write), then preallocate=True (64 MiB segments,
            # allocated up front: an fdatasync that need not record a new file size)
            for opts, times in (({}, pl), ({"preallocate": True, "segment_bytes": 64 << 20}, pre)):
                d = self.path("dur", f"pylog-{len(opts)}-{rep}")
                log = pylog.Log(d, fsync="always", **opts)
                append = log.append
                t = time.perf_counter()
                for _ in range(k):
                    append(value)
                times.append(time.perf_counter() - t)
                log.close()
            os.makedirs(self.path("dur"), exist_ok=True)
            fd = os.open(self.path("dur", f"plain-{rep}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            rec = LEN.pack(len(value)) + value
            t = time.perf_counter()
            for _ in range(k):
                os.write(fd, rec)
                os.fdatasync(fd)
            plain.append(time.perf_counter() - t)
            os.close(fd)
        t1, t0 = median(pl), median(plain)
        self.add(Row("durable", "append fsync=always, 1 writer", "pylog", k, t1, k / t1, k * 100 / t1 / 1e6, samples=pl))
        tp = median(pre)
        self.add(Row("durable", "append fsync=always, 1 writer", "pylog preallocate=True", k, tp, k / tp,
                     k * 100 / tp / 1e6, samples=pre))
        self.add(Row("durable", "append fsync=always, 1 writer", "file write+fdatasync", k, t0, k / t0,
                     k * 100 / t0 / 1e6, samples=plain))
        # group commit
        threads, per = 16, (25 if q else 100)
        self.log(f"[durability] 16 threads x {per} appends with fsync='always' ...", flush=True)
        gc = []
        for rep in range(reps):
            d = self.path("dur", f"group-{rep}")
            log = pylog.Log(d, fsync="always")
            barrier = threading.Barrier(threads + 1)

            def work(log=log, barrier=barrier):
                barrier.wait()
                for _ in range(per):
                    log.append(value)

            ts = [threading.Thread(target=work) for _ in range(threads)]
            for th in ts:
                th.start()
            barrier.wait()
            t = time.perf_counter()
            for th in ts:
                th.join()
            gc.append(time.perf_counter() - t)
            log.close()
        tg = median(gc)
        total = threads * per
        self.add(Row("durable", "append fsync=always, 16 threads", "pylog", total, tg, total / tg,
                     total * 100 / tg / 1e6, samples=gc))
        shutil.rmtree(self.path("dur"), ignore_errors=True)

    def reopen(self) -> None:
        segs = 1000
        per = {"1x": 10 if self.quick else 20, "10x": 100 if self.quick else 200}
        self.log(f"[reopen] two logs of {segs} segments ({per['1x']} and {per['10x']} records of 100 B each) ...",
                 flush=True)
        value = os.urandom(100)
        paths = {}
        with no_fsync():
            for name, p in per.items():
                path = self.path("reopen", name)
                log = pylog.Log(path, fsync="never")
                vals = [value] * p
                for _ in range(segs):
                    log.append_batch(vals)
                    log.roll()
                log.close()
                paths[name] = path
        reps = 7
        times: dict[str, list[float]] = {"1x": [], "10x": [], "unclean": []}
        for _ in range(reps):
            for name in ("1x", "10x"):
                t = time.perf_counter()
                log = pylog.Log(paths[name])
                times[name].append(time.perf_counter() - t)
                log.close()
        for _ in range(3):
            marker = os.path.join(paths["1x"], "clean-shutdown")
            if os.path.exists(marker):
                os.unlink(marker)
            t = time.perf_counter()
            log = pylog.Log(paths["1x"])
            times["unclean"].append(time.perf_counter() - t)
            log.close()
        for name in ("1x", "10x"):
            t = median(times[name])
            size = sum(os.path.getsize(os.path.join(paths[name], f)) for f in os.listdir(paths[name]))
            self.add(Row("reopen", f"reopen clean, {segs} segments, {name} data", "pylog", segs * per[name], t,
                         note=f"{size / 1e6:.1f} MB on disk", samples=times[name]))
        t = median(times["unclean"])
        self.add(Row("reopen", f"reopen unclean, {segs} segments, 1x data", "pylog", segs * per["1x"], t,
                     samples=times["unclean"]))
        shutil.rmtree(self.path("reopen"), ignore_errors=True)

    def verify_scan(self) -> None:
        n = 20_000 if self.quick else 100_000
        self.log(f"[verify] C verify-scan of a sealed segment of {n:,} x 1 KiB ...", flush=True)
        path = self.path("verify")
        vals = [os.urandom(1024) for _ in range(BATCH)]
        with no_fsync():
            log = pylog.Log(path, fsync="never")
            for _ in range(n // BATCH):
                log.append_batch(vals)
            log.roll()
            log.close()
        log = pylog.Log(path, readonly=True)
        size = log.size_bytes
        assert not log.verify()
        t = time.perf_counter()
        log.verify()
        loops = max(1, int(0.05 / max(time.perf_counter() - t, 1e-6)))  # ~50 ms a sample
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(loops):
                bad = log.verify()
            ts.append((time.perf_counter() - t) / loops)
            assert not bad
        log.close()
        t = median(ts)
        self.add(Row("verify", "verify() of 1 KiB records", "pylog", n, t, n / t, size / t / 1e6,
                     note=f"{size / t / 1e9:.2f} GB/s", samples=ts))
        shutil.rmtree(path, ignore_errors=True)

    def crc(self) -> None:
        self.log("[crc] CRC32C of 1 MiB and 100 B buffers: pylog vs the crc32c package ...", flush=True)
        fns: dict[str, Callable[[bytes], int]] = {"pylog": pylog.crc32c}
        try:
            import crc32c as crc_pkg

            fns["crc32c package"] = crc_pkg.crc32c
        except ImportError:
            self.log("  (the crc32c package is not installed: no comparison)")
        big = os.urandom(1 << 20)
        small = os.urandom(100)
        assert all(f(big) == pylog.crc32c(big) for f in fns.values())
        res: dict[tuple[str, str], list[float]] = {}
        calls_big, calls_small = (50, 20_000) if self.quick else (200, 100_000)
        for _ in range(7):
            for name, f in fns.items():
                t = time.perf_counter()
                for _ in range(calls_big):
                    f(big)
                res.setdefault((name, "1 MiB"), []).append(time.perf_counter() - t)
                t = time.perf_counter()
                for _ in range(calls_small):
                    f(small)
                res.setdefault((name, "100 B"), []).append(time.perf_counter() - t)
        for (name, what), ts in res.items():
            t = median(ts)
            calls, nbytes = (calls_big, 1 << 20) if what == "1 MiB" else (calls_small, 100)
            self.add(Row("crc32c", f"crc32c {what}", name, calls, t, calls / t, calls * nbytes / t / 1e6,
                         note=f"{calls * nbytes / t / 1e9:.2f} GB/s", samples=ts))

    def arrow(self, label: str, n: int) -> None:
        reader = find_arrow_reader()
        if reader is None:
            self.log("[arrow] pylog has no columnar (Arrow) reader yet: skipped")
            return
        self.log(f"[arrow] columnar read of {n:,} x 100 B in sealed segments ...", flush=True)
        path = self.path("arrow")
        vals = [os.urandom(100) for _ in range(BATCH)]
        with no_fsync():
            log = pylog.Log(path, fsync="never")
            for _ in range(n // BATCH):
                log.append_batch(vals)
            log.roll()
            log.close()
        log = pylog.Log(path, readonly=True, cached_segments=None)
        reader(log)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            reader(log)
            ts.append(time.perf_counter() - t)
        log.close()
        t = median(ts)
        nn = (n // BATCH) * BATCH
        self.add(Row(label, "columnar read (Arrow)", "pylog", nn, t, nn / t, nn * 100 / t / 1e6, samples=ts))
        shutil.rmtree(path, ignore_errors=True)

    # -- targets --------------------------------------------------------------------------
    def compute_targets(self, main: str, kib: str | None) -> None:
        T = self.targets

        def rate(ds, wl, sysname):
            r = self.find(ds, wl, sysname)
            return None if r is None else r.rate

        def ratio(a, b):
            return None if a is None or b is None else a / b

        T.append(Target("append_batch vs file join+write/1000, 100 B",
                        ratio(rate(main, "append (batch)", "pylog"), rate(main, "append (batch)", "file")), 1.0, ">=",
                        issue=2))
        if kib:
            T.append(Target("append_batch vs file join+write/1000, 1 KiB",
                            ratio(rate(kib, "append (batch)", "pylog"), rate(kib, "append (batch)", "file")), 1.0,
                            ">=", issue=2))
        T.append(Target("append (each) vs file f.write per record",
                        ratio(rate(main, "append (each)", "pylog"), rate(main, "append (each)", "file")), 0.6, ">=",
                        issue=2))
        T.append(Target("append (each) vs lmdb put",
                        ratio(rate(main, "append (each)", "pylog"), rate(main, "append (each)", "lmdb")), 1.0, ">=",
                        issue=6))
        T.append(Target("scan records/s (memoryview values)", rate(main, "scan", "pylog"), 3e6, ">=", "rec/s",
                        issue=2))
        T.append(Target("scan vs lmdb zero-copy cursor",
                        ratio(rate(main, "scan", "pylog"), rate(main, "scan", "lmdb")), 1.0, ">=", issue=6))
        a = self.find(main, "columnar read (Arrow)", "pylog")
        T.append(Target("columnar/Arrow read records/s", None if a is None else a.rate, 20e6, ">=", "rec/s", issue=6,
                        note="" if a is not None else "no columnar reader in pylog yet"))
        r = self.find(main, "random read", "pylog")
        lm = self.find(main, "random read", "lmdb")
        T.append(Target("random read p50", None if r is None else r.p50_us, 1.5, "<=", "us", issue=2))
        T.append(Target("random read p50 vs lmdb get p50 (pylog/lmdb)",
                        None if r is None or lm is None else r.p50_us / lm.p50_us, 1.0, "<=", issue=6))
        v = self.find("verify", "verify() of 1 KiB records", "pylog")
        T.append(Target("C verify-scan, 1 KiB records", None if v is None else v.mb_s / 1e3, 8.0, ">=", "GB/s",
                        issue=2))
        c1 = self.find("crc32c", "crc32c 1 MiB", "pylog")
        c2 = self.find("crc32c", "crc32c 1 MiB", "crc32c package")
        T.append(Target("CRC32C 1 MiB vs crc32c package", None if c1 is None or c2 is None else c1.rate / c2.rate,
                        0.9, ">=", issue=6))
        d1 = self.find("durable", "append fsync=always, 1 writer", "pylog")
        d0 = self.find("durable", "append fsync=always, 1 writer", "file write+fdatasync")
        T.append(Target("fsync=always 1 writer vs write+fdatasync loop", ratio(d1 and d1.rate, d0 and d0.rate), 1.0,
                        ">=", issue=3))
        g = self.find("durable", "append fsync=always, 16 threads", "pylog")
        T.append(Target("fsync=always 16 threads vs 1 writer (group commit)", ratio(g and g.rate, d1 and d1.rate),
                        20.0, ">=", issue=3))
        r1 = next((r for r in self.rows if r.workload.startswith("reopen clean") and r.workload.endswith("1x data")), None)
        r10 = next((r for r in self.rows if r.workload.startswith("reopen clean") and r.workload.endswith("10x data")),
                   None)
        T.append(Target("reopen clean 1,000 segments", None if r1 is None else r1.seconds * 1e3, 50.0, "<=", "ms",
                        issue=3))
        T.append(Target("reopen 10x data / 1x data", None if r1 is None or r10 is None else r10.seconds / r1.seconds,
                        1.5, "<=", issue=3))

    # -- output ---------------------------------------------------------------------------
    def table(self) -> str:
        out = []
        head = f"{'workload':34} {'system':22} {'n':>9} {'records/s':>10} {'MB/s':>8} {'p50 us':>8} {'p99 us':>8} " \
               f"{'B/rec':>7} {'pylog x':>8}  note"
        current = None
        for r in self.rows:
            if r.dataset != current:
                current = r.dataset
                out.append("")
                out.append(f"== {current} ==")
                out.append(head)
                out.append("-" * len(head))
            ref = self.find(r.dataset, r.workload, "pylog")
            rel = ""
            if ref is not None and r.system != "pylog":
                if r.p50_us and ref.p50_us:
                    rel = f"{r.p50_us / ref.p50_us:.2f}"
                elif r.rate and ref.rate:
                    rel = f"{ref.rate / r.rate:.2f}"
                elif r.bytes_per_record and ref.bytes_per_record and not r.note == "RAM":
                    rel = f"{r.bytes_per_record / ref.bytes_per_record:.2f}"
            wl = r.workload
            if r.seconds is not None and r.rate is None:
                rate = f"{r.seconds * 1e3:.1f} ms"
            else:
                rate = _si(r.rate)
            out.append(
                f"{wl[:34]:34} {r.system[:22]:22} {r.n:>9,} {rate:>10} "
                f"{'-' if r.mb_s is None else f'{r.mb_s:.0f}':>8} "
                f"{'-' if r.p50_us is None else f'{r.p50_us:.2f}':>8} {'-' if r.p99_us is None else f'{r.p99_us:.2f}':>8} "
                f"{'-' if r.bytes_per_record is None else f'{r.bytes_per_record:.1f}':>7} {rel:>8}  {r.note}"
            )
        out.append("")
        out.append("pylog x: how many times better pylog is than that row (rate ratio; for latency and bytes, "
                   "the row's figure / pylog's). Medians of the repetitions; timer overhead "
                   f"({self.overhead:.0f} ns) subtracted from latencies.")
        return "\n".join(out)

    def conditions(self) -> dict[str, Any]:
        cpu = platform.processor()
        with contextlib.suppress(OSError):
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        commit = self.commit
        return {
            "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "pylog": pylog.__version__, "backend": pylog.backend,
            "crc": sorted(f for f in pylog.backend_features if f.startswith("crc32c-")),
            "commit": commit, "quick": self.quick, "argv": sys.argv[1:],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }


def dataset_values(n: int, size: int) -> list[bytes]:
    """The values of a dataset: ``n`` references to a seeded pool of 1,024 random values
    of ``size`` bytes (so 1,000,000 records do not take 1,000,000 allocations)."""
    rng = np.random.default_rng(1234)
    pool = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(1024)]
    return [pool[i & 1023] for i in range(n)]


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def find_arrow_reader() -> Callable[[Any], Any] | None:
    """pylog's columnar reader, wherever it lives: a Log method, a ``pylog.arrow`` function,
    or else the Arrow path of the Spark data source (``pylog.spark``: a C scan of each sealed
    segment turned into Arrow record batches; needs pyspark and pyarrow)."""
    for meth in ("read_arrow", "to_arrow", "read_columns"):
        if hasattr(pylog.Log, meth):
            return lambda log, _m=meth: getattr(log, _m)()
    for mod, fn in (("pylog.arrow", "read_table"), ("pylog.arrow", "to_table"), ("pylog.arrow", "read_log"),
                    ("pylog.arrow", "read_arrow"), ("pylog.columnar", "read_table")):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, fn):
            return getattr(m, fn)
    try:
        spark = importlib.import_module("pylog.spark")
        read_slice, slice_cls = spark._read_slice, spark._Slice
    except (ImportError, AttributeError):
        return None

    def read(log: pylog.Log) -> list[Any]:
        out: list[Any] = []
        for s in log.segments():
            if s["sealed"] and s["next_offset"] > s["base_offset"]:
                sl = slice_cls("bench", 0, s["path"], s["base_offset"], 32, s["next_offset"], s["size_bytes"])
                out.extend(read_slice(sl))
        return out

    read.__doc__ = "pylog.spark's Arrow reader, one slice per sealed segment"
    return read


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: finishes in under a minute")
    ap.add_argument("--records", type=int, default=None, help="records of the main dataset (default 1,000,000; "
                    "100,000 with --quick); the 1 KiB dataset has a tenth of them")
    ap.add_argument("--value-size", type=int, default=100, help="value size of the main dataset (default 100)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of each throughput workload (median)")
    ap.add_argument("--no-kib", action="store_true", help="skip the 1 KiB dataset")
    ap.add_argument("--peers", default=None, help="comma-separated peers to run (default: all available)")
    ap.add_argument("--json", default=None, help="also save the results to this JSON file")
    ap.add_argument("--tmpdir", default=None, help="where to write the data (default: the system temp dir)")
    ap.add_argument("--fail-on-miss", action="store_true", help="exit 1 when a speed target misses")
    ap.add_argument("--silent", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n = args.records or (100_000 if args.quick else 1_000_000)
    size = args.value_size
    t_start = time.perf_counter()
    run = Run(args)
    redis_sys: RedisSystem | None = None
    try:
        peers: list[System] = [PylogSystem(), FileSystem(), SqliteSystem(), LmdbSystem(n, max(size, 1024)),
                               RocksdictSystem(), QueuelibSystem()]
        if args.quick:  # the slow peers write fewer records (rates are per record anyway)
            for p in peers[2:]:
                if not isinstance(p, LmdbSystem):
                    p.each_cap = p.batch_cap = 20_000
        rs = RedisSystem(args.quick)
        peers.append(rs)
        wanted = None if args.peers is None else {p.strip() for p in args.peers.split(",")}
        systems = []
        for s in peers:
            if wanted is not None and s.name != "pylog" and s.name.split()[0] not in wanted:
                continue
            why = s.available()
            if why:
                print(f"peer skipped: {s.name}: {why}")
                continue
            if isinstance(s, RedisSystem):
                try:
                    s.start()
                except Exception as e:  # noqa: BLE001 - a peer that cannot start is reported
                    print(f"peer skipped: {s.name}: {e}")
                    continue
                redis_sys = s
            systems.append(s)
        main_label = f"{n:,} records x {size} B"
        run.dataset(main_label, n, size, systems, args.repeat)
        run.arrow(main_label, n)
        kib_label = None
        if not args.no_kib and size != 1024:
            kib_label = f"{max(n // 10, BATCH):,} records x 1024 B"
            # --quick: only the systems the 1 KiB target needs (and lmdb for context)
            kib_systems = [s for s in systems if not args.quick or s.name in ("pylog", "file", "lmdb")]
            run.dataset(kib_label, max(n // 10, BATCH), 1024, kib_systems, args.repeat)
        elif size == 1024:
            kib_label = main_label
        run.durability()
        run.reopen()
        run.verify_scan()
        run.crc()
    finally:
        if redis_sys is not None:
            redis_sys.close()
        shutil.rmtree(run.root, ignore_errors=True)
    run.compute_targets(main_label, kib_label)
    print(run.table())
    print()
    print(f"conditions: {json.dumps(run.conditions())}")
    print(f"command: python -m benchmarks.compare {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    for t in run.targets:
        print(t.line())
    print(f"compare: {sum(t.ok for t in run.targets)} of {len(run.targets)} targets met "
          f"({time.perf_counter() - t_start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": run.conditions(), "rows": [asdict(r) for r in run.rows],
                       "targets": [dict(asdict(t), ok=t.ok, line=t.line()) for t in run.targets]}, f, indent=1)
    if args.fail_on_miss and not all(t.ok for t in run.targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
