"""pylog against the peers a user would pick, on the same workloads, in one run.

    pylog bench --compare [--quick] [--records N] [--value-size B] [--json FILE]
    python -m pylog.bench ...            (the same; python -m benchmarks.compare in a checkout)

Peers (one module each in :mod:`pylog.bench`): a plain Python file (per-record
``f.write(struct.pack(...) + v)`` and a joined write per 1,000 records), sqlite3 (WAL), lmdb,
rocksdict, queuelib, and Redis Streams when a
``redis-server`` binary and the ``redis`` client are present (a private server on 127.0.0.1,
a free port and a temp dir, stopped at the end). lmdb, rocksdict, queuelib, redis, crc32c
and pyarrow come with the ``bench`` extra (``pip install "pylog-commitlog[bench]"``). A peer
that is not installed is reported as skipped, and so are the targets measured against it.

Workloads, ``fsync="never"`` (no fsync anywhere) unless named otherwise, page cache warm:

* append (each): one record per call; append (batch): 1,000 records per call;
* scan: every record read back in order, touching each value (``len``);
* random read: latency of single reads at random offsets (p50 / p99);
* poll (500): ``Consumer.poll(500)`` over a one-partition topic of sealed segments (pylog only);
* bytes on disk per record after the batch append;
* durability: ``fsync="always"`` one writer (by default, and with ``preallocate=True``) vs
  ``os.write`` + ``os.fdatasync`` per record,
  16 threads with ``fsync="always"`` (group commit) vs one writer; reopen of a 1,000-segment
  log after a clean shutdown, and with 10x the data; the C verify-scan of a sealed segment of
  1 KiB records; CRC32C vs the ``crc32c`` package.

Every figure is the median of several repetitions, systems interleaved within each
repetition, and every ratio compares figures of the same run. It prints a table and one
``target: <name>: measured <value> (goal <goal>) PASS|FAIL`` line per speed target of
issues 2, 3, 6 and 16 (``SKIP`` when its peer did not run), then the count met and, when one
was missed, a ``note:`` with the machine's load average at the start and the end of the run
against its core count: the goals are set for a quiet machine, and on a busy one a miss says
more about the load than about pylog. The exit status is 0 whatever the targets say (speed is
reported, not gated: machines are noisy) unless ``--fail-on-miss`` is given; a crash exits
non-zero.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

import pylog
from pylog.bench.common import BATCH, LEN, Row, System, Target, _si, dataset_values, median, no_fsync, timer_overhead_ns
from pylog.bench.peer_file import FileMmapScan, FileSystem
from pylog.bench.peer_lmdb import LmdbSystem
from pylog.bench.peer_pylog import PylogSystem
from pylog.bench.peer_queuelib import QueuelibSystem
from pylog.bench.peer_redis import RedisSystem
from pylog.bench.peer_rocksdict import RocksdictSystem
from pylog.bench.peer_sqlite import SqliteSystem


# ----------------------------------------------------------------------------------------
# the run
class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.rows: list[Row] = []
        self.targets: list[Target] = []
        self.missing: dict[str, str] = {}  # peer (or "arrow", "crc32c") -> why it did not run
        self.root = tempfile.mkdtemp(prefix="pylog-compare-", dir=args.tmpdir)
        self.overhead = timer_overhead_ns()
        self.t0 = time.perf_counter()
        self.commit = _git_commit()  # taken at the start: the code that is measured
        self.load: list[float | None] = [None, None]  # the load average at the start and the end
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
        # Consumer.poll(500) from sealed segments (the systems that have a consumer: pylog)
        pollers = [s for s in systems if hasattr(s, "poll")]
        poll_t: dict[str, list[float]] = {s.name: [] for s in pollers}
        for rep in range(reps):
            for s in pollers:
                nb = counts[s.name][1]
                batches = [values[i : i + BATCH] for i in range(0, nb, BATCH)]
                d = self.path(label, s.name.split()[0], f"poll-{rep}")
                dt, npoll = s.poll(d, batches)
                poll_t[s.name].append(dt)
                shutil.rmtree(d, ignore_errors=True)
        for s in pollers:
            t = median(poll_t[s.name])
            self.add(Row(label, "poll (500)", s.name, npoll, t, npoll / t, npoll * size / t / 1e6,
                         note="Consumer.poll(500), sealed", samples=poll_t[s.name]))
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
        # 7 alternating rounds (3 before): a single fdatasync that stalls for milliseconds
        # moves a round of 400 by several percent, in either system
        reps = 3 if q else 7
        # the datasets written before leave gigabytes of dirty pages; their write-back would
        # stall these fdatasyncs at random (both systems'), so it is done first
        os.sync()
        value = os.urandom(100)
        self.log(f"[durability] fsync='always' one writer vs write+fdatasync, {k} records x {reps} ...", flush=True)
        pl: list[float] = []
        pre: list[float] = []
        plain: list[float] = []
        for rep in range(reps):
            # the default (files grow with each write), then preallocate=True (64 MiB segments,
            # allocated up front: an fdatasync that need not record a new file size)
            runs: tuple[tuple[dict[str, Any], list[float]], ...] = (
                ({}, pl), ({"preallocate": True, "segment_bytes": 64 << 20}, pre))
            for opts, times in runs:
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
        self.add(Row("durable", "append fsync=always, 1 writer", "pylog", k, t1, k / t1, k * 100 / t1 / 1e6,
                     samples=pl))
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

            def work(log: pylog.Log = log, barrier: threading.Barrier = barrier) -> None:
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
        write_sealed_log(path, n, 1024)
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
            self.missing["crc32c"] = "the crc32c package is not installed"
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
            self.missing["arrow"] = 'pyarrow is not installed: pip install "pylog-commitlog[arrow]"'
            self.log(f"[arrow] skipped: {self.missing['arrow']}")
            return
        self.log(f"[arrow] columnar read of {n:,} x 100 B in sealed segments ...", flush=True)
        path = self.path("arrow")
        write_sealed_log(path, n, 100)
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

        def rate(ds: str, wl: str, sysname: str) -> float | None:
            r = self.find(ds, wl, sysname)
            return None if r is None else r.rate

        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a / b

        T.append(Target("append_batch vs file join+write/1000, 100 B",
                        ratio(rate(main, "append (batch)", "pylog"), rate(main, "append (batch)", "file")), 1.2, ">=",
                        issue=16))
        if kib:
            T.append(Target("append_batch vs file join+write/1000, 1 KiB",
                            ratio(rate(kib, "append (batch)", "pylog"), rate(kib, "append (batch)", "file")), 1.2,
                            ">=", issue=16))
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
        T.append(Target("Consumer.poll(500) records/s, sealed segments", rate(main, "poll (500)", "pylog"), 3e6, ">=",
                        "rec/s", issue=16))
        a = self.find(main, "columnar read (Arrow)", "pylog")
        T.append(Target("columnar/Arrow read records/s", None if a is None else a.rate, 50e6, ">=", "rec/s", issue=16,
                        note="" if a is not None else "no columnar reader in pylog yet"))
        r = self.find(main, "random read", "pylog")
        lm = self.find(main, "random read", "lmdb")
        T.append(Target("random read p50", None if r is None else r.p50_us, 1.5, "<=", "us", issue=2))
        T.append(Target("random read p50 vs lmdb get p50 (pylog/lmdb)",
                        None if r is None or lm is None else ratio(r.p50_us, lm.p50_us), 1.0, "<=", issue=6))
        v = self.find("verify", "verify() of 1 KiB records", "pylog")
        T.append(Target("C verify-scan, 1 KiB records", None if v is None or v.mb_s is None else v.mb_s / 1e3, 8.0,
                        ">=", "GB/s", issue=2))
        c1 = self.find("crc32c", "crc32c 1 MiB", "pylog")
        c2 = self.find("crc32c", "crc32c 1 MiB", "crc32c package")
        T.append(Target("CRC32C 1 MiB vs crc32c package", None if c1 is None or c2 is None else ratio(c1.rate, c2.rate),
                        0.9, ">=", issue=6))
        d1 = rate("durable", "append fsync=always, 1 writer", "pylog")
        d0 = rate("durable", "append fsync=always, 1 writer", "file write+fdatasync")
        T.append(Target("fsync=always 1 writer vs write+fdatasync loop", ratio(d1, d0), 1.0,
                        ">=", issue=3))
        g = rate("durable", "append fsync=always, 16 threads", "pylog")
        T.append(Target("fsync=always 16 threads vs 1 writer (group commit)", ratio(g, d1),
                        10.0, ">=", issue=16))
        r1 = next((r for r in self.rows
                   if r.workload.startswith("reopen clean") and r.workload.endswith("1x data")), None)
        r10 = next((r for r in self.rows if r.workload.startswith("reopen clean") and r.workload.endswith("10x data")),
                   None)
        T.append(Target("reopen clean 1,000 segments",
                        None if r1 is None or r1.seconds is None else r1.seconds * 1e3, 50.0, "<=", "ms", issue=3))
        T.append(Target("reopen 10x data / 1x data",
                        None if r1 is None or r10 is None else ratio(r10.seconds, r1.seconds), 1.5, "<=", issue=3))
        # a target against a peer that did not run is skipped, not missed
        needs = {"vs file": "file", "vs lmdb": "lmdb", "columnar/Arrow": "arrow", "vs crc32c package": "crc32c"}
        for t in T:
            for words, peer in needs.items():
                if words in t.name and peer in self.missing:
                    t.skipped = f"{peer}: {self.missing[peer]}"

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
                elif r.bytes_per_record and ref.bytes_per_record and r.note != "RAM":
                    rel = f"{r.bytes_per_record / ref.bytes_per_record:.2f}"
            wl = r.workload
            if r.seconds is not None and r.rate is None:
                rate = f"{r.seconds * 1e3:.1f} ms"
            else:
                rate = _si(r.rate)
            out.append(
                f"{wl[:34]:34} {r.system[:22]:22} {r.n:>9,} {rate:>10} "
                f"{'-' if r.mb_s is None else f'{r.mb_s:.0f}':>8} "
                f"{'-' if r.p50_us is None else f'{r.p50_us:.2f}':>8} "
                f"{'-' if r.p99_us is None else f'{r.p99_us:.2f}':>8} "
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
            "commit": commit, "quick": self.quick, "argv": sys.argv[1:], "load": self.load,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }


def load_average() -> float | None:
    """The 1-minute load average, or None where the system does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_note(missed: int, load: Sequence[float | None], cores: int | None, quick: bool) -> str:
    """The ``note:`` line printed after the targets when ``missed`` of them were missed (empty
    when none was): the machine's load during the run (``load``: the load average at the start
    and at the end; ``cores``: its CPU count) and what to make of a miss. Speed targets are set
    for a quiet machine: a load average above the core count means other work took CPU from
    the run, and a miss then says more about the machine than about pylog."""
    if missed == 0:
        return ""
    what = f"{missed} target{'s' if missed > 1 else ''} missed"
    known = [x for x in load if x is not None]
    sizes = " and without --quick (its small sizes are noisier)" if quick else ""
    if not known or not cores:
        return (f"note: {what}; this system reports no load average: speed targets are set for a quiet "
                f"machine, so rerun with nothing else running{sizes} before reading a miss as a slowdown")
    start, end = load
    figures = (f"{start:.1f} at the start and {end:.1f} at the end" if start is not None and end is not None
               else f"{known[0]:.1f}")
    where = f"the load average was {figures}, on {cores} core{'s' if cores > 1 else ''}"
    if max(known) > cores:
        return (f"note: {what} on a busy machine: {where}, so other work was taking CPU from this run. "
                f"The targets are set for a quiet machine: rerun when the load average is below the core "
                f"count{sizes} before reading a miss as a slowdown")
    return (f"note: {what} on a quiet machine ({where}): a miss here is worth a look; docs/benchmarks.md "
            f"has the figures of earlier runs{' (run without --quick to compare with them)' if quick else ''}")


def summary(run: Run, seconds: float) -> list[str]:
    """The last lines of the output: one ``target:`` line per target, the ``compare:`` count
    (``seconds``: the run's length) and, when a target was missed, the :func:`load_note`."""
    lines = [t.line() for t in run.targets]
    skipped = sum(bool(t.skipped) for t in run.targets)
    lines.append(f"compare: {sum(t.ok for t in run.targets)} of {len(run.targets) - skipped} targets met"
                 f"{f', {skipped} skipped (peer not run)' if skipped else ''} ({seconds:.0f} s)")
    note = load_note(sum(not t.ok and not t.skipped for t in run.targets), run.load, os.cpu_count(), run.quick)
    return lines + [note] if note else lines


def write_sealed_log(path: str, n: int, value_size: int) -> None:
    """A closed log at ``path`` of ``n // BATCH`` batches of ``BATCH`` random values of
    ``value_size`` bytes, all in sealed segments (rolled before closing), written without
    fsync: the input of the verify-scan and the columnar-read workloads."""
    vals = [os.urandom(value_size) for _ in range(BATCH)]
    with no_fsync():
        log = pylog.Log(path, fsync="never")
        for _ in range(n // BATCH):
            log.append_batch(vals)
        log.roll()
        log.close()


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def find_arrow_reader() -> Callable[[Any], Any] | None:
    """pylog's columnar reader (:meth:`pylog.Log.read_arrow`), or None when pyarrow is not
    installed (it comes with the ``arrow`` and ``bench`` extras)."""
    try:
        if importlib.util.find_spec("pyarrow") is None:
            return None
    except (ImportError, ValueError):
        return None
    return lambda log: log.read_arrow()


def main(argv: Sequence[str] | None = None, prog: str = "pylog bench --compare") -> int:
    """Run the comparison (``pylog bench --compare [ARGS]``); returns the exit status."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
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
    load_start = load_average()
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
                run.missing[s.name.split()[0]] = "not selected with --peers"
                continue
            why = s.available()
            if why:
                print(f"peer skipped: {s.name}: {why}")
                run.missing[s.name.split()[0]] = why
                continue
            if isinstance(s, RedisSystem):
                try:
                    s.start()
                except Exception as e:  # noqa: BLE001 - a peer that cannot start is reported
                    print(f"peer skipped: {s.name}: {e}")
                    run.missing[s.name.split()[0]] = str(e)
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
    run.load = [load_start, load_average()]
    run.compute_targets(main_label, kib_label)
    print(run.table())
    print()
    print(f"conditions: {json.dumps(run.conditions())}")
    print(f"command: {prog} {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print("\n".join(summary(run, time.perf_counter() - t_start)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": run.conditions(), "rows": [asdict(r) for r in run.rows],
                       "targets": [dict(asdict(t), ok=t.ok, line=t.line()) for t in run.targets]}, f, indent=1)
    if args.fail_on_miss and not all(t.ok or t.skipped for t in run.targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
