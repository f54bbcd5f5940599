"""The Log API: config, errors, zero-copy views, the segment LRU, rolls, threads, policies."""
import os
import threading
import time

import pytest
from conftest import scan_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog import format as fmt
from pylog.errors import (
    ConfigError,
    InvalidTimestampError,
    LogClosedError,
    LogLockedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)


def _files(d):
    out = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if os.path.isfile(p) and name != fmt.LOCK_FILE:
            with open(p, "rb") as f:
                out[name] = f.read()
    return out


def test_append_read_roundtrip_and_properties(make_log):
    log = make_log()
    assert (log.start_offset, log.next_offset, len(log)) == (0, 0, 0)
    assert log.append(b"a") == 0
    assert log.append(bytearray(b"bb"), key=b"k", metadata=memoryview(b"m")) == 1
    r = log.read(1)
    assert (r.offset, bytes(r.value), bytes(r.key), bytes(r.metadata)) == (1, b"bb", b"k", b"m")
    assert log.read(0).key is None and log.read(0).metadata is None
    assert log.append(None, key=b"gone") == 2 and log.read(2).value is None  # a tombstone
    assert len(log) == 3 and log.size_bytes > 32
    assert isinstance(r, pylog.Record) and r == (1, r.timestamp, r.key, r.value, r.metadata)


def test_config_is_persisted_and_merged_on_reopen(log_dir):
    with pylog.Log(log_dir, segment_bytes=8192, retention_ms=1000) as log:
        log.append(b"x")
    with pylog.Log(log_dir) as log:
        assert log.config.segment_bytes == 8192 and log.config.retention_ms == 1000
    with pylog.Log(log_dir, retention_ms=5, fsync="always") as log:
        assert log.config.retention_ms == 5 and log.config.fsync == "always"
    with pytest.raises(ConfigError, match="initial_offset"):
        pylog.Log(log_dir, initial_offset=7)
    with pylog.Log(log_dir, config=pylog.LogConfig(segment_bytes=4096)) as log:
        assert log.config.segment_bytes == 4096


@pytest.mark.parametrize("bad", [
    dict(segment_bytes=10), dict(segment_bytes=1 << 40), dict(fsync="sometimes"),
    dict(index_interval_bytes=-1), dict(cached_segments=-1), dict(max_record_bytes="big"),
    dict(flush_ms=0), dict(retention_bytes=-5), dict(initial_offset=-1), dict(preallocate="yes"),
    dict(no_such_option=1), dict(segment_bytes=True),
])
def test_bad_config_values_are_named(log_dir, bad):
    with pytest.raises(ConfigError) as e:
        pylog.Log(log_dir, **bad)
    assert str(next(iter(bad))) in str(e.value)


def test_initial_offset(make_log):
    log = make_log(initial_offset=1000)
    assert log.append(b"x") == 1000 and log.start_offset == 1000
    with pytest.raises(OffsetOutOfRangeError):
        log.read(999)


def test_record_too_large_leaves_log_unchanged(make_log, log_dir):
    log = make_log(max_record_bytes=100)
    log.append(b"x" * 100)
    log.flush()
    before = _files(log_dir)
    with pytest.raises(RecordTooLargeError, match="101"):
        log.append(b"x" * 101)
    with pytest.raises(RecordTooLargeError):
        log.append(b"x" * 60, key=b"k" * 41)
    with pytest.raises(RecordTooLargeError):
        log.append_batch([b"ok", b"y" * 200])
    with pytest.raises(RecordTooLargeError):
        log.append(iter([b"a" * 60, b"b" * 60, b"never taken"]))
    log.flush()
    assert log.next_offset == 1 and _files(log_dir) == before


def test_streaming_append_rolls_back_on_iterator_error(make_log):
    log = make_log()

    def chunks():
        yield b"part1"
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError, match="source died"):
        log.append(chunks())
    assert log.next_offset == 0
    assert log.append(iter([b"a", memoryview(b"bc"), bytearray(b"d")])) == 0
    assert bytes(log.read(0).value) == b"abcd"


@pytest.mark.parametrize("value", ["text", 12, 3.5, object(), [1, 2]])
def test_non_bytes_values_raise_typeerror(make_log, value):
    log = make_log()
    with pytest.raises(TypeError):
        log.append(value)
    with pytest.raises(TypeError):
        log.append(b"v", key="text-key")
    assert log.next_offset == 0


def test_expected_offset(make_log):
    log = make_log()
    assert log.append(b"a", expected_offset=0) == 0
    with pytest.raises(OffsetMismatchError, match="expected_offset=5"):
        log.append(b"b", expected_offset=5)
    assert log.next_offset == 1


def test_timestamps_never_decrease(make_log):
    log = make_log()
    log.append(b"a", timestamp=2000)
    with pytest.raises(InvalidTimestampError, match="1999"):
        log.append(b"b", timestamp=1999)
    with pytest.raises(InvalidTimestampError):
        log.append(b"b", timestamp=-1)
    with pytest.raises(InvalidTimestampError):
        log.append_batch([b"x", b"y"], timestamps=[3000, 2500])
    log.append(b"c")  # now() >= 2000
    assert log.read(1).timestamp >= 2000 and log.next_offset == 2


def test_read_errors(make_log):
    log = make_log()
    log.append(b"a")
    for bad in (-1, 1, 10**12):
        with pytest.raises(OffsetOutOfRangeError) as e:
            log.read(bad)
        assert str(bad) in str(e.value) and isinstance(e.value, IndexError)
    with pytest.raises(TypeError):
        log.read("0")
    with pytest.raises(ValueError):
        log.read_batch(0, max_bytes=-1)
    assert log.read_batch(1) == []


def test_sealed_values_are_zero_copy_and_outlive_close_and_deletion(log_dir):
    log = pylog.Log(log_dir, segment_bytes=4096, cached_segments=1)
    log.append_batch([b"%04d" % i * 50 for i in range(100)])
    sealed = log.read(0)
    assert isinstance(sealed.value, memoryview) and sealed.value.readonly
    batch = log.read_batch(0, max_records=5)
    log.close()
    assert bytes(sealed.value) == b"0000" * 50 and bytes(batch[4].value) == b"0004" * 50
    log = pylog.Log(log_dir, retention_bytes=0)
    v = log.read(0).value
    assert log.enforce_retention() > 0 and log.start_offset > 0
    assert bytes(v) == b"0000" * 50  # the file is gone, the view still reads
    log.close()


def test_lru_bounds_open_maps(log_dir):
    with pylog.Log(log_dir, segment_bytes=4096, cached_segments=3) as log:
        log.append_batch([b"x" * 200] * 2000)
        assert len(log._sealed) > 50
        for off in range(0, 2000, 7):
            log.read(off)
        mapped = [s for s in log._sealed if s.is_mapped]
        assert len(mapped) <= 3 and len(log._cache) <= 3
        with open("/proc/self/maps") as f:
            maps = sum(1 for line in f if os.path.realpath(log_dir) + "/" in line)
        assert maps <= 3 * 3 + 3  # store, index, time index per cached segment (+ active)


def test_roll_by_size_time_and_full_index(make_log, tmp_path):
    log = make_log(segment_bytes=4096)
    log.append_batch([b"x" * 1000] * 10)
    assert all(s["size_bytes"] <= 4096 for s in log.segments()) and len(log.segments()) >= 3
    t = make_log(str(tmp_path / "t"), segment_ms=1000)
    t.append(b"a", timestamp=10_000)
    t.append(b"b", timestamp=10_500)
    t.append(b"c", timestamp=11_000)
    assert [s["base_offset"] for s in t.segments()] == [0, 2]
    i = make_log(str(tmp_path / "i"), index_interval_bytes=0, index_max_bytes=32)
    i.append_batch([b"z"] * 10)
    assert len(i.segments()) == 3  # 4 entries per index, so 4 + 4 + 2 records


def test_truncate_across_segments_and_views_survive(make_log):
    log = make_log(segment_bytes=4096)
    log.append_batch([b"%03d" % i * 30 for i in range(200)])
    held = log.read(150).value
    log.truncate(50)
    assert log.next_offset == 50 and bytes(held) == b"150" * 30
    assert log.append(b"new") == 50 and bytes(log.read(50).value) == b"new"
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate(52)
    log.truncate(0)
    assert len(log) == 0


def test_offset_for_time_across_segments(make_log):
    log = make_log(segment_bytes=4096)
    log.append_batch([b"x" * 100] * 300, timestamps=[1000 + 10 * i for i in range(300)])
    assert log.offset_for_time(0) == 0
    assert log.offset_for_time(1000 + 10 * 123) == 123
    assert log.offset_for_time(1000 + 10 * 123 + 1) == 124
    assert log.offset_for_time(10**9) is None


def test_remove_expired_keeps_active(make_log):
    log = make_log(segment_bytes=4096)
    log.append_batch([b"x" * 500] * 30, timestamps=[1000] * 30)
    n_sealed = len(log._sealed)
    assert log.remove_expired(60_000) == n_sealed
    assert log.start_offset == log._active.base_offset and log.next_offset == 30


def test_second_writer_is_refused(log_dir, make_log):
    make_log()
    with pytest.raises(LogLockedError):
        pylog.Log(log_dir)


def test_closed_log_raises(log_dir):
    log = pylog.Log(log_dir)
    log.append(b"x")
    log.close()
    log.close()
    for call in (lambda: log.append(b"y"), lambda: log.read(0), lambda: log.next_offset):
        with pytest.raises(LogClosedError):
            call()


def test_remove_deletes_files(tmp_path):
    d = tmp_path / "gone"
    log = pylog.Log(d, segment_bytes=4096)
    log.append_batch([b"x" * 100] * 100)
    log.remove()
    assert not d.exists()


def test_threads_append_and_read_concurrently(make_log):
    log = make_log(segment_bytes=8192)
    n_threads, per = 4, 500
    errors = []

    def writer(t):
        for i in range(per):
            off = log.append(b"%d-%d" % (t, i))
            if bytes(log.read(off).value) != b"%d-%d" % (t, i):
                errors.append(off)

    def reader():
        while log.next_offset < n_threads * per:
            n = log.next_offset
            if n:
                log.read(n - 1)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and log.next_offset == n_threads * per
    expected = sorted(b"%d-%d" % (t, i) for t in range(n_threads) for i in range(per))
    assert sorted(bytes(r.value) for r in log.scan()) == expected


def test_interval_policy_flushes_by_count_and_by_time(make_log):
    log = make_log(fsync="interval", flush_messages=10, flush_ms=None)
    for i in range(9):
        log.append(b"x")
    assert log._gc.durable_next == 0
    log.append(b"x")
    assert log._gc.durable_next == 10
    timed = make_log(os.path.join(log._active.dir, "..", "timed"), fsync="interval", flush_ms=50)
    timed.append(b"x")
    deadline = time.time() + 5
    while timed._gc.durable_next < 1 and time.time() < deadline:
        time.sleep(0.02)
    assert timed._gc.durable_next == 1, "the background flusher fsynced within flush_ms"


def test_readonly_reader_follows_the_writer(log_dir, make_log):
    w = make_log(segment_bytes=4096)
    w.append_batch([b"a" * 100] * 50)
    w.flush()
    r = pylog.Log(log_dir, readonly=True)
    try:
        assert r.next_offset == 50
        w.append_batch([b"b" * 100] * 100)
        w.flush()
        assert bytes(r.read(120).value) == b"b" * 100  # past the end: refreshes itself
        assert r.next_offset == 150 and len(list(r.scan())) == 150
    finally:
        r.close()


def test_reopen_after_a_crash_does_not_reverify_sealed_segments(log_dir, monkeypatch):
    from pylog.segment import SealedSegment
    from pylog.testing import simulate_crash

    with pylog.Log(log_dir, segment_bytes=4096) as log:
        log.append_batch([b"x" * 200] * 200)
    log = pylog.Log(log_dir)  # a clean open; the recovery point is where close() left it
    log.append(b"after")
    simulate_crash(log)
    verified = []
    monkeypatch.setattr(SealedSegment, "verify", lambda self, nxt: verified.append(self) or [])
    with pylog.Log(log_dir) as log:
        assert log.next_offset >= 200
    assert verified == [], "sealed segments below the recovery point are trusted"


def test_preallocated_log_reopens_clean(tmp_path, monkeypatch):
    from pylog.log import Log

    d = str(tmp_path / "pre")
    with pylog.Log(d, segment_bytes=1 << 20, preallocate=True) as log:
        log.append_batch([b"y" * 100] * 50)
    called = []
    monkeypatch.setattr(Log, "_recover", lambda self, *a: called.append(1))
    with pylog.Log(d) as log:
        assert log.next_offset == 50 and bytes(log.read(49).value) == b"y" * 100
    assert called == [], "a clean shutdown of a preallocated log needs no recovery"


def _batches_in_two_logs(tmp_path, monkeypatch, script, **kw):
    """Run ``script(log)`` on a log whose big batches are framed in place and on one whose
    batches are all copied into the write buffer; the store and index files of both."""
    import pylog.log as log_mod

    out = []
    lay_out = log_mod._lay_out
    laid = []
    monkeypatch.setattr(log_mod, "_c_bytes_only", None)  # no gathered writes (tests/test_append_gather.py)
    monkeypatch.setattr(log_mod, "_lay_out", lambda *a: laid.append(lay_out(*a)) or laid[-1])
    for name, threshold in (("in_place", 0), ("copied", 1 << 62)):
        monkeypatch.setattr(log_mod, "IN_PLACE_MIN_BYTES", threshold)
        laid.clear()
        d = str(tmp_path / name)
        with pylog.Log(d, **kw) as log:
            script(log)
        assert laid and all((x is not None) == (threshold == 0) for x in laid)
        with pylog.Log(d, **kw) as log:
            seen = scan_rows(log)
        files = {k: v for k, v in _files(d).items() if k.endswith((".log", ".index", ".timeindex"))}
        out.append((files, seen))
    return out


def test_in_place_batches_write_the_bytes_copied_batches_write(tmp_path, monkeypatch):
    def script(log):
        ts = 1_000_000
        for i in range(12):
            n = 1 + (i * 7) % 40
            vals = [bytes([i, j]) * (5 + (i * j) % 150) for j in range(n)]
            keys = [b"k%d" % j for j in range(n)] if i % 3 == 0 else None
            meta = [b"m" * (j % 4) for j in range(n)] if i % 4 == 1 else None
            log.append_batch(vals, keys=keys, metadata=meta, timestamps=[ts + i * 100 + j for j in range(n)])
            log.append(b"one %d" % i, timestamp=ts + i * 100 + 99)  # between batches

    (files_a, seen_a), (files_b, seen_b) = _batches_in_two_logs(
        tmp_path, monkeypatch, script, segment_bytes=4096, index_interval_bytes=300)
    assert len(files_a) > 6  # batches crossed several rolls
    assert files_a == files_b and seen_a == seen_b
    assert len(seen_a) == sum(1 + (i * 7) % 40 for i in range(12)) + 12


def test_in_place_batch_leaves_the_log_readable_at_once_and_after_reopen(tmp_path, monkeypatch):
    import pylog.log as log_mod

    monkeypatch.setattr(log_mod, "IN_PLACE_MIN_BYTES", 0)
    monkeypatch.setattr(log_mod, "_c_bytes_only", None)  # no gathered writes (tests/test_append_gather.py)
    d = str(tmp_path / "log")
    vals = [os.urandom(200 + i) for i in range(300)]
    with pylog.Log(d, segment_bytes=16384) as log:
        assert log.append_batch(vals[:150]) == 0
        assert bytes(log.read(149).value) == vals[149] and bytes(log.read(3).value) == vals[3]
        assert log.append_batch(vals[150:]) == 150
        assert [bytes(r.value) for r in log.scan(140, 160)] == vals[140:160]
    with pylog.Log(d) as log:
        assert log.next_offset == 300 and [bytes(r.value) for r in log.scan()] == vals
        assert not log.verify()


def test_batches_that_cannot_be_laid_out_take_the_copying_path(make_log, monkeypatch):
    """A None, a str, a view of wider items or packed bytes: _lay_out declines and the
    general path frames them (or refuses them) as before."""
    import array

    import pylog.log as log_mod

    monkeypatch.setattr(log_mod, "IN_PLACE_MIN_BYTES", 0)
    wide = memoryview(array.array("H", [1, 2, 3]))
    for values in ([b"a", None], [b"a", wide], log_mod.PackedBytes(b"abc", [1, 2])):
        assert log_mod._lay_out(values, None, None, len(values)) is None
    assert log_mod._lay_out([b"a", b"b"], [b"k", None], None, 2) is None
    log = make_log()
    assert log.append_batch([b"a", None, wide]) == 0
    assert log.read(1).value is None and bytes(log.read(2).value) == wide.tobytes()
    with pytest.raises(TypeError):
        log.append_batch([b"a", "text"])
    assert log.next_offset == 3


def test_in_place_batch_refuses_a_record_over_max_record_bytes(make_log, monkeypatch):
    import pylog.log as log_mod

    monkeypatch.setattr(log_mod, "IN_PLACE_MIN_BYTES", 0)
    log = make_log(max_record_bytes=1000)
    assert log.append_batch([b"x" * 100] * 20) == 0  # 2,000 bytes in all, none over 1,000
    with pytest.raises(RecordTooLargeError, match="1001"):
        log.append_batch([b"y" * 10, b"z" * 1001])
    with pytest.raises(RecordTooLargeError):
        log.append_batch([b"v" * 500], keys=[b"k" * 501])
    assert log.next_offset == 20 and bytes(log.read(19).value) == b"x" * 100


@given(sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=12),
       tail=st.sampled_from(["none", "zeros", "garbage", "torn"]), probe=st.sampled_from([16, 64, 4096]),
       data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_whole_frames_end_matches_a_walk_of_the_whole_file(tmp_path_factory, monkeypatch, sizes, tail, probe, data):
    """A read-only reader finds where the whole frames end through pread copies (tail.py),
    growing its read when a frame is larger than the copy; it must stop exactly where a
    walk of the whole file does, whatever follows the last frame."""
    from pylog import tail as tail_mod
    from pylog._backend import impl
    from pylog.segment import walker

    monkeypatch.setattr(tail_mod, "PROBE_BYTES", probe)
    d = str(tmp_path_factory.mktemp("wfe"))
    with pylog.Log(d, fsync="never") as log:
        for i, n in enumerate(sizes):
            log.append(bytes([i % 251]) * n)
    store = os.path.join(d, "00000000000000000000.log")
    with open(store, "ab") as f:
        if tail == "zeros":  # a preallocated tail
            f.write(bytes(data.draw(st.integers(1, 5000))))
        elif tail == "garbage":
            f.write(data.draw(st.binary(min_size=1, max_size=200)))
        elif tail == "torn" and sizes:  # the start of a copy of the last frame
            raw = open(store, "rb").read()
            last = sizes[-1] + fmt.FRAME_HEADER_SIZE
            f.write(raw[-last:][: data.draw(st.integers(1, last - 1))] if last > 1 else b"")
    raw = open(store, "rb").read()
    a = walker(0, None)
    a.recover(impl.Buffer(raw), len(raw))
    fd = os.open(store, os.O_RDONLY)
    try:
        got = tail_mod.whole_frames_end(fd, fmt.FILE_HEADER_SIZE, len(raw), 0, 0)
        mid = data.draw(st.integers(0, len(sizes)))  # also from a frame in the middle
        start = fmt.FILE_HEADER_SIZE + sum(n + fmt.FRAME_HEADER_SIZE for n in sizes[:mid])
        got_mid = tail_mod.whole_frames_end(fd, start, len(raw), 0, mid)
    finally:
        os.close(fd)
    whole = fmt.FILE_HEADER_SIZE + sum(n + fmt.FRAME_HEADER_SIZE for n in sizes)
    assert got == a.position == whole
    assert got_mid == whole


def test_write_out_hands_buffered_appends_to_the_os_without_fsync(log_dir, make_log):
    w = make_log(fsync="never")
    w.append(b"buffered")
    r = pylog.Log(log_dir, readonly=True)
    try:
        assert r.next_offset == 0, "a small append under fsync='never' stays in the write buffer"
        w.write_out()
        assert w._gc.durable_next == 0, "write_out does not fsync"
        r.refresh()
        assert r.next_offset == 1 and bytes(r.read(0).value) == b"buffered"
        r.write_out()  # read-only: nothing buffered, nothing to do
        w.close()
        w.write_out()  # closed: does nothing, as the flusher thread needs at exit
    finally:
        r.close()


def test_a_failed_write_out_fences_the_log(make_log, monkeypatch):
    """write_out is a write-out like any other: a failed pwrite fences the log (a retried
    write can report success after the data is gone), so the next append says why."""
    import errno

    from pylog import segment

    w = make_log(fsync="never")
    w.append(b"buffered")

    def eio(*_a, **_k):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(segment.fileutil, "pwrite_all", eio)
    with pytest.raises(OSError):
        w.write_out()
    monkeypatch.undo()
    with pytest.raises(pylog.LogFencedError):
        w.append(b"after")
