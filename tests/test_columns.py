"""The columnar scan (``scan_columns``): the C core against the pure-Python oracle, and both
against the records that were framed."""
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pylog import _pure
from pylog import format as fmt
from pylog._backend import impl
from pylog._columns import Columns

BACKENDS = [impl, _pure] if impl is not _pure else [_pure]
BASE = 100

records = st.lists(
    st.tuples(st.none() | st.binary(max_size=30), st.none() | st.binary(max_size=30),
              st.none() | st.binary(max_size=200), st.integers(0, 3)),
    min_size=1, max_size=60,
)


def _frame_all(recs, gaps=False):
    """A store buffer (header + frames) of ``recs`` = (key, metadata, value, skip) tuples;
    with ``gaps``, ``skip`` offsets are left out before each record (a compacted segment).
    Returns (buffer, offsets, frame positions)."""
    a = impl.Appender(BASE, next_offset=BASE, position=32, max_position=1 << 30, max_timestamp=None,
                      index_interval=1 << 20, bytes_since_index=0, index_cap=4, buffer_bytes=1 << 20)
    a.gaps = gaps
    offsets, positions = [], []
    for i, (k, m, v, skip) in enumerate(recs):
        if gaps and skip:
            a.next_offset = a.next_offset + skip
        attrs = (k is None) | (m is None) << 1 | (v is None) << 2
        positions.append(a.position)
        off = a.frame(v, k, m, attrs, 1000 + 7 * i)
        assert off >= 0
        offsets.append(off)
    flags = fmt.HEADER_COMPACTED if gaps else 0
    return impl.header_encode(fmt.STORE_MAGIC, BASE, flags) + bytes(a.pending()), offsets, positions


def _scan_all(mod, store, *, start=32, expected=BASE, stop=None, gaps=False, capacity=1000, caps=(0, 0, 0),
              grow=True):
    """Scan until a stop that is not E_SPACE (growing the full columns); returns the
    Columns, the statuses and ends of every call, and the rows each call added."""
    cols = Columns(capacity, attributes=True, key=caps[0], metadata=caps[1], value=caps[2])
    calls = []
    pos = start
    buf = mod.Buffer(store)
    while True:
        rc, n, end = mod.scan_columns(buf, len(store), pos, expected, stop, cols, gaps)
        calls.append((rc, n, end))
        if n and expected is not None:
            expected = int(cols.offsets[cols.rows - 1]) + 1
        pos = end
        if rc == mod.E_SPACE and grow:
            assert any(c.need for _n, c in cols.binary())
            assert cols.grow_for_space()
            continue
        return cols, calls


def _snapshot(cols):
    """Everything a scan wrote that a reader may look at, as plain Python values."""
    n = cols.rows
    out = {"rows": n, "offsets": cols.offsets[:n].tolist(), "timestamps": cols.timestamps[:n].tolist(),
           "attributes": cols.attributes[:n].tolist()}
    for name, c in cols.binary():
        used = c.used(n)
        out[name] = (c.offsets[: n + 1].tolist(), bytes(c.data[:used]), bytes(c.validity[: (n + 7) // 8]),
                     c.null_count)
    return out


def _values(cols, name):
    """Row values of a binary column (None for nulls), decoded the way Arrow would."""
    c = getattr(cols, name)
    out = []
    for i in range(cols.rows):
        valid = (c.validity[i >> 3] >> (i & 7)) & 1
        out.append(bytes(c.data[c.offsets[i] : c.offsets[i + 1]]) if valid else None)
    return out


@given(records, st.booleans(), st.integers(1, 70), st.sampled_from([(0, 0, 0), (5, 3, 64), (1 << 16,) * 3]))
def test_backends_agree_and_match_the_records(recs, gaps, capacity, caps):
    store, offsets, _ = _frame_all(recs, gaps)
    snaps = []
    for mod in BACKENDS:
        cols, calls = _scan_all(mod, store, gaps=gaps, capacity=capacity, caps=caps)
        snaps.append((_snapshot(cols), calls))
        want = min(capacity, len(recs))
        assert calls[-1][0] == mod.OK
        assert cols.rows == want
        assert sum(n for _rc, n, _end in calls) == want
        assert cols.offsets[:want].tolist() == offsets[:want]
        assert cols.timestamps[:want].tolist() == [1000 + 7 * i for i in range(want)]
        assert _values(cols, "key") == [r[0] for r in recs[:want]]
        assert _values(cols, "metadata") == [r[1] for r in recs[:want]]
        assert _values(cols, "value") == [r[2] for r in recs[:want]]
        assert cols.value.null_count == sum(r[2] is None for r in recs[:want])
        if want == len(recs):
            assert calls[-1][2] == len(store)
    assert snaps[0] == snaps[-1]


@given(records, st.data())
def test_a_bad_byte_stops_the_scan_with_the_rows_before_it(recs, data):
    store, _offsets, positions = _frame_all(recs)
    j = data.draw(st.integers(0, len(recs) - 1))
    end_j = positions[j + 1] if j + 1 < len(recs) else len(store)
    i = data.draw(st.integers(positions[j], end_j - 1))  # a byte of frame j
    bad = bytearray(store)
    bad[i] ^= 1 << data.draw(st.integers(0, 7))
    snaps = []
    for mod in BACKENDS:
        cols, calls = _scan_all(mod, bytes(bad))
        rc, _n, end = calls[-1]
        assert rc not in (mod.OK, mod.E_SPACE), "a flipped bit must be detected"
        assert cols.rows == j and end == positions[j], "exactly the frames before the bad one"
        assert _values(cols, "value") == [r[2] for r in recs[:j]]
        snaps.append((_snapshot(cols), calls))
    assert snaps[0] == snaps[-1]


def test_crc_mismatch_mid_buffer_in_a_compacted_segment():
    recs = [(b"k%d" % i, None if i % 2 else b"m", None if i == 4 else b"v" * i, i % 3) for i in range(10)]
    store, offsets, positions = _frame_all(recs, gaps=True)
    bad = bytearray(store)
    bad[positions[6] + fmt.FRAME_HEADER_SIZE] ^= 0xFF  # the first key byte of record 6
    for mod in BACKENDS:
        cols, calls = _scan_all(mod, bytes(bad), gaps=True)
        assert (calls[-1][0], calls[-1][2], cols.rows) == (mod.E_CRC, positions[6], 6)
        assert cols.offsets[:6].tolist() == offsets[:6]
        assert _values(cols, "value")[4] is None  # the tombstone
        assert cols.value.null_count == 1


def test_stop_offset_and_expected_offset():
    recs = [(None, None, b"x%d" % i, 2) for i in range(8)]
    store, offsets, positions = _frame_all(recs, gaps=True)  # offsets 102, 105, 108, ...
    for mod in BACKENDS:
        # stop between two kept offsets: the frame past it is left for the next reader
        cols, calls = _scan_all(mod, store, gaps=True, stop=offsets[3] - 1)
        assert (calls[-1][0], calls[-1][2], cols.rows) == (mod.OK, positions[3], 3)
        assert cols.offsets[:3].tolist() == offsets[:3]
        # without gaps, a skipped offset is an error
        cols, calls = _scan_all(mod, store, gaps=False)
        assert calls[-1][0] == mod.E_OFFSET and cols.rows == 0
        # no expectation: any offsets
        cols, calls = _scan_all(mod, store, expected=None)
        assert (calls[-1][0], calls[-1][2], cols.rows) == (mod.OK, len(store), 8)
        # starting mid-buffer, at a frame
        cols, calls = _scan_all(mod, store, start=positions[5], expected=offsets[5], gaps=True)
        assert (calls[-1][0], calls[-1][2], cols.rows) == (mod.OK, len(store), 3)
        assert cols.offsets[:3].tolist() == offsets[5:]


def test_a_full_column_refuses_the_whole_row():
    recs = [(b"kk", None, b"v" * 10, 0) for _ in range(5)]
    store, _offsets, positions = _frame_all(recs)
    for mod in BACKENDS:
        cols, calls = _scan_all(mod, store, caps=(100, 0, 25), grow=False)
        assert calls == [(mod.E_SPACE, 2, positions[2])]
        assert cols.value.need == 30 and cols.key.need == 0
        assert cols.key.used(2) == 4 and cols.value.used(2) == 20
        # grown, the scan goes on from where it stopped
        assert cols.grow_for_space()
        rc, n, end = mod.scan_columns(mod.Buffer(store), len(store), positions[2], BASE + 2, None, cols)
        assert (rc, n, end) == (mod.OK, 3, len(store))
        assert _values(cols, "value") == [b"v" * 10] * 5


def test_columns_not_collected_are_left_alone():
    recs = [(b"k%d" % i, b"m", b"v%d" % i, 0) for i in range(20)]
    store, offsets, _ = _frame_all(recs)
    for mod in BACKENDS:
        cols = Columns(32, timestamps=False, key=None, metadata=None, value=64)
        rc, n, end = mod.scan_columns(mod.Buffer(store), len(store), 32, BASE, None, cols)
        assert (rc, n, end) == (mod.OK, 20, len(store))
        assert cols.offsets[:20].tolist() == offsets
        assert _values(cols, "value") == [r[2] for r in recs]


@pytest.mark.parametrize("claimed", [0, 27, 0x7FFFFFFF, 0xFFFFFFF0])
def test_lying_length_fields_never_read_past_the_buffer(claimed):
    buf = struct.pack("<II", claimed, 0) + bytes(40)
    for mod in BACKENDS:
        cols = Columns(4)
        rc, n, end = mod.scan_columns(mod.Buffer(buf), len(buf), 0, None, None, cols)
        assert rc in (mod.E_LENGTH, mod.E_SHORT) and n == 0 and end == 0


def test_bad_arguments():
    store, _o, _p = _frame_all([(None, None, b"v", 0)])
    for mod in BACKENDS:
        cols = Columns(2)
        cols.rows = 3  # more rows than room
        assert mod.scan_columns(mod.Buffer(store), len(store), 32, BASE, None, cols)[0] == mod.E_ARG
        cols = Columns(2)
        cols.value.offsets[0] = -1  # a negative start of the data
        assert mod.scan_columns(mod.Buffer(store), len(store), 32, BASE, None, cols)[0] == mod.E_ARG
        cols = Columns(0)  # no room at all: nothing read
        assert mod.scan_columns(mod.Buffer(store), len(store), 32, BASE, None, cols) == (mod.OK, 0, 32)


def test_appending_to_earlier_rows_keeps_the_bitmap_bits():
    # 11 rows in two calls whose boundary falls inside a validity byte
    recs = [(None, None, None if i % 3 == 0 else b"%d" % i, 0) for i in range(11)]
    store, _offsets, positions = _frame_all(recs)
    for mod in BACKENDS:
        cols = Columns(5, attributes=True, key=0, metadata=0, value=64)
        rc, n, end = mod.scan_columns(mod.Buffer(store), len(store), 32, BASE, None, cols)
        assert (rc, n, end) == (mod.OK, 5, positions[5])
        more = Columns(11, attributes=True, key=0, metadata=0, value=64)
        for name, c in cols.binary():  # carry the 5 rows over into a bigger set of buffers
            m = getattr(more, name)
            m.offsets[:6] = c.offsets[:6]
            m.data[: c.used(5)] = c.data[: c.used(5)]
            m.validity[:1] = c.validity[:1]
            m.null_count = c.null_count
        more.rows = 5
        rc, n, end = mod.scan_columns(mod.Buffer(store), len(store), end, BASE + 5, None, more)
        assert (rc, n, end) == (mod.OK, 6, len(store))
        assert _values(more, "value") == [r[2] for r in recs]
        assert more.value.null_count == 4
        assert np.unpackbits(more.value.validity[:2], bitorder="little")[:11].tolist() == \
            [int(r[2] is not None) for r in recs]


def test_bad_frames_are_found_where_the_scan_checks_three_crcs_at_once():
    """The C scan checks the CRCs of small frames three at a time (bodies up to 4 KiB) and
    of larger ones one by one: a bad byte in any frame of a mix of both, at any place in a
    group of three, still stops the scan exactly before that frame."""
    sizes = [100, 20, 4000, 4060, 4100, 7, 0, 9000, 64, 65, 66, 4068, 4069, 1, 2, 3, 12000, 5]
    recs = [(None, None, bytes([i]) * s, 0) for i, s in enumerate(sizes)]
    store, _offsets, positions = _frame_all(recs)
    ends = positions[1:] + [len(store)]
    for mod in BACKENDS:
        cols, calls = _scan_all(mod, store)
        assert calls[-1][0] == mod.OK and _values(cols, "value") == [r[2] for r in recs]
    for j in range(len(recs)):
        for where in (positions[j] + 5, min(positions[j] + 40, ends[j] - 1), ends[j] - 1):  # crc, a value byte, last
            bad = bytearray(store)
            bad[where] ^= 0x10
            for mod in BACKENDS:
                cols, calls = _scan_all(mod, bytes(bad))
                assert calls[-1][0] == mod.E_CRC, (j, where)
                assert cols.rows == j and calls[-1][2] == positions[j], (j, where)
