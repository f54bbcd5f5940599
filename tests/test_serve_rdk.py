"""Broker fixes found by librdkafka's test suite (scripts/librdkafka-suite.py, docs/serve.md
"librdkafka's test suite"): one test each, through confluent-kafka, fast enough for every run."""
from __future__ import annotations

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from serve_util import BrokerProcess  # noqa: E402

import pylog  # noqa: E402


@pytest.fixture(scope="module")
def broker(tmp_path_factory):  # type: ignore[no-untyped-def]
    b = BrokerProcess(str(tmp_path_factory.mktemp("rdk") / "root"))
    yield b
    assert b.stop() == 0


def _policy(a: AdminClient, topic: str) -> str:
    res = ConfigResource(ResourceType.TOPIC, topic)
    return a.describe_configs([res])[res].result(20)["cleanup.policy"].value


def test_cleanup_policy_append_compact_makes_compact_delete(broker):
    """librdkafka 0011 (test_message_single_partition_record_fail): IncrementalAlterConfigs
    APPENDs ``compact`` to a topic's ``cleanup.policy`` (``delete``), as Kafka allows, then
    expects each keyless record to fail with INVALID_RECORD. The broker refused the
    resulting ``delete,compact`` (INVALID_CONFIG), so every record was stored."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("both", 1, 1)])["both"].result(20)
    res = ConfigResource(ResourceType.TOPIC, "both", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    a.incremental_alter_configs([res])[res].result(20)
    assert _policy(a, "both") == "compact,delete"

    errors: list[str | None] = []
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.size": 1})
    for i in range(6):
        key = None if i % 3 == 0 else b"k%d" % i
        p.produce("both", value=b"v%d" % i, key=key,
                  on_delivery=lambda err, _m: errors.append(None if err is None else err.name()))
        p.flush(20)
    assert errors == ["INVALID_RECORD", None, None, "INVALID_RECORD", None, None]

    # SUBTRACT compact: back to delete, and a keyless record is stored again
    res = ConfigResource(ResourceType.TOPIC, "both", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SUBTRACT)])
    a.incremental_alter_configs([res])[res].result(20)
    assert _policy(a, "both") == "delete"
    errors.clear()
    p.produce("both", value=b"keyless", on_delivery=lambda err, _m: errors.append(err))
    p.flush(20)
    assert errors == [None]

    # none at all is still refused
    res = ConfigResource(ResourceType.TOPIC, "both", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    with pytest.raises(ck.KafkaException) as e:
        a.incremental_alter_configs([res])[res].result(20)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_CONFIG


def test_compact_delete_topics_get_retention_and_compaction(tmp_path):
    """The library's side of ``compact,delete``: both the retention and the compaction of
    the store take such a topic."""
    store = pylog.LogStore(str(tmp_path / "root"))
    store.create_topic("cd", partitions=1, cleanup_policy="compact,delete", segment_bytes=4096,
                       retention_bytes=8192)
    store.create_topic("c", partitions=1, cleanup_policy="compact")
    log = store.topic("cd").partition(0)
    for i in range(400):
        log.append(b"x" * 40, key=b"k%d" % (i % 5))
    log.roll()
    got = store.enforce_retention()
    assert got.get(("cd", 0), 0) > 0 and ("c", 0) not in got
    done = store.compact()
    assert ("cd", 0) in done and ("c", 0) in done
    store.close()


def test_create_partitions_with_an_assignment_to_this_broker(broker):
    """librdkafka 0081 (do_test_CreatePartitions): growing a topic with an explicit replica
    assignment that names this broker (node 0) alone was INVALID_REPLICA_ASSIGNMENT ("manual
    replica assignment is not supported"), although CreateTopics accepts the same."""
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("grow", 2, 1)])["grow"].result(20)
    a.create_partitions([NewPartitions("grow", 4, replica_assignment=[[0], [0]])])["grow"].result(20)
    md = a.list_topics("grow", timeout=20).topics["grow"]
    assert sorted(md.partitions) == [0, 1, 2, 3] and all(p.replicas == [0] for p in md.partitions.values())
    for assignment in ([[1]], [[0], [0]]):  # another broker; two assignments for one new partition
        with pytest.raises(ck.KafkaException) as e:
            a.create_partitions([NewPartitions("grow", 5, replica_assignment=assignment)])["grow"].result(20)
        assert e.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT
    a.create_partitions([NewPartitions("grow", 5)])["grow"].result(20)
    assert len(a.list_topics("grow", timeout=20).topics["grow"].partitions) == 5
