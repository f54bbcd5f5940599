"""Frame encoding, scanning and finding: the C core against the pure-Python oracle."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pylog import _pure
from pylog import format as fmt
from pylog._backend import impl

records = st.lists(
    st.tuples(st.none() | st.binary(max_size=30), st.none() | st.binary(max_size=30), st.binary(max_size=200)),
    min_size=1, max_size=60,
)


def _frame_all(mod, recs, interval, base=100):
    a = mod.Appender(base, next_offset=base, position=32, max_position=1 << 30, max_timestamp=None,
                     index_interval=interval, bytes_since_index=interval, index_cap=4, buffer_bytes=1 << 20)
    for i, (k, m, v) in enumerate(recs):
        attrs = (k is None) | (m is None) << 1
        n = a.frame(v, k, m, attrs, 1000 + i)
        if n == mod.E_INDEX_FULL:
            a.grow_index(a.index_count * 2 + 4)
            n = a.frame(v, k, m, attrs, 1000 + i)
        assert n == base + i
    body = bytes(a.pending())
    return a, mod.header_encode(fmt.STORE_MAGIC, base) + body


@given(records, st.sampled_from([0, 50, 4096]))
def test_native_frames_equal_pure_frames(recs, interval):
    a1, s1 = _frame_all(impl, recs, interval)
    a2, s2 = _frame_all(_pure, recs, interval)
    assert s1 == s2
    assert a1.index_bytes(0, a1.index_count) == a2.index_bytes(0, a2.index_count)
    assert a1.timeindex_bytes(0, a1.index_count) == a2.timeindex_bytes(0, a2.index_count)


@given(records, st.sampled_from([0, 50, 4096]))
def test_batch_framing_equals_one_by_one(recs, interval):
    _, one = _frame_all(impl, recs, interval)
    a = impl.Appender(100, next_offset=100, position=32, max_position=1 << 30, max_timestamp=None,
                      index_interval=interval, bytes_since_index=interval, index_cap=len(recs) + 1,
                      buffer_bytes=1 << 20)

    def join(items):
        return (b"".join(x or b"" for x in items),
                np.array([fmt.NULL_LEN if x is None else len(x) for x in items], dtype=np.uint32))

    kj, kl = join([r[0] for r in recs])
    mj, ml = join([r[1] for r in recs])
    vj, vl = join([r[2] for r in recs])
    ts = np.arange(1000, 1000 + len(recs), dtype=np.int64)
    rc, n = a.frame_batch(vj, vl, kj, kl, mj, ml, ts, 0)
    assert (rc, n) == (impl.OK, len(recs))
    assert fmt.STORE_MAGIC and impl.header_encode(fmt.STORE_MAGIC, 100) + bytes(a.pending()) == one


@given(records, st.data())
def test_scan_and_find_agree_across_backends(recs, data):
    a, store = _frame_all(impl, recs, 64)
    ib = a.index_bytes(0, a.index_count)
    for mod in (impl, _pure):
        rc, frames, end = mod.scan(mod.Buffer(store), len(store), 32, 100, 1000, 1 << 40)
        assert rc == mod.OK and end == len(store) and len(frames) == len(recs)
        assert frames["offset"].tolist() == list(range(100, 100 + len(recs)))
        for i, (k, m, v) in enumerate(recs):
            f = frames[i]
            p = int(f["position"]) + 36 + int(f["key_length"]) + int(f["metadata_length"])
            assert store[p : p + int(f["value_length"])] == v
    target = data.draw(st.integers(100, 99 + len(recs)))
    got = [mod.find(mod.Buffer(store), len(store), mod.Buffer(ib), a.index_count, 100, target) for mod in (impl, _pure)]
    assert got[0] == got[1]
    assert got[0][0] == impl.OK and got[0][1][1] == target


@given(records, st.data())
def test_scan_stops_at_first_bad_byte(recs, data):
    _, store = _frame_all(impl, recs, 4096)
    i = data.draw(st.integers(32, len(store) - 1))
    bad = bytearray(store)
    bad[i] ^= 1 << data.draw(st.integers(0, 7))
    for mod in (impl, _pure):
        rc, frames, end = mod.scan(mod.Buffer(bytes(bad)), len(bad), 32, 100, 1000, 1 << 40)
        assert rc != mod.OK, "a flipped bit must be detected"
        assert end <= i, "no frame containing the flipped byte is returned"


@pytest.mark.parametrize("claimed", [0, 27, 0x7FFFFFFF, 0xFFFFFFF0])
def test_lying_length_fields_never_read_past_the_buffer(claimed):
    import struct

    buf = struct.pack("<II", claimed, 0) + bytes(40)
    for mod in (impl, _pure):
        rc, frames, end = mod.scan(mod.Buffer(buf), len(buf), 0, None, 10, 1 << 40)
        assert rc in (mod.E_LENGTH, mod.E_SHORT) and len(frames) == 0


def test_min_one_frame_even_over_budget():
    _, store = _frame_all(impl, [(None, None, b"x" * 500)] * 3, 4096)
    rc, frames, _ = impl.scan(impl.Buffer(store), len(store), 32, 100, 10, 1)
    assert rc == impl.OK and len(frames) == 1


def _lay_out(recs):
    """Records as frames with a gap for each header, and their lengths (NULL_LEN for None)."""
    gap = bytes(fmt.FRAME_HEADER_SIZE)
    buf = bytearray(b"".join(gap + (k or b"") + (m or b"") + v for k, m, v in recs))
    lens = [np.array([fmt.NULL_LEN if r[j] is None else len(r[j]) for r in recs], dtype=np.uint32)
            for j in range(3)]
    return buf, lens


@given(records, st.sampled_from([0, 50, 4096]))
def test_in_place_framing_equals_copying(recs, interval):
    """Frames made in place (both backends) are the bytes plog_frame_batch copies, with the
    same index entries."""
    _, one = _frame_all(impl, recs, interval)
    ts = np.arange(1000, 1000 + len(recs), dtype=np.int64)
    for mod in (impl, _pure):
        a = mod.Appender(100, next_offset=100, position=32, max_position=1 << 30, max_timestamp=None,
                         index_interval=interval, bytes_since_index=interval, index_cap=len(recs) + 1,
                         buffer_bytes=1 << 20)
        buf, (kl, ml, vl) = _lay_out(recs)
        rc, n, written = a.frame_in_place(buf, vl, kl, ml, ts, 0)
        assert (rc, n, written) == (mod.OK, len(recs), len(buf))
        assert impl.header_encode(fmt.STORE_MAGIC, 100) + bytes(buf) == one
        assert a.position == len(one) and a.next_offset == 100 + len(recs) and a.used == 0
        b, _ = _frame_all(mod, recs, interval)
        assert a.index_bytes(0, a.index_count) == b.index_bytes(0, b.index_count)


def test_in_place_framing_stops_at_a_full_segment_and_goes_on_in_the_next():
    recs = [(None, None, bytes([i]) * 100) for i in range(10)]
    for mod in (impl, _pure):
        buf, (kl, ml, vl) = _lay_out(recs)
        a = mod.Appender(0, next_offset=0, position=32, max_position=32 + 4 * 136, max_timestamp=None,
                         index_interval=0, bytes_since_index=0, index_cap=64, buffer_bytes=1 << 16)
        rc, n, written = a.frame_in_place(buf, vl, kl, ml, None, 7)
        assert (rc, n, written) == (mod.E_SEGMENT_FULL, 4, 4 * 136)
        b = mod.Appender(4, next_offset=4, position=32, max_position=1 << 20, max_timestamp=7,
                         index_interval=0, bytes_since_index=0, index_cap=64, buffer_bytes=1 << 16)
        rc, n, written = b.frame_in_place(memoryview(buf)[written:], vl[4:], None, None, None, 7)
        assert (rc, n, written) == (mod.OK, 6, 6 * 136)
        rc, frames, _ = mod.scan(mod.Buffer(bytes(32) + bytes(buf[4 * 136 :])), 32 + 6 * 136, 32, 4, 100, 1 << 20)
        assert rc == mod.OK and frames["offset"].tolist() == list(range(4, 10))


def test_in_place_framing_refuses_a_buffer_that_does_not_fit_or_pending_bytes():
    recs = [(None, None, b"x" * 10)] * 3
    for mod in (impl, _pure):
        buf, (kl, ml, vl) = _lay_out(recs)
        a = mod.Appender(0, next_offset=0, position=32, max_position=1 << 20, max_timestamp=None,
                         index_interval=0, bytes_since_index=0, index_cap=64, buffer_bytes=1 << 16)
        before = bytes(buf)
        assert a.frame_in_place(buf + b"!", vl, kl, ml, None, 0)[0] == mod.E_ARG
        assert a.frame_in_place(buf[:-1], vl, kl, ml, None, 0)[0] == mod.E_ARG
        assert a.frame(b"y", None, None, 3, 0) == 0  # one record pending in the write buffer
        assert a.frame_in_place(buf, vl, kl, ml, None, 0)[0] == mod.E_ARG
        assert bytes(buf) == before and a.next_offset == 1
