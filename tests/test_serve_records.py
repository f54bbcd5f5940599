"""The RecordBatch v2 codec (csrc/kafka.c) against its pure twin and against kafka-python's
independent RecordBatch implementation, under hypothesis."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog import _pure
from pylog import format as fmt

kafka_records = pytest.importorskip("kafka.record.default_records")
_native = pytest.importorskip("pylog._native")

from pylog.serve.headers import decode_headers, encode_headers  # noqa: E402

blob = st.one_of(st.none(), st.binary(max_size=300))
header = st.tuples(st.text(max_size=10), st.binary(max_size=20))
record = st.tuples(blob, blob, st.lists(header, max_size=4), st.integers(0, 10**6))


def _joined(items):  # type: ignore[no-untyped-def]
    lens = np.array([fmt.NULL_LEN if x is None else len(x) for x in items], np.uint32)
    return b"".join(x for x in items if x is not None), lens


@given(st.lists(record, min_size=1, max_size=40), st.integers(0, 2**40), st.integers(0, 2**40))
def test_encode_matches_pure_and_kafka_python_reads_it(recs, base, base_ts):
    offsets = np.arange(base, base + len(recs), dtype=np.int64)
    stamps = np.array([base_ts + r[3] for r in recs], np.int64)
    keys, klens = _joined([r[0] for r in recs])
    values, vlens = _joined([r[1] for r in recs])
    meta, mlens = _joined([encode_headers(r[2]) for r in recs])
    rc, out = _native.kafka_encode(offsets, stamps, keys, klens, values, vlens, meta, mlens)
    assert rc == 0
    assert (rc, out) == _pure.kafka_encode(offsets, stamps, keys, klens, values, vlens, meta, mlens)
    batch = kafka_records.DefaultRecordBatch(bytes(out))
    assert batch.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    assert got == [(base + i, base_ts + r[3], r[0], r[1], [(k, v) for k, v in r[2]]) for i, r in enumerate(recs)]


@given(st.lists(record, min_size=1, max_size=40))
def test_decode_what_kafka_python_builds(recs):
    b = kafka_records.DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                                producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                                batch_size=1 << 30)
    for i, (k, v, hs, ts) in enumerate(recs):
        assert b.append(i, timestamp=ts, key=k, value=v, headers=list(hs)) is not None
    section = bytes(b.build())[61:]
    res = _native.kafka_decode(section, len(recs))
    ref = _pure.kafka_decode(section, len(recs))
    assert res[0] == 0 and ref[0] == 0
    for a, r in zip(res[1:], ref[1:]):
        if isinstance(a, tuple):
            assert bytes(a[0]) == bytes(r[0]) and list(a[1]) == list(r[1])
        else:
            assert list(a) == list(r)
    _, ts, od, keys, values, headers = res
    assert list(od) == list(range(len(recs)))
    hdata, hlens, pos = bytes(headers[0]), headers[1], 0
    for i, (k, v, hs, _t) in enumerate(recs):
        if hlens[i] == fmt.NULL_LEN:
            assert hs == []
        else:
            assert decode_headers(hdata[pos : pos + hlens[i]]) == [(a, c) for a, c in hs]
            pos += int(hlens[i])


@given(st.binary(max_size=200), st.integers(-5, 50))
def test_decode_garbage_never_crashes_and_agrees_with_pure(data, count):
    a = _native.kafka_decode(data, count)
    b = _pure.kafka_decode(data, count)
    assert a[0] == b[0]
    if a[0] == 0:
        assert [list(x[1]) for x in a[3:]] == [list(x[1]) for x in b[3:]]


def _compressed_batch(codec: str, values: list[bytes]) -> bytes:
    b = kafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type={"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec],
        is_transactional=False, producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, v in enumerate(values):
        b.append(i, timestamp=1000 + i, key=None, value=v, headers=[])
    return bytes(b.build())


CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_decodes_and_bombs_are_refused(codec):
    from pylog.serve.records import BatchError, decode_records

    values = [b"a" * 1000 for _ in range(1000)]  # 1 MB that compresses to little
    data = _compressed_batch(codec, values)
    d = decode_records(data, 2 << 20)
    assert d.count == 1000 and bytes(d.values[0]) == b"".join(values)
    if codec != "none":
        with pytest.raises(BatchError) as e:
            decode_records(data, 100_000)  # the limit, not the claimed size, bounds the output
        assert e.value.code == 2


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(CODECS), st.lists(st.binary(max_size=50), min_size=1, max_size=20),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6), st.booleans())
def test_mutated_batches_are_refused_or_decoded_never_crash(codec, values, flips, fix_crc):
    """With ``fix_crc`` the mutated bytes (past the CRC) get a matching CRC32C, so the
    decompressors and the record decoder see them."""
    from pylog import crc32c
    from pylog.serve.records import BatchError, decode_records

    data = bytearray(_compressed_batch(codec, values))
    for pos, byte in flips:
        data[(21 + pos % (len(data) - 21)) if fix_crc else pos % len(data)] = byte
    if fix_crc:
        data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    try:
        d = decode_records(bytes(data), 1 << 20)
    except BatchError:
        return
    assert d.count >= 0
