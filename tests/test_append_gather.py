"""append_batch's gathered write (pylog._speedups' Framer.frame_gather): a big batch of
bytes values is framed where the values lie and written with pwritev, never joined into one
buffer. It must write exactly the bytes the in-place and the copying paths write, keep the
log readable at once, and lose nothing acknowledged when the write fails part way."""
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import py_env, scan_rows

import pylog
import pylog.log as log_mod
from pylog import format as fmt

needs_gather = pytest.mark.skipif(log_mod._c_bytes_only is None,
                                  reason="the gathered write needs pylog._speedups (native backend)")


def _files(d):
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith((fmt.STORE_SUFFIX, fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX)):
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
    return out


def _three_ways(tmp_path, monkeypatch, script, **kw):
    """``script(log)`` on a log whose big batches are gathered, one whose big batches are
    framed in place, and one whose batches are all copied into the write buffer: for each,
    the store and index files and the records read back after a reopen, and how many
    batches took the gathered write."""
    gather, bytes_only = log_mod.gather_batch, log_mod._c_bytes_only
    out = {}
    for name in ("gathered", "in_place", "copied"):
        taken = []

        def spy(*a, taken=taken):
            g = gather(*a)
            taken.append(g is not None)
            return g

        monkeypatch.setattr(log_mod, "gather_batch", spy)
        monkeypatch.setattr(log_mod, "_c_bytes_only", None if name != "gathered" else bytes_only)
        monkeypatch.setattr(log_mod, "IN_PLACE_MIN_BYTES", 1 << 62 if name == "copied" else 64 << 10)
        d = str(tmp_path / name)
        with pylog.Log(d, **kw) as log:
            script(log)
        with pylog.Log(d, **kw) as log:
            seen = scan_rows(log)
            assert log.verify() == []
        out[name] = (_files(d), seen, sum(taken))
    return out


def _sizes_script(log):
    """Batches of values only, small (copied next to their headers) and large (written from
    where they lie: 16 KiB and up), big enough to pass the in-place threshold, some with
    timestamps, one of more than IOV_MAX (1024) pieces, with rolls and index growth."""
    ts = 2_000_000_000_000  # above the patched clock: batches without timestamps get the latest one
    for i in range(9):
        n = [700, 40, 1100, 300, 5, 2000, 64, 900, 1200][i]
        big = i in (2, 6)  # every value >= 16 KiB: two pieces a record
        vals = [bytes([i, j % 251]) * ((8200 + j) if big else (30 + (i * j) % 1500)) for j in range(n)]
        stamps = [ts + j for j in range(n)] if i % 2 else None
        ts += n
        log.append_batch(vals, timestamps=stamps)
        log.append(b"between %d" % i, timestamp=ts)


@needs_gather
def test_gathered_batches_write_the_bytes_the_other_paths_write(tmp_path, monkeypatch):
    # fixed timestamps where none are given: the three logs must be byte for byte equal
    monkeypatch.setattr(log_mod, "_now_ms", lambda: 1_999_000_000_000)
    res = _three_ways(tmp_path, monkeypatch, _sizes_script, segment_bytes=8 << 20, index_interval_bytes=4096)
    files_g, seen_g, taken_g = res["gathered"]
    assert taken_g >= 6, "the big batches took the gathered write"
    assert res["in_place"][2] == 0 and res["copied"][2] == 0
    assert len([f for f in files_g if f.endswith(fmt.STORE_SUFFIX)]) >= 3  # batches crossed rolls
    assert files_g == res["in_place"][0] == res["copied"][0]
    assert seen_g == res["in_place"][1] == res["copied"][1]
    assert len(seen_g) == 700 + 40 + 1100 + 300 + 5 + 2000 + 64 + 900 + 1200 + 9


@needs_gather
def test_a_gathered_write_of_more_than_iov_max_pieces(tmp_path, monkeypatch):
    """1,500 values of 16 KiB and more in one segment without index growth: 3,000 pieces in
    one frame_gather chunk, written IOV_MAX (1,024) pieces a pwritev."""
    def script(log):
        log.append_batch([bytes([j % 256]) * (16384 + j) for j in range(1500)], timestamps=[7] * 1500)

    res = _three_ways(tmp_path, monkeypatch, script, segment_bytes=64 << 20, index_interval_bytes=64 << 20)
    assert res["gathered"][2] == 1
    assert res["gathered"][0] == res["in_place"][0] == res["copied"][0]
    assert res["gathered"][1] == res["copied"][1] and len(res["gathered"][1]) == 1500


@needs_gather
def test_gathered_batch_is_readable_at_once_and_after_reopen(tmp_path):
    d = str(tmp_path / "log")
    vals = [os.urandom(1000 + (i % 7) * 3000) for i in range(400)]
    with pylog.Log(d, segment_bytes=1 << 20) as log:
        assert log_mod.gather_batch(vals[:200], None, None, 200, log_mod._lengths(vals[:200])) is not None
        assert log.append_batch(vals[:200]) == 0
        assert bytes(log.read(199).value) == vals[199] and bytes(log.read(3).value) == vals[3]
        assert log.append_batch(vals[200:]) == 200
        assert [bytes(r.value) for r in log.scan(190, 260)] == vals[190:260]
        assert len(log.segments()) > 1
    with pylog.Log(d) as log:
        assert log.next_offset == 400 and [bytes(r.value) for r in log.scan()] == vals
        assert not log.verify()


def test_batches_the_gathered_write_does_not_take():
    """Keys, metadata, a non-list, a bytes-like that is not bytes, a None, a small batch,
    or a fault-injection layer in vfs: the other paths."""
    vals = [b"x" * 1000] * 100
    lens = log_mod._lengths(vals)
    if log_mod._c_bytes_only is None:
        assert log_mod.gather_batch(vals, None, None, 100, lens) is None
        return
    g = log_mod.gather_batch(vals, None, None, 100, lens)
    assert g == vals and g is not vals  # a private copy
    assert log_mod.gather_batch(vals, [b"k"] * 100, None, 100, lens) is None
    assert log_mod.gather_batch(vals, None, [b"m"] * 100, 100, lens) is None
    assert log_mod.gather_batch(tuple(vals), None, None, 100, lens) is None
    assert log_mod.gather_batch(vals[:10], None, None, 10, lens[:10]) is None  # below IN_PLACE_MIN_BYTES
    for odd in (bytearray(b"x" * 1000), memoryview(b"x" * 1000), None):
        assert log_mod.gather_batch(vals[:99] + [odd], None, None, 100, lens) is None


@needs_gather
def test_gathered_batch_refuses_bad_records_before_writing_any(make_log):
    log = make_log(max_record_bytes=5000)
    assert log.append_batch([b"a" * 1000] * 100) == 0
    with pytest.raises(pylog.RecordTooLargeError):
        log.append_batch([b"b" * 1000] * 99 + [b"c" * 5001])
    with pytest.raises(pylog.InvalidTimestampError):
        log.append_batch([b"d" * 1000] * 100, timestamps=[10] * 50 + [9] * 50)
    assert log.next_offset == 100 and log.verify() == []
    assert {bytes(r.value) for r in log.scan()} == {b"a" * 1000}


FSIZE_CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    import pylog, pylog.log as log_mod
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit: short, then EFBIG
    path, limit = sys.argv[1], int(sys.argv[2])
    log = pylog.Log(path, fsync="never", segment_bytes=64 << 20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    acked, error, gathered = 0, None, 0
    for i in range(100):
        vals = [bytes([i % 256, j % 256]) * 500 for j in range(300)]
        gathered += log_mod.gather_batch(vals, None, None, 300, log_mod._lengths(vals)) is not None
        try:
            assert log.append_batch(vals) == acked
        except OSError as e:
            error = e.errno
            break
        acked += 300
    try:
        log.append_batch([b"z" * 1000] * 100)
        fenced = False
    except pylog.LogFencedError:
        fenced = True
    print(json.dumps({"acked": acked, "error": error, "fenced": fenced, "gathered": gathered}))
    sys.stdout.flush()
    os._exit(0)
""")


def test_a_write_cut_short_by_the_file_size_limit_loses_nothing_acknowledged(tmp_path):
    """RLIMIT_FSIZE ends the file mid-batch: the kernel writes part of a pwritev (a short
    write, written on from where it stopped), then refuses with EFBIG. The batch fails with
    that OSError, the log is fenced, and a reopen finds every acknowledged record, then at
    most the whole records of the failed batch that reached the file."""
    import json

    path = str(tmp_path / "log")
    limit = 2_000_000 + 12_345  # inside the 7th batch (~300 KiB each), not at a frame edge
    r = subprocess.run([sys.executable, "-c", FSIZE_CHILD, path, str(limit)], capture_output=True, text=True,
                       timeout=120, env=py_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["error"] == 27  # EFBIG
    assert out["fenced"] and 300 <= out["acked"] < 30_000
    if log_mod._c_bytes_only is not None:
        assert out["gathered"] >= out["acked"] // 300
    store = [n for n in os.listdir(path) if n.endswith(fmt.STORE_SUFFIX)]
    assert os.path.getsize(os.path.join(path, store[0])) == limit  # the write went up to the limit
    with pylog.Log(path) as log:
        # every acknowledged record, then at most a prefix of the failed batch's own whole
        # records (as for any failed write: tests/test_crash_powercut.py)
        assert out["acked"] <= log.next_offset < out["acked"] + 300
        recs = list(log.scan())
        assert len(recs) == log.next_offset
        assert all(bytes(r.value) == bytes([(r.offset // 300) % 256, (r.offset % 300) % 256]) * 500 for r in recs)
        assert log.verify() == []


@needs_gather
def test_gathered_batches_after_a_huge_one_and_with_a_small_write_buffer(tmp_path, monkeypatch):
    """frame_gather frames in the write buffer (grown to 1 MiB first, whatever
    write_buffer_bytes says) and lets go of its per-record arrays after a batch of more than
    16,384 records; batches after that, big and small, still write the bytes the other
    paths write."""
    def script(log):
        log.append_batch([b"%06d" % j * 20 for j in range(40_000)], timestamps=[5] * 40_000)
        for i in range(3):
            log.append_batch([bytes([i]) * (600 + j) for j in range(300)], timestamps=[6 + i] * 300)
        log.append_batch([b"x" * 70_000] * 3, timestamps=[10] * 3)

    res = _three_ways(tmp_path, monkeypatch, script, write_buffer_bytes=4096, segment_bytes=4 << 20)
    assert res["gathered"][2] == 5
    assert res["gathered"][0] == res["in_place"][0] == res["copied"][0]
    assert res["gathered"][1] == res["copied"][1] and len(res["gathered"][1]) == 40_000 + 900 + 3
