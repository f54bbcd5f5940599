"""pylog.arrow: columnar reads against log.scan(), on random logs."""
import os
import random

import pytest

pa = pytest.importorskip("pyarrow")

from conftest import scan_rows, store_files  # noqa: E402

import pylog  # noqa: E402
import pylog.arrow  # noqa: E402
from pylog.errors import CorruptRecordError, OffsetOutOfRangeError  # noqa: E402

NOW = 10**12


def table_rows(table):
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    ts = table.column("timestamp").cast(pa.int64()).to_pylist()
    return list(zip(cols["offset"], ts, cols["key"], cols["value"], cols["metadata"]))


def fill(log, rng, n, *, keys=True, metadata=True, tombstones=True, batch=False):
    """Append ``n`` random records: keys, metadata and tombstones mixed, sizes 0..300."""
    ts = 1_000_000 + 10 * log.next_offset  # never below an earlier call's timestamps
    if batch:
        vals = [rng.randbytes(rng.randint(0, 300)) for _ in range(n)]
        log.append_batch(vals, keys=[rng.randbytes(rng.randint(0, 8)) if keys and rng.random() < 0.5 else None
                                     for _ in range(n)], timestamps=[ts + i for i in range(n)])
        return
    for _ in range(n):
        ts += rng.randint(0, 5)
        key = rng.randbytes(rng.randint(0, 12)) if keys and rng.random() < 0.6 else None
        meta = rng.randbytes(rng.randint(0, 20)) if metadata and rng.random() < 0.3 else None
        value = None if tombstones and key is not None and rng.random() < 0.1 else rng.randbytes(rng.randint(0, 300))
        log.append(value, key=key, metadata=meta, timestamp=ts)


@pytest.mark.parametrize("seed", range(6))
def test_read_table_equals_scan_on_random_logs(make_log, seed):
    rng = random.Random(seed)
    log = make_log(segment_bytes=rng.choice([4096, 16384, 1 << 20]), fsync="never",
                   index_interval_bytes=rng.choice([0, 256, 4096]))
    fill(log, rng, rng.randint(1, 900))
    if seed % 2:
        fill(log, rng, 300, batch=True)
    fill(log, rng, rng.randint(0, 50))  # some left in the write buffer: read anyway
    for _ in range(rng.randint(1, 20)):
        log.append(rng.randbytes(rng.randint(0, 80)))  # plain appends wait in the queue or the write buffer
    assert log._q or log._active.app.used, "the test means to read records not yet written out"
    table = pylog.arrow.read_table(log)
    want = scan_rows(log)
    assert table.schema == pylog.arrow.SCHEMA
    assert table.num_rows == log.next_offset - log.start_offset == len(want)
    assert table_rows(table) == want
    table.validate(full=True)
    for _ in range(8):  # random bounds
        a = rng.randint(log.start_offset, log.next_offset)
        b = rng.randint(a, log.next_offset)
        assert table_rows(pylog.arrow.read_table(log, a, b)) == scan_rows(log, a, b)
    if log.size_bytes > 2 * log.config.segment_bytes:
        assert len(log.segments()) > 1  # the reads above crossed rolls


def test_iter_batches_respects_batch_rows_and_bounds(make_log):
    rng = random.Random(7)
    log = make_log(segment_bytes=8192, fsync="never")
    fill(log, rng, 700)
    start, stop = 37, 651
    batches = list(pylog.arrow.iter_batches(log, start, stop, batch_rows=50))
    assert all(0 < b.num_rows <= 50 for b in batches)
    assert all(b.schema == pylog.arrow.SCHEMA for b in batches)
    table = pa.Table.from_batches(batches)
    assert table_rows(table) == scan_rows(log, start, stop)
    # a batch never spans two segments
    bases = [s["base_offset"] for s in log.segments()]
    for b in batches:
        offs = b.column("offset").to_pylist()
        assert len({max(x for x in bases if x <= o) for o in offs}) == 1


def test_column_selection(make_log):
    log = make_log()
    for i in range(100):
        log.append(b"v%d" % i, key=b"k%d" % i if i % 2 else None)
    t = pylog.arrow.read_table(log, 10, 20, columns=["value", "offset"])
    assert t.column_names == ["value", "offset"]
    assert t.column("offset").to_pylist() == list(range(10, 20))
    assert t.column("value").to_pylist() == [b"v%d" % i for i in range(10, 20)]
    t = pylog.arrow.read_table(log, columns=["key"])
    assert t.column("key").null_count == 50
    with pytest.raises(ValueError, match="unknown columns"):
        pylog.arrow.read_table(log, columns=["nope"])
    with pytest.raises(TypeError):
        pylog.arrow.read_table(log, columns="value")


def test_timestamps_are_milliseconds_utc(make_log):
    log = make_log()
    log.append(b"x", timestamp=1_700_000_000_123)
    col = pylog.arrow.read_table(log).column("timestamp")
    assert col.type == pa.timestamp("ms", tz="UTC")
    assert col.cast(pa.int64()).to_pylist() == [1_700_000_000_123]


def test_empty_logs_and_empty_ranges(make_log):
    log = make_log()
    t = pylog.arrow.read_table(log)
    assert t.num_rows == 0 and t.schema == pylog.arrow.SCHEMA
    log.append(b"a")
    log.append(b"b")
    assert pylog.arrow.read_table(log, 1, 1).num_rows == 0
    assert list(pylog.arrow.iter_batches(log, 2, 2)) == []


def test_bounds_are_checked(make_log):
    log = make_log(initial_offset=10)
    for i in range(5):
        log.append(b"%d" % i)
    with pytest.raises(OffsetOutOfRangeError):
        pylog.arrow.read_table(log, 9)
    with pytest.raises(OffsetOutOfRangeError):
        pylog.arrow.read_table(log, 10, 16)
    with pytest.raises(OffsetOutOfRangeError):
        pylog.arrow.iter_batches(log, 0)  # at the call, not at the first next()
    with pytest.raises(ValueError):
        pylog.arrow.read_table(log, 14, 12)
    with pytest.raises(ValueError):
        pylog.arrow.iter_batches(log, batch_rows=0)
    assert pylog.arrow.read_table(log, 10, 15).column("offset").to_pylist() == list(range(10, 15))


def test_log_read_arrow(make_log):
    log = make_log(segment_bytes=4096)
    rng = random.Random(3)
    fill(log, rng, 200)
    assert log.read_arrow().equals(pylog.arrow.read_table(log))
    assert table_rows(log.read_arrow(50, 150)) == scan_rows(log, 50, 150)
    assert log.read_arrow(columns=["offset"]).column_names == ["offset"]


def test_compacted_segments(make_log):
    rng = random.Random(11)
    log = make_log(segment_bytes=4096, fsync="never")
    for i in range(800):
        k = b"k%d" % rng.randint(0, 30)
        log.append(None if rng.random() < 0.05 else rng.randbytes(rng.randint(1, 60)), key=k, timestamp=1000 + i)
    log.compact(now_ms=NOW)
    want = scan_rows(log)
    assert len(want) < 800, "compaction removed records"
    assert table_rows(pylog.arrow.read_table(log)) == want
    offs = [r[0] for r in want]
    for a, b in [(0, 800), (offs[3] + 1, offs[-5]), (offs[-1], 800), (offs[10] + 1, offs[11])]:
        assert table_rows(pylog.arrow.read_table(log, a, b)) == scan_rows(log, a, b)
    batches = list(pylog.arrow.iter_batches(log, batch_rows=7))
    assert table_rows(pa.Table.from_batches(batches)) == want


def test_readonly_reader_sees_the_writers_records(make_log, log_dir):
    rng = random.Random(5)
    writer = make_log(segment_bytes=8192)
    fill(writer, rng, 300)
    writer.flush()
    reader = pylog.Log(log_dir, readonly=True)
    try:
        assert table_rows(pylog.arrow.read_table(reader)) == scan_rows(writer)
    finally:
        reader.close()


def _corrupt_sealed(log_dir):
    """Flip a byte in the middle of the first segment's store file; returns its path."""
    path = store_files(log_dir)[0]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x40]))
    return path


def test_a_corrupt_sealed_segment_raises(make_log, log_dir):
    log = make_log(segment_bytes=16384)
    for i in range(1000):
        log.append(b"value-%06d" % i + bytes(40), key=b"k%d" % i)
    assert len(log.segments()) > 2
    log.close()
    path = _corrupt_sealed(log_dir)
    log = make_log()
    with pytest.raises(CorruptRecordError) as e:
        pylog.arrow.read_table(log)
    assert e.value.path == path
    with pytest.raises(CorruptRecordError):
        list(log.scan())  # the same verdict as the row reader
    # iter_batches yields what comes before the bad frame, then raises
    got = []
    with pytest.raises(CorruptRecordError) as e2:
        for b in pylog.arrow.iter_batches(log, batch_rows=10):
            got.extend(b.column("offset").to_pylist())
    assert got == list(range(len(got))) and 0 < len(got) < 1000
    assert e2.value.offset == len(got)
    # a range after the bad segment reads fine
    later = log.segments()[1]["base_offset"]
    assert pylog.arrow.read_table(log, later).num_rows == 1000 - later
    # no value that failed its CRC ever comes back
    with pytest.raises(CorruptRecordError):
        pylog.arrow.read_table(log, got[-1] + 1 if got else 0)


def test_dropped_buffers_are_reused_and_released(make_log, monkeypatch):
    log = make_log()
    log.append_batch([bytes([i % 256]) * 200 for i in range(20_000)])  # 4 MB of values
    first = pylog.arrow.read_table(log, columns=["value"])
    want = first.column("value").to_pylist()
    pylog.arrow.release_buffers()
    del first  # its value buffer (>= 1 MiB) goes to the cache...
    assert pylog.arrow.release_buffers() >= 4_000_000  # ...which frees it
    t1 = pylog.arrow.read_table(log, columns=["value"])
    addr = t1.column("value").chunk(0).buffers()[2].address
    del t1
    t2 = pylog.arrow.read_table(log, columns=["value"])  # the same memory, rewritten
    assert t2.column("value").chunk(0).buffers()[2].address == addr
    assert t2.column("value").to_pylist() == want
    # a live table's buffers are never handed out again
    t3 = pylog.arrow.read_table(log, columns=["value"])
    assert t3.column("value").chunk(0).buffers()[2].address != addr
    assert t2.column("value").to_pylist() == want == t3.column("value").to_pylist()
    monkeypatch.setattr(pylog.arrow, "BUFFER_CACHE_BYTES", 0)
    pylog.arrow.release_buffers()
    del t2, t3
    assert pylog.arrow.release_buffers() == 0  # nothing kept
