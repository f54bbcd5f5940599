"""Bad input never hurts `pylog serve`: lying sizes, truncated and garbage frames, unknown API
keys and versions, slow clients, corrupt batches (all or nothing per partition), and a
SIGKILL under acks=all load that loses nothing acknowledged."""
from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("kio")

from conftest import scaled  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    api_versions_ok,
    batch,
    call,
    connect,
    create_topic,
    fetch,
    fetched_values,
    frame,
    produce,
    recv_exact,
)

import pylog  # noqa: E402
from pylog.serve.protocol import RequestError, decode_request  # noqa: E402


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    assert b.stop() == 0, b.stderr()


def test_lying_and_oversized_sizes_close_only_that_connection(broker):
    for claimed in (0x7FFFFFFF, 200 << 20, -5, 3):
        with connect(broker) as s:
            s.sendall(struct.pack(">i", claimed) + b"\0" * 16)
            assert recv_exact(s, 4) is None  # closed, nothing allocated for the claim
    # a frame that claims 50 MB and never finishes: other clients are served meanwhile
    slow = connect(broker)
    slow.sendall(struct.pack(">i", 50 << 20) + b"\0" * 100)
    assert api_versions_ok(broker)
    slow.close()
    import psutil

    assert psutil.Process(broker.proc.pid).memory_info().rss < 400 << 20


def test_unknown_keys_versions_and_next_step_apis(broker):
    with connect(broker) as s:  # an API key nobody serves: the connection is closed
        s.sendall(struct.pack(">ihhi", 10, 999, 0, 1) + b"\0\0")
        assert recv_exact(s, 4) is None
    with connect(broker) as s:  # ApiVersions at a future version: answered at v0, error 35
        r = call(s, struct.pack(">ihhih", 10, 18, 99, 5, -1), 18, 0)
        assert r.error_code == 35 and {k.api_key for k in r.api_keys} >= {0, 1, 2, 3, 18}
    with connect(broker) as s:  # Produce v2 is below Kafka 4.0's minimum
        s.sendall(frame(0, 3, {"acks": 1, "timeout": 100, "topic_data": []})[:6] + struct.pack(">h", 2) +
                  b"\0" * 20)
        assert recv_exact(s, 4) is None
    with connect(broker) as s:  # SASL without a users file: no mechanism, no state to authenticate
        r = call(s, frame(36, 2, {"auth_bytes": b""}), 36, 2)
        assert r.error_code == 34
        r = call(s, frame(17, 1, {"mechanism": "PLAIN"}), 17, 1)  # no users file: no mechanism
        assert r.error_code == 33 and list(r.mechanisms) == []
    assert api_versions_ok(broker)


def test_corrupt_batch_refused_and_partition_all_or_nothing(broker):
    with connect(broker) as s:
        r = call(s, frame(19, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}],
                                  "timeout": 5000}), 19, 7)
        assert r.topics[0].error_code == 0
        ok = call(s, produce("t", batch([b"a", b"b"])), 0, 9)
        assert ok.responses[0].partition_responses[0].error_code == 0
        # a good batch followed by a corrupt one: neither is appended
        r = call(s, produce("t", batch([b"c"]) + batch([b"d"], corrupt=True)), 0, 9)
        assert r.responses[0].partition_responses[0].error_code == 2  # CORRUPT_MESSAGE
        r = call(s, produce("t", batch([b"c"]) + batch([b"d"])[:30]), 0, 9)  # truncated
        assert r.responses[0].partition_responses[0].error_code == 2
        ok = call(s, produce("t", batch([b"e"])), 0, 9)
        assert ok.responses[0].partition_responses[0].base_offset == 2
    with pylog.Log(os.path.join(broker.root, "t", "partition-0"), readonly=True) as log:
        assert [bytes(r.value) for r in log.scan()] == [b"a", b"b", b"e"]


@settings(max_examples=scaled(300, 5000), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=300), st.sampled_from([0, 1, 2, 3, 18, 19, 20, 32, 37, 10, 22]), st.integers(-1, 13))
@example(tail=b"\x00\x00\x01\x00\x00", key=1, version=12)  # an unknown tagged field: kio raised KeyError
def test_fuzz_request_decoder(tail, key, version):
    data = struct.pack(">hhi", key, version, 1) + tail
    try:
        decode_request(data)
    except RequestError:
        pass


def test_fuzz_over_the_socket(broker):
    rng = np.random.default_rng(1)
    good = [produce("fz", batch([b"x" * 10] * 3)), frame(3, 12, {"topics": None}),
            frame(1, 12, {"max_wait": 10, "min_bytes": 0, "max_bytes": 1000, "topics": [
                {"topic": "fz", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1000}]}]})]
    end = time.monotonic() + scaled(20, 300)
    for i in range(scaled(300, 5000)):
        if time.monotonic() > end:
            break
        f = bytearray(good[i % len(good)])
        for _ in range(int(rng.integers(1, 6))):
            f[int(rng.integers(4, len(f)))] = int(rng.integers(0, 256))
        with connect(broker) as s:
            s.settimeout(20)
            s.sendall(bytes(f))
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
    assert api_versions_ok(broker)
    assert broker.proc.poll() is None


@pytest.mark.parametrize("configs", [{"flush.messages": "1"}, {}], ids=["flush1", "default"])
def test_sigkill_under_acks_all_loses_nothing_acknowledged(tmp_path, configs):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    b = BrokerProcess(str(tmp_path / "root"))
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept: a dropped client cancels its calls
        admin.create_topics([NewTopic("dur", 2, 1, config=configs)])["dur"].result(20)
        acked: list[tuple[int, int, bytes]] = []
        lock = threading.Lock()

        def done(err, msg):  # type: ignore[no-untyped-def]
            if err is None:
                with lock:
                    acked.append((msg.partition(), msg.offset(), msg.value()))

        p = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 1,
                         "message.timeout.ms": 5000, "retries": 0})
        killed = False
        end = time.monotonic() + 60
        i = 0
        while time.monotonic() < end:
            p.produce("dur", value=b"rec-%d" % i, key=b"%d" % (i % 7), on_delivery=done)
            i += 1
            p.poll(0)
            if not killed and len(acked) >= 2000:
                os.kill(b.proc.pid, signal.SIGKILL)
                killed = True
                break
            if i % 500 == 0:
                p.flush(5)
        p.flush(10)
        assert killed, f"only {len(acked)} acknowledged in 60 s"
        b.proc.wait(10)
    finally:
        if b.proc.poll() is None:
            b.proc.kill()
    store = pylog.LogStore(b.root)
    try:
        t = store.topic("dur")
        for part, off, value in acked:
            assert bytes(t.partition(part).read(off).value) == value
    finally:
        store.close()


def test_vanishing_clients(broker):
    with connect(broker) as s:
        create_topic(s, "gone")
    with connect(broker) as s:  # a produce whose client leaves before the answer
        s.sendall(produce("gone", batch([b"v"])))
    with connect(broker) as s:  # half a frame, then gone
        s.sendall(produce("gone", batch([b"w"]))[:20])
    s = connect(broker)  # a long poll whose client leaves
    s.sendall(fetch("gone", 0, max_wait=2000, min_bytes=1 << 20))
    s.close()
    s = connect(broker)  # reset (RST) mid-request
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.sendall(produce("gone", batch([b"x"]))[:30])
    s.close()
    time.sleep(0.5)
    assert api_versions_ok(broker)
    with connect(broker) as s:  # the complete produce was appended, the halves were not
        got = fetched_values(call(s, fetch("gone", 0), 1, 12))
    assert got == [(0, b"v")]
