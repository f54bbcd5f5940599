"""pylog._speedups, the CPython extension that makes Records in C (issue 16).

* which backend loads it: the native one when built, never the pure one (the oracle, no C);
* its Records equal the Python-built ones (pylog.segment._build_records over the pure
  backend's scan) over random frames: keys, metadata and values None or bytes, offsets with
  compaction gaps, any start, record and byte budgets; list and lazy iterator; reads;
* corrupt bytes anywhere: no Record it returns differs from what was written (a frame that
  fails its CRC is never turned into a Record);
* the Records keep the NamedTuple's behaviour and their views the map alive;
* views made without slicing (FAST_VIEWS) are in every visible way the slices, and outlive
  close and retention too.
"""
import gc
import os
import pickle
import subprocess
import sys
import sysconfig

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog import _pure
from pylog import format as fmt
from pylog._backend import speedups
from pylog.record import Record
from pylog.segment import _build_records

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

needs_speedups = pytest.mark.skipif(speedups is None,
                                    reason="pylog._speedups is not in use (pure backend, or not built)")

_PROBE = """
import sys, tempfile, pylog, pylog._backend as b
d = tempfile.mkdtemp()
with pylog.Log(d, segment_bytes=4096) as log:
    log.append_batch([b"v%d" % i * 40 for i in range(300)])
    assert bytes(log.read(3).value) == b"v3" * 40
    assert sum(1 for _ in log.scan()) == 300 and len(log.read_batch(0, max_records=50)) == 50
print(b.NAME, b.speedups is not None, "pylog._speedups" in sys.modules, "pylog._cffi" in sys.modules,
      "speedups" in pylog.backend_features, b.speedups.crc_impl() if b.speedups else "-",
      b.impl.crc_impl() if b.NAME == "native" else "-")
"""


def _probe(**env):
    e = {k: v for k, v in os.environ.items() if k not in ("PYLOG_BACKEND", "PYLOG_SPEEDUPS")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", _PROBE], env=e, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


_REBUILD = "pylog._speedups is not built here: run `python setup.py build_ext --inplace`"


def test_pure_backend_loads_no_c_at_all():
    name, used, sp_loaded, cffi_loaded, feature, *_ = _probe(PYLOG_BACKEND="pure")
    assert (name, used, sp_loaded, cffi_loaded, feature) == ("pure", "False", "False", "False", "False")


def _require_built():
    """The C core must be built; then the extension must be too (a build that failed to make
    it would otherwise pass unnoticed), unless it was left out on purpose."""
    pytest.importorskip("pylog._cffi")
    if os.environ.get("PYLOG_NO_SPEEDUPS") == "1":
        pytest.skip("built with PYLOG_NO_SPEEDUPS=1")


def test_native_backend_uses_the_extension():
    _require_built()
    name, used, sp_loaded, _cffi, feature, sp_crc, native_crc = _probe(PYLOG_BACKEND="native")
    assert (name, used, sp_loaded, feature) == ("native", "True", "True", "True"), _REBUILD
    assert sp_crc == native_crc  # the extension's copy of the core picks the same CRC32C code


def test_extension_follows_the_forced_portable_crc():
    _require_built()
    *_, sp_crc, native_crc = _probe(PYLOG_BACKEND="native", PYLOG_CRC32C_FORCE_PORTABLE="1")
    assert sp_crc == native_crc == "portable"


def test_speedups_off_runs_the_python_paths():
    pytest.importorskip("pylog._cffi")
    name, used, sp_loaded, _cffi, feature, *_ = _probe(PYLOG_BACKEND="native", PYLOG_SPEEDUPS="0")
    assert (name, used, sp_loaded, feature) == ("native", "False", "False", "False")


# ---- C-built Records against the Python-built ones ------------------------------------------

fields = st.one_of(st.none(), st.binary(max_size=40))
records = st.lists(st.tuples(fields, fields, fields, st.integers(0, 3), st.integers(0, 2)), min_size=0, max_size=40)


def _store(recs, gaps, interval=1 << 31, with_index=False):
    """A store buffer (file header + frames) of ``recs``: (key, value, metadata, offset
    step - 1 when ``gaps``, timestamp step); returns (bytes, [(position, offset, ts, k, v, m)])
    and with ``with_index`` the offset index entries (one per ``interval`` bytes) too."""
    base = 1000
    a = _pure.Appender(base, next_offset=base, position=fmt.FILE_HEADER_SIZE, max_position=fmt.MAX_SEGMENT_BYTES,
                       max_timestamp=None, index_interval=interval, bytes_since_index=interval, index_cap=1 << 12,
                       buffer_bytes=1 << 20)
    a.gaps = gaps
    out = []
    ts = 1_700_000_000_000
    for k, v, m, skip, dts in recs:
        if gaps and skip:
            a.next_offset = a.next_offset + skip
        ts += dts
        attrs = (fmt.ATTR_NULL_KEY if k is None else 0) | (fmt.ATTR_NULL_METADATA if m is None else 0) | (
            fmt.ATTR_NULL_VALUE if v is None else 0)
        pos = a.position
        off = a.frame(v, k, m, attrs, ts)
        assert off >= 0, off
        out.append((pos, off, ts, k, v, m))
    head = _pure.header_encode(fmt.STORE_MAGIC, base, fmt.HEADER_COMPACTED if gaps else 0)
    data = bytes(head) + bytes(a.pending())
    if with_index:
        return data, out, bytes(a.index_bytes(0, a.index_count))
    return data, out


def _plain(r):
    return tuple(None if x is None else (bytes(x) if isinstance(x, memoryview) else x) for x in r)


def _kinds(r):
    return tuple(type(x) for x in r)


def _c_map(data):
    """(memoryview, address, length) of a bytes object as the native backend hands them to C."""
    from pylog import _native

    buf = _native.Buffer(data)
    return memoryview(data), buf.addr, len(data), buf


@needs_speedups
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records, gaps=st.booleans(), start=st.integers(0, 40), max_out=st.integers(1, 50),
       max_bytes=st.one_of(st.just((1 << 64) - 1), st.integers(0, 3000)), lazy=st.booleans())
def test_c_records_equal_python_records(recs, gaps, start, max_out, max_bytes, lazy):
    data, written = _store(recs, gaps)
    start = min(start, len(written))
    pos, expected = (written[start][0], written[start][1]) if start < len(written) else (len(data), None)
    prc, frames, pend = _pure.scan(_pure.Buffer(data), len(data), pos, expected, max_out, max_bytes, gaps)
    mv = memoryview(data)
    want = _build_records(mv, frames, False)
    mv_c, addr, length, keep = _c_map(data)
    got, n, last, rc, end, used, first = speedups.scan(mv_c, addr, length, pos, expected, max_out, max_bytes, gaps,
                                                        lazy)
    got = list(got)
    assert (rc, end, n) == (prc, int(pend), len(want))
    assert used == int(frames["frame_size"].sum()) and first == (int(frames["frame_size"][0]) if n else 0)
    assert last == (int(frames["offset"][-1]) if n else -1)
    assert [_plain(r) for r in got] == [_plain(r) for r in want]
    assert [_kinds(r) for r in got] == [_kinds(r) for r in want]
    assert all(type(r) is Record for r in got)
    # and every one is what was written
    by_off = {o: (o, t, k, v, m) for _p, o, t, k, v, m in written}
    assert [_plain(r) for r in got] == [by_off[r.offset] for r in got]
    # single reads through the index-less lookup: the same Record, None for offsets not there
    for _p, o, t, k, v, m in written[:10]:
        r = speedups.read(mv_c, addr, length, 0, 0, 1000, gaps, o)
        assert type(r) is Record and _plain(r) == (o, t, k, v, m)
    missing = written[-1][1] + 1 if written else 1000
    assert speedups.read(mv_c, addr, length, 0, 0, 1000, gaps, missing) is None


@needs_speedups
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records.filter(bool), gaps=st.booleans(), where=st.integers(0), bit=st.integers(0, 7),
       lazy=st.booleans())
def test_corrupt_bytes_never_become_records(recs, gaps, where, bit, lazy):
    data, written = _store(recs, gaps)
    i = fmt.FILE_HEADER_SIZE + where % (len(data) - fmt.FILE_HEADER_SIZE)
    bad = bytearray(data)
    bad[i] ^= 1 << bit
    bad = bytes(bad)
    mv, addr, length, keep = _c_map(bad)
    got, n, *_ = speedups.scan(mv, addr, length, fmt.FILE_HEADER_SIZE, written[0][1], 1000, (1 << 64) - 1, gaps,
                               lazy)
    by_off = {o: (o, t, k, v, m) for _p, o, t, k, v, m in written}
    got = list(got)
    assert len(got) < len(written)  # the scan stops at the bad frame
    assert all(_plain(r) == by_off.get(r.offset) for r in got)
    hit = next(o for p, o, *_ in reversed(written) if p <= i)
    for _p, o, *_ in written:
        r = speedups.read(mv, addr, length, 0, 0, 1000, gaps, o)
        assert r is None if o == hit else (r is None or _plain(r) == by_off[o])


@needs_speedups
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records.filter(bool), gaps=st.booleans(), where=st.one_of(st.none(), st.integers(0)),
       bit=st.integers(0, 7), start=st.integers(0, 40), expect=st.booleans(), max_out=st.integers(1, 50),
       max_bytes=st.one_of(st.just((1 << 64) - 1), st.integers(0, 3000)))
def test_scan_stops_where_the_one_frame_loop_stops(recs, gaps, where, bit, start, expect, max_out, max_bytes):
    """The C scan checks CRCs three frames at a time: what it returns (the frames, the status,
    the end position) is the pure backend's frame-by-frame scan's, a bit flipped anywhere."""
    from pylog import _native

    data, written = _store(recs, gaps)
    if where is not None:
        i = fmt.FILE_HEADER_SIZE + where % (len(data) - fmt.FILE_HEADER_SIZE)
        bad = bytearray(data)
        bad[i] ^= 1 << bit
        data = bytes(bad)
    start = min(start, len(written) - 1)
    pos, expected = written[start][0], (written[start][1] if expect else None)
    prc, pframes, pend = _pure.scan(_pure.Buffer(data), len(data), pos, expected, max_out, max_bytes, gaps)
    nrc, nframes, nend = _native.scan(_native.Buffer(data), len(data), pos, expected, max_out, max_bytes, gaps)
    assert (int(nrc), int(nend)) == (int(prc), int(pend))
    assert nframes.tolist() == pframes.tolist()
    mv, addr, length, keep = _c_map(data)
    got, n, _last, rc, end, *_ = speedups.scan(mv, addr, length, pos, expected, max_out, max_bytes, gaps, False)
    assert (rc, end, n) == (prc, int(pend), len(pframes))
    assert [_plain(r) for r in got] == [_plain(r) for r in _build_records(memoryview(data), pframes, False)]


def _reader(data, index, gaps, count):
    """A sealed segment's Reader over ``data`` with ``index`` (bytes of index entries)."""
    from pylog import _native

    ib = _native.Buffer(index) if index else None
    mv, addr, length, keep = _c_map(data)
    return speedups.Reader(mv, addr, length, ib.addr if ib else 0, len(index) // 8, 1000, gaps, (keep, ib), count)


@needs_speedups
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records.filter(bool), gaps=st.booleans(), interval=st.integers(0, 400), order=st.randoms(),
       corrupt=st.one_of(st.none(), st.tuples(st.integers(0), st.integers(0, 7))))
def test_reader_reads_every_record_and_no_corrupt_one(recs, gaps, interval, order, corrupt):
    """Reader.read: the index lookup, its table of positions (a second read in a block uses
    it) and the CRC-checked frame: each offset's Record as written, None where it is not; with
    a flipped bit, the Record of the frame it hit is never returned."""
    data, written, index = _store(recs, gaps, interval, with_index=True)
    hit = None
    if corrupt is not None:
        i = fmt.FILE_HEADER_SIZE + corrupt[0] % (len(data) - fmt.FILE_HEADER_SIZE)
        hit = next(o for p, o, *_ in reversed(written) if p <= i)
        bad = bytearray(data)
        bad[i] ^= 1 << corrupt[1]
        data = bytes(bad)
    count = written[-1][1] + 1 - 1000
    reader = _reader(data, index, gaps, count)
    by_off = {o: (o, t, k, v, m) for _p, o, t, k, v, m in written}
    offs = list(range(1000, 1000 + count + 2))
    for _pass in range(2):
        order.shuffle(offs)
        for o in offs:
            r = reader.read(o)
            if o not in by_off or o == hit:
                assert r is None, (o, r)
            elif hit is None:
                assert type(r) is Record and _plain(r) == by_off[o]
            else:  # damage elsewhere may hide a record (the walk to it fails), never change it
                assert r is None or _plain(r) == by_off[o]


# ---- the Records' behaviour ----------------------------------------------------------------

@pytest.fixture(params=["tp_alloc", "tuple.__new__"])
def record_alloc(request):
    """Both ways the extension makes a Record: tp_alloc (CPython < 3.14) and tuple.__new__
    (3.14 on, whose tuples cache their hash), each on this interpreter."""
    was = speedups._set_direct_alloc(request.param == "tp_alloc")
    yield request.param
    speedups._set_direct_alloc(was)


@needs_speedups
def test_c_records_behave_like_the_namedtuple(tmp_path, record_alloc):
    with pylog.Log(str(tmp_path / "l"), segment_bytes=4096) as log:
        log.append(b"value", key=b"key", metadata=b"meta", timestamp=5)
        log.append_batch([b"x" * 100] * 100, timestamps=[7] * 100)
        log.roll()
        r = log.read(0)
        py = Record(0, 5, b"key", b"value", b"meta")
        assert type(r) is Record and isinstance(r, tuple) and len(r) == 5
        assert r == py and hash(r) == hash(py) and r._asdict()["metadata"] == b"meta"
        assert repr(r) == "Record(offset=0, timestamp=5, key=b'key', value=b'value', metadata=b'meta')"
        assert r._replace(offset=9).offset == 9 and r[3] == b"value" and r.value.readonly
        assert pickle.loads(pickle.dumps(r._replace(key=None, value=b"v", metadata=None))) == (0, 5, None, b"v", None)
        batch = log.read_batch(1, max_records=3)
        assert [type(b) for b in batch] == [Record] * 3 and batch[0] == (1, 7, None, b"x" * 100, None)
        assert hash(batch[0]) == hash(Record(1, 7, None, b"x" * 100, None))
        # no cycle can run through them: the collector is spared them (their views it still sees)
        assert not gc.is_tracked(r) and not any(gc.is_tracked(b) for b in batch) and gc.is_tracked(r.value)


@needs_speedups
def test_c_views_keep_the_map_alive_and_nothing_leaks(tmp_path):
    d = str(tmp_path / "l")
    log = pylog.Log(d, segment_bytes=1 << 16, retention_bytes=0)
    log.append_batch([b"%05d" % i * 20 for i in range(2000)])
    log.roll()
    seg = log._sealed[0]
    m = seg.maps()
    mv = m.mv
    refs = sys.getrefcount(mv)
    for _ in range(3):
        for off in range(0, 500):
            log.read(off)
        log.read_batch(0, max_records=400)
        list(log.scan(0, 600))
    gc.collect()
    assert sys.getrefcount(mv) == refs  # no reference to the map's view leaked
    del m, mv
    it = log.scan(0, 300)  # one chunk, in the first segment
    first = next(it)
    one = log.read(1)
    batch = log.read_batch(2, max_records=10)
    log.close()
    log = pylog.Log(d, retention_bytes=0)
    log.enforce_retention()
    log.close()
    assert not os.path.exists(seg.store_path)  # retention deleted the segment
    rest = list(it)  # the lazy iterator still reads the map of a deleted, closed segment
    assert len(rest) == 299 and bytes(rest[-1].value) == b"00299" * 20
    assert bytes(first.value) == b"00000" * 20 and bytes(one.value) == b"00001" * 20
    assert bytes(batch[-1].value) == b"00011" * 20


@needs_speedups
def test_bad_arguments_are_refused_not_read():
    data = b"\0" * 64
    mv, addr, length, keep = _c_map(data)
    with pytest.raises(ValueError, match="past the map"):
        speedups.scan(mv, addr, 65, 32, None, 10, 100, False, False)
    with pytest.raises(TypeError):
        speedups.read(b"not a view", addr, length, 0, 0, 0, False, 0)
    with pytest.raises(TypeError):
        speedups.scan(mv, addr, length)


# ---- the Record pool (scans and fetches reuse the Records their users dropped) ---------------

needs_pool = pytest.mark.skipif(speedups is None or not speedups.DIRECT_ALLOC,
                                reason="no Record pool: pure backend, or Records made through tuple.__new__")


@needs_pool
@pytest.mark.parametrize("max_records", [500, 1000])
def test_polling_sets_off_no_collection(tmp_path, max_records):
    """poll(500) in a loop: each Record comes from the pool, so a poll makes one counted
    container per record (its view) and frees one (the view of the Record it reuses). Made
    anew, two per record crossed the young generation's threshold (700) on every poll with
    the previous batch alive, and promoting those batches set off full collections."""
    with pylog.LogStore(str(tmp_path / "s")) as store:
        topic = store.create_topic("t", 1, fsync="never")
        for i in range(160):
            topic.append_batch([b"%06d" % i * 16] * 1000)
        topic.partition(0).roll()
        c = store.consumer("t")
        runs = []

        def counted(phase, info):
            if phase == "start":
                runs.append(info["generation"])

        was = gc.get_threshold()
        gc.set_threshold(700, 10, 10)
        try:
            for _ in range(10):  # the pool fills
                got = c.poll(max_records)
            gc.collect()
            gc.callbacks.append(counted)
            n = 0
            for _ in range(150):
                got = c.poll(max_records)
                n += len(got)
        finally:
            if counted in gc.callbacks:
                gc.callbacks.remove(counted)
            gc.set_threshold(*was)
        c.close()
        assert n == 150 * max_records and bytes(got[-1].value) == b"%06d" % (160 * max_records // 1000 - 1) * 16
        assert len(runs) <= 5, f"{len(runs)} collections in 150 polls (generations {runs[:20]})"


@needs_pool
def test_records_held_are_never_reused(tmp_path):
    """Records a caller still holds keep their contents however many Records are made after
    them (a Record is reused only when the pool holds its only reference)."""
    with pylog.Log(str(tmp_path / "l"), segment_bytes=1 << 18) as log:
        n = 20_000
        log.append_batch([b"%06d" % i * 8 for i in range(n)], keys=[b"k%d" % i if i % 3 else None for i in range(n)])
        log.roll()

        def want(o):
            return (o, None if o % 3 == 0 else b"k%d" % o, b"%06d" % o * 8)

        kept, singles, one_by_one = [], [], []
        for b, off in enumerate(range(0, n, 500)):
            batch = log.read_batch(off, max_records=500)
            if b % 5 == 0:
                kept.append(batch)
            singles.append(batch[b % 500])
        for r in log.scan():
            if r.offset % 997 == 0:
                one_by_one.append(r)
            del r
        for r in (*[r for b in kept for r in b], *singles, *one_by_one):
            assert (r.offset, _plain(r)[2], bytes(r.value)) == want(r.offset)
        assert len(one_by_one) == len(range(0, n, 997)) and len(kept) == 8


def _mapped(path):
    with open("/proc/self/maps") as f:
        return os.path.basename(path) in f.read()


@needs_pool
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_dropped_records_keep_no_map_alive(tmp_path):
    """A Record its user dropped keeps no map mapped: when the segment's maps are let go
    (here: retention deletes the segment), the pool lets go of what such Records hold; a
    Record still held keeps its view (and so the map) valid."""
    d = str(tmp_path / "l")
    log = pylog.Log(d, segment_bytes=1 << 16, retention_bytes=0)
    log.append_batch([b"%05d" % i * 20 for i in range(3000)])
    log.roll()
    first = log._sealed[0].store_path
    held = log.read_batch(0, max_records=5)
    for off in range(0, 600, 100):
        log.read_batch(off, max_records=100)  # dropped at once
    assert sum(1 for _ in log.scan(0, 600)) == 600
    log.close()
    log = pylog.Log(d, retention_bytes=0)
    log.enforce_retention()
    log.close()
    gc.collect()
    assert not os.path.exists(first) and _mapped(first)  # the held Records' views
    assert bytes(held[4].value) == b"00004" * 20
    del held
    gc.collect()
    d2 = str(tmp_path / "other")  # a fetch from another map lets go of the dropped ones
    with pylog.Log(d2) as other:
        other.append_batch([b"x"] * 10)
        other.roll()
        assert len(other.read_batch(0)) == 10
    assert not _mapped(first)


# ---- views made without slicing (FAST_VIEWS) ------------------------------------------------

def _view_facts(v):
    """Everything a caller can see of a view (or None)."""
    if v is None:
        return None
    sub = v[1:-1]
    return (bytes(v), v.tobytes(), len(v), v.nbytes, v.readonly, v.format, v.itemsize, v.ndim, v.shape, v.strides,
            v.suboffsets, v.c_contiguous, v.f_contiguous, v.contiguous, hash(v), v == bytes(v), bytes(sub),
            sub.shape, bytes(v.cast("c")), bytes(memoryview(v)), v.tolist(), type(v.obj))


@pytest.fixture(params=[True, False], ids=["fast-views", "sliced-views"])
def view_mode(request):
    """Both ways the extension makes a value's view: without a slice (where the import-time
    layout check passed) and by slicing the map's view."""
    was = speedups._set_fast_views(request.param)
    yield request.param
    speedups._set_fast_views(was)


@needs_speedups
@pytest.mark.skipif(bool(sysconfig.get_config_var("Py_GIL_DISABLED")) or sys.version_info >= (3, 15),
                    reason="the memoryview layout is checked on CPython 3.10-3.14 with the GIL")
def test_views_are_made_without_slicing_here():
    """The import-time check found this interpreter's memoryviews laid out as the extension
    expects, so scans and reads make their views without a slice (a third of a scanned
    Record's time); were it wrong, views would silently be made the slow way."""
    assert speedups.FAST_VIEWS == 1
    assert speedups._set_fast_views(True) is True


@needs_speedups
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=records.filter(bool), gaps=st.booleans(), lazy=st.booleans())
def test_views_made_without_slicing_are_the_slices(recs, gaps, lazy):
    """A key, value or metadata view made without a slice is in every visible way the view
    slicing the map makes: bytes, length, shape, strides, flags, hash, sub-slices, casts,
    its exporter; for scans (list and lazy), reads and a Reader's reads."""
    data, written, index = _store(recs, gaps, 64, with_index=True)
    mv, addr, length, keep = _c_map(data)
    count = written[-1][1] + 1 - 1000
    got = {}
    was = speedups._set_fast_views(True)
    try:
        for fast in (True, False):
            speedups._set_fast_views(fast)
            recs_ = list(speedups.scan(mv, addr, length, fmt.FILE_HEADER_SIZE, written[0][1], 1000, (1 << 64) - 1,
                                       gaps, lazy)[0])
            reads = [speedups.read(mv, addr, length, 0, 0, 1000, gaps, o) for _p, o, *_ in written]
            reader = _reader(data, index, gaps, count)
            reads += [reader.read(o) for _p, o, *_ in written]
            got[fast] = [(r.offset, r.timestamp, *map(_view_facts, r[2:])) for r in recs_ + reads]
    finally:
        speedups._set_fast_views(was)
    by_off = {o: (o, t, k, v, m) for _p, o, t, k, v, m in written}
    assert got[True] == got[False]
    assert [(o, t, *(f and f[0] for f in fs)) for o, t, *fs in got[True]] == [by_off[o] for o, *_ in got[True]]
    assert len(got[True]) == 3 * len(written)


@needs_speedups
def test_a_released_map_view_is_refused_not_read(view_mode):
    """A map view released by its owner: the scan raises (it reads nothing through it), as
    slicing a released view does."""
    data, written = _store([(b"k", b"v" * 30, None, 0, 1)] * 5, False)
    mv, addr, length, keep = _c_map(data)
    recs, *_ = speedups.scan(mv, addr, length, fmt.FILE_HEADER_SIZE, None, 10, (1 << 64) - 1, False, True)
    first = next(recs)
    mv.release()
    with pytest.raises(ValueError):
        next(recs)
    with pytest.raises(ValueError):
        speedups.read(mv, addr, length, 0, 0, 1000, False, 1001)
    assert bytes(first.value) == b"v" * 30  # a view made before still reads its bytes


@needs_speedups
def test_views_outlive_close_and_retention(tmp_path, view_mode):
    """Views made either way hold the map: a lazily made scan's Records, reads and fetches
    read their bytes after the log is closed and retention deleted their segment; views of
    views, their release and the collector change nothing for the others."""
    d = str(tmp_path / "l")
    log = pylog.Log(d, segment_bytes=1 << 16, retention_bytes=0)
    log.append_batch([b"%05d" % i * 20 for i in range(2000)], keys=[b"k%d" % i for i in range(2000)],
                     metadata=[b"m" * (i % 3) for i in range(2000)])
    log.roll()
    seg = log._sealed[0]
    it = log.scan(0, 300)
    first = next(it)
    one, batch = log.read(1), log.read_batch(2, max_records=10)
    sub = first.value[5:10]
    again = memoryview(one.value)
    log.close()
    log = pylog.Log(d, retention_bytes=0)
    log.enforce_retention()
    log.close()
    assert not os.path.exists(seg.store_path)
    rest = list(it)  # made after the segment was deleted, from the lazy iterator's map
    gc.collect()
    again.release()
    assert len(rest) == 299 and [r.offset for r in rest] == list(range(1, 300))
    assert all(bytes(r.value) == b"%05d" % r.offset * 20 and bytes(r.key) == b"k%d" % r.offset and
               bytes(r.metadata) == b"m" * (r.offset % 3) for r in rest)
    assert bytes(first.value) == b"00000" * 20 and bytes(sub) == b"00000" and bytes(one.value) == b"00001" * 20
    assert bytes(batch[-1].value) == b"00011" * 20 and bytes(batch[-1].key) == b"k11"
    assert first.value.shape == (100,) and first.value.strides == (1,) and first.value.readonly


@pytest.mark.skipif(speedups is None, reason="pylog._speedups is not built")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc symbol versions are Linux's")
def test_the_c_modules_need_no_glibc_newer_than_2_17():
    """The built modules reference no glibc symbol version above 2.17, so the wheels stay
    manylinux2014 (Debian 11, Ubuntu 20.04, RHEL 8, Raspberry Pi OS bullseye). glibc 2.34
    moved libpthread into libc and gave some moved functions (pthread_mutexattr_*,
    pthread_condattr_setclock) a GLIBC_2.34 version: using them made the ARM wheels
    manylinux_2_34, which the ARM suite's wheel install refused."""
    import shutil

    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    import pylog._cffi as cffi_mod

    for mod in (speedups, cffi_mod):
        out = subprocess.run([objdump, "-T", mod.__file__], capture_output=True, text=True, check=True).stdout
        versions = {tuple(int(x) for x in v.split(".")) for v in
                    (w[len("GLIBC_"):].rstrip(")") for w in out.replace("(", " ").split() if w.startswith("GLIBC_2"))}
        too_new = sorted(v for v in versions if v > (2, 17))
        assert versions and not too_new, (mod.__file__, too_new)
