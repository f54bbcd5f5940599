"""`pylog serve` keeps timestamps as Kafka does (issue 29, items 2 and 3), through
confluent-kafka (librdkafka): CreateTime kept as produced, also when it goes back;
offsets_for_times and ListOffsets MAX_TIMESTAMP (the first offset holding the largest
timestamp, KAFKA-16310); ``message.timestamp.type=LogAppendTime``."""
from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)
from serve_util import BrokerProcess  # noqa: E402

import pylog  # noqa: E402

T0 = 1_600_000_000_000  # 2020: far older than anything the broker stamps
# produced in this order: they go back and forth, and the largest (T0 + 9000) comes twice
STAMPS = [T0 + x for x in (1000, 5000, 2000, 9000, 3000, 9000, 500)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(str(tmp_path_factory.mktemp("serve") / "root"))
    yield b
    assert b.stop() == 0


def _produce(b: BrokerProcess, topic: str, stamps: list[int]) -> list[tuple[int, tuple[int, int]]]:
    """Produce one record per stamp, one at a time (each its own batch): (offset, timestamp
    of the delivery report) each."""
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    out = []

    def done(err, msg):  # type: ignore[no-untyped-def]
        assert err is None, err
        out.append((msg.offset(), msg.timestamp()))

    for i, ts in enumerate(stamps):
        p.produce(topic, value=b"v%d" % i, timestamp=ts, on_delivery=done)
        assert p.flush(20) == 0  # one batch per record
    return out


def _consume(b: BrokerProcess, topic: str, n: int) -> list[ck.Message]:
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    out: list[ck.Message] = []
    end = time.monotonic() + 30
    while len(out) < n and time.monotonic() < end:
        m = c.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            out.append(m)
    c.close()
    return out


def test_create_time_kept_as_produced(broker):
    """Old timestamps that go back come back unchanged (the old broker raised each one
    below the partition's newest), in the library too; offsets_for_times answers the first
    offset at or after each time, as Kafka does."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("ct", 1, 1)])["ct"].result(20)
    reports = _produce(broker, "ct", STAMPS)
    assert reports == [(i, (ck.TIMESTAMP_CREATE_TIME, ts)) for i, ts in enumerate(STAMPS)]
    got = _consume(broker, "ct", len(STAMPS))
    assert [(m.offset(), m.timestamp()) for m in got] == [(i, (ck.TIMESTAMP_CREATE_TIME, ts))
                                                          for i, ts in enumerate(STAMPS)]
    with pylog.Log(os.path.join(broker.root, "ct", "partition-0"), readonly=True) as log:
        assert [r.timestamp for r in log.scan()] == STAMPS
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused"})
    for target, want in ((T0, 0), (T0 + 1500, 1), (T0 + 4000, 1), (T0 + 6000, 3), (T0 + 9000, 3),
                         (T0 + 9001, -1)):
        found = c.offsets_for_times([ck.TopicPartition("ct", 0, target)], timeout=20)
        assert found[0].error is None and found[0].offset == want, (target, found[0])
    c.close()
    # ListOffsets MAX_TIMESTAMP (-3): the FIRST offset holding the largest (KAFKA-16310)
    res = a.list_offsets({ck.TopicPartition("ct", 0): OffsetSpec.max_timestamp()})
    info = res[ck.TopicPartition("ct", 0)].result(20)
    assert (info.offset, info.timestamp) == (3, T0 + 9000)
    res = a.list_offsets({ck.TopicPartition("ct", 0): OffsetSpec.for_timestamp(T0 + 2500)})
    info = res[ck.TopicPartition("ct", 0)].result(20)
    assert (info.offset, info.timestamp) == (1, T0 + 5000)


def test_log_append_time(broker):
    """message.timestamp.type=LogAppendTime: the broker stamps its own time (not the
    producer's), says so in the Produce response and in Fetch answers (batch attribute bit
    3), and DescribeConfigs reports the type."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("lat", 1, 1, config={"message.timestamp.type": "LogAppendTime"})])["lat"].result(20)
    res = ConfigResource(ConfigResource.Type.TOPIC, "lat")
    assert a.describe_configs([res])[res].result(20)["message.timestamp.type"].value == "LogAppendTime"
    res = ConfigResource(ConfigResource.Type.TOPIC, "ct")
    assert a.describe_configs([res])[res].result(20)["message.timestamp.type"].value == "CreateTime"
    before = int(time.time() * 1000)
    reports = _produce(broker, "lat", STAMPS[:4])
    after = int(time.time() * 1000)
    assert [o for o, _ in reports] == [0, 1, 2, 3]
    stamped = [t for _, t in reports]
    assert all(kind == ck.TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after for kind, ts in stamped), stamped
    assert [ts for _, ts in stamped] == sorted(ts for _, ts in stamped)
    got = _consume(broker, "lat", 4)
    assert [m.timestamp() for m in got] == stamped  # each record its own append's time
    with pylog.Log(os.path.join(broker.root, "lat", "partition-0"), readonly=True) as log:
        assert log.config.timestamps == "append-time"
        assert [(ck.TIMESTAMP_LOG_APPEND_TIME, r.timestamp) for r in log.scan()] == stamped
    bad = a.create_topics([NewTopic("lat-bad", 1, 1, config={"message.timestamp.type": "Sometimes"})])
    with pytest.raises(ck.KafkaException) as e:
        bad["lat-bad"].result(20)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_CONFIG


def test_auto_created_topic_keeps_create_time(broker):
    """A topic the broker creates on first use keeps producers' timestamps too."""
    _produce(broker, "auto-ct", [T0 + 3000, T0 + 1000])
    got = _consume(broker, "auto-ct", 2)  # (a delivery report shows the producer's own time)
    assert [m.timestamp() for m in got] == [(ck.TIMESTAMP_CREATE_TIME, T0 + 3000),
                                            (ck.TIMESTAMP_CREATE_TIME, T0 + 1000)]


def test_max_timestamp_is_the_first_offset_holding_it(broker):
    """ListOffsets MAX_TIMESTAMP on timestamps that never decrease but repeat the largest:
    the first offset holding it (KAFKA-16310), not the last record (what the old broker
    answered)."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    _produce(broker, "maxts", [T0 + 1, T0 + 5, T0 + 7, T0 + 7, T0 + 7])
    tp = ck.TopicPartition("maxts", 0)
    info = a.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(20)
    assert (info.offset, info.timestamp) == (2, T0 + 7)
    empty = ck.TopicPartition("maxts-empty", 0)
    a.create_topics([NewTopic("maxts-empty", 1, 1)])["maxts-empty"].result(20)
    info = a.list_offsets({empty: OffsetSpec.max_timestamp()})[empty].result(20)
    assert (info.offset, info.timestamp) == (-1, -1)


def test_timestamp_bounds_answer_invalid_timestamp(broker):
    """message.timestamp.after.max.ms (Kafka 4.0's default for a new topic: one hour) and
    before.max.ms: a CreateTime out of them is refused with INVALID_TIMESTAMP, nothing
    appended; LogAppendTime topics are not bound."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    lat = NewTopic("bounds-lat", 1, 1, config={"message.timestamp.type": "LogAppendTime"})
    before = NewTopic("bounds-before", 1, 1, config={"message.timestamp.before.max.ms": "60000"})
    for f in a.create_topics([NewTopic("bounds", 1, 1), before, lat]).values():
        f.result(20)
    res = ConfigResource(ConfigResource.Type.TOPIC, "bounds")
    cfg = a.describe_configs([res])[res].result(20)
    assert cfg["message.timestamp.after.max.ms"].value == "3600000"
    assert cfg["message.timestamp.before.max.ms"].value == str((1 << 63) - 1)
    now = int(time.time() * 1000)
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "retries": 0})
    errors = []

    def done(err, msg):  # type: ignore[no-untyped-def]
        errors.append((msg.topic(), err.code() if err else None))

    cases = [("bounds", now + 2 * 3_600_000), ("bounds", now + 60_000), ("bounds", T0),
             ("bounds-before", now - 3_600_000), ("bounds-before", now - 1_000), ("bounds-lat", now + 2 * 3_600_000)]
    for topic, ts in cases:
        p.produce(topic, value=b"x", timestamp=ts, on_delivery=done)
        assert p.flush(20) == 0
    assert errors == [("bounds", ck.KafkaError.INVALID_TIMESTAMP), ("bounds", None), ("bounds", None),
                      ("bounds-before", ck.KafkaError.INVALID_TIMESTAMP), ("bounds-before", None),
                      ("bounds-lat", None)]
    with pylog.Log(os.path.join(broker.root, "bounds", "partition-0"), readonly=True) as log:
        assert [r.timestamp for r in log.scan()] == [now + 60_000, T0]
