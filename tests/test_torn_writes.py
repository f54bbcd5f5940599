"""Torn writes are cut, damage is kept, write units are atomic (issue 30 items 1-4, the
log-layer part of issue 25 item 2; docs/durability.md "Torn writes versus damage").

A power cut may persist the sectors of an unsynced write in any order. CrashFS
(pylog.testing) records what each fsync made durable and builds the image a machine finds
after reboot; here the image is also built by hand, sector by sector, for the issue's exact
reproductions. Failed writes come from strace's fault injection on a real writer process.

* 1: ``fsync="always"``: after a power cut the log is a prefix of what was appended, holding
  every acknowledged record; a torn unacknowledged batch is cut silently, even when its later
  sectors persisted whole frames (``recovery_report`` empty, ``verify()`` clean,
  ``truncated_bytes`` counts it).
* 2: ``"interval"``/``"never"``: a prefix, whatever the OS persisted.
* 3: an ``append_batch`` survives whole or not at all: across a roll, at every operation of
  it, and when a write of it fails (in the writing process and after a reopen).
* 4: damage below the last point known durable is kept and reported, the records after it
  readable.

Every test runs under both backends (the suite runs again with PYLOG_BACKEND=pure).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import LONG, py_env, scaled
from conftest import store_files as stores
from conftest import store_frames as frames

import pylog
from pylog import checkpoint, vfs
from pylog import format as fmt
from pylog.errors import CorruptRecordError, OffsetOutOfRangeError
from pylog.testing import CrashFS, PowerCut, simulate_crash

SECTOR = 512


@pytest.fixture
def no_real_fsync(monkeypatch):
    """Durability is what CrashFS records; the disk's own fsyncs would only slow the tests."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


def val(i: int, size: int = 90) -> bytes:
    return (b"%06d-" % i * (size // 7 + 1))[:size]


def cut_before_fdatasync(fs: CrashFS, nth: int = 1) -> None:
    """Make the ``nth`` fdatasync from now on the point where the power goes."""
    count = [0]
    real = fs.fdatasync

    def fdatasync(fd: int) -> None:
        count[0] += 1
        if count[0] >= nth:
            fs.dead = True
            raise PowerCut("before fdatasync")
        real(fd)

    fs.fdatasync = fdatasync  # type: ignore[method-assign]
    vfs.fdatasync = fdatasync  # installed already: vfs holds the bound methods


def image(fs: CrashFS, dest: str, store_of: str, lose: tuple[int, int] | None = None,
          keep_new: bool = True) -> str:
    """The power-cut image of ``fs`` in ``dest``: every file as its last fsync left it,
    except the store ``store_of`` (a path below fs.root), which holds everything written
    (``keep_new``) but the sectors ``[lose[0], lose[1])`` (sector numbers), which hold what
    they held at the last fsync (zeros past its end)."""
    fs.materialize(dest, tear=False)
    store_of = os.path.realpath(store_of)
    rel = os.path.relpath(store_of, fs.root)
    fid = fs.current[os.path.dirname(store_of)][os.path.basename(store_of)]
    old, new = fs.durable.get(fid, b""), fs._current_bytes(fid)
    assert new is not None
    data = bytearray(new if keep_new else old)
    if lose is not None:
        for s in range(*lose):
            a, b = s * SECTOR, min((s + 1) * SECTOR, len(data))
            was = old[a:b]
            data[a:b] = was + bytes(b - a - len(was))
    with open(os.path.join(dest, rel), "wb") as f:
        f.write(data)
    return dest


# -- item 1: the reproduction under fsync="always" -------------------------------------
@pytest.mark.parametrize("reopened", [False, True], ids=["fresh", "reopened"])
def test_torn_unacknowledged_batch_with_its_first_sector_lost_is_cut_silently(tmp_path, no_real_fsync, reopened):
    """20 acknowledged records end 8 bytes before a sector boundary; a 12-record append_batch
    is written, the power goes before its fdatasync, and the sector holding the batch's
    first 8 bytes is lost while every later sector persisted (11 whole frames of it). Was:
    offset 20 kept as interior damage (CorruptRecordError), 21..31 readable after it, a
    recovery_report entry, verify() reporting it. Now the batch is cut, silently."""
    root = tmp_path / "root"
    root.mkdir()
    path = str(root / "log")
    opts = dict(fsync="always", segment_bytes=1 << 20)
    if reopened:  # the durable point at 10 (a clean close), else at 0 (a new log)
        with pylog.Log(path, **opts) as log:
            for i in range(10):
                log.append(val(i))
    fs = CrashFS(str(root))
    with fs:
        log = pylog.Log(path, **opts)
        for i in range(log.next_offset, 20):  # 32 + 20 * 126 = 2552 = 4 * 512 + 504
            assert log.append(val(i)) == i
        end = os.path.getsize(stores(path)[0])
        assert end % SECTOR == SECTOR - 8
        cut_before_fdatasync(fs)
        with pytest.raises(PowerCut):
            log.append_batch([val(20 + i, 100) for i in range(12)])
    simulate_crash(log)
    img = image(fs, str(tmp_path / "img"), stores(path)[0], lose=(end // SECTOR, end // SECTOR + 1))
    st = stores(os.path.join(img, "log"))[0]
    whole = [f for f in frames(st)]
    assert len(whole) == 20  # the oracle stops at the lost sector ...
    with open(st, "rb") as f:  # ... which 11 whole frames of the batch follow
        data = f.read()
    assert sum(data.count(val(20 + i, 100)) for i in range(1, 12)) == 11
    with pylog.Log(os.path.join(img, "log")) as log:
        assert log.next_offset == 20
        assert log.recovery_report == [] and log.verify() == []
        assert log.truncated_bytes == 12 * (36 + 100)
        assert [bytes(r.value) for r in log.scan()] == [val(i) for i in range(20)]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(21)
        assert log.append(b"next") == 20
    with pylog.Log(os.path.join(img, "log")) as log:
        assert log.verify() == [] and bytes(log.read(20).value) == b"next"


# -- item 2: "interval" and "never" keep a prefix ----------------------------------------------
@pytest.mark.parametrize("policy", ["interval", "never"])
def test_a_lost_sector_with_later_records_persisted_leaves_a_prefix(tmp_path, no_real_fsync, policy):
    """Per-record appends, flushed at 232 (interval: every 232 records); records 232..240 are
    written after the flush and the sector holding 232..235 is lost while the one holding
    236..240 persisted. Was: 236-240 readable without 232-235. Now the log ends at 232 (or
    at the first record of the lost sector), a prefix, and nothing is reported."""
    root = tmp_path / "root"
    root.mkdir()
    path = str(root / "log")
    opts = dict(fsync=policy, segment_bytes=1 << 20, write_buffer_bytes=0)
    if policy == "interval":
        opts.update(flush_messages=232, flush_ms=None)
    fs = CrashFS(str(root))
    with fs:
        log = pylog.Log(path, **opts)
        for i in range(232):
            log.append(val(i, 100))
        if policy == "never":
            log.flush()
        for i in range(232, 241):
            log.append(val(i, 100))
        log.write_out()
    simulate_crash(log)
    st = stores(path)[0]
    fr = {off: (pos, size) for pos, size, off in frames(st)}
    first_lost = fr[232][0] // SECTOR  # the sector where record 232 starts
    assert fr[236][0] // SECTOR > first_lost
    img = image(fs, str(tmp_path / "img"), st, lose=(first_lost, first_lost + 1))
    with open(stores(os.path.join(img, "log"))[0], "rb") as f:
        data = f.read()
    assert all(data.count(val(i, 100)) == 1 for i in range(236, 241))  # whole, after the hole
    with pylog.Log(os.path.join(img, "log")) as log:
        assert log.next_offset == 232  # every flushed record, nothing after the lost sector
        assert log.recovery_report == [] and log.verify() == []
        assert [bytes(r.value) for r in log.scan()] == [val(i, 100) for i in range(232)]


# -- item 4: damage below the durable point is kept --------------------------------------------
def test_damage_below_the_durable_point_is_kept_and_a_torn_write_after_it_cut(tmp_path, no_real_fsync):
    """A flipped bit in record 5, which a clean close made durable, and then a torn
    unacknowledged batch: the damage is kept and reported, 6..19 readable; the batch is cut."""
    root = tmp_path / "root"
    root.mkdir()
    path = str(root / "log")
    with pylog.Log(path, fsync="always") as log:
        for i in range(20):
            log.append(val(i))
    fs = CrashFS(str(root))
    with fs:
        log = pylog.Log(path, fsync="always")
        cut_before_fdatasync(fs)
        with pytest.raises(PowerCut):
            log.append_batch([val(20 + i, 100) for i in range(12)])
    simulate_crash(log)
    st = stores(path)[0]
    end = frames(st)[19][0] + frames(st)[19][1]
    img = image(fs, str(tmp_path / "img"), st, lose=(end // SECTOR, end // SECTOR + 1))
    ist = stores(os.path.join(img, "log"))[0]
    pos5, size5, _ = frames(ist)[5]
    with open(ist, "r+b") as f:
        f.seek(pos5 + size5 - 3)
        b = f.read(1)[0]
        f.seek(pos5 + size5 - 3)
        f.write(bytes([b ^ 4]))
    with pylog.Log(os.path.join(img, "log")) as log:
        assert log.next_offset == 20
        assert [e.offset for e in log.recovery_report] == [5]
        assert [e.offset for e in log.verify()] == [5]
        with pytest.raises(CorruptRecordError):
            log.read(5)
        assert [bytes(log.read(i).value) for i in range(6, 20)] == [val(i) for i in range(6, 20)]


# -- item 3: a batch is atomic, at every operation of it ---------------------------------------
def _batch_run(root: str, policy: str, cut: int | None, seed: int) -> tuple[CrashFS, int, bool]:
    """Acknowledged records, then one append_batch that rolls the segment once or twice,
    with the power cut before operation ``cut`` of the batch (None: no cut). Returns the
    CrashFS, how many operations came before the batch, and whether it returned."""
    path = os.path.join(root, "log")
    opts = dict(fsync=policy, segment_bytes=4096, write_buffer_bytes=1024, index_interval_bytes=256)
    with pylog.Log(path, **opts) as log:
        log.append_batch([val(i, 60) for i in range(30)])
    fs = CrashFS(root, seed=seed)
    done = False
    log = None
    start_ops = 0
    with fs:
        try:
            log = pylog.Log(path, **opts)
            first = log.next_offset
            start_ops = fs.ops
            if cut is not None:
                fs.cut_after = start_ops + cut
            assert log.append_batch([val(first + i, 150) for i in range(50)]) == first
            done = True
            if policy != "always":
                log.flush()
        except PowerCut:
            pass
    if log is not None:
        simulate_crash(log)
    return fs, start_ops, done


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_a_batch_across_rolls_survives_whole_or_not_at_all_at_every_cut(tmp_path, no_real_fsync, policy):
    """A power cut before an operation of a 50-record batch that fills more than one 4 KiB
    segment (write-outs, rolls, fsyncs; 17 of them in CI, every one with PYLOG_LONG=1),
    the image torn by CrashFS's sector model: the log holds 30 or 80 records, never a part
    of the batch, and reports nothing."""
    dry = tmp_path / "dry"
    dry.mkdir()
    fs, start, done = _batch_run(str(dry), policy, None, 0)
    total = fs.ops - start
    first, n = 30, 50
    assert done and total > 10
    stats = {"none": 0, "whole": 0}
    cuts = list(range(1, total + 1))
    if not LONG:  # CI: a sample of the cut points, one tearing each (PYLOG_LONG=1: all, 10)
        cuts = sorted(random.Random(policy).sample(cuts, min(len(cuts), 15)) + [total])
    cuts.append(total + 1)  # no cut: the batch returned (and was flushed)
    for cut in cuts:
        for t in range(scaled(1, 10)):
            root = tmp_path / f"r{cut}-{t}"
            root.mkdir()
            fs, _start, done = _batch_run(str(root), policy, cut, t)
            img = fs.materialize(str(tmp_path / f"i{cut}-{t}"))
            with pylog.Log(os.path.join(img, "log")) as log:
                nxt = log.next_offset
                assert nxt in (first, first + n), (cut, t, nxt)
                assert log.recovery_report == [] and log.verify() == [], (cut, t)
                want = [val(i, 60) for i in range(first)] + [val(first + i, 150) for i in range(nxt - first)]
                assert [bytes(r.value) for r in log.scan()] == want
                stats["whole" if nxt > first else "none"] += 1
            shutil.rmtree(root)
            shutil.rmtree(img)
    assert stats["none"] and stats["whole"], stats


def test_a_batch_split_by_a_roll_is_cut_from_the_sealed_segment_too(tmp_path, no_real_fsync):
    """The power goes after the roll that split a batch sealed its first records, before
    any of the new segment's frames were written: the opening writer cuts the sealed part
    (it was never acknowledged), silently, and counts its bytes."""
    dry = tmp_path / "dry"
    dry.mkdir()
    fs, start, _done = _batch_run(str(dry), "never", None, 0)
    first = 30
    # the first roll that split the batch: its durable-point write, the seal, the next
    # segment's files and the directory fsync that makes them durable; the cut comes right
    # after that (op number k is fs.log[k - 1])
    j = next(i for i, (op, p) in enumerate(fs.log)
             if i >= start and op == "fdatasync" and p.endswith(fmt.DURABLE_FILE))
    j = next(i for i, (op, p) in enumerate(fs.log) if i > j and op == "fsync" and p.endswith("log"))
    root = tmp_path / "r"
    root.mkdir()
    fs, _start, done = _batch_run(str(root), "never", j + 2 - start, 0)
    assert not done
    img = fs.materialize(str(tmp_path / "img"), tear=False)
    p = os.path.join(img, "log")
    assert checkpoint.read_durable_point(p)[2] == first
    with pylog.Log(p) as log:
        assert log.next_offset == first and log.truncated_bytes > 0
        assert log.recovery_report == [] and log.verify() == []
        assert [bytes(r.value) for r in log.scan()] == [val(i, 60) for i in range(first)]


# -- issue 25 item 2, log layer: a failed append_batch leaves none of its records --------------
WRITER = r"""
import json, sys, pylog
from pylog.errors import OffsetOutOfRangeError
path = sys.argv[1]
log = pylog.Log(path, fsync="never", write_buffer_bytes=4096, segment_bytes=int(sys.argv[2]))
first = log.next_offset
out = {"first": first}
try:
    log.append_batch([b"%05d" % i * 40 for i in range(200)])
except OSError as e:
    out["error"] = e.errno
else:  # the failure comes later (or not at all): not this test's case
    print(json.dumps({"returned": True}))
    sys.exit(0)
out["next_offset"] = log.next_offset
out["stable"] = log.stable_offset
out["scan"] = [r.offset for r in log.scan()]
out["batch"] = len(log.read_batch(0, max_bytes=1 << 30))
try:
    log.read(first)
    out["read_first"] = True
except OffsetOutOfRangeError:
    out["read_first"] = False
try:
    log.close()
except OSError:
    pass
print(json.dumps(out))
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize("segment_bytes", [1 << 20, 12_000], ids=["one-segment", "across-rolls"])
def test_a_batch_whose_write_fails_leaves_none_of_its_records(tmp_path, segment_bytes):
    """ENOSPC on a write of a 200-record batch that goes out in several writes (strace
    injects it into the 1st, 2nd, ... write, one run each): the writing process's
    next_offset, reads, scans and fetches stop before the batch, and so does the log after
    a reopen. Was: the records of the writes before the failure stayed readable."""
    path = str(tmp_path / "log")
    with pylog.Log(path) as log:
        log.append_batch([b"before-%d" % i for i in range(10)])
    seen = set()
    for when in range(1, 5):
        shutil.rmtree(path + ".run", ignore_errors=True)
        shutil.copytree(path, path + ".run")
        p = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64,pwritev,pwritev2",
                            "-e", f"inject=pwrite64,pwritev,pwritev2:error=ENOSPC:when={when}",
                            sys.executable, "-c", WRITER, path + ".run", str(segment_bytes)],
                           capture_output=True, text=True, timeout=120, env=py_env())
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout.strip().splitlines()[-1])
        seen.add("returned" if out.get("returned") else "failed")
        if out.get("returned"):
            continue
        assert out["first"] == 10
        assert out["next_offset"] == 10 and out["stable"] == 10, out
        assert out["scan"] == list(range(10)) and out["batch"] == 10 and out["read_first"] is False, out
        with pylog.Log(path + ".run") as log:
            assert log.next_offset == 10, when
            assert log.recovery_report == [] and log.verify() == []
            assert [bytes(r.value) for r in log.scan()] == [b"before-%d" % i for i in range(10)]
    assert "failed" in seen, seen


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_batch_whose_fdatasync_fails_is_out_of_view(tmp_path):
    """fsync="always", EIO from the batch's fdatasync (strace): the batch was written but
    never acknowledged; the fenced writer's next_offset and reads stop before it (was: all
    of it readable), and after a reopen it is there whole or not at all."""
    path = str(tmp_path / "log")
    with pylog.Log(path) as log:
        log.append_batch([b"before-%d" % i for i in range(10)])
    code = WRITER.replace('fsync="never"', 'fsync="always"')
    p = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=fdatasync",
                        "-e", "inject=fdatasync:error=EIO:when=1", sys.executable, "-c", code, path, str(1 << 20)],
                       capture_output=True, text=True, timeout=120, env=py_env())
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.get("error") == 5, out
    assert out["next_offset"] == 10 and out["scan"] == list(range(10)) and out["read_first"] is False, out
    with pylog.Log(path) as log:
        assert log.next_offset in (10, 210)
        assert log.recovery_report == [] and log.verify() == []


def test_old_format_logs_open_and_each_record_is_its_own_unit(tmp_path):
    """A log written before write units (no frame has ATTR_UNIT_CONTINUES) opens as before:
    the test vectors decode, and a batch written now marks every frame but its last."""
    path = str(tmp_path / "log")
    with pylog.Log(path) as log:
        log.append_batch([b"a", b"b", b"c"])
        log.append(b"d")
        log.append_batch([b"e"])
    with open(stores(path)[0], "rb") as f:
        data = f.read()
    attrs = [int.from_bytes(data[p + 24 : p + 28], "little") for p, _s, _o in frames(stores(path)[0])]
    cont = fmt.ATTR_UNIT_CONTINUES
    assert [a & cont for a in attrs] == [cont, cont, 0, 0, 0]
    with pylog.Log(path) as log:
        assert [bytes(r.value) for r in log.scan()] == [b"a", b"b", b"c", b"d", b"e"]
        assert log.verify() == []


def test_random_tears_of_batches_under_every_policy(tmp_path, no_real_fsync):
    """Batches and single appends under each policy, the power cut at a random operation,
    the image torn at random (CrashFS's sector model): a prefix ending with a whole batch,
    every acknowledged record, nothing reported."""
    rng = random.Random(30)
    for trial in range(scaled(40, 400)):
        policy = rng.choice(["always", "interval", "never"])
        root = tmp_path / f"t{trial}"
        root.mkdir()
        path = str(root / "log")
        opts = dict(fsync=policy, segment_bytes=rng.choice([4096, 1 << 20]), write_buffer_bytes=rng.choice([0, 700]))
        if policy == "interval":
            opts.update(flush_messages=rng.randint(1, 20), flush_ms=None)
        fs = CrashFS(str(root), cut_after=rng.randint(5, 120), seed=trial)
        ends = {0}
        acked = 0
        log = None
        with fs:
            try:
                log = pylog.Log(path, **opts)
                for _ in range(30):
                    k = rng.randint(1, 15) if rng.random() < 0.5 else 0
                    ends.add(log.next_offset + max(k, 1))  # in flight: it may survive, whole
                    if k:
                        log.append_batch([val(log.next_offset + i, rng.randint(10, 300)) for i in range(k)])
                    else:
                        log.append(val(log.next_offset, rng.randint(10, 300)))
                    if policy == "always":
                        acked = max(ends)
                    elif rng.random() < 0.2:
                        log.flush()
                        acked = max(ends)
            except PowerCut:
                pass
        if log is not None:
            simulate_crash(log)
        img = fs.materialize(str(tmp_path / f"i{trial}"))
        if not os.path.exists(os.path.join(img, "log")):
            continue
        with pylog.Log(os.path.join(img, "log")) as log:
            n = log.next_offset
            assert n in ends and n >= acked, (trial, policy, n, acked, sorted(ends))
            assert log.recovery_report == [] and log.verify() == [], trial
            for r in log.scan():
                assert bytes(r.value)[:6] == b"%06d" % r.offset


def test_both_backends_mark_write_units_alike():
    """The C core and the pure-Python backend frame a batch with the same bytes, bit 3 on
    every frame but the unit's last, also when the batch is framed in two calls (a unit
    split by a full write buffer), and both read such frames back."""
    from pylog import _native, _pure

    out = []
    for impl in (_native, _pure):
        app = impl.Appender(0, next_offset=0, position=fmt.FILE_HEADER_SIZE, max_position=1 << 20,
                            max_timestamp=None, index_interval=0, bytes_since_index=0, index_cap=64,
                            buffer_bytes=1 << 16)
        app.unit_end = 5
        vals = [b"v%d" % i for i in range(5)]
        lens = np.array([len(v) for v in vals], dtype=np.uint32)
        joined = b"".join(vals)
        assert app.frame_batch(joined[:4], lens[:2], None, None, None, None, None, 7) == (impl.OK, 2)
        assert app.frame_batch(joined[4:], lens[2:], None, None, None, None, None, 7) == (impl.OK, 3)
        app.unit_end = 0
        assert app.frame(b"single", None, None, 3, 7) == 5
        out.append(bytes(app.pending()))
    assert out[0] == out[1]
    data = out[0]
    for impl in (_native, _pure):
        rc, fr, _end = impl.scan(impl.Buffer(data), len(data), 0, 0, 10, 1 << 30, False)
        assert rc == impl.OK and len(fr) == 6
        assert [int(a) & fmt.ATTR_UNIT_CONTINUES for a in fr["attributes"]] == [8, 8, 8, 8, 0, 0]


def test_a_reader_sees_no_part_of_a_batch_being_written(tmp_path, monkeypatch):
    """A batch goes out in several writes (keyed, 4 KiB write buffer); while the writer is
    held after its first write, a read-only reader (another Log, as another process has)
    sees none of it, then all of it once the batch is written."""
    import threading

    path = str(tmp_path / "log")
    w = pylog.Log(path, write_buffer_bytes=4096)
    w.append_batch([b"before"] * 5)
    w.write_out()
    r = pylog.Log(path, readonly=True)
    held, go = threading.Event(), threading.Event()
    real = vfs.pwrite
    calls = [0]

    def pwrite(fd: int, data: object, pos: int) -> int:
        n = real(fd, data, pos)
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).endswith(".log"):
            calls[0] += 1
            if calls[0] == 1:
                held.set()
                assert go.wait(30)
        return n

    monkeypatch.setattr(vfs, "pwrite", pwrite)
    t = threading.Thread(target=lambda: (w.append_batch([b"%04d" % i * 50 for i in range(100)],
                                                        keys=[b"k"] * 100), w.write_out()))
    t.start()
    try:
        assert held.wait(30)
        size = os.path.getsize(stores(path)[0])
        assert size > 2000  # the first write of the batch reached the file ...
        r.refresh()
        assert r.next_offset == 5  # ... and the reader sees none of it
        with pytest.raises(OffsetOutOfRangeError):
            r.read(5)
    finally:
        go.set()
        t.join(30)
    r.refresh()
    assert r.next_offset == 105 and bytes(r.read(104).value) == b"0099" * 50
    r.close()
    w.close()


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_a_reader_sees_no_part_of_a_batch_split_by_a_roll(tmp_path, monkeypatch, policy):
    """A batch framed across a roll: when the roll has sealed its first records and made the
    next segment, the rest not yet written, a read-only reader (a fresh open, and one that
    refreshes) shows none of the batch; a crash then would cut all of it. Once the batch is
    written it shows whole. (Found by test_seam_topics' produce killed at random: a
    ``pylog consume`` showed a split batch's first records, which the next open cut.)"""
    path = str(tmp_path / "log")
    log = pylog.Log(path, segment_bytes=4096, fsync=policy)
    log.append_batch([b"a" * 100] * 5)
    follower = pylog.Log(path, readonly=True)
    seen: list[tuple[list[int], list[int]]] = []
    in_batch = [False]
    real = checkpoint.write_recovery_point

    def at_roll(dirpath, offset):  # type: ignore[no-untyped-def]
        real(dirpath, offset)
        if in_batch[0] and not seen:  # the first roll inside the batch: the next segment is there, empty
            with pylog.Log(path, readonly=True) as fresh:
                opened = [r.offset for r in fresh.scan()]
            follower.refresh()
            seen.append((opened, [r.offset for r in follower.scan()]))

    rolls: list[list[int]] = []
    real_mark = checkpoint.write_durable_point

    def at_mark(dirpath, base, durable, *, open_unit=None, sync=False):  # type: ignore[no-untyped-def]
        real_mark(dirpath, base, durable, open_unit=open_unit, sync=sync)
        if in_batch[0] and open_unit is not None:
            # a roll splitting the batch has begun (the next segment is not made yet); at the
            # second one a whole segment of the batch is sealed before it
            with pylog.Log(path, readonly=True) as fresh:
                rolls.append([r.offset for r in fresh.scan()])
            follower.refresh()  # and a reader that follows, its tail still the batch's first segment
            rolls.append([r.offset for r in follower.scan()])

    monkeypatch.setattr(checkpoint, "write_recovery_point", at_roll)
    monkeypatch.setattr(checkpoint, "write_durable_point", at_mark)
    in_batch[0] = True
    first = log.append_batch([b"b" * 100] * 100)
    in_batch[0] = False
    assert seen, "the batch did not cross a roll"
    assert len(rolls) >= 2, rolls
    if policy == "always":  # the first 5 are written (and synced) before the batch begins
        assert seen[0] == (list(range(5)), list(range(5)))
        assert all(r == list(range(5)) for r in rolls), rolls
    else:  # they may still be in the writer's buffer; none of the batch shows either way
        assert all(r in ([], list(range(5))) for r in [*seen[0], *rolls]), (seen, rolls)
    log.flush()  # (under interval and never the batch may still be in the writer's buffer)
    follower.refresh()
    assert [r.offset for r in follower.scan()] == list(range(first + 100))
    with pylog.Log(path, readonly=True) as fresh:
        assert [r.offset for r in fresh.scan()] == list(range(first + 100))
    follower.close()
    log.close()



def _killed_with_a_split_batch(path: str, policy: str) -> None:
    """A writer process killed after a roll sealed the first records of a batch, the rest
    still in its write buffer: the batch returned (under "interval" or "never", not
    flushed), offsets 0..4 flushed before it; segment 0 holds 0..28, segment 29 is empty."""
    script = f"""
import os, signal, pylog
log = pylog.Log({path!r}, segment_bytes=4096, fsync={policy!r}, flush_messages=10**9, flush_ms=10**9)
if log.next_offset == 0:
    log.append_batch([b"a" * 100] * 5)
    log.flush()
first = log.append_batch([b"b" * 100] * 34)  # 5 + 34 frames of 128 B: one roll, 5 records after it
assert len(log.segments()) == 2, log.segments()
print(first, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    p = subprocess.run([sys.executable, "-c", script], env=py_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr
    assert int(p.stdout.strip()) == 5
    assert len(stores(path)) == 2 and os.path.getsize(stores(path)[1]) == fmt.FILE_HEADER_SIZE
    assert len(frames(stores(path)[0])) > 5  # the batch's first records are in the sealed segment


@pytest.mark.parametrize("policy", ["interval", "never"])
def test_readers_see_no_part_of_a_split_batch_while_recovery_cuts_it(tmp_path, monkeypatch, policy):
    """The next writer's open cuts the whole batch a killed writer's roll split: a truncate
    into the sealed segment. A read-only reader that refreshes at every step of that open,
    and one opened fresh at each, show none of the batch: until the truncate the split mark
    caps them, during it the truncate point does. (Found by the store model test: a
    consumer in another process read a killed producer's split batch during the next
    writer's open, whose records then went to other offsets.)"""
    from pylog import fileutil
    from pylog.retention import LogRetention

    path = str(tmp_path / "log")
    _killed_with_a_split_batch(path, policy)
    follower = pylog.Log(path, readonly=True)
    assert [r.offset for r in follower.scan()] == list(range(5))
    seen: list[tuple[str, list[int], list[int]]] = []

    def look(step: str) -> None:
        follower.refresh()
        with pylog.Log(path, readonly=True) as fresh:
            seen.append((step, [r.offset for r in follower.scan()], [r.offset for r in fresh.scan()]))

    def after(mod, name):  # type: ignore[no-untyped-def]
        real = getattr(mod, name)

        def hooked(*a, **k):  # type: ignore[no-untyped-def]
            out = real(*a, **k)
            look(name)
            return out
        monkeypatch.setattr(mod, name, hooked)

    for name in ("write_truncate_point", "write_durable_point", "write_recovery_point", "clear_truncate_point"):
        after(checkpoint, name)
    after(fileutil, "shrink_file")
    after(LogRetention, "_delete_files")
    w = pylog.Log(path, fsync=policy)
    monkeypatch.undo()
    steps = [s for s, _, _ in seen]
    assert {"write_truncate_point", "_delete_files", "shrink_file", "clear_truncate_point"} <= set(steps), steps
    bad = [(s, a[-3:], b[-3:]) for s, a, b in seen if a != list(range(5)) or b != list(range(5))]
    assert not bad, bad
    assert w.next_offset == 5 and w.recovery_report == [] and w.truncated_bytes > 0
    w.append_batch([b"c" * 100] * 3)
    w.flush()
    follower.refresh()
    assert [bytes(r.value)[:1] for r in follower.scan()] == [b"a"] * 5 + [b"c"] * 3
    follower.close()
    w.close()


def test_a_recovery_cut_whole_between_a_readers_walk_and_its_look_is_seen(tmp_path, monkeypatch):
    """The same cut, done whole while a reader is between its walk of the files and its look
    at what caps reads (pylog.loader.refresh_hook): the reader's walk holds the sealed
    segment as it was, and the marks it then reads no longer name the batch. It sees that
    the partition's truncate state changed across its look and looks again: the batch
    never shows."""
    from pylog import loader

    path = str(tmp_path / "log")
    with pylog.Log(path, segment_bytes=4096) as log:
        log.append_batch([b"a" * 100] * 5)
    follower = pylog.Log(path, readonly=True)  # a reader that follows, and one opened fresh
    assert [r.offset for r in follower.scan()] == list(range(5))
    _killed_with_a_split_batch(path, "never")
    for reader in ("follower", "fresh"):
        opened: list[pylog.Log] = []

        def hook(log, opened=opened):  # type: ignore[no-untyped-def]
            if not opened:
                opened.append(pylog.Log(path))  # recovery: the whole truncate, here

        monkeypatch.setattr(loader, "refresh_hook", hook)
        if reader == "follower":
            follower.refresh()
            r = follower
        else:
            _killed_with_a_split_batch(path, "never")
            r = pylog.Log(path, readonly=True)
        monkeypatch.undo()
        assert opened and opened[0].next_offset == 5 and opened[0].truncated_bytes > 0, reader
        # as the look left it (a read refreshes again when it finds records gone)
        assert (r.next_offset, r.stable_offset) == (5, 5), reader
        assert [x.offset for x in r.scan()] == list(range(5)), reader
        opened[0].close()
        r.close()


def test_a_flush_that_ends_a_split_batch_between_a_readers_walk_and_its_look(tmp_path, monkeypatch):
    """A roll split a batch (the rest in the writer's buffer); a reader walks (its new last
    segment empty), then the writer's flush writes the rest and drops the split mark before
    the reader looks at its caps. The reader sees the mark changed and looks again: it
    shows the batch whole, never its first part alone. (A review found it showed the
    first part.)"""
    from pylog import loader

    path = str(tmp_path / "log")
    w = pylog.Log(path, segment_bytes=4096, fsync="never", flush_ms=None)
    w.append_batch([b"a" * 100] * 10)
    w.flush()
    r = pylog.Log(path, readonly=True)
    first = w.append_batch([b"b" * 100] * 40)
    assert len(w.segments()) == 2 and checkpoint.read_durable_point(path)[2] == first
    with pylog.Log(path, readonly=True) as fresh:
        assert fresh.stable_offset == first  # split: none of it yet
    flushed: list[int] = []

    def hook(log):  # type: ignore[no-untyped-def]
        if not flushed:
            w.flush()  # the rest written, the mark's open unit dropped
            flushed.append(1)

    monkeypatch.setattr(loader, "refresh_hook", hook)
    r.refresh()
    monkeypatch.undo()
    assert flushed and r.stable_offset == first + 40, r.stable_offset
    assert [bytes(x.value)[:1] for x in r.scan(first)] == [b"b"] * 40
    r.close()
    w.close()


def test_a_cut_that_puts_the_recovery_point_back_is_seen_by_a_reader_in_its_look(tmp_path, monkeypatch):
    """Inside one refresh of a reader: a writer process rolls in the middle of a batch and
    is killed (the rest lost), then the next writer's open cuts the batch, which puts the
    recovery point back where the reader first read it. The recovery point counts
    truncates, so the reader's before and after differ and it looks again: it never shows
    the cut records. (A review found the reader kept them.)"""
    from pylog import loader

    path = str(tmp_path / "log")
    p = subprocess.run([sys.executable, "-c", f"""
import os, pylog
log = pylog.Log({path!r}, segment_bytes=4096, fsync="never")
log.append_batch([b"a" * 100] * 5)
log.flush()
os._exit(0)  # not closed: the recovery point stays at the segment's base
"""], env=py_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = pylog.Log(path, readonly=True)
    assert r.read(2).offset == 2  # the first segment mapped
    real_walk = r._walk
    walks: list[int] = []

    def walk():  # type: ignore[no-untyped-def]
        if not walks:
            _killed_with_a_split_batch(path, "never")
        walks.append(1)
        real_walk()

    monkeypatch.setattr(r, "_walk", walk)
    opened: list[pylog.Log] = []

    def hook(log):  # type: ignore[no-untyped-def]
        if not opened:
            opened.append(pylog.Log(path))  # recovery: the whole cut, here

    monkeypatch.setattr(loader, "refresh_hook", hook)
    rp_before = checkpoint.read_recovery_point(path)
    r.refresh()
    monkeypatch.undo()
    assert opened and opened[0].next_offset == 5 and checkpoint.read_recovery_point(path) == rp_before
    assert len(walks) >= 2  # it looked again
    assert (r.next_offset, r.stable_offset) == (5, 5)
    assert [bytes(x.value)[:1] for x in r.scan()] == [b"a"] * 5
    opened[0].close()
    r.close()


def test_a_recovery_cut_that_fails_before_changing_a_file_still_cuts_at_the_next_open(tmp_path, monkeypatch):
    """The open that cuts a split batch fails (EIO) on the truncate's durable-point write,
    before any segment file changed. The truncate goes back (its point removed), so the mark
    naming the split unit must go back too: readers still stop before the batch, and the
    next open cuts it. (A review found the batch's first records kept for good.)"""
    import errno

    from pylog import retention

    path = str(tmp_path / "log")
    _killed_with_a_split_batch(path, "never")
    real = checkpoint.write_durable_point
    failed: list[int] = []

    def write_durable_point(*a, **k):  # type: ignore[no-untyped-def]
        if os.path.exists(os.path.join(path, fmt.TRUNCATE_FILE)) and not failed:
            real(*a, **k)
            failed.append(1)
            raise OSError(errno.EIO, "injected")
        return real(*a, **k)

    monkeypatch.setattr(retention.checkpoint, "write_durable_point", write_durable_point)
    w = pylog.Log(path)
    monkeypatch.undo()
    assert failed and any("could not cut" in a for a in w.recovery_actions), w.recovery_actions
    assert not os.path.exists(os.path.join(path, fmt.TRUNCATE_FILE))
    assert checkpoint.read_durable_point(path)[2] == 5  # the split unit named again
    with pylog.Log(path, readonly=True) as r:
        assert r.stable_offset == 5
    w.close()
    with pylog.Log(path) as w2:
        assert w2.next_offset == 5 and [bytes(x.value)[:1] for x in w2.scan()] == [b"a"] * 5
