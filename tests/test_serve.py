"""`pylog serve` with kafka-python, a Kafka client nobody here wrote (tests/serve_util.py
runs the broker as a real process on a free loopback port)."""
from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from serve_util import BrokerProcess, api_versions_ok  # noqa: E402

import pylog  # noqa: E402
from pylog.serve.headers import decode_headers  # noqa: E402


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    b.stop()


def _producer(b: BrokerProcess, **kw):  # type: ignore[no-untyped-def]
    # idempotence needs InitProducerId, which comes with the next step (docs/serve.md)
    return kafka.KafkaProducer(bootstrap_servers=b.bootstrap, enable_idempotence=False, **kw)


def _consume(b: BrokerProcess, topic: str, n: int, partition: int = 0, **kw):  # type: ignore[no-untyped-def]
    c = kafka.KafkaConsumer(bootstrap_servers=b.bootstrap, consumer_timeout_ms=5000, **kw)
    c.assign([kafka.TopicPartition(topic, partition)])
    if "auto_offset_reset" not in kw:
        c.seek_to_beginning()
    out = []
    for m in c:
        out.append(m)
        if len(out) >= n:
            break
    c.close()
    return out


def test_produce_fetch_round_trip_with_library_reader(broker):
    p = _producer(broker, acks="all")
    sent = [p.send("orders", value=b"v%d" % i, key=b"k%d" % i, headers=[("h", b"x%d" % i), ("n", b"")])
            for i in range(50)]
    offsets = [f.get(timeout=20).offset for f in sent]
    p.close()
    assert offsets == list(range(50))
    got = _consume(broker, "orders", 50)
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == [
        (i, b"k%d" % i, b"v%d" % i, [("h", b"x%d" % i), ("n", b"")]) for i in range(50)]
    # the same records through the library, read-only beside the broker that writes them
    with pylog.Log(os.path.join(broker.root, "orders", "partition-0"), readonly=True) as log:
        recs = list(log.scan())
    assert [(r.offset, bytes(r.key), bytes(r.value)) for r in recs] == [
        (i, b"k%d" % i, b"v%d" % i) for i in range(50)]
    assert decode_headers(recs[3].metadata) == [("h", b"x3"), ("n", b"")]
    # a library writer is refused while the broker writes the partition
    with pytest.raises(pylog.LogLockedError):
        pylog.Log(os.path.join(broker.root, "orders", "partition-0"))


def test_graceful_sigterm_exit(broker):
    p = _producer(broker, acks=1)
    p.send("t", b"x").get(timeout=20)
    p.close()
    assert broker.stop(signal.SIGTERM) == 0


def test_library_appends_reach_kafka_consumers(tmp_path):
    from pylog.serve.headers import encode_headers

    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        t = store.create_topic("lib")
        t.append(b"with-headers", key=b"a", partition=0, metadata=encode_headers([("trace", b"42"), ("z", None)]),
                 timestamp=1_700_000_000_000)
        t.append(b"raw-metadata", partition=0, metadata=b"\xff not headers", timestamp=1_700_000_000_001)
        t.append(b"plain", partition=0, timestamp=1_700_000_000_002)
    b = BrokerProcess(root)
    try:
        got = _consume(b, "lib", 3)
        assert [(m.offset, m.key, m.value, m.headers, m.timestamp) for m in got] == [
            (0, b"a", b"with-headers", [("trace", b"42"), ("z", None)], 1_700_000_000_000),
            (1, None, b"raw-metadata", [("pylog.metadata", b"\xff not headers")], 1_700_000_000_001),
            (2, None, b"plain", [], 1_700_000_000_002)]
    finally:
        assert b.stop() == 0


def test_second_broker_on_the_same_root_and_busy_port_fail_in_one_line(broker, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT, py_env

    for args in (["--root", broker.root, "serve", "--port", "0"],
                 ["--root", str(tmp_path / "other"), "serve", "--port", str(broker.port)]):
        out = subprocess.run([sys.executable, "-m", "pylog.cli", *args], cwd=ROOT, env=py_env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out
        err = [line for line in out.stderr.splitlines() if "pylog.serve INFO" not in line]
        assert len(err) == 1 and "Traceback" not in out.stderr, out.stderr
    assert api_versions_ok(broker)


def test_serve_without_the_extra_says_what_to_install(tmp_path):
    from conftest import run_py

    out = run_py(f"""
        import sys
        sys.modules["kio"] = None  # as if the serve extra were not installed
        from pylog.cli import main
        main(["--root", {str(tmp_path)!r}, "serve", "--port", "0"])
    """)
    assert out.returncode == 1
    assert out.stderr.strip().count("\\n") == 0 and "pylog-commitlog[serve]" in out.stderr, out.stderr


def test_library_reader_follows_kafka_producers(broker):
    """A read-only Log kept open beside the broker sees exactly the acknowledged records
    after each round of produces (it refreshes to the writer's tail)."""
    p = _producer(broker, acks=1, linger_ms=0)
    p.send("follow", b"first").get(timeout=20)
    path = os.path.join(broker.root, "follow", "partition-0")
    with pylog.Log(path, readonly=True) as log:
        acked = 1
        for rnd in range(10):
            futures = [p.send("follow", b"r%d-%d" % (rnd, i)) for i in range(rnd * 7 + 1)]
            acked += len([f.get(timeout=20) for f in futures])
            log.refresh()
            assert log.next_offset == acked
            assert bytes(log.read(acked - 1).value) == b"r%d-%d" % (rnd, rnd * 7)
    p.close()
