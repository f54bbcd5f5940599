"""pylog serve: what Kafka groups keep beyond the offset (issue 29's group items).

Commit metadata and leader epochs stored beside the offset and returned by OffsetFetch
(also after a restart, and through the admin APIs); a group whose consumers closed is Empty
and deletable at once; members keep their ids across a broker restart (also a kill -9) and
go on consuming; OffsetDelete; ListGroups v5's state and type filters.
"""
from __future__ import annotations

import signal
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from serve_util import BrokerProcess  # noqa: E402

import pylog  # noqa: E402


@pytest.fixture()
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    b.stop()


def _topic(b: BrokerProcess, name: str, partitions: int, n: int) -> None:
    """Create ``name`` and produce ``n`` records (``name-i``) round-robin over its partitions."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(name, value=f"{name}-{i}".encode(), partition=i % partitions)
    assert p.flush(20) == 0


def _consumer(b: BrokerProcess, group: str, **conf: object) -> ck.Consumer:
    return ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                        **conf})


def _assigned(c: ck.Consumer, timeout: float = 20) -> list[TopicPartition]:
    end = time.monotonic() + timeout
    while not c.assignment() and time.monotonic() < end:
        c.poll(0.1)
    assert c.assignment(), "no assignment"
    return c.assignment()


# -- 1. commit metadata and leader epoch ---------------------------------------------------------
def test_commit_metadata_and_leader_epoch_round_trip_and_survive_restart(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root)
    try:
        _topic(b, "meta", 2, 10)
        c = _consumer(b, "gm")
        c.subscribe(["meta"])
        _assigned(c)
        c.commit(offsets=[TopicPartition("meta", 0, 3, metadata="state-0", leader_epoch=0),
                          TopicPartition("meta", 1, 2, metadata="ünïcode ✓")], asynchronous=False)
        got = {tp.partition: tp for tp in c.committed([TopicPartition("meta", 0), TopicPartition("meta", 1)], 10)}
        assert (got[0].offset, got[0].metadata, got[0].leader_epoch) == (3, "state-0", 0)
        assert (got[1].offset, got[1].metadata) == (2, "ünïcode ✓")
        c.close()
    finally:
        b.stop(signal.SIGKILL)
    # the library reads the same commit (confluent-kafka sends the C string's terminating
    # NUL as part of the metadata; Kafka stores it as sent, so does pylog)
    store = pylog.LogStore(root)
    with store.consumer("meta", group="gm") as pc:
        assert pc.committed(0) == 3 and pc.committed_metadata(0) == "state-0\0"
        assert pc.committed_metadata(1) == "ünïcode ✓\0"
    store.close()
    b = BrokerProcess(root)
    try:
        c = _consumer(b, "gm")
        got = {tp.partition: tp for tp in c.committed([TopicPartition("meta", 0), TopicPartition("meta", 1)], 10)}
        assert (got[0].offset, got[0].metadata, got[0].leader_epoch) == (3, "state-0", 0)
        assert (got[1].offset, got[1].metadata) == (2, "ünïcode ✓")
        c.close()
    finally:
        b.stop()


def test_admin_alter_and_list_consumer_group_offsets_keep_metadata(broker):
    _topic(broker, "adm", 2, 6)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    req = ConsumerGroupTopicPartitions("ga", [TopicPartition("adm", 0, 4, metadata="m0"),
                                              TopicPartition("adm", 1, 1, metadata="m1")])
    res = admin.alter_consumer_group_offsets([req])["ga"].result(10)
    assert {tp.partition: tp.error for tp in res.topic_partitions} == {0: None, 1: None}
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("ga")])["ga"].result(10)
    got = {tp.partition: (tp.offset, tp.metadata) for tp in res.topic_partitions}
    assert got == {0: (4, "m0"), 1: (1, "m1")}


def test_pylog_consumer_commit_metadata_is_seen_by_kafka_clients(broker):
    _topic(broker, "lib", 2, 4)
    store = pylog.LogStore(broker.root)
    with store.consumer("lib", group="gl") as pc:
        pc.commit({0: 1, 1: 2}, metadata={0: "zero"})
        assert pc.committed_metadata(0) == "zero" and pc.committed_metadata(1) == ""
        pc.commit({1: 2}, metadata="one")  # same offset, new metadata: stored
        assert pc.committed_metadata(1) == "one"
        with pytest.raises(pylog.InvalidArgumentError, match="4097 characters"):
            pc.commit({0: 1}, metadata="x" * 4097)
        with pytest.raises(TypeError, match="must be a str"):
            pc.commit({0: 1}, metadata={0: 5})  # type: ignore[dict-item]
    store.close()
    # kafka-python (confluent-kafka reads metadata as a C string: a text sent without a
    # terminating NUL, as pylog's and Java's clients send it, comes back with what follows)
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="gl", enable_auto_commit=False)
    try:
        got = {p: kc.committed(KTP("lib", p), metadata=True) for p in (0, 1)}
        assert {p: (o.offset, o.metadata) for p, o in got.items()} == {0: (1, "zero"), 1: (2, "one")}
    finally:
        kc.close()


def test_offset_file_versions():
    from pylog.consumer import OFFSET_FILE_SIZE, decode_commit, decode_offset, encode_offset

    old = encode_offset(1234, 99)  # no metadata, no epoch: the 36-byte version 1, as before
    assert len(old) == OFFSET_FILE_SIZE and decode_commit(old) == (1234, -1, "")
    new = encode_offset(77, 99, "ctx ✓", 5)
    assert decode_commit(new) == (77, 5, "ctx ✓") and decode_offset(new) == 77
    for bad in (new[:-1], new[:20] + bytes([new[20] ^ 1]) + new[21:], new + b"x"):
        assert decode_commit(bad) is None
