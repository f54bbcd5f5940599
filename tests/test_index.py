"""Index search in C against bisect; index checks; numpy views of index files."""
import bisect
import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import pylog
from pylog import _pure
from pylog import format as fmt
from pylog._backend import impl


def _index(rels, positions):
    return b"".join(struct.pack("<II", r, p) for r, p in zip(rels, positions))


sorted_rels = st.lists(st.integers(0, 1 << 32 - 1), unique=True, max_size=300).map(sorted)


@given(sorted_rels, st.integers(0, (1 << 32) - 1), st.integers(0, 7))
def test_index_lookup_matches_bisect(rels, target, skip):
    raw = bytes(skip) + _index(rels, range(32, 32 + len(rels)))  # any alignment
    buf = impl.Buffer(raw, skip=skip)
    got = impl.index_lookup(buf, len(rels), target)
    assert got == bisect.bisect_right(rels, target) - 1
    assert _pure.index_lookup(_pure.Buffer(raw, skip=skip), len(rels), target) == got


def test_index_lookup_every_target_of_even_and_skewed_indexes():
    """The C lookup guesses by interpolation before it bisects: check every target in and
    around the entries of an evenly spaced index (where the guess is right), a skewed one
    (squares: where it is wrong) and one with a single huge jump."""
    shapes = {
        "even": [i * 30 for i in range(2000)],
        "skewed": [i * i for i in range(2000)],
        "jump": list(range(1000)) + [(1 << 31) + i for i in range(1000)],
    }
    for name, rels in shapes.items():
        buf = impl.Buffer(_index(rels, range(32, 32 + len(rels))))
        targets = sorted({t for r in rels[:: 7] + rels[-20:] for t in (r - 1, r, r + 1) if t >= 0})
        targets += [0, rels[-1] + 1000, (1 << 32) - 1]
        for t in targets:
            assert impl.index_lookup(buf, len(rels), t) == bisect.bisect_right(rels, t) - 1, (name, t)


@given(st.lists(st.integers(0, 1 << 50), max_size=300).map(sorted), st.integers(-5, 1 << 51))
def test_timeindex_lookup_matches_bisect(stamps, target):
    raw = b"".join(struct.pack("<qII", t, i, 32 + i) for i, t in enumerate(stamps))
    got = impl.timeindex_lookup(impl.Buffer(raw), len(stamps), target)
    assert got == bisect.bisect_left(stamps, target) - 1


@given(sorted_rels)
def test_index_check_accepts_increasing_and_rejects_disorder(rels):
    n = len(rels)
    good = _index(rels, range(32, 32 + n))
    assert impl.index_check(impl.Buffer(good), n, 32 + n + 36) == -1
    if n >= 2:
        bad = _index(rels[::-1], range(32, 32 + n))
        assert impl.index_check(impl.Buffer(bad), n, 32 + n + 36) >= 1
    if n:
        past_end = _index(rels, range(32, 32 + n))
        assert impl.index_check(impl.Buffer(past_end), n, 32) == 0


def test_sealed_index_is_a_numpy_view_and_exact_size(tmp_path):
    with pylog.Log(tmp_path / "l", segment_bytes=4096, index_interval_bytes=0) as log:
        log.append_batch([b"x" * 100] * 100)
        seg = log._sealed[0]
        arr = seg.index_array()
        assert arr.dtype == fmt.INDEX_DTYPE
        assert list(arr["relative_offset"]) == list(range(len(arr)))
        assert not arr.flags.writeable
        tarr = seg.timeindex_array()
        assert len(tarr) == len(arr)
        assert (np.diff(tarr["timestamp"]) >= 0).all()
        ipath = seg.store_path[: -len(".log")] + ".index"
        import os

        assert os.path.getsize(ipath) == 32 + 8 * len(arr)  # trimmed to its exact size
