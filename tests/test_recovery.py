"""Recovery of a damaged active segment, damaged metadata and stray files (DESIGN.md §5,
crash-tests.md §6 scenarios 1, 2, 3, 5 and 7).

Each test builds a log, closes it, damages the files the way a crash (or a bad disk) can,
reopens and checks the recovered log against what was written: it ends at the last whole
record, ``next_offset`` is right, every surviving record reads back exactly, appends resume
and a reread after more appends (and after another reopen) is right.
"""
from __future__ import annotations

import builtins
import mmap
import os
import random
import shutil
import struct
import time

import pytest
from conftest import py_env, run_py, scaled
from conftest import store_files as stores
from conftest import store_frames as frames

import pylog
from pylog import checkpoint
from pylog import format as fmt

HDR = fmt.FILE_HEADER_SIZE


# -- helpers ---------------------------------------------------------------------------------
def values_for(n: int, seed: int = 1, lo: int = 0, hi: int = 40) -> list[bytes]:
    r = random.Random(seed)
    return [r.randbytes(r.randint(lo, hi)) for _ in range(n)]


def build(path: str, values: list[bytes], **kw) -> None:
    """A closed (cleanly shut down) log holding ``values`` at offsets 0.."""
    opts = dict(fsync="never", segment_bytes=4096, index_interval_bytes=64)
    opts.update(kw)
    with pylog.Log(path, **opts) as log:
        for i, v in enumerate(values):
            log.append(v, key=b"k%d" % i if i % 2 else None, timestamp=1_000 + 10 * i)


def unclean(path: str) -> None:
    """Make the next open an unclean one (as if the process had died while appending to
    the active segment): no clean marker, and a recovery point no later than the active
    segment's base (close() left it at next_offset, which would count every record as
    durable, so that a cut torn tail would be reported as lost durable records). A damaged
    recovery point is left as it is."""
    try:
        os.unlink(os.path.join(path, fmt.CLEAN_SHUTDOWN_FILE))
    except FileNotFoundError:
        pass
    rp = checkpoint.read_recovery_point(path)
    bases = [fmt.parse_segment_name(n, fmt.STORE_SUFFIX) for n in os.listdir(path)]
    bases = [b for b in bases if b is not None]
    if rp is not None and bases and rp > max(bases):
        checkpoint.write_recovery_point(path, max(bases))


def check_log(path: str, values: list[bytes], n: int, *, extra: int = 3, seed: int = 0) -> None:
    """Reopen ``path``: it must hold exactly values[:n], take ``extra`` more appends, and
    read back right after them and after another reopen."""
    want = list(values[:n])
    with pylog.Log(path) as log:
        assert log.next_offset == n, (log.next_offset, n)
        assert log.recovery_report == []
        got = [bytes(r.value) for r in log.scan()]
        assert got == want
        r = random.Random(seed)
        for i in range(extra):
            v = r.randbytes(r.randint(0, 50))
            assert log.append(v, timestamp=10**9 + i) == n + i
            want.append(v)
        assert [bytes(r.value) for r in log.scan()] == want
        assert log.verify() == []
    with pylog.Log(path) as log:
        assert log.next_offset == len(want)
        assert [bytes(log.read(o).value) for o in range(len(want))] == want


@pytest.fixture
def pristine(tmp_path):
    """A closed log with sealed segments and an active one; (path, values, active store)."""
    path = str(tmp_path / "pristine")
    values = values_for(260, seed=7)
    build(path, values)
    assert len(stores(path)) >= 3
    return path, values, stores(path)[-1]


def copy_of(src: str, tmp_path, name: str) -> str:
    dst = str(tmp_path / name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


# -- 1. torn tail at every byte --------------------------------------------------------------
def test_cut_at_every_byte_of_the_last_three_records(pristine, tmp_path):
    path, values, active = pristine
    fr = frames(active)
    assert len(fr) >= 3
    name = os.path.basename(active)
    start = fr[-3][0]
    end = fr[-1][0] + fr[-1][1]
    assert end == os.path.getsize(active)
    cuts = list(range(start, end))  # every byte inside the last three frames
    trials = 0
    for cut in cuts:
        d = copy_of(path, tmp_path, "cut")
        os.truncate(os.path.join(d, name), cut)
        unclean(d)
        whole = [f for f in fr if f[0] + f[1] <= cut]
        n = whole[-1][2] + 1 if whole else fr[0][2]
        with pylog.Log(d) as log:
            assert log.next_offset == n, f"cut at {cut}"
            assert log.truncated_bytes == cut - (whole[-1][0] + whole[-1][1] if whole else HDR)
            # the torn record's neighbours read back; appends resume right after them
            assert bytes(log.read(n - 1).value) == values[n - 1]
            with pytest.raises(pylog.OffsetOutOfRangeError):
                log.read(n)
            tail = [b"resumed-%d" % cut, b""]
            assert log.append_batch(tail, timestamps=[10**9, 10**9]) == n
            got = [bytes(r.value) for r in log.scan(n - min(n, 20))]
            assert got == values[max(0, n - 20):n] + tail
        if cut % 8 == 0 or cut == end - 1:  # the full check (another reopen) now and then
            check_log(d, values[:n] + tail, n + 2, extra=1, seed=cut)
        trials += 1
    assert trials == end - start


def test_cut_inside_file_header_of_active_segment(pristine, tmp_path):
    """A store cut inside its own 32-byte header (a crash right after creating it)."""
    path, values, active = pristine
    base = fmt.parse_segment_name(os.path.basename(active), fmt.STORE_SUFFIX)
    for cut in range(0, HDR):
        d = copy_of(path, tmp_path, "hcut")
        os.truncate(os.path.join(d, os.path.basename(active)), cut)
        unclean(d)
        check_log(d, values, base, extra=2, seed=cut)


# -- 2. garbage, zeros and lying length fields -----------------------------------------------
def _frame_header(length: int, offset: int, crc: int = 0) -> bytes:
    return struct.pack("<IIQqIII", length, crc, offset, 5, 7, 0, 0)


TAILS = {
    "random-garbage": lambda r, n: r.randbytes(300),
    "zeros-512": lambda r, n: bytes(512),
    "length-past-eof": lambda r, n: _frame_header(10_000, n) + r.randbytes(20),
    "zero-length": lambda r, n: _frame_header(0, n) + r.randbytes(20),
    "length-below-minimum": lambda r, n: _frame_header(27, n) + r.randbytes(40),
    "length-u32-max": lambda r, n: _frame_header(0xFFFFFFFF, n) + r.randbytes(40),
    "length-2GiB": lambda r, n: _frame_header(0x80000000, n) + r.randbytes(40),
    "length-negative-i32": lambda r, n: _frame_header(0xFFFFFFF0, n) + r.randbytes(40),
    "header-only": lambda r, n: _frame_header(40, n),
    "short-prefix": lambda r, n: b"\x30\x00",
}


@pytest.mark.parametrize("kind", sorted(TAILS))
def test_garbage_tail_is_cut(pristine, tmp_path, kind):
    path, values, active = pristine
    d = copy_of(path, tmp_path, "g")
    st = os.path.join(d, os.path.basename(active))
    tail = TAILS[kind](random.Random(kind), len(values))
    with open(st, "ab") as f:
        f.write(tail)
    unclean(d)
    with pylog.Log(d) as log:
        assert log.next_offset == len(values)
        assert log.truncated_bytes == len(tail)
    # the cut bytes are kept aside, as etcd's repair does
    with open(st + fmt.BROKEN_SUFFIX, "rb") as f:
        assert f.read() == tail
    check_log(d, values, len(values), seed=3)


def test_valid_frame_with_bad_crc_after_valid_data(pristine, tmp_path):
    """Partial garbage after valid data: a copy of the last frame with the right offset and
    length but one byte of its value changed (a torn write that left the old page)."""
    path, values, active = pristine
    d = copy_of(path, tmp_path, "p")
    st = os.path.join(d, os.path.basename(active))
    pos, size, off = frames(st)[-1]
    with open(st, "rb") as f:
        data = f.read()
    fake = bytearray(data[pos : pos + size])
    fake[8:16] = struct.pack("<Q", len(values))      # the next offset: all but the CRC is right
    fake[-1] ^= 0x40
    with open(st, "ab") as f:
        f.write(fake)
    unclean(d)
    with pylog.Log(d) as log:
        assert log.truncated_bytes == len(fake)
    check_log(d, values, len(values))


def test_garbage_tail_whole_file_is_junk(tmp_path):
    """A store that is junk from its first frame on (BookKeeper testAllJunkJournal)."""
    path = str(tmp_path / "j")
    build(path, [])
    st = stores(path)[-1]
    with open(st, "ab") as f:
        f.write(random.Random(5).randbytes(5000))
    unclean(path)
    with pylog.Log(path) as log:
        assert log.next_offset == 0 and log.truncated_bytes == 5000
    check_log(path, [], 0)


def test_lying_length_allocates_nothing(pristine, tmp_path):
    """Recovery over a frame claiming 2 GiB must not allocate anything near that size."""
    import resource
    import subprocess
    import sys

    path, values, active = pristine
    d = copy_of(path, tmp_path, "lie")
    with open(os.path.join(d, os.path.basename(active)), "ab") as f:
        f.write(_frame_header(0x7FFFFFF0, len(values)) + bytes(64))
    unclean(d)
    code = (
        "import resource, sys, pylog\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"  # 1 GiB of address space
        f"log = pylog.Log({d!r})\n"
        f"assert log.next_offset == {len(values)}\n"
        "log.close()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=py_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert resource.RLIMIT_AS  # the limit exists on this platform


# -- 3. torn sector and flipped bit in the middle of the active segment ------------------------
# Interior damage is not a torn tail: recovery keeps every intact record after it, reports the
# damage, and seals the damaged segment (tests/test_seam_recovery.py covers the rule in depth).
def check_damaged(d: str, values: list[bytes], bad: set[int]) -> None:
    """Reopen ``d``: all of ``values`` claimed, the offsets in ``bad`` (and only they) raise
    CorruptRecordError naming themselves, the damage is reported, appends continue."""
    n = len(values)
    with pylog.Log(d) as log:
        assert log.next_offset == n and log.truncated_bytes == 0
        assert log.recovery_report and log.verify()
        assert {e.offset for e in log.recovery_report} <= bad
        for o in range(n):
            if o in bad:
                with pytest.raises(pylog.CorruptRecordError) as ei:
                    log.read(o)
                assert ei.value.offset == o
            else:
                assert bytes(log.read(o).value) == values[o], o
        assert log.append(b"after") == n
    with pylog.Log(d) as log:
        assert bytes(log.read(n).value) == b"after" and log.verify()


def test_torn_sector_in_the_middle(pristine, tmp_path):
    path, values, active = pristine
    d = copy_of(path, tmp_path, "t")
    st = os.path.join(d, os.path.basename(active))
    fr = frames(st)
    mid = fr[len(fr) // 2]
    zero_at = mid[0] + 8  # inside the middle frame
    assert zero_at + 512 < fr[-1][0]  # whole frames follow the zeros
    with open(st, "r+b") as f:
        f.seek(zero_at)
        f.write(bytes(512))
    unclean(d)
    bad = {off for pos, sz, off in fr if pos < zero_at + 512 and pos + sz > zero_at}
    check_damaged(d, values, bad)


def test_torn_sector_at_the_end_is_cut(pristine, tmp_path):
    path, values, active = pristine
    d = copy_of(path, tmp_path, "t")
    st = os.path.join(d, os.path.basename(active))
    fr = frames(st)
    mid = fr[len(fr) // 2]
    size = os.path.getsize(st)
    with open(st, "r+b") as f:
        f.seek(mid[0] + 8)
        f.write(bytes(size - mid[0] - 8))  # zeros to the end: a torn tail
    unclean(d)
    with pylog.Log(d) as log:
        assert log.next_offset == mid[2]
        assert log.truncated_bytes == size - mid[0]
    check_log(d, values, mid[2])


def test_flipped_bit_in_active_payload(pristine, tmp_path):
    path, values, active = pristine
    r = random.Random(11)
    for trial in range(scaled(20, 200)):
        d = copy_of(path, tmp_path, "f")
        st = os.path.join(d, os.path.basename(active))
        fr = frames(st)
        k = r.randrange(len(fr))
        pos, size, off = fr[k]
        byte = pos + r.randrange(4, size)  # anywhere after the length field
        with open(st, "r+b") as f:
            f.seek(byte)
            b = f.read(1)[0]
            f.seek(byte)
            f.write(bytes([b ^ (1 << r.randrange(8))]))
        unclean(d)
        if k == len(fr) - 1:  # the last frame: nothing valid after it, a torn tail
            with pylog.Log(d) as log:
                assert log.next_offset == off, (trial, byte)
            check_log(d, values, off, extra=1)
        else:
            check_damaged(d, values, {off})


# -- 5. crash at every step of multi-file operations: stray files -----------------------------
def test_stray_files_are_removed_at_open(pristine, tmp_path):
    path, values, active = pristine
    d = copy_of(path, tmp_path, "s")
    base = fmt.parse_segment_name(os.path.basename(active), fmt.STORE_SUFFIX)
    orphan = 10**12
    stray = [
        fmt.CHECKPOINT_FILE + fmt.TEMP_SUFFIX,
        fmt.CLEAN_SHUTDOWN_FILE + fmt.TEMP_SUFFIX,
        fmt.segment_name(base, fmt.INDEX_SUFFIX) + fmt.TEMP_SUFFIX,
        fmt.segment_name(orphan, fmt.STORE_SUFFIX) + fmt.DELETED_SUFFIX,
        fmt.segment_name(orphan, fmt.INDEX_SUFFIX) + fmt.DELETED_SUFFIX,
        fmt.segment_name(orphan, fmt.INDEX_SUFFIX),        # orphan: no .log
        fmt.segment_name(orphan, fmt.TIMEINDEX_SUFFIX),
    ]
    for name in stray:
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"junk" * 10)
    for clean in (True, False):
        dd = copy_of(d, tmp_path, "s2")
        if not clean:
            unclean(dd)
        with pylog.Log(dd) as log:
            left = set(os.listdir(dd))
            assert not left & set(stray), left & set(stray)
            assert log.next_offset == len(values)
        check_log(dd, values, len(values))


def test_crash_during_open_counts_as_unclean(pristine, tmp_path):
    """The clean-shutdown marker is deleted (durably) as the log opens (KAFKA-10471)."""
    path, values, active = pristine
    d = copy_of(path, tmp_path, "o")
    assert os.path.exists(os.path.join(d, fmt.CLEAN_SHUTDOWN_FILE))
    log = pylog.Log(d)
    assert not os.path.exists(os.path.join(d, fmt.CLEAN_SHUTDOWN_FILE))
    from pylog.testing import simulate_crash

    simulate_crash(log)
    # junk after the end would be cut only by a recovery: prove the next open recovers
    with open(os.path.join(d, os.path.basename(active)), "ab") as f:
        f.write(b"\x01" * 100)
    with pylog.Log(d) as log:
        assert log.truncated_bytes == 100
    check_log(d, values, len(values))


# -- 7. metadata damage ---------------------------------------------------------------------
def _ckp(offset: int, version: int = 1) -> bytes:
    body = struct.pack("<8sHHIQ", b"PYLOGCKP", version, 0, 0, offset)
    return body + struct.pack("<I", pylog.crc32c(body))


def _cln(next_offset: int, base: int, size: int, ts: int, mtime_ns: int, version: int = 2) -> bytes:
    """A clean-shutdown marker (pylog/checkpoint.py layout) with a valid CRC."""
    body = struct.pack("<8sHHIQQQqq", b"PYLOGCLN", version, 0, 0, next_offset, base, size, ts, mtime_ns)
    return body + struct.pack("<I", pylog.crc32c(body))


def _damaged_variants(good: bytes, craft) -> dict[str, bytes]:
    r = random.Random(len(good))
    out = {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "garbage": r.randbytes(len(good)),
        "bad-crc": good[:-1] + bytes([good[-1] ^ 1]),
        "unknown-version": craft(99),
        "longer": good + b"\x00" * 8,
    }
    return out


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "bad-crc", "unknown-version",
                                    "longer", "stale-zero", "past-the-end", "huge",
                                    "inside-sealed"])
def test_recovery_point_damage(pristine, tmp_path, damage):
    """A damaged or wrong recovery point never crashes the open nor changes the data; the
    sealed segments stay checked and a torn tail is still cut."""
    path, values, active = pristine
    d = copy_of(path, tmp_path, "rp")
    base = fmt.parse_segment_name(os.path.basename(active), fmt.STORE_SUFFIX)
    p = os.path.join(d, fmt.CHECKPOINT_FILE)
    with open(p, "rb") as f:
        good = f.read()
    assert checkpoint.read_recovery_point(d) is not None
    variants = _damaged_variants(good, lambda v: _ckp(base, v))
    variants.update({"stale-zero": _ckp(0), "past-the-end": _ckp(base + 10_000),
                     "huge": _ckp((1 << 64) - 1), "inside-sealed": _ckp(base - 3)})
    os.unlink(p)
    with open(p, "wb") as f:
        f.write(variants[damage])
    with open(os.path.join(d, os.path.basename(active)), "ab") as f:
        f.write(b"\xff" * 77)
    unclean(d)
    with pylog.Log(d) as log:
        assert log.truncated_bytes == 77
        assert log.next_offset == len(values)
    check_log(d, values, len(values))


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "bad-crc", "unknown-version",
                                    "old-version-1", "longer", "stale", "wrong-size", "wrong-base",
                                    "wrong-mtime", "next-more-than-bytes", "next-before-base",
                                    "next-before-last-indexed", "no-max-timestamp"])
def test_clean_shutdown_marker_damage(pristine, tmp_path, damage):
    """A damaged, stale or lying clean-shutdown marker never crashes the open and never
    makes the log accept wrong offsets: it falls back to full recovery.

    The lying markers here carry a valid CRC and the store's true size and mtime, so only
    the check of next_offset against the index files can catch them (a lie that the index
    files allow cannot be caught without reading record data: docs/durability.md)."""
    path, values, active = pristine
    d = copy_of(path, tmp_path, "cs")
    base = fmt.parse_segment_name(os.path.basename(active), fmt.STORE_SUFFIX)
    p = os.path.join(d, fmt.CLEAN_SHUTDOWN_FILE)
    size = os.path.getsize(active)
    with open(p, "rb") as f:
        good = f.read()
    st = checkpoint.take_clean(d, remove=False)
    assert st is not None and st.next_offset == len(values) and st.active_size == size
    ts = st.max_timestamp
    mt = os.stat(os.path.join(d, os.path.basename(active))).st_mtime_ns
    assert st.active_mtime_ns == mt
    n = len(values)
    with open(os.path.join(d, fmt.segment_name(base, fmt.INDEX_SUFFIX)), "rb") as f:
        ib = f.read()[HDR:]
    last_rel, last_pos = struct.unpack_from("<II", ib, len(ib) - 8)
    room = (size - last_pos) // fmt.FRAME_HEADER_SIZE  # most records the bytes after it can hold
    variants = _damaged_variants(good, lambda v: _cln(n, base, size, ts, mt, v))
    old_v1 = struct.pack("<8sHHIQQQq", b"PYLOGCLN", 1, 0, 0, n, base, size, ts)
    variants.update({
        "old-version-1": old_v1 + struct.pack("<I", pylog.crc32c(old_v1)),
        "wrong-size": _cln(n, base, size - 1, ts, mt),
        "wrong-base": _cln(n, base - 1, size, ts, mt),
        "wrong-mtime": _cln(n, base, size, ts, mt - 1),
        "next-more-than-bytes": _cln(base + last_rel + room + 1, base, size, ts, mt),
        "next-before-base": _cln(base - 1, base, size, ts, mt),
        "next-before-last-indexed": _cln(base + last_rel, base, size, ts, mt),
        "no-max-timestamp": _cln(n, base, size, -(1 << 63), mt),
        "stale": None,
    })
    if damage == "stale":
        # the marker of an earlier clean close, left over while the log moved on: close, keep
        # the marker, reopen, append, crash (no new marker), put the old marker back
        log = pylog.Log(d)
        log.append(b"later", timestamp=10**9)
        log.flush()
        from pylog.testing import simulate_crash

        simulate_crash(log)
        with open(p, "wb") as f:
            f.write(good)
        expect = values + [b"later"]
    else:
        os.unlink(p)
        with open(p, "wb") as f:
            f.write(variants[damage])
        expect = values
    with pylog.Log(d) as log:
        assert log.next_offset == len(expect)
        assert [bytes(r.value) for r in log.scan()] == expect
        assert not os.path.exists(p)
    check_log(d, expect, len(expect))


def test_stale_marker_same_size_different_records(tmp_path):
    """A stale clean-shutdown marker whose recorded size happens to match the store again
    (the log was truncated and refilled with fewer, larger records) must not make the log
    claim offsets it does not hold."""
    path = str(tmp_path / "stale")
    with pylog.Log(path, fsync="never", index_interval_bytes=1 << 20) as log:
        for i in range(10):                             # 10 frames of 40 bytes
            log.append(bytes([i]) * 4, timestamp=1_000 + i)
    p = os.path.join(path, fmt.CLEAN_SHUTDOWN_FILE)
    with open(p, "rb") as f:
        old = f.read()
    time.sleep(0.05)  # the marker is tied to the store's mtime: let the clock move on
    with pylog.Log(path) as log:
        log.truncate(0)
        for i in range(5):                              # 5 frames of 80 bytes: same size
            log.append(bytes([100 + i]) * 44, timestamp=5_000 + i)
        log.flush()
        size = log.size_bytes
    with open(p, "wb") as f:  # the old marker comes back (a restore, a lost unlink...)
        f.write(old)
    assert size == checkpoint.take_clean(path, remove=False).active_size
    with pylog.Log(path) as log:
        assert log.next_offset == 5
        assert [bytes(r.value) for r in log.scan()] == [bytes([100 + i]) * 44 for i in range(5)]


# -- clean open reads no record data ----------------------------------------------------------
def test_clean_open_reads_no_record_data(pristine, tmp_path, monkeypatch):
    """Prove it twice: no read of any store file during a clean open (reads traced), and a
    corrupted record body in the active segment goes unnoticed by a clean open but is
    found (and reported, the records after it kept) by an unclean one."""
    path, values, active = pristine
    d = copy_of(path, tmp_path, "c")
    st = os.path.join(d, os.path.basename(active))
    pos, size, off = frames(st)[-4]
    before = os.stat(st)
    with open(st, "r+b") as f:  # flip a bit in the value of a record 4 from the end
        f.seek(pos + size - 1)
        b = f.read(1)[0]
        f.seek(pos + size - 1)
        f.write(bytes([b ^ 0x10]))
    # bit rot does not touch the file's times (a write through the file system would, and
    # the clean-shutdown marker, tied to the mtime, would no longer be trusted)
    os.utime(st, ns=(before.st_atime_ns, before.st_mtime_ns))
    d2 = copy_of(d, tmp_path, "c2")

    touched: list[str] = []
    real_pread, real_mmap, real_open = os.pread, mmap.mmap, builtins.open

    def fd_name(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "?"

    def pread(fd, n, at):
        touched.append(fd_name(fd))
        return real_pread(fd, n, at)

    def mm(fd, *a, **k):
        touched.append(fd_name(fd))
        return real_mmap(fd, *a, **k)

    def op(file, mode="r", *a, **k):
        if "r" in mode or "+" in mode:
            touched.append(os.path.realpath(file) if isinstance(file, (str, bytes, os.PathLike)) else "?")
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(mmap, "mmap", mm)
    monkeypatch.setattr(builtins, "open", op)
    log = pylog.Log(d)
    monkeypatch.undo()
    try:
        assert log.truncated_bytes == 0  # a clean open
        read_stores = [t for t in touched if t.endswith(fmt.STORE_SUFFIX)]
        assert read_stores == [], read_stores
        assert touched, "the trace saw nothing: it is not wired in"
        assert log.truncated_bytes == 0 and log.next_offset == len(values)
        # the damage is there, and a read of it raises rather than returning wrong bytes
        with pytest.raises(pylog.CorruptRecordError) as e:
            log.read(off)
        assert e.value.offset == off
        assert bytes(log.read(off - 1).value) == values[off - 1]
        assert [x.offset for x in log.verify()] == [off]
    finally:
        log.close()
    unclean(d2)
    # an unclean open walks the active segment, finds the damage and keeps what follows it
    check_damaged(d2, values, {off})


def test_store_modified_after_close_is_recovered(pristine, tmp_path):
    """A store written to after the clean close (its mtime moved) is not trusted by the
    clean-shutdown marker: the open recovers, and finds the damage."""
    path, values, active = pristine
    d = copy_of(path, tmp_path, "m")
    st = os.path.join(d, os.path.basename(active))
    pos, size, off = frames(st)[-2]
    time.sleep(0.02)
    with open(st, "r+b") as f:
        f.seek(pos + 20)
        f.write(b"\xee")
    check_damaged(d, values, {off})


# -- preallocated stores (preallocate=True) ----------------------------------------------------
PRE = dict(fsync="always", preallocate=True, segment_bytes=1 << 20)


def _kill_preallocated_writer(path: str, n: int) -> str:
    """A ``preallocate=True`` writer appends ``n`` acknowledged records and is SIGKILLed:
    its store still holds the zeros of the space it reserved. Returns the store's path."""
    r = run_py(f"""
        import os, pylog
        log = pylog.Log({path!r}, **{PRE!r})
        for i in range({n}):
            log.append(b"v%d" % i)
        os.kill(os.getpid(), 9)
        """, timeout=60)
    assert r.returncode == -9, r.stderr[-2000:]
    st = stores(path)[-1]
    assert os.path.getsize(st) == PRE["segment_bytes"]  # the reserved space is still there
    return st


@pytest.mark.parametrize("tail", ["none", "garbage", "torn frame"])
def test_preallocated_zeros_are_not_torn_bytes(tmp_path, tail):
    """After a crash, the zeros of preallocated space are cut without being counted or
    saved as torn bytes; what the writer really left after its last frame is."""
    path = str(tmp_path / "pre")
    n = 50
    st = _kill_preallocated_writer(path, n)
    fr = frames(st)
    assert len(fr) == n
    end = fr[-1][0] + fr[-1][1]
    junk = b""
    if tail == "garbage":
        junk = random.Random(7).randbytes(300) + b"\x01"
    elif tail == "torn frame":  # the first 20 bytes of a copy of the last frame, bumped offset
        with open(st, "rb") as f:
            f.seek(fr[-1][0])
            head = bytearray(f.read(20))
        head[8:16] = struct.pack("<Q", n)
        junk = bytes(head)
    with open(st, "r+b") as f:
        f.seek(end)
        f.write(junk)
    # zeros at the end of the junk (a timestamp byte of the torn header can be 0) look
    # exactly like the reserved zeros after it: only the junk up to its last non-zero byte
    # can be told apart
    junk_seen = junk.rstrip(b"\0")
    with pylog.Log(path, **PRE) as log:
        assert log.next_offset == n and log.recovery_report == []
        assert log.truncated_bytes == len(junk_seen)
        assert [bytes(r.value) for r in log.scan()] == [b"v%d" % i for i in range(n)]
        log.append(b"after")
        assert os.path.getsize(st) == PRE["segment_bytes"]  # reserved again after recovery
    assert os.path.exists(st + fmt.BROKEN_SUFFIX) == bool(junk_seen)
    if junk_seen:
        with open(st + fmt.BROKEN_SUFFIX, "rb") as f:
            assert f.read() == junk_seen
    assert os.path.getsize(st) == end + fmt.FRAME_HEADER_SIZE + len(b"after")  # trimmed at close


def test_preallocated_zeros_are_not_torn_when_reopened_without_preallocation(tmp_path):
    """A log written with preallocate=True, crashed, reopened with preallocate=False: the
    reserved zeros are still no torn tail (they used to be counted as cut and saved as a
    segment-sized ``.broken`` file of zeros); the file ends at its last frame."""
    path = str(tmp_path / "pre")
    n = 30
    st = _kill_preallocated_writer(path, n)
    fr = frames(st)
    end = fr[-1][0] + fr[-1][1]
    with pylog.Log(path, preallocate=False) as log:
        assert log.config.preallocate is False
        assert log.next_offset == n and log.recovery_report == [] and log.truncated_bytes == 0
        assert os.path.getsize(st) == end
        log.append(b"after")
        assert [bytes(r.value) for r in log.scan()] == [b"v%d" % i for i in range(n)] + [b"after"]
    assert not os.path.exists(st + fmt.BROKEN_SUFFIX)
    with pylog.Log(path) as log:  # the stored config now says no preallocation: a clean reopen
        assert log.truncated_bytes == 0 and log.next_offset == n + 1
    assert os.path.getsize(st) == end + fmt.FRAME_HEADER_SIZE + len(b"after")


def test_clean_reopen_of_a_preallocated_log_reserves_space_again(tmp_path):
    path = str(tmp_path / "pre")
    with pylog.Log(path, **PRE) as log:
        log.append_batch([b"x" * 100] * 10)
    st = stores(path)[-1]
    size = os.path.getsize(st)
    assert size == HDR + 10 * (fmt.FRAME_HEADER_SIZE + 100)  # trimmed at close
    with pylog.Log(path, **PRE) as log:
        assert log.truncated_bytes == 0 and log.next_offset == 10
        assert os.path.getsize(st) == PRE["segment_bytes"]
        log.append(b"y")
        assert bytes(log.read(10).value) == b"y"
    assert os.path.getsize(st) == size + fmt.FRAME_HEADER_SIZE + 1


def test_data_end_finds_the_last_non_zero_byte(tmp_path):
    from pylog.fileutil import data_end

    r = random.Random(11)
    p = str(tmp_path / "f")
    for trial in range(40):
        size = r.choice([0, 1, 100, 4096, 70_000, 3 << 20])
        with open(p, "wb") as f:
            f.truncate(size)  # a sparse file: holes read as zeros
            for _ in range(r.randint(0, 4)):
                if size:
                    at = r.randrange(size)
                    f.seek(at)
                    f.write(bytes([r.randint(1, 255)]) * r.randint(1, 64))
            f.truncate(size)
        data = open(p, "rb").read()
        start = r.randint(0, size)
        want = max(start, len(data.rstrip(b"\0")))
        fd = os.open(p, os.O_RDONLY)
        try:
            assert data_end(fd, start, size) == want, (trial, size, start)
            got = data_end(fd, start, size, limit=4096)  # gives up on long runs of zeros
            assert want <= got <= size
        finally:
            os.close(fd)


def test_data_end_skips_holes_without_reading_them(tmp_path, monkeypatch):
    """1 MiB of data, then a 40 MiB hole (what preallocated space is, unwritten): the end is
    found through SEEK_DATA/SEEK_HOLE, reading back only the data extent, not the 40 MiB
    that the 16 MiB read-back limit would give up on."""
    from pylog import fileutil

    p = str(tmp_path / "f")
    with open(p, "wb") as f:
        f.write(b"\x07" * (1 << 20))
        f.truncate(41 << 20)
    fd = os.open(p, os.O_RDONLY)
    try:
        if os.lseek(fd, 0, os.SEEK_HOLE) >= 41 << 20:
            pytest.skip("this file system reports no holes")
        read = []
        real = os.pread
        monkeypatch.setattr(fileutil.os, "pread", lambda f, n, at: read.append(n) or real(f, n, at))
        assert fileutil.data_end(fd, 0, 41 << 20) == 1 << 20
        assert sum(read) <= 1 << 20  # the data extent at most, never the hole
    finally:
        os.close(fd)


def test_a_full_disk_does_not_stop_a_preallocated_log_from_opening(tmp_path, monkeypatch):
    """Reserving space is best effort: with the disk full the log still opens (to read, or
    to free space by retention) and appends grow the file as usual."""
    import errno

    from pylog import vfs

    path = str(tmp_path / "pre")
    with pylog.Log(path, **PRE) as log:
        log.append(b"a")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(vfs, "posix_fallocate", full)
    for reopen in ("clean", "unclean"):
        if reopen == "unclean":
            unclean(path)
        with pylog.Log(path, **PRE) as log:
            log.append(b"b")
            assert bytes(log.read(log.next_offset - 1).value) == b"b"
    with pylog.Log(path) as log:
        assert [bytes(r.value) for r in log.scan()] == [b"a", b"b", b"b"]
