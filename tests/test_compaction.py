"""Compaction against a dict model, including a crash at every step of the swap."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import scaled, scan_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog import compaction
from pylog.log import CLEANED_SUFFIX, SWAP_SUFFIX

NOW = 10**12  # "now" for tombstone expiry in these tests


class Crash(Exception):
    pass


def records_of(log):
    return [(off, key, value) for off, _ts, key, value, _meta in scan_rows(log)]


def check_against_model(log, history, compacted: bool, tombstones_expired: bool):
    """``history``: every (offset, key, value) appended. Checks the compaction contract."""
    got = records_of(log)
    assert got == sorted(got)  # offsets increase
    allrecs = {off: (k, v) for off, k, v in history}
    for off, k, v in got:  # every record is an original, at its original offset
        assert allrecs[off] == (k, v)
    latest: dict[bytes, int] = {}
    for off, k, _v in history:
        if k is not None:
            latest[k] = off
    kept = {off for off, _k, _v in got}
    active_base = log.segments()[-1]["base_offset"]
    for off, k, v in history:
        if k is None or off >= active_base:
            assert off in kept  # keyless records and the active segment are never touched
        elif latest[k] == off:
            if v is None and tombstones_expired and compacted:
                assert off not in kept
            else:
                assert off in kept  # the latest record of each key stays
        elif compacted:
            assert off not in kept  # superseded records in sealed segments go
    # the table a reader rebuilds from the log equals the model's
    table: dict[bytes, bytes | None] = {}
    for _off, k, v in got:
        if k is not None:
            table[k] = v
    model = {k: allrecs[o][1] for k, o in latest.items()}
    if tombstones_expired and compacted:
        model = {k: v for k, v in model.items() if v is not None or latest[k] >= active_base}
        table = {k: v for k, v in table.items() if v is not None or k in model}
    assert table == model
    assert log.verify() == []


def write(log, ops, ts=1000):
    history = []
    for key, value in ops:
        off = log.append(value, key=key, timestamp=ts)
        history.append((off, key, value))
    return history


keys = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e"]))
values = st.one_of(st.none(), st.binary(max_size=40))


@settings(max_examples=scaled(40, 400))
@given(st.lists(st.tuples(keys, values), min_size=1, max_size=150), st.booleans())
def test_compaction_against_dict_model(tmp_path_factory, ops, expire):
    path = tmp_path_factory.mktemp("c")
    with pylog.Log(path, segment_bytes=4096, cleanup_policy="compact",
                   delete_retention_ms=0 if expire else 10**15) as log:
        ops = [(k, v) if k is not None or v is not None else (k, b"") for k, v in ops]
        history = write(log, [(k, v + b"\x00" * 40 if v is not None else v) for k, v in ops])
        log.compact(now_ms=NOW)
        check_against_model(log, history, True, expire)
        log.compact(now_ms=NOW)  # idempotent
        check_against_model(log, history, True, expire)
        more = write(log, [(b"a", b"again" * 30)] * 40)
        history += more
        log.compact(now_ms=NOW)
        check_against_model(log, history, True, expire)
    with pylog.Log(path) as log:
        check_against_model(log, history, True, expire)


def test_offsets_preserved_and_reads(tmp_path):
    with pylog.Log(tmp_path / "l", segment_bytes=4096, delete_retention_ms=0) as log:
        for i in range(400):
            log.append(b"v%d" % i + b"." * 30, key=b"k%d" % (i % 5), timestamp=1000 + i)
        log.append(b"single" + b"." * 30, key=b"single", timestamp=2000)
        for i in range(120):
            log.append(b"w" * 30, key=b"k0", timestamp=3000)
        rep = log.compact(now_ms=NOW)
        assert rep.segments_cleaned >= 3 and rep.records_removed > 300
        assert rep.bytes_after < rep.bytes_before
        with pytest.raises(pylog.OffsetRemovedError):
            log.read(0)
        assert bytes(log.read(400).key) == b"single"
        assert log.start_offset == 0 and log.next_offset == 521
        first = log.read_batch(0, max_records=3)
        assert [r.offset for r in first][:1] == [first[0].offset] and first[0].offset > 0
        assert log.offset_for_time(2000) == 400
        assert log.offset_for_time(1000) <= 400
        with pytest.raises(pylog.PylogError):
            log.truncate(1)  # into a compacted segment: refused, nothing changes
        assert log.next_offset == 521


def test_tombstones_wait_for_delete_retention(tmp_path):
    with pylog.Log(tmp_path / "l", segment_bytes=4096, delete_retention_ms=1000) as log:
        log.append(b"x" * 100, key=b"gone", timestamp=5000)
        log.append(None, key=b"gone", timestamp=5000)
        for i in range(100):
            log.append(b"y" * 100, key=b"other", timestamp=5000)
        log.compact(now_ms=5500)  # tombstone younger than 1 s: kept
        assert [r.offset for r in log.scan() if r.key is not None and bytes(r.key) == b"gone"] == [1]
        rep = log.compact(now_ms=7000)
        assert rep.tombstones_removed == 1
        assert [r for r in log.scan() if r.key is not None and bytes(r.key) == b"gone"] == []


def test_views_of_old_segments_survive_compaction(tmp_path):
    with pylog.Log(tmp_path / "l", segment_bytes=4096) as log:
        for i in range(300):
            log.append(b"%05d" % i + b"z" * 40, key=b"k%d" % (i % 3))
        views = [log.read(i).value for i in range(0, 200)]
        log.compact(now_ms=NOW)
        assert [bytes(v)[:5] for v in views] == [b"%05d" % i for i in range(200)]


def test_crash_script_subprocess(tmp_path):
    """A real process killed (os._exit) in the middle of the swap; reopening finishes it."""
    path = tmp_path / "l"
    script = textwrap.dedent("""
        import os, sys, pylog
        from pylog import compaction
        log = pylog.Log(sys.argv[1], segment_bytes=4096)
        for i in range(300):
            log.append(b"v%d" % i + b"." * 30, key=b"k%d" % (i % 4), timestamp=1000)
        log.flush()
        def hook(step):
            if step == "index-replaced":
                os._exit(9)
        compaction.crash_hook = hook
        log.compact(now_ms=10**12)
    """)
    rc = subprocess.call([sys.executable, "-c", script, str(path)])
    assert rc == 9
    assert any(n.endswith(SWAP_SUFFIX) for n in os.listdir(path))
    with pylog.Log(path) as log:
        assert not any(n.endswith((SWAP_SUFFIX, CLEANED_SUFFIX)) for n in os.listdir(path))
        assert log.next_offset == 300
        assert log.verify() == []
        table = {bytes(r.key): bytes(r.value) for r in log.scan()}
        assert table == {b"k%d" % k: b"v%d" % (296 + k) + b"." * 30 for k in range(4)}


def _crash_at(step):
    def hook(name):
        if name == step:
            raise Crash(name)
    return hook


@pytest.mark.parametrize("occurrence", [1, 2])
@pytest.mark.parametrize("step", compaction.STEPS)
def test_crash_at_every_step_of_the_swap(tmp_path, step, occurrence):
    """Crash at each step (of the first or second segment's swap), then reopen: no record
    lost that the model keeps, no stray file, and a second compaction finishes the job."""
    path = tmp_path / "l"
    log = pylog.Log(path, segment_bytes=4096, delete_retention_ms=0)
    ops = [(b"k%d" % (i % 6), b"v%d" % i + b"-" * 40) for i in range(250)]
    ops[17] = (b"k5", None)
    ops[100] = (None, b"keyless")
    history = write(log, ops)
    log.flush()
    seen = [0]

    def hook(name):
        if name == step:
            seen[0] += 1
            if seen[0] == occurrence:
                raise Crash(name)

    compaction.crash_hook = hook
    try:
        with pytest.raises(Crash):
            log.compact(now_ms=NOW)
    finally:
        compaction.crash_hook = None
    # the process "dies": no close, no clean-shutdown marker
    log._closed = True
    log._release_lock()
    from pylog import flusher

    flusher.unregister(log)
    with pylog.Log(path) as log2:
        names = os.listdir(path)
        assert not any(n.endswith((SWAP_SUFFIX, CLEANED_SUFFIX)) for n in names), names
        check_against_model(log2, history, compacted=False, tombstones_expired=False)
        # anything compacted so far holds only what compaction may remove
        log2.compact(now_ms=NOW)
        check_against_model(log2, history, compacted=True, tombstones_expired=True)
    with pylog.Log(path) as log3:
        check_against_model(log3, history, compacted=True, tombstones_expired=True)


def test_interrupted_swap_files_by_hand(tmp_path):
    """Index .swap files without a store .swap were never committed: deleted on open."""
    path = tmp_path / "l"
    with pylog.Log(path, segment_bytes=4096) as log:
        for i in range(200):
            log.append(b"x" * 40, key=b"k")
        base = log.segments()[0]["base_offset"]
    idx = os.path.join(path, f"{base:020d}.index")
    with open(idx + SWAP_SUFFIX, "wb") as f:
        f.write(b"garbage")
    with open(os.path.join(path, f"{base:020d}.log") + CLEANED_SUFFIX, "wb") as f:
        f.write(b"garbage")
    with pylog.Log(path) as log:
        assert not any(n.endswith((SWAP_SUFFIX, CLEANED_SUFFIX)) for n in os.listdir(path))
        assert len(list(log.scan())) == 200


def test_store_compact_and_policy(tmp_path):
    with pylog.LogStore(tmp_path / "r") as s:
        c = s.create_topic("changelog", 2, segment_bytes=4096, cleanup_policy="compact")
        d = s.create_topic("events", 1, segment_bytes=4096)
        for i in range(300):
            c.append(b"v" * 40, key=b"k%d" % (i % 3))
            d.append(b"v" * 40, key=b"k")
        reports = s.compact()
        assert set(reports) == {("changelog", 0), ("changelog", 1)}
        assert sum(r.records_removed for r in reports.values()) > 250
        assert len(list(d.partition(0).scan())) == 300
        cons = s.consumer("changelog", group="g")
        seen = []
        while True:
            recs = cons.poll(50)
            if not recs:
                break
            seen.extend(recs)
        table = {bytes(r.key): bytes(r.value) for r in seen}
        assert table == {b"k0": b"v" * 40, b"k1": b"v" * 40, b"k2": b"v" * 40}


def test_corrupt_segment_refuses_compaction(tmp_path):
    path = tmp_path / "l"
    with pylog.Log(path, segment_bytes=4096) as log:
        for i in range(200):
            log.append(b"x" * 40, key=b"k%d" % (i % 2))
        seg = log.segments()[0]["path"]
    with open(seg, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    before = sorted(os.listdir(path))
    with pylog.Log(path) as log:
        with pytest.raises(pylog.CorruptRecordError):
            log.compact(now_ms=NOW)
        assert sorted(n for n in os.listdir(path)) == sorted(n for n in before if n != "clean-shutdown")
