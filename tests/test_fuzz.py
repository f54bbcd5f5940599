"""The frame decoder and recovery under hypothesis, over random and mutated store bytes.

* the C scan, find and recovery walk agree with the pure-Python twin (``pylog._pure``,
  the oracle) on every buffer: status, frames and end position;
* opening a log whose active store holds any bytes at all never crashes nor hangs: it ends
  at the last whole valid frame (as the oracle counts them), reads back exactly those
  records and accepts appends;
* a lying length field never makes anyone allocate its claimed size.

(atheris is not used: hypothesis drives the same entry points, shrinks failures, and needs
nothing outside the test requirements.)
"""
from __future__ import annotations

import datetime
import os
import random
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog import _pure, checkpoint
from pylog import format as fmt

native = pytest.importorskip("pylog._native")

HDR = fmt.FILE_HEADER_SIZE
FAST = settings(deadline=datetime.timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow])


def framed(records: list[tuple[bytes | None, bytes | None, bytes | None]], base: int = 0,
           ts0: int = 1000) -> bytes:
    """A store file (header + frames) made by the pure backend's framing."""
    a = _pure.Appender(base, next_offset=base, position=HDR, max_position=fmt.MAX_SEGMENT_BYTES,
                       max_timestamp=None, index_interval=0, bytes_since_index=0, index_cap=1 << 16,
                       buffer_bytes=1 << 22)
    for i, (k, m, v) in enumerate(records):
        attrs = (k is None) | (m is None) << 1 | (v is None) << 2
        assert a.frame(v, k, m, attrs, ts0 + i) >= 0
    return _pure.header_encode(fmt.STORE_MAGIC, base) + bytes(a.pending())


blobs = st.one_of(st.none(), st.binary(max_size=40))
record_lists = st.lists(st.tuples(blobs, blobs, blobs), max_size=12)


@st.composite
def store_bytes(draw) -> bytes:
    """Valid frames, then mutations: bit flips, byte overwrites (lengths that lie), cuts,
    inserted or appended garbage."""
    data = bytearray(framed(draw(record_lists)))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "u32", "cut", "insert", "append", "zero"]))
        if kind == "flip" and len(data) > HDR:
            i = draw(st.integers(HDR, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "u32" and len(data) >= HDR + 4:
            i = draw(st.integers(HDR, len(data) - 4))
            v = draw(st.sampled_from([0, 1, 27, 28, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])
                     | st.integers(0, 0xFFFFFFFF))
            data[i : i + 4] = struct.pack("<I", v)
        elif kind == "cut" and len(data) > HDR:
            del data[draw(st.integers(HDR, len(data))):]
        elif kind == "insert":
            i = draw(st.integers(HDR, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=40))
        elif kind == "append":
            data += draw(st.binary(max_size=200))
        elif kind == "zero" and len(data) > HDR:
            i = draw(st.integers(HDR, len(data) - 1))
            n = draw(st.integers(1, 512))
            data[i : i + n] = bytes(min(n, len(data) - i))
    return bytes(data)


def _scan(impl, data: bytes, start: int, expected, max_out: int, max_bytes: int, gaps: bool):
    rc, frames, end = impl.scan(impl.Buffer(data), len(data), start, expected, max_out, max_bytes, gaps)
    return int(rc), np.asarray(frames).tolist(), int(end)


@FAST
@given(store_bytes(), st.integers(0, 64), st.booleans(), st.integers(1, 20), st.integers(0, 2000),
       st.booleans())
def test_scan_native_and_pure_agree(data, start_shift, from_header, max_out, max_bytes, gaps):
    start = HDR if from_header else min(len(data), HDR + start_shift)
    for expected in (None, 0, 3):
        assert _scan(native, data, start, expected, max_out, max_bytes, gaps) == \
            _scan(_pure, data, start, expected, max_out, max_bytes, gaps)


@FAST
@given(st.binary(max_size=600), st.integers(0, 600), st.integers(1, 10))
def test_scan_random_bytes_agree(data, start, max_out):
    start = min(start, len(data))
    assert _scan(native, data, start, None, max_out, 1 << 20, False) == \
        _scan(_pure, data, start, None, max_out, 1 << 20, False)


def _recover(impl, data: bytes, interval: int):
    a = impl.Appender(0, next_offset=0, position=HDR, max_position=fmt.MAX_SEGMENT_BYTES, max_timestamp=None,
                      index_interval=interval, bytes_since_index=interval, index_cap=4, buffer_bytes=0)
    rc, n = a.recover(impl.Buffer(data), len(data)) if len(data) >= HDR else (None, 0)
    if rc is None:
        return None
    return (int(rc), n, a.next_offset, a.position, a.max_timestamp, a.index_count,
            a.index_bytes(0, a.index_count), a.timeindex_bytes(0, a.index_count))


@FAST
@given(store_bytes(), st.sampled_from([0, 1, 64, 4096]))
def test_recovery_walk_native_and_pure_agree(data, interval):
    assert _recover(native, data, interval) == _recover(_pure, data, interval)


@FAST
@given(store_bytes(), st.integers(0, 15))
def test_find_native_and_pure_agree(data, target):
    a = _pure.Appender(0, next_offset=0, position=HDR, max_position=fmt.MAX_SEGMENT_BYTES, max_timestamp=None,
                       index_interval=0, bytes_since_index=0, index_cap=64, buffer_bytes=0)
    a.recover(_pure.Buffer(data), len(data))
    n = a.index_count
    ib = a.index_bytes(0, n)
    got = [impl.find(impl.Buffer(data), len(data), impl.Buffer(ib) if n else None, n, 0, target)
           for impl in (native, _pure)]
    assert (int(got[0][0]), got[0][1]) == (int(got[1][0]), got[1][1])


def oracle_whole_frames(data: bytes) -> tuple[int, set[int], int]:
    """(next offset, damaged offsets) of a store under the rule "recovery cuts only a torn
    tail": whole, valid frames with consecutive offsets from 0 follow the header; a bad
    region is stepped over when a whole valid frame follows it at the earliest position whose
    offset the skipped bytes could account for (at most one record per frame header's size),
    the offsets in between damaged; bad bytes with no such frame after them end the store.
    The third value counts the bad regions stepped over (junk may lose no offset)."""
    mv = memoryview(data)
    pos, nxt, damaged, regions = HDR, 0, set(), 0
    while pos < len(data):
        rc, f = _pure._decode(mv, len(data), pos)
        if rc == _pure.OK and f[1] == nxt:
            pos, nxt = pos + f[3], nxt + 1
            continue
        for p in range(pos + 1, len(data)):
            rc, f = _pure._decode(mv, len(data), p)
            if rc == _pure.OK and nxt <= f[1] <= nxt + (p - pos) // fmt.FRAME_HEADER_SIZE:
                damaged.update(range(nxt, f[1]))
                pos, nxt, regions = p, f[1], regions + 1
                break
        else:
            break
    return nxt, damaged, regions


def oracle_torn_prefix(data: bytes) -> int:
    """The next offset of a store none of whose bytes are known durable: the whole, valid
    frames with consecutive offsets from 0 up to the first bad one (a torn write: whatever
    follows it is cut), cut back to the end of the last write unit (a frame without
    ``ATTR_UNIT_CONTINUES``)."""
    mv = memoryview(data)
    pos, nxt, unit_end = HDR, 0, 0
    while pos < len(data):
        rc, f = _pure._decode(mv, len(data), pos)
        if rc != _pure.OK or f[1] != nxt:
            break
        pos, nxt = pos + f[3], nxt + 1
        if not f[4] & fmt.ATTR_UNIT_CONTINUES:
            unit_end = nxt
    return unit_end


_COUNTER = [0]


@settings(deadline=datetime.timedelta(seconds=20), max_examples=40,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(store_bytes(), st.booleans(), st.booleans())
def test_open_any_active_store(tmp_path, data, keep_index, durable):
    """Recovery over arbitrary bytes: no crash, appends resume. When the bytes are known
    durable (a durable-point mark past them): interior damage kept and reported, a torn tail
    cut after the last whole frame. When none is (a mark at 0): a torn write, cut at the
    first bad frame and back to the end of a write unit, silently."""
    _COUNTER[0] += 1
    path = str(tmp_path / f"log{_COUNTER[0]}")
    with pylog.Log(path, fsync="never", index_interval_bytes=64):
        pass
    store = os.path.join(path, fmt.segment_name(0, fmt.STORE_SUFFIX))
    with open(store, "wb") as f:
        f.write(data)
    if not keep_index:
        os.unlink(os.path.join(path, fmt.segment_name(0, fmt.INDEX_SUFFIX)))
    os.unlink(os.path.join(path, fmt.CLEAN_SHUTDOWN_FILE))
    checkpoint.write_durable_point(path, 0, 1 << 62 if durable else 0)
    if not durable:
        want = oracle_torn_prefix(data) if len(data) >= HDR else 0
        with pylog.Log(path) as log:
            assert log.next_offset == want
            assert log.recovery_report == [] and log.verify() == []
            assert [r.offset for r in log.scan()] == list(range(want))
            assert log.append(b"after") == want
        return
    want, damaged, regions = oracle_whole_frames(data) if len(data) >= HDR else (0, set(), 0)
    with pylog.Log(path) as log:
        assert log.next_offset == want
        if damaged:  # interior damage is kept, reported and never skipped by a scan
            with pytest.raises(pylog.CorruptRecordError) as e:
                list(log.scan())
            assert e.value.offset == min(damaged)
            assert log.verify() and {e.offset for e in log.recovery_report} - {None} <= damaged
            for o in range(want):
                if o in damaged:
                    with pytest.raises(pylog.CorruptRecordError):
                        log.read(o)
                else:
                    assert log.read(o).offset == o
        else:  # junk that loses no record is reported, and a scan reads every record
            recs = list(log.scan())
            assert [r.offset for r in recs] == list(range(want))
            assert len(log.verify()) == regions
        assert log.append(b"after") == want
    with pylog.Log(path) as log:
        assert bytes(log.read(want).value) == b"after"


@pytest.mark.parametrize("claimed", [0x7FFFFFFF, 0x7FFFFFF0, 0x40000000, 0xFFFFFFFF])
def test_lying_length_allocates_nothing(claimed):
    """A frame claiming up to 2 GiB: decoding, scanning and recovery allocate nothing near it."""
    data = framed([(None, None, b"ok")]) + struct.pack("<IIQqIII", claimed, 0, 1, 0, 0, 0, 0) + bytes(64)
    tracemalloc.start()
    try:
        for impl in (native, _pure):
            rc, frames, _ = impl.scan(impl.Buffer(data), len(data), HDR, 0, 8, 1 << 40, False)
            assert len(frames) == 1 and rc != impl.OK
            assert _recover(impl, data, 0)[2] == 1
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_random_files_never_crash_decoder():
    """Plain random files, a few thousand, through both backends (no hypothesis shrinking
    needed: the property is that nothing raises or hangs)."""
    rng = random.Random(1)
    for i in range(2000):
        data = _pure.header_encode(fmt.STORE_MAGIC, 0) + rng.randbytes(rng.randint(0, 300))
        if rng.random() < 0.5:  # a plausible first length field
            data = data[:HDR] + struct.pack("<I", rng.randint(28, 300)) + data[HDR + 4:]
        assert _recover(native, data, 64) == _recover(_pure, data, 64)
        assert _scan(native, data, HDR, 0, 16, 1 << 20, False) == _scan(_pure, data, HDR, 0, 16, 1 << 20, False)
