"""`pylog serve` with confluent-kafka (librdkafka), aiokafka and kcat: admin operations,
each compression codec, consuming from earliest / latest / a timestamp, headers."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic  # noqa: E402
from serve_util import BrokerProcess  # noqa: E402

import pylog  # noqa: E402
from pylog.serve.headers import decode_headers, encode_headers  # noqa: E402


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(str(tmp_path_factory.mktemp("serve") / "root"))
    yield b
    assert b.stop() == 0


def _produce(b: BrokerProcess, topic: str, n: int, **conf):  # type: ignore[no-untyped-def]
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, **conf})
    acked = []

    def done(err, msg):  # type: ignore[no-untyped-def]
        assert err is None, err
        acked.append(msg.offset())

    for i in range(n):
        p.produce(topic, value=b"value-%d" % i, key=b"key-%d" % i, headers=[("i", str(i).encode())],
                  on_delivery=done)
        if i % 1000 == 999:
            p.poll(0)
    assert p.flush(30) == 0
    return acked


def _consume(b: BrokerProcess, topic: str, n: int, offset: int = ck.OFFSET_BEGINNING, partition: int = 0):  # type: ignore[no-untyped-def]
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([ck.TopicPartition(topic, partition, offset)])
    out = []
    end = time.monotonic() + 30
    while len(out) < n and time.monotonic() < end:
        m = c.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            out.append(m)
    c.close()
    return out


def test_admin_create_describe_partitions_delete(broker):
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    fs = a.create_topics([NewTopic("adm", 2, 1, config={"flush.messages": "1", "retention.ms": "60000"})])
    fs["adm"].result(20)
    bad = a.create_topics([NewTopic("adm-bad", 1, 1, config={"no.such.config": "1"})])
    with pytest.raises(ck.KafkaException) as e:
        bad["adm-bad"].result(20)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    again = a.create_topics([NewTopic("adm", 1, 1)])
    with pytest.raises(ck.KafkaException) as e:
        again["adm"].result(20)
    assert e.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    res = ConfigResource(ConfigResource.Type.TOPIC, "adm")
    cfg = a.describe_configs([res])[res].result(20)
    assert cfg["flush.messages"].value == "1" and cfg["retention.ms"].value == "60000"
    a.create_partitions([NewPartitions("adm", 5)])["adm"].result(20)
    md = a.list_topics(timeout=20)
    assert len(md.topics["adm"].partitions) == 5
    # the library sees the same topic, its config mapped to LogConfig
    with pylog.Log(os.path.join(broker.root, "adm", "partition-4"), readonly=True) as log:
        assert log.config.fsync == "always" and log.config.retention_ms == 60000
    a.delete_topics(["adm"])["adm"].result(20)
    assert "adm" not in a.list_topics(timeout=20).topics
    assert not os.path.exists(os.path.join(broker.root, "adm"))


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_each_codec_consume_and_library_read(broker, codec):
    topic = "codec-" + codec
    acked = _produce(broker, topic, 3000, **{"compression.type": codec, "acks": "all"})
    assert sorted(acked) == list(range(3000))
    got = _consume(broker, topic, 3000)
    assert [(m.offset(), m.key(), m.value(), m.headers()) for m in got] == [
        (i, b"key-%d" % i, b"value-%d" % i, [("i", str(i).encode())]) for i in range(3000)]
    with pylog.Log(os.path.join(broker.root, topic, "partition-0"), readonly=True) as log:
        r = log.read(1234)
        assert (bytes(r.key), bytes(r.value), decode_headers(r.metadata)) == (
            b"key-1234", b"value-1234", [("i", b"1234")])


def test_library_appends_reach_kafka_consumers(broker):
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("lib", 1, 1)])["lib"].result(20)
    _produce(broker, "lib", 3)  # offsets 0-2 from librdkafka
    # the broker is the writer; a library process appends through the broker only, so this
    # checks the other direction with what a library would have written: metadata in the
    # header encoding and metadata in another encoding
    p = ck.Producer({"bootstrap.servers": broker.bootstrap})
    p.produce("lib", value=b"x", headers=[("a", b"1"), ("b", None)])
    p.flush(20)
    got = _consume(broker, "lib", 4)
    assert got[3].headers() == [("a", b"1"), ("b", None)]
    with pylog.Log(os.path.join(broker.root, "lib", "partition-0"), readonly=True) as log:
        assert bytes(log.read(3).metadata) == encode_headers([("a", b"1"), ("b", None)])


def test_consume_from_latest_and_timestamp(broker):
    p = ck.Producer({"bootstrap.servers": broker.bootstrap})
    t0 = 1_700_000_000_000
    for i in range(100):
        p.produce("times", value=b"%d" % i, timestamp=t0 + i * 1000)
    p.flush(20)
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused"})
    found = c.offsets_for_times([ck.TopicPartition("times", 0, t0 + 42_500)], timeout=20)
    assert found[0].offset == 43
    lo, hi = c.get_watermark_offsets(ck.TopicPartition("times", 0), timeout=20)
    assert (lo, hi) == (0, 100)
    c.close()
    got = _consume(broker, "times", 57, offset=43)
    assert [m.value() for m in got] == [b"%d" % i for i in range(43, 100)]
    assert got[0].timestamp() == (ck.TIMESTAMP_CREATE_TIME, t0 + 43_000)
    # from latest: only what is produced after the assignment
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused"})
    c.assign([ck.TopicPartition("times", 0, ck.OFFSET_END)])
    c.poll(1.0)
    p.produce("times", value=b"new")
    p.flush(20)
    m = None
    end = time.monotonic() + 20
    while m is None and time.monotonic() < end:
        m = c.poll(0.5)
    c.close()
    assert m is not None and (m.offset(), m.value()) == (100, b"new")


def test_aiokafka(broker):
    aiokafka = pytest.importorskip("aiokafka")

    async def run() -> list:  # type: ignore[type-arg]
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=False)
        await p.start()
        try:
            for i in range(20):
                await p.send_and_wait("aio", b"a%d" % i, key=b"k", headers=[("h", b"v")])
        finally:
            await p.stop()
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([aiokafka.TopicPartition("aio", 0)])
            await c.seek_to_beginning()
            out = []
            while len(out) < 20:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=500), 20)
                for msgs in batch.values():
                    out.extend(msgs)
            return [(m.offset, m.key, m.value, list(m.headers)) for m in out]
        finally:
            await c.stop()

    got = asyncio.run(asyncio.wait_for(run(), 60))
    assert got == [(i, b"k", b"a%d" % i, [("h", b"v")]) for i in range(20)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian package) not installed")
def test_kcat(broker):
    lines = "".join(f"k{i}:v{i}\n" for i in range(10))
    subprocess.run(["kcat", "-b", broker.bootstrap, "-P", "-t", "kc", "-K:", "-H", "src=kcat"],
                   input=lines, text=True, check=True, timeout=60)
    out = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", "kc", "-o", "beginning", "-e",
                          "-f", "%o %k %s %h\n"], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == [f"{i} k{i} v{i} src=kcat" for i in range(10)]
    meta = subprocess.run(["kcat", "-b", broker.bootstrap, "-L", "-t", "kc"], capture_output=True, text=True,
                          check=True, timeout=60)
    assert 'topic "kc" with 1 partitions' in meta.stdout
