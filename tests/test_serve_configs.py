"""Topic and broker configs as Kafka users write them (issue 29 items 7, 8 and 4): every Kafka
topic config accepted and reported, those with a meaning here honoured, IncrementalAlterConfigs
and AlterConfigs on a live topic, ``pylog serve --config`` in server.properties form, and
keyless records refused by a compacted topic. Through confluent-kafka, kafka-python and raw
requests against a real ``pylog serve`` process."""
from __future__ import annotations

import pytest
from serve_util import BrokerProcess, call, connect, create_topic, produce, wait_for

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(str(tmp_path_factory.mktemp("root")))
    yield b
    b.stop()


def _keyed_batch(keys: list[bytes | None]) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, k in enumerate(keys):
        b.append(i, timestamp=1000, key=k, value=b"v%d" % i, headers=[])
    return bytes(b.build())


# -- item 4: keyless records in a compacted topic ---------------------------------------------
def test_keyless_record_in_compacted_topic_is_refused_per_record(broker):
    with connect(broker) as s:
        create_topic(s, "compacted-raw", cleanup_policy="compact")
        r = call(s, produce("compacted-raw", _keyed_batch([b"a", None, b"b", None])), 0, 9)
        p = r.responses[0].partition_responses[0]
        assert p.error_code == 87 and p.base_offset == -1  # INVALID_RECORD
        assert [e.batch_index for e in p.record_errors] == [1, 3]
        assert "without key" in p.record_errors[0].batch_index_error_message
        assert "compacted-raw-0" in (p.error_message or "")
        # nothing of that batch was appended; a keyed batch still goes in at offset 0
        r = call(s, produce("compacted-raw", _keyed_batch([b"a", b"b"])), 0, 9)
        p = r.responses[0].partition_responses[0]
        assert (p.error_code, p.base_offset) == (0, 0)
        # a delete topic takes keyless records
        create_topic(s, "plain-raw")
        r = call(s, produce("plain-raw", _keyed_batch([None])), 0, 9)
        assert r.responses[0].partition_responses[0].error_code == 0


def test_keyless_record_in_compacted_topic_fails_its_delivery(broker):
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic("compacted-ck", 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([new])["compacted-ck"].result(20)
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    got: dict[bytes | None, object] = {}
    p.produce("compacted-ck", value=b"x", key=None, on_delivery=lambda err, msg: got.__setitem__(None, err))
    p.flush(20)
    p.produce("compacted-ck", value=b"y", key=b"k", on_delivery=lambda err, msg: got.__setitem__(b"k", err))
    p.flush(20)
    err = got[None]
    assert err is not None and err.code() == ck.KafkaError.INVALID_RECORD, err
    assert got[b"k"] is None
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-keyless", "auto.offset.reset": "earliest"})
    try:
        c.assign([ck.TopicPartition("compacted-ck", 0, 0)])
        msgs = wait_for(lambda: c.consume(10, 1), 20)
        assert [(m.key(), m.value(), m.offset()) for m in msgs] == [(b"k", b"y", 0)]
    finally:
        c.close()
