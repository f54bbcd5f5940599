"""Raspberry Pi memory budget: many segments, bounded memory and file descriptors.

laminarmq aimed at 1 TB of log on a Pi 3B with 1 GB of RAM. What pylog holds per segment
is what decides that (docs/arm.md has the arithmetic): a sealed segment that is not in the
LRU keeps no map and no file descriptor, only a small Python object. This test opens a log
of 10,000 small segments with ``cached_segments=16``, reads across all of them, and checks
that resident memory grows by less than 50 MB, that at most 16 sealed segments (plus the
active one) stay mapped, and that open file descriptors stay under 16 x 3 plus a constant.
It reads the way a consumer does, fetch by fetch (``read_batch`` with a byte budget);
``test_scan_keeps_few_segments_mapped`` checks ``Log.scan`` the same way.

The log is built once per session in a child process (append_batch, fsync="never"), so
the memory the build used does not hide growth in the process that measures. Runs on x86
and under qemu-user (scripts/test-arm.sh): there RSS is qemu's, which includes its code
cache, so a warm-up read on a small log comes first.
"""
from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest

import pylog

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")

N_SEGMENTS = 10_000
CACHED = 16
SEGMENT_BYTES = 4096  # the smallest allowed
VALUE_BYTES = 1900  # 2 frames of 36 + 1900 bytes fill a 4 KiB segment: a third rolls
PER_SEGMENT = 2
RSS_BUDGET = 50 << 20
FD_BUDGET = CACHED * 3 + 8

# The builder skips fsync, and replaces files by unlink + rename: sealing a segment syncs
# its files and rewrites the recovery point, which (fsync, and ext4 flushing a file renamed
# over another) costs more than everything else in building 10,000 segments. Durability of
# this throwaway data is not what the test measures.
BUILD = textwrap.dedent("""
    import os, sys
    os.fsync = os.fdatasync = lambda fd: None
    import pylog
    from pylog import vfs

    def replace(src, dst):  # ext4 flushes the data of a file renamed over another one
        try:
            os.unlink(dst)
        except FileNotFoundError:
            pass
        os.rename(src, dst)

    vfs.replace = replace
    path, n_records, value_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with pylog.Log(path, segment_bytes=4096, fsync="never", cached_segments=16) as log:
        batch = 2000
        for first in range(0, n_records, batch):
            k = min(batch, n_records - first)
            log.append_batch([i.to_bytes(8, "little") * (value_bytes // 8)
                              for i in range(first, first + k)])
""")


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def n_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def n_mapped_files(directory: str) -> int:
    """Distinct files under ``directory`` that this process maps."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith(directory):
                names.add(parts[5].strip())
    return len(names)


@pytest.fixture(scope="session")
def many_segments(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pi-budget") / "log")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", BUILD, path, str(N_SEGMENTS * PER_SEGMENT), str(VALUE_BYTES)],
                   check=True, timeout=1200)
    return path, time.monotonic() - t0


def value_of(i: int) -> bytes:
    return i.to_bytes(8, "little") * (VALUE_BYTES // 8)


def test_10000_segments_fit_a_pi(many_segments, tmp_path, record_property):
    path, build_s = many_segments
    n_records = N_SEGMENTS * PER_SEGMENT

    # Warm-up on a small log: imports, first-use allocations, and (under qemu) translated code.
    with pylog.Log(str(tmp_path / "warm"), segment_bytes=SEGMENT_BYTES, fsync="never", cached_segments=CACHED) as w:
        w.append_batch([value_of(i) for i in range(200)])
    with pylog.Log(str(tmp_path / "warm"), cached_segments=CACHED) as w:
        for rec in w.scan():
            bytes(rec.value[:8])
        w.read(7)
    gc.collect()
    rss0, fds0 = rss_bytes(), n_fds()

    t0 = time.monotonic()
    log = pylog.Log(path, cached_segments=CACHED)
    try:
        open_s = time.monotonic() - t0
        assert log.next_offset == n_records
        n_seg = len([f for f in os.listdir(path) if f.endswith(".log")])
        assert n_seg >= N_SEGMENTS

        peak_rss = peak_fds = peak_maps = 0

        def sample():
            nonlocal peak_rss, peak_fds, peak_maps
            peak_rss = max(peak_rss, rss_bytes())
            peak_fds = max(peak_fds, n_fds())
            peak_maps = max(peak_maps, n_mapped_files(path))

        t0 = time.monotonic()
        count = off = 0
        while off < n_records:  # every record of every segment, in order, fetch by fetch
            batch = log.read_batch(off, max_bytes=SEGMENT_BYTES)
            for rec in batch:
                assert rec.offset == count  # consecutive, none missed
                count += 1
                if rec.offset % 1000 == 0:
                    assert bytes(rec.value[:8]) == rec.offset.to_bytes(8, "little")
                    sample()
            off = batch[-1].offset + 1
            del batch, rec
        assert count == n_records
        scan_s = time.monotonic() - t0

        t0 = time.monotonic()
        rnd = random.Random(1)
        for j in range(2000):  # random segments: the LRU keeps evicting
            off = rnd.randrange(n_records)
            assert bytes(log.read(off).value[:8]) == off.to_bytes(8, "little")
            if j % 100 == 0:
                sample()
        read_s = time.monotonic() - t0
        gc.collect()
        sample()
    finally:
        log.close()

    growth = peak_rss - rss0
    fd_growth = peak_fds - fds0
    figures = (f"{n_seg} segments, {n_records} records: build {build_s:.1f} s, open {open_s:.1f} s, "
               f"fetch all {scan_s:.1f} s, 2000 random reads {read_s:.1f} s; RSS {rss0 >> 20} MB + "
               f"{growth / 2**20:.1f} MB peak growth; fds {fds0} + {fd_growth} peak; "
               f"mapped segment files peak {peak_maps}")
    print("memory:", figures)
    record_property("memory", figures)
    assert growth < RSS_BUDGET, figures
    assert fd_growth < FD_BUDGET, figures
    # 3 files (store, index, time index) per mapped segment: 16 sealed + the active one
    assert peak_maps <= (CACHED + 1) * 3, figures


def test_scan_keeps_few_segments_mapped(many_segments):
    """Log.scan reads segment by segment: the LRU bounds what it maps, not its batch size
    (a scan that fetched 8 MiB batches across 4 KiB segments once held ~2,000 maps, and on
    CPython < 3.13 as many descriptors)."""
    path, _ = many_segments
    fds0 = n_fds()
    peak_fds = peak_maps = 0
    with pylog.Log(path, cached_segments=CACHED) as log:
        for rec in log.scan(0, 3000 * PER_SEGMENT):
            if rec.offset % 500 == 0:
                peak_fds = max(peak_fds, n_fds())
                peak_maps = max(peak_maps, n_mapped_files(path))
    assert peak_maps <= (CACHED + 2) * 3, f"{peak_maps} segment files mapped at once"
    assert peak_fds - fds0 < FD_BUDGET, f"{peak_fds - fds0} more descriptors"
