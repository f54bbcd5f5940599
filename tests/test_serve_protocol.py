"""`pylog serve` at the protocol level: Fetch long polls and byte limits, acks=0, read
isolation, a SIGTERM with a request in flight, and concurrent acks=all producers sharing
fsyncs (counted with strace on the broker process)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

pytest.importorskip("kio")
pytest.importorskip("kafka")

from conftest import strace_path  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    batch,
    call,
    connect,
    create_topic,
    fetch,
    fetched_values,
    frame,
    produce,
    wait_for,
)


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    assert b.stop() == 0, b.stderr()


def test_fetch_long_poll_wakes_on_produce_and_times_out(broker):
    with connect(broker) as s:
        create_topic(s, "lp")
        t0 = time.monotonic()
        r = call(s, fetch("lp", 0, max_wait=400, min_bytes=1), 1, 12)
        waited = time.monotonic() - t0
        assert fetched_values(r) == [] and waited >= 0.35
    done = {}

    def poll() -> None:
        with connect(broker) as s2:
            t = time.monotonic()
            done["r"] = call(s2, fetch("lp", 0, max_wait=15000, min_bytes=1), 1, 12)
            done["t"] = time.monotonic() - t

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.5)
    with connect(broker) as s:
        assert call(s, produce("lp", batch([b"wake"])), 0, 9).responses[0].partition_responses[0].error_code == 0
    th.join(20)
    assert fetched_values(done["r"]) == [(0, b"wake")]
    assert 0.4 < done["t"] < 10  # answered by the produce, long before max_wait


def test_fetch_byte_limits(broker):
    with connect(broker) as s:
        create_topic(s, "mb")
        for i in range(10):
            call(s, produce("mb", batch([b"%03d" % (i * 10 + j) + b"x" * 997 for j in range(10)])), 0, 9)
        allr = fetched_values(call(s, fetch("mb", 0), 1, 12))
        assert [o for o, _ in allr] == list(range(100))
        some = fetched_values(call(s, fetch("mb", 0, partition_max_bytes=20_000), 1, 12))
        assert 1 <= len(some) < 100 and [o for o, _ in some] == list(range(len(some)))
        one = fetched_values(call(s, fetch("mb", 42, partition_max_bytes=1), 1, 12))
        assert one[0][0] == 42 and one[0][1].startswith(b"042")  # at least one record, always
        over = call(s, fetch("mb", 101), 1, 12)
        assert over.responses[0].partitions[0].error_code == 1  # OFFSET_OUT_OF_RANGE
        hw = call(s, fetch("mb", 0, isolation=1), 1, 12).responses[0].partitions[0]
        assert (hw.high_watermark, hw.last_stable_offset, hw.log_start_offset) == (100, 100, 0)


def test_acks_zero_gets_no_answer_but_is_appended(broker):
    with connect(broker) as s:
        create_topic(s, "a0")
        s.sendall(produce("a0", batch([b"quiet"]), acks=0))
        # the next answer on this connection is the fetch's: the produce had none
        r = call(s, fetch("a0", 0, max_wait=5000, min_bytes=1), 1, 12)
        assert fetched_values(r) == [(0, b"quiet")]


def test_sigterm_answers_the_request_in_flight(broker):
    with connect(broker) as s:
        create_topic(s, "st")
        s.sendall(fetch("st", 0, max_wait=3000, min_bytes=1))
        time.sleep(0.3)
        os.kill(broker.proc.pid, signal.SIGTERM)
        s.settimeout(20)
        head = s.recv(4)
        assert len(head) == 4  # answered (empty, after its wait), not reset
    assert broker.proc.wait(30) == 0


@pytest.mark.skipif(strace_path() is None, reason="strace not installed, or under qemu-user")
def test_concurrent_acks_all_producers_share_fsyncs(broker, tmp_path):
    with connect(broker) as s:
        create_topic(s, "fs", flush_messages="1")
        call(s, produce("fs", batch([b"warm"])), 0, 9)
    trace = str(tmp_path / "strace.out")
    st = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", trace, "-p",
                           str(broker.proc.pid)], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # strace attaches to every thread
        threads, per = 8, 25
        errors = []

        def producer(k: int) -> None:
            with connect(broker) as c:
                for i in range(per):
                    r = call(c, produce("fs", batch([b"%d-%d" % (k, i)])), 0, 9)
                    if r.responses[0].partition_responses[0].error_code:
                        errors.append(r)

        ts = [threading.Thread(target=producer, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors
    finally:
        time.sleep(0.5)
        os.kill(st.pid, signal.SIGINT)
        st.wait(20)
    syncs = sum(1 for line in open(trace) if "fsync(" in line or "fdatasync(" in line)
    acked = threads * per
    # every acks=all answer waited for an fsync, but concurrent appends shared them
    print(f"{syncs} fsyncs for {acked} acks=all produces")
    assert 0 < syncs < acked, (syncs, acked)
    with connect(broker) as s:
        got = fetched_values(call(s, fetch("fs", 1, max_bytes=1 << 20), 1, 12))
        assert len(got) == acked


def test_metadata_v0_empty_list_means_every_topic_and_transactional_batches_refused(broker):
    import numpy as np

    from pylog import _backend

    with connect(broker) as s:
        create_topic(s, "m1")
        create_topic(s, "m2", partitions=3)
        r = call(s, frame(3, 0, {"topics": []}), 3, 0)
        assert sorted((t.name, len(t.partitions)) for t in r.topics) == [("m1", 1), ("m2", 3)]
        r = call(s, frame(3, 12, {"topics": [], "allow_auto_topic_creation": False}), 3, 12)
        assert r.topics == ()
        rc, b = _backend.impl.kafka_encode(np.arange(1), np.full(1, 5), b"", np.full(1, 0xFFFFFFFF, np.uint32),
                                           b"tx", np.full(1, 2, np.uint32))
        b = bytearray(b)
        b[22] |= 0x10  # attributes: transactional; the CRC32C covers them, so recompute it
        b[17:21] = _backend.impl.crc32c(bytes(b[21:])).to_bytes(4, "big")
        r = call(s, produce("m1", bytes(b)), 0, 9)
        assert r.responses[0].partition_responses[0].error_code == 48  # INVALID_TXN_STATE


def test_retention_runs_in_the_broker(tmp_path):
    """retention.ms is enforced by the broker itself (the CLI cannot while it serves)."""
    import subprocess
    import sys

    from conftest import ROOT, py_env

    root = str(tmp_path / "root")
    code = ("import sys; from pylog.serve import serve\n"
            "serve(sys.argv[1], '127.0.0.1', 0, ready=lambda s: print('listening on 127.0.0.1:%d' % s.port,"
            " flush=True), cleanup_interval=0.3)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, root], cwd=ROOT, env=py_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline().rsplit(":", 1)[1])  # type: ignore[union-attr]
        b = type("B", (), {"port": port})()
        with connect(b) as s:  # type: ignore[arg-type]
            create_topic(s, "old", segment_bytes="4096", retention_ms="1")
            for i in range(40):
                call(s, produce("old", batch([b"%04d" % i + b"x" * 200])), 0, 9)

            def earliest() -> int:
                r = call(s, frame(2, 7, {"topics": [{"name": "old", "partitions": [
                    {"partition_index": 0, "timestamp": -2}]}]}), 2, 7)
                return r.topics[0].partitions[0].offset

            assert wait_for(lambda: earliest() > 0, timeout=20), "no segment was deleted"
            got = fetched_values(call(s, fetch("old", earliest()), 1, 12))
            assert got and got[0][0] == earliest()
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()  # type: ignore[union-attr]


# -- Fetch size limits (KIP-74): whole batches, at most the limits, as many records as fit --------

def _varint_len(v: int) -> int:
    z = (v << 1) ^ (v >> 63)  # zigzag, as Kafka's record fields
    n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


def _record_len(offset_delta: int, value: bytes) -> int:
    """Wire size of one record of ``batch()``: no key, no headers, timestamp delta 0."""
    body = 1 + 1 + _varint_len(offset_delta) + 1 + _varint_len(len(value)) + len(value) + 1
    return _varint_len(body) + body


def _batches(data: bytes) -> list[tuple[int, int]]:
    """(base offset, record count) of each RecordBatch in ``data``; asserts that they are whole
    (a trailing partial batch is what a Kafka client throws away and fetches again)."""
    out, pos = [], 0
    while pos < len(data):
        assert len(data) - pos >= 61, f"a partial batch header at {pos} of {len(data)}"
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        assert pos + 12 + length <= len(data), f"a partial batch at {pos}: {length + 12} bytes claimed"
        out.append((int.from_bytes(data[pos : pos + 8], "big"), int.from_bytes(data[pos + 57 : pos + 61], "big")))
        pos += 12 + length
    return out


def _fetch_parts(topic: str, parts: list[tuple[int, int, int]], max_bytes: int) -> bytes:
    """A Fetch v12 frame of (partition, offset, partition_max_bytes) of ``topic``."""
    return frame(1, 12, {"max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
                         "topics": [{"topic": topic, "partitions": [
                             {"partition": p, "fetch_offset": o, "partition_max_bytes": m} for p, o, m in parts]}]})


def test_fetch_returns_whole_batches_within_partition_max_bytes(broker):
    """A Fetch returns at most partition_max_bytes of whole batches, as many records as fit.
    The old broker budgeted only the values' bytes, so the encoded batch overran the limit
    by the records' framing (about 11%: 18.7 MB answered for 16 MiB asked)."""
    values = [b"%05d" % i + b"v" * 95 for i in range(3000)]
    with connect(broker) as s:
        create_topic(s, "fl")
        for i in range(0, len(values), 500):
            call(s, produce("fl", batch(values[i : i + 500])), 0, 9)
        for start, limit in [(0, 300), (0, 1000), (7, 20_000), (100, 65_536), (0, 200_000), (2990, 200_000)]:
            r = call(s, fetch("fl", start, max_bytes=1 << 24, partition_max_bytes=limit), 1, 12)
            data = bytes(r.responses[0].partitions[0].records or b"")
            batches = _batches(data)
            got = fetched_values(r)
            assert got == [(start + i, values[start + i]) for i in range(len(got))]
            assert sum(n for _, n in batches) == len(got)
            assert len(data) <= limit, (start, limit, len(data))
            # as many as fit: one batch here, and the next record would not have fitted
            fit, size = 0, 61
            while start + fit < len(values) and size + _record_len(fit, values[start + fit]) <= limit:
                size += _record_len(fit, values[start + fit])
                fit += 1
            assert len(got) == fit and len(data) == size, (start, limit, len(got), fit)


def test_fetch_max_bytes_over_partitions_and_the_first_batch_rule(broker):
    """max_bytes bounds the whole response; only the first record of the first non-empty
    partition may exceed the limits (KIP-74), never a later partition's."""
    small = [b"s%03d" % i + b"." * 96 for i in range(50)]
    with connect(broker) as s:
        create_topic(s, "kp", partitions=2)
        call(s, produce("kp", batch(small), partition=0), 0, 9)
        call(s, produce("kp", batch([b"B" * 5000, b"after"]), partition=1), 0, 9)
        call(s, produce("kp", batch(small), partition=1), 0, 9)

        def sizes(r) -> list[bytes]:  # type: ignore[no-untyped-def]
            return [bytes(p.records or b"") for p in r.responses[0].partitions]

        # partition 0 has data first; partition 1's first record (5000 B) is over its
        # partition_max_bytes: nothing of it (it would be returned were it first)
        r = call(s, _fetch_parts("kp", [(0, 0, 800), (1, 0, 1000)], 10_000), 1, 12)
        p0, p1 = sizes(r)
        assert 0 < len(p0) <= 800 and _batches(p0)[0][0] == 0
        assert p1 == b"", len(p1)
        # the same record first in the response: returned whole, alone, over both limits
        r = call(s, _fetch_parts("kp", [(0, 50, 800), (1, 0, 1000)], 1000), 1, 12)
        p0, p1 = sizes(r)
        assert p0 == b"" and _batches(p1) == [(0, 1)] and len(p1) > 5000
        # max_bytes is shared: partition 1 gets only what partition 0 left, and nothing when
        # that is less than its first record
        whole = len(sizes(call(s, _fetch_parts("kp", [(0, 0, 1 << 20)], 1 << 20), 1, 12))[0])
        for max_bytes in (3000, 5400, whole + 150, whole + 400):
            r = call(s, _fetch_parts("kp", [(0, 0, 1 << 20), (1, 2, 1 << 20)], max_bytes), 1, 12)
            p0, p1 = sizes(r)
            assert len(p0) + len(p1) <= max_bytes, (max_bytes, len(p0), len(p1))
            assert len(p0) == whole or (max_bytes - 120 < len(p0) <= max_bytes and not p1)
            assert bool(p1) == (max_bytes - whole >= 61 + 110)  # room for one record of partition 1
            assert not p1 or _batches(p1)[0][0] == 2


def test_fetches_over_many_segments_skip_no_record(broker):
    """Small records over many segments, read by Fetches of a few KB each as a consumer
    does (each from the offset after the last one it got): every offset, none skipped. The
    old broker took one chunk of rows per segment (about partition_max_bytes / 40 of them)
    and went on to the next segment when that chunk was smaller than the limit, skipping
    the rest of the segment's records."""
    with connect(broker) as s:
        create_topic(s, "sg", segment_bytes="16384")
        for i in range(30):
            call(s, produce("sg", batch([b"%04d" % (i * 100 + j) for j in range(100)])), 0, 9)
        seen, off = [], 0
        while off < 3000 and len(seen) < 3000:
            got = fetched_values(call(s, fetch("sg", off, partition_max_bytes=4000), 1, 12))
            assert got, off
            seen += got
            off = got[-1][0] + 1
        assert seen == [(i, b"%04d" % i) for i in range(3000)]


def test_large_response_frames_keep_the_records_buffer_uncopied():
    """encode_response gives a Fetch response with large records as its buffers in order, the
    records object itself among them (not copied), and their bytes are exactly kio's
    encoding of the whole frame; a small response stays one bytes object."""
    import io
    import struct

    from kio.index import load_response_schema
    from kio.serial import entity_writer

    from pylog.serve.protocol import build, encode_response

    cls = load_response_schema(1, 12)
    records = bytes(range(256)) * 4096  # 1 MiB

    class Req:
        correlation_id = 77

    def payload(recs: bytes) -> object:
        return build(cls, {"error_code": 0, "session_id": 0, "responses": [{"topic": "t", "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 9, "last_stable_offset": 9,
             "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": recs}]}]})

    for recs, large in ((records, True), (b"small", False)):
        p = payload(recs)
        ref = io.BytesIO()
        entity_writer(cls.__header_schema__)(ref, cls.__header_schema__(correlation_id=77))
        entity_writer(cls)(ref, p)
        want = struct.pack(">i", len(ref.getvalue())) + ref.getvalue()
        out = encode_response(Req, p)  # type: ignore[arg-type]
        if large:
            assert isinstance(out, list) and any(part is recs for part in out)
            assert b"".join(bytes(x) for x in out) == want
        else:
            assert out == want and isinstance(out, bytes)


def test_a_fetch_of_megabytes_arrives_whole(broker):
    """A response of several MB written in slices arrives whole: every record, in order."""
    values = [b"%06d" % i + b"z" * 994 for i in range(6000)]
    with connect(broker) as s:
        create_topic(s, "big")
        for i in range(0, len(values), 1000):
            call(s, produce("big", batch(values[i : i + 1000])), 0, 9)
        r = call(s, fetch("big", 0, max_bytes=16 << 20, partition_max_bytes=16 << 20), 1, 12)
        assert len(r.responses[0].partitions[0].records) > 6_000_000
        assert fetched_values(r) == list(enumerate(values))
