"""Decode the committed format-v1 test vectors (written by an independent encoder)."""
import json
import os
import shutil

import pylog
from pylog import format as fmt
from pylog._backend import impl

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _expected():
    with open(os.path.join(DATA, "vectors.json")) as f:
        return json.load(f)


def _hex(b):
    return None if b is None else bytes(b).hex()


def test_vectors_decode_through_log(tmp_path):
    exp = _expected()
    d = tmp_path / "p"
    shutil.copytree(os.path.join(DATA, "vectors"), d)
    with pylog.Log(d) as log:  # an unclean open: a full CRC walk of the store
        assert log.start_offset == exp["base_offset"]
        assert log.next_offset == exp["base_offset"] + len(exp["records"])
        assert log.truncated_bytes == 0
        got = [
            {"offset": r.offset, "timestamp": r.timestamp, "key": _hex(r.key),
             "metadata": _hex(r.metadata), "value": _hex(r.value)}
            for r in log.scan()
        ]
        assert got == exp["records"]
        for rec in exp["records"]:
            r = log.read(rec["offset"])
            assert _hex(r.value) == rec["value"] and _hex(r.key) == rec["key"]
        assert log.offset_for_time(1700000000001) == 101
        assert log.offset_for_time(1700000000002) == 103
        assert log.verify() == []


def test_vector_frames_are_what_pylog_encodes():
    exp = _expected()
    a = impl.Appender(100, next_offset=100, position=32, max_position=1 << 20, max_timestamp=None,
                      index_interval=0, bytes_since_index=0, index_cap=16, buffer_bytes=1 << 16)
    for rec in exp["records"]:
        k, m, v = (None if rec[x] is None else bytes.fromhex(rec[x]) for x in ("key", "metadata", "value"))
        attrs = (k is None) | (m is None) << 1 | (v is None) << 2
        assert a.frame(v, k, m, attrs, rec["timestamp"]) == rec["offset"]
    assert bytes(a.pending()).hex() == "".join(f["hex"] for f in exp["frames"])
    with open(os.path.join(DATA, "vectors", f"{100:020d}.log"), "rb") as f:
        store = f.read()
    assert impl.crc32c(store) == exp["store_crc32c"]
    assert impl.header_check(store[:32], fmt.STORE_MAGIC)[:2] == (impl.OK, 100)
