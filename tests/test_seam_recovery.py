"""Recovery cuts only a torn tail (issue 14, cases 1-3; DESIGN.md section 5).

* Interior damage in the active segment is kept at an unclean or untrusted open: every
  intact record stays readable, the damaged ones raise ``CorruptRecordError`` naming their own
  offset, ``recovery_report`` / ``verify()`` / ``pylog verify`` report them, appends continue.
  Only bad bytes with no whole, valid frame of a following offset after them are cut.
* What recovery cut (below the recovery point) or found stays reported, persisted in the
  partition directory, until ``clear_recovery_report()`` / ``pylog recover --clear-report``.
* Cutting at damage is the operator's ``truncate_at_damage()`` / ``pylog recover
  --truncate-at-damage``, which saves what it cuts first.
* ``pylog recover`` never says "ok" about damage ``pylog verify`` reports (case 2).
* A read names the damaged record's offset, and reads after it succeed (case 3).

Real files and real processes throughout; every test runs under both backends (the suite
runs again with PYLOG_BACKEND=pure), and the C and pure frame searches are cross-checked.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import py_env, run_py, scaled
from conftest import store_files as stores
from conftest import store_frames as frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog import _native, _pure, checkpoint
from pylog import format as fmt
from pylog.errors import CorruptRecordError

N = 5000


def value(i: int) -> bytes:
    return b"value-%05d" % i


def build(path: str, n: int = N, **kw) -> None:
    with pylog.Log(path, **kw) as log:
        log.append_batch([value(i) for i in range(n)], timestamps=[10**9 + i for i in range(n)])


def poke(store: str, pos: int, data: bytes | None = None, xor: int = 0x20) -> None:
    """Overwrite ``store`` at ``pos`` with ``data`` (default: the byte there xor ``xor``),
    through the file system, so the store's mtime changes and a clean marker is not trusted."""
    time.sleep(0.01)
    with open(store, "r+b") as f:
        if data is None:
            f.seek(pos)
            data = bytes([f.read(1)[0] ^ xor])
        f.seek(pos)
        f.write(data)


def cli(*args: str, root: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pylog.cli"] + (["--root", root] if root else []) + list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=py_env())


def check_reads(log: pylog.Log, n: int, bad: set[int]) -> None:
    """Every offset below ``n`` reads back its value, except those in ``bad``, which raise a
    CorruptRecordError naming themselves."""
    for o in range(n):
        if o in bad:
            with pytest.raises(CorruptRecordError) as ei:
                log.read(o)
            assert ei.value.offset == o, (o, ei.value)
            assert ei.value.path.endswith(fmt.STORE_SUFFIX)
        else:
            assert bytes(log.read(o).value) == value(o), o


def middle_frame(path: str) -> tuple[str, tuple[int, int, int]]:
    st_ = stores(path)[-1]
    fr = frames(st_)
    return st_, fr[len(fr) // 2]


# -- case 1: the repro ---------------------------------------------------------------
def test_flip_in_the_middle_of_the_only_store_keeps_every_intact_record(tmp_path):
    path = str(tmp_path / "p")
    build(path)
    st_ = stores(path)[0]
    size = os.path.getsize(st_)
    victim = next(f for f in frames(st_) if f[0] <= size // 2 < f[0] + f[1])
    poke(st_, size // 2)
    with pylog.Log(path) as log:
        assert log.next_offset == N and log.truncated_bytes == 0
        assert [(e.offset, e.position) for e in log.recovery_report] == [(victim[2], victim[0])]
        assert [(e.offset, e.position) for e in log.verify()] == [(victim[2], victim[0])]
        check_reads(log, N, {victim[2]})
        assert log.append(b"after") == N
        assert bytes(log.read(N).value) == b"after"
    # reopened cleanly: the damage is still there and still reported
    with pylog.Log(path) as log:
        assert log.next_offset == N + 1
        assert [e.offset for e in log.verify()] == [victim[2]]
        check_reads(log, N, {victim[2]})


@pytest.mark.parametrize("field", ["length", "crc", "offset", "attributes", "payload"])
def test_any_field_of_an_interior_frame(tmp_path, field):
    """Where the length field is intact the walk steps over the frame; where it is not, it
    finds the next whole CRC-valid frame of a following offset."""
    path = str(tmp_path / "p")
    build(path, 600, index_interval_bytes=1 << 20)  # one index entry: reads walk the frames
    st_, (pos, size, off) = middle_frame(path)
    at = {"length": pos + 1, "crc": pos + 5, "offset": pos + 9, "attributes": pos + 24,
          "payload": pos + size - 1}[field]
    poke(st_, at, xor=0x40)
    with pylog.Log(path) as log:
        assert log.next_offset == 600 and log.truncated_bytes == 0
        assert [(e.offset, e.position) for e in log.verify()] == [(off, pos)]
        check_reads(log, 600, {off})


def test_damage_across_several_frames_names_each_lost_offset(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    fr = frames(st_)
    poke(st_, pos + 3, bytes(4 * size))  # zeros from inside one frame over the next four
    lost = {f[2] for f in fr if f[0] < pos + 3 + 4 * size and f[0] + f[1] > pos + 3}
    assert len(lost) == 5
    with pylog.Log(path) as log:
        assert log.next_offset == 600
        (e,) = log.verify()
        assert (e.offset, e.position) == (off, pos)
        assert f"offsets {min(lost)}..{max(lost)} unreadable" in e.reason
        check_reads(log, 600, lost)


def test_two_damaged_regions_are_both_kept_and_reported(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_ = stores(path)[0]
    fr = frames(st_)
    a, b = fr[100], fr[400]
    poke(st_, a[0] + 1)
    poke(st_, b[0] + a[1] - 1)
    with pylog.Log(path) as log:
        assert [e.offset for e in log.verify()] == [100, 400]
        check_reads(log, 600, {100, 400})


def test_a_torn_tail_is_still_cut_and_not_reported(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    # a writer process killed after an append: no clean marker, the recovery point at the base
    p = run_py("""
        import os, signal, sys, pylog
        log = pylog.Log(sys.argv[1])
        log.append(b"x")
        log.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """, path)
    assert p.returncode == -9, p.stderr
    rp = checkpoint.read_recovery_point(path)
    assert rp is not None and rp <= 600
    with open(st_, "ab") as f:
        f.write(b"\x55" * 50)  # a torn frame after the last whole one
    with pylog.Log(path) as log:
        assert log.next_offset == 601 and log.truncated_bytes == 50
        assert log.recovery_report == [] and log.verify() == []
    assert os.path.exists(st_ + fmt.BROKEN_SUFFIX)


def test_damage_in_the_last_frame_of_a_closed_log_is_cut_but_reported(tmp_path):
    """The last frame has nothing valid after it, so the torn-tail rule cuts it; but the
    recovery point says it was durable: the cut is reported until cleared."""
    path = str(tmp_path / "p")
    build(path, 600)
    st_ = stores(path)[0]
    last = frames(st_)[-1]
    poke(st_, last[0] + last[1] - 1)
    with pylog.Log(path) as log:
        assert log.next_offset == 599 and log.truncated_bytes == last[1]
        (e,) = log.recovery_report
        assert e.offset == 599 and "599..599" in e.reason
        assert [x.offset for x in log.verify()] == [599]
    with pylog.Log(path) as log:  # a clean reopen: still reported
        assert [x.offset for x in log.verify()] == [599]
        assert log.clear_recovery_report() == 1
        assert log.verify() == []
    with pylog.Log(path) as log:
        assert log.verify() == []


def test_the_report_file_format(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    poke(st_, pos + size - 1)
    pylog.Log(path).close()
    with open(os.path.join(path, fmt.REPORT_FILE)) as f:
        doc = json.load(f)
    assert doc["version"] == 1
    (e,) = doc["entries"]
    assert (e["segment"], e["position"], e["offset"], e["action"]) == (os.path.basename(st_), pos, off, "kept")
    assert isinstance(e["time_ms"], int) and "CRC32C" in e["reason"]


def test_an_unreadable_report_is_reported_not_ignored(tmp_path):
    path = str(tmp_path / "p")
    build(path, 10)
    with open(os.path.join(path, fmt.REPORT_FILE), "w") as f:
        f.write("{not json")
    with pylog.Log(path) as log:
        (e,) = log.verify()
        assert "recovery report itself" in e.reason
        log.clear_recovery_report()
        assert log.verify() == []


def test_clearing_the_report_keeps_reporting_damage_still_there(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    poke(st_, pos + size - 1)
    with pylog.Log(path) as log:
        assert log.clear_recovery_report() == 1
        assert [e.offset for e in log.verify()] == [off]  # the bytes are still bad
    with pylog.Log(path, readonly=True) as r:
        with pytest.raises(pylog.ReadOnlyLogError):
            r.clear_recovery_report()


# -- the operator's cut ----------------------------------------------------------------------
def test_truncate_at_damage_saves_what_it_cuts(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    poke(st_, pos + size - 1)
    with open(st_, "rb") as f:
        whole = f.read()
    with pylog.Log(path) as log:
        log.append_batch([b"later-%d" % i for i in range(5)])  # in the segment after the sealed one
        log.flush()
        later = stores(path)[-1]
        with open(later, "rb") as f:
            later_bytes = f.read()
        got = log.truncate_at_damage()
        assert got is not None
        cut_off, saved = got
        assert cut_off == off and log.next_offset == off
        assert os.path.basename(saved) == f"cut-at-{off}"
        assert sorted(os.listdir(saved)) == sorted([f"{os.path.basename(st_)}.from-{pos}", os.path.basename(later)])
        with open(os.path.join(saved, f"{os.path.basename(st_)}.from-{pos}"), "rb") as f:
            assert f.read() == whole[pos:]
        with open(os.path.join(saved, os.path.basename(later)), "rb") as f:
            assert f.read() == later_bytes
        check_reads(log, off, set())
        assert log.append(b"new") == off
        assert log.truncate_at_damage() is None  # nothing damaged is left
    with pylog.Log(path) as log:
        assert log.next_offset == off + 1 and bytes(log.read(off).value) == b"new"
        # what recovery found is still in the report until cleared
        assert [e.offset for e in log.verify()] == [off]
        log.clear_recovery_report()
        assert log.verify() == []


# -- case 2 and the CLI ------------------------------------------------------------------------
def _topic_with_damage(tmp_path, *, sealed: bool) -> tuple[str, str, int]:
    root = str(tmp_path / "data")
    from pylog.topics import LogStore

    s = LogStore(root)
    t = s.create_topic("t", partitions=1, **({"segment_bytes": 8192} if sealed else {}))
    t.append_batch([value(i) for i in range(600)], partition=0)
    s.close()
    part = os.path.join(root, "t", "partition-0")
    st_ = stores(part)[0]
    fr = frames(st_)
    pos, size, off = fr[len(fr) // 2]
    if sealed:  # bit rot under a trusted clean marker: the store's mtime kept
        before = os.stat(st_)
        poke(st_, pos + size - 1)
        os.utime(st_, ns=(before.st_atime_ns, before.st_mtime_ns))
    else:
        poke(st_, pos + size - 1)
    return root, st_, off


def test_pylog_recover_does_not_say_ok_about_a_corrupt_sealed_segment(tmp_path):
    root, st_, off = _topic_with_damage(tmp_path, sealed=True)
    assert len(stores(os.path.dirname(st_))) > 1
    v = cli("verify", root=root)
    assert v.returncode == 1 and f"offset {off} " in v.stdout
    r = cli("recover", root=root)
    assert r.returncode == 1, r
    assert "ok" not in r.stdout.split(")", 1)[1] and f"offset {off} " in r.stdout
    assert r.stderr.startswith("pylog: error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_cli_verify_recover_truncate_and_clear(tmp_path):
    root, st_, off = _topic_with_damage(tmp_path, sealed=False)
    v = cli("verify", root=root)  # read-only, before any writer recovered the damage
    assert v.returncode == 1, v
    assert f"offset {off} " in v.stdout and "Traceback" not in v.stderr
    r = cli("recover", root=root)
    assert r.returncode == 1 and f"offset {off} " in r.stdout
    assert "[0, 600)" in r.stdout
    v = cli("verify", root=root)
    assert v.returncode == 1 and len(v.stdout.splitlines()) == 1 and f"offset {off} " in v.stdout
    t = cli("recover", "--truncate-at-damage", root=root)
    part = os.path.dirname(st_)
    saved = os.path.join(part, f"cut-at-{off}")
    assert f"truncated at damaged offset {off}, what was cut saved to {saved}" in t.stdout
    assert os.path.isdir(saved) and f"[0, {off})" in t.stdout
    assert t.returncode == 1  # the report still holds what recovery found
    c = cli("recover", "--clear-report", root=root)
    assert c.returncode == 0 and "cleared 1 recovery report entry" in c.stdout, c
    v = cli("verify", root=root)
    assert v.returncode == 0 and v.stdout.startswith("ok"), v


def test_pylog_verify_reports_a_cut_until_cleared(tmp_path):
    root = str(tmp_path / "data")
    from pylog.topics import LogStore

    s = LogStore(root)
    s.create_topic("t", partitions=1).append_batch([value(i) for i in range(50)], partition=0)
    s.close()
    st_ = stores(os.path.join(root, "t", "partition-0"))[0]
    last = frames(st_)[-1]
    poke(st_, last[0] + last[1] - 1)
    r = cli("recover", root=root)
    assert r.returncode == 1 and "torn tail cut at open: offsets 49..49" in r.stdout
    assert cli("verify", root=root).returncode == 1
    assert cli("recover", "--clear-report", root=root).returncode == 0
    assert cli("verify", root=root).returncode == 0


# -- case 3: the offset named, and reads after damage ------------------------------------------
@pytest.mark.parametrize("field", ["length", "crc", "offset", "payload"])
def test_corrupt_record_error_names_the_damaged_record(tmp_path, field):
    """A sealed segment (clean open, nothing rebuilt) with record 104 damaged and one index
    entry for the whole segment: a read of 150 succeeds, a read of 104 names 104."""
    path = str(tmp_path / "p")
    with pylog.Log(path, index_interval_bytes=1 << 20) as log:
        log.append_batch([value(i) for i in range(200)])
        log.roll()
        log.append(b"active")
    st_ = stores(path)[0]
    pos, size, off = frames(st_)[104]
    assert off == 104
    before = os.stat(st_)
    at = {"length": pos + 2, "crc": pos + 4, "offset": pos + 8, "payload": pos + size - 2}[field]
    poke(st_, at, xor=0x11)
    os.utime(st_, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pylog.Log(path) as log:
        assert log.recovery_report == []  # a clean open reads no record data
        for o in (150, 105, 199, 103, 0):
            assert bytes(log.read(o).value) == value(o)
        with pytest.raises(CorruptRecordError) as ei:
            log.read(104)
        assert (ei.value.offset, ei.value.position, ei.value.path) == (104, pos, st_)
        assert [(e.offset, e.position) for e in log.verify()] == [(104, pos)]
        # a fetch stops before the damage; one from the damage raises naming it
        got = log.read_batch(100, max_records=10)
        assert [r.offset for r in got] == [100, 101, 102, 103]
        with pytest.raises(CorruptRecordError) as ei:
            log.read_batch(104)
        assert ei.value.offset == 104
        assert [r.offset for r in log.read_batch(105, max_records=3)] == [105, 106, 107]


def test_scan_and_arrow_raise_at_the_damaged_offset_never_skip_it(tmp_path):
    pytest.importorskip("pyarrow")
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    poke(st_, pos + size - 1)
    with pylog.Log(path) as log:
        seen = []
        with pytest.raises(CorruptRecordError) as ei:
            for r in log.scan():
                seen.append(r.offset)
        assert ei.value.offset == off and seen == list(range(off))
        with pytest.raises(CorruptRecordError) as ei:
            log.read_arrow()
        assert ei.value.offset == off
        with pytest.raises(CorruptRecordError) as ei:
            log.read_arrow(off - 3, off + 3)
        assert ei.value.offset == off
        t = log.read_arrow(off + 1, 600)
        assert t.column("offset").to_pylist() == list(range(off + 1, 600))
        assert [r.offset for r in log.scan(off + 1)] == list(range(off + 1, 600))


# -- other processes ---------------------------------------------------------------------------
READER = """
import sys, pylog
from pylog.errors import CorruptRecordError
log = pylog.Log(sys.argv[1], readonly=True)
bad, good = [], 0
for o in range(log.next_offset):
    try:
        assert bytes(log.read(o).value) == b"value-%05d" % o, o
        good += 1
    except CorruptRecordError as e:
        bad.append((o, e.offset))
print((log.next_offset, good, bad, [e.offset for e in log.verify()]))
"""


def test_a_readonly_reader_in_another_process_agrees(tmp_path):
    path = str(tmp_path / "p")
    build(path, 600)
    st_, (pos, size, off) = middle_frame(path)
    poke(st_, pos + size - 1)
    # no writer has recovered the damage yet: the reader stops at it, but verify finds it
    p = run_py(READER, path)
    assert p.returncode == 0, p.stderr
    n, good, bad, ver = eval(p.stdout)
    assert (n, good, bad, ver) == (off, off, [], [off])
    with pylog.Log(path) as log:  # the writer recovers (and keeps writing) while it reads
        log.append(b"value-00600")
        log.flush()
        p = run_py(READER, path)
        assert p.returncode == 0, p.stderr
        assert eval(p.stdout) == (601, 600, [(off, off)], [off])


# -- the frame search: C and pure agree with each other and with a model -----------------------
def _walk(mod, buf: bytes, gaps: bool = False):
    """(status, damage list, next_offset, position, index entries) of a walk over ``buf``
    with backend ``mod`` (the loop of pylog.segment.walk)."""
    a = mod.Appender(0, next_offset=0, position=fmt.FILE_HEADER_SIZE, max_position=fmt.MAX_SEGMENT_BYTES,
                     max_timestamp=None, index_interval=4096, bytes_since_index=4096, index_cap=4,
                     buffer_bytes=0)
    b = mod.Buffer(buf)
    damage = []
    while True:
        rc, _ = a.recover(b, len(buf))
        if rc == mod.OK:
            break
        rrc, f = mod.resync(b, len(buf), a.position, a.next_offset, 0, gaps)
        if rrc != mod.OK:
            break
        damage.append((a.position, f[0], a.next_offset, f[1]))
        a.resume_at(f[0], f[1])
    return rc, damage, a.next_offset, a.position, a.index_bytes(0, a.index_count)


def _frames_of(values: list[bytes]) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A store holding ``values`` (framed with pylog itself, in a scratch log) and its frames."""
    import tempfile

    d = tempfile.mkdtemp()
    with pylog.Log(d) as log:
        log.append_batch(values, timestamps=[7] * len(values))
    st_ = stores(d)[0]
    with open(st_, "rb") as f:
        data = f.read()
    return data, frames(st_)


@settings(max_examples=scaled(60, 600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.binary(max_size=120), min_size=2, max_size=40),
       damages=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 90), st.sampled_from(["zero", "flip", "junk"])),
                        min_size=1, max_size=3),
       data=st.data())
def test_walk_against_a_model_in_both_backends(values, damages, data):
    buf, fr = _frames_of(values)
    b = bytearray(buf)
    touched = set()
    for at, n, kind in damages:
        start = fmt.FILE_HEADER_SIZE + at % (len(buf) - fmt.FILE_HEADER_SIZE)
        end = min(len(buf), start + n)
        if kind == "zero":
            b[start:end] = bytes(end - start)
        elif kind == "flip":
            b[start] ^= 1 << data.draw(st.integers(0, 7))
            end = start + 1
        else:
            b[start:end] = data.draw(st.binary(min_size=end - start, max_size=end - start))
        touched.update(range(start, end))
    bad = [f for f in fr if any(p in touched for p in range(f[0], f[0] + f[1]))
           and bytes(b[f[0]:f[0] + f[1]]) != buf[f[0]:f[0] + f[1]]]
    nat = _walk(_native, bytes(b))
    pure = _walk(_pure, bytes(b))
    assert nat == pure
    rc, damage, nxt, position, _ix = nat
    bad_offsets = {f[2] for f in bad}
    if not bad:
        assert rc == _native.OK and damage == [] and nxt == len(values)
        return
    intact_after = [f for f in fr if f[2] > max(bad_offsets)]
    if intact_after:  # interior damage only: nothing cut, every lost offset is a damaged one
        assert nxt == len(values) and rc == _native.OK and position == len(b)
    else:  # the last frames are damaged: the walk stops at the first of the trailing run
        trailing = min(o for o in bad_offsets if all(x in bad_offsets for x in range(o, len(values))))
        assert nxt == trailing
    lost = set()
    for _p, _e, first, end in damage:
        lost.update(range(first, end))
    assert lost <= bad_offsets
    assert lost | {o for o in bad_offsets if o >= nxt} == bad_offsets


@pytest.mark.parametrize("kept", [0, 5, fmt.FILE_HEADER_SIZE - 1])
def test_a_torn_roll_is_not_reported_as_damage(tmp_path, kept):
    """A writer killed during a roll (the new store file made, its header not all written;
    or a roll in progress in another process) leaves a last segment with less than a file
    header. Readers read every record; read-only verify() and ``pylog verify`` report no
    damage (they said "bad file header: torn frame" and exited 1); the writer's next open
    makes it the active segment with a whole header; a whole header that is wrong is still
    damage."""
    root = str(tmp_path / "data")
    with pylog.LogStore(root) as s:
        t = s.create_topic("t", partitions=1, segment_bytes=4096)
        t.append_batch([value(i) for i in range(100)], partition=0)
    part = os.path.join(root, "t", "partition-0")
    torn = os.path.join(part, f"{100:020d}.log")
    header = _native.header_encode(fmt.STORE_MAGIC, 100)
    with open(torn, "wb") as f:
        f.write(header[:kept])
    with pylog.Log(part, readonly=True) as ro:
        assert ro.next_offset == 100 and bytes(ro.read(99).value) == value(99)
        assert ro.verify() == []
    v = cli("verify", root=root)
    assert v.returncode == 0 and v.stdout.startswith("ok"), v
    with pylog.Log(part) as w:  # the writer's open finishes the roll
        assert w.next_offset == 100 and w.verify() == []
        assert w.append(b"after") == 100
    with open(torn, "rb") as f:
        assert f.read(fmt.FILE_HEADER_SIZE) == header
    os.truncate(torn, 0)
    for ext in (".index", ".timeindex"):
        os.unlink(torn[:-4] + ext)
    # a whole header that names another base offset is damage, in the last segment too
    with open(torn, "wb") as f:
        f.write(_native.header_encode(fmt.STORE_MAGIC, 7))
    with pylog.Log(part, readonly=True) as ro:
        assert any("bad file header" in str(e) for e in ro.verify())
