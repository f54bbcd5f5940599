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
        assert e.value.code == 10  # MESSAGE_TOO_LARGE: over the budget, not corrupt


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


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=60), st.integers(0, 40_000), st.booleans())
@settings(max_examples=300)
def test_fit_batch_takes_the_longest_prefix_within_the_limit(sizes, limit, oversize):
    """fit_batch against a model: the most leading rows whose batch is at most ``limit``
    bytes; one row over it only when ``oversize``, else None; a bounded number of encodes."""
    from pylog.serve.records import HEADER_SIZE, fit_batch

    calls = []

    def encode(k: int) -> bytes:
        calls.append(k)
        return b"x" * (HEADER_SIZE + sum(sizes[:k]))

    got = fit_batch(encode, len(sizes), limit, oversize)
    fit = 0
    while fit < len(sizes) and HEADER_SIZE + sum(sizes[: fit + 1]) <= limit:
        fit += 1
    if fit:
        assert got is not None and len(got) == HEADER_SIZE + sum(sizes[:fit])
    elif oversize:
        assert got is not None and len(got) == HEADER_SIZE + sizes[0]
    else:
        assert got is None
    assert len(calls) <= 2 * len(sizes).bit_length() + 4, calls


@pytest.mark.parametrize("scan", ["columnar", "read_batch"])
def test_broker_records_are_whole_batches_within_the_limit(tmp_path, monkeypatch, scan):
    """reads.read_batches on both of its paths (the columnar scan; Log.read_batch without
    pyarrow): whole batches, at most ``limit`` bytes, the first record alone when it is over
    the limit and ``oversize``, nothing otherwise."""
    from kafka.record.memory_records import MemoryRecords

    from pylog import Log
    from pylog.serve import reads as reads_mod

    if scan == "read_batch":
        monkeypatch.setattr(reads_mod, "_arrow", None)
    values = [b"%04d" % i + b"y" * (i % 7 * 40) for i in range(400)]
    with Log(str(tmp_path / "log")) as log:
        log.append_batch([b"B" * 3000], timestamps=[1])
        log.append_batch(values, timestamps=[2] * len(values))
        end = log.next_offset
        for off, limit in [(1, 100), (1, 1000), (5, 4096), (1, 1 << 20), (0, 1000), (0, 4000)]:
            data = bytes(reads_mod.read_batches(log, off, end, limit, True))
            recs, got = MemoryRecords(data), []
            while recs.has_next():
                got += [(r.offset, r.value) for r in recs.next_batch()]
            assert got == [(off + i, ([b"B" * 3000] + values)[off + i]) for i in range(len(got))]
            assert got, (off, limit)
            assert len(data) <= limit or len(got) == 1, (off, limit, len(data))
            if len(data) > limit:  # only when even one record does not fit: then nothing without oversize
                assert reads_mod.read_batches(log, off, end, limit, False) == b""


@given(st.lists(st.tuples(blob, st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=40),
                                                                 st.lists(header, max_size=3)),
                          st.integers(0, 10**9)), min_size=1, max_size=30),
       st.integers(0, 3000), st.booleans())
@settings(max_examples=60, deadline=None)
def test_fetch_encoding_takes_the_longest_prefix_that_fits(recs, limit, oversize):
    """reads.read_batches (columnar scan, sizes counted before encoding) against a model: the
    most leading records whose one batch (encode_records, the Record path) is at most
    ``limit`` bytes; keys, values, timestamps, Kafka headers and other metadata mixed."""
    import shutil
    import tempfile

    from pylog import Log
    from pylog.serve.reads import read_batches
    from pylog.serve.records import encode_records

    d = tempfile.mkdtemp(prefix="pylog-fit-")
    try:
        with Log(d + "/l") as log:
            metas = [encode_headers(m) if isinstance(m, list) else m for _, _, m, _ in recs]
            log.append_batch([v for _, v, _, _ in recs], keys=[k for k, _, _, _ in recs],
                             timestamps=sorted(t for *_, t in recs), metadata=metas)
            stored = log.read_batch(0, max_bytes=1 << 30)
            got = bytes(read_batches(log, 0, log.next_offset, limit, oversize))
        fit = 0
        while fit < len(stored) and len(encode_records(stored[: fit + 1])) <= limit:
            fit += 1
        if fit:
            assert got == encode_records(stored[:fit])
        elif oversize:
            assert got == encode_records(stored[:1])
        else:
            assert got == b""
    finally:
        shutil.rmtree(d)
