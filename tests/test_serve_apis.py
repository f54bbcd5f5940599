"""`pylog serve`: the APIs users' tools call (issue 29, item 9): DeleteRecords,
OffsetForLeaderEpoch, DescribeProducers, authorized operations in Metadata, fetch sessions
and the current versions of Produce, Fetch and Metadata; through confluent-kafka
(librdkafka) where it has the call, else raw kio requests."""
from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    batch,
    call,
    connect,
    create_topic,
    fetch,
    frame,
    produce,
    produce_result,
)

import pylog  # noqa: E402
from pylog.serve.admin_records import START_DIR  # noqa: E402

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture
def root(tmp_path):  # type: ignore[no-untyped-def]
    return str(tmp_path / "root")


@pytest.fixture
def broker(root):  # type: ignore[no-untyped-def]
    """A broker of its own (the tests that restart it)."""
    b = BrokerProcess(root)
    yield b
    assert b.stop() == 0


@pytest.fixture(scope="module")
def shared(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One broker for the tests that neither restart it nor need an empty root (each
    uses topics of its own)."""
    b = BrokerProcess(str(tmp_path_factory.mktemp("apis") / "root"))
    yield b
    assert b.stop() == 0


def _produce(bootstrap: str, topic: str, n: int, partition: int = 0, **conf: object) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    errors = []
    for i in range(n):
        p.produce(topic, value=b"value-%d-" % i + b"x" * 100, partition=partition,
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert p.flush(30) == 0 and not errors, errors


def _first_from_earliest(bootstrap: str, topic: str, group: str) -> int:
    """The offset of the first record a subscribed consumer with auto.offset.reset=earliest gets."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        end = time.monotonic() + 30
        while time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                return int(m.offset())
        raise AssertionError("no record consumed in 30 s")
    finally:
        c.close()


def _earliest(a: AdminClient, topic: str) -> int:
    tp = ck.TopicPartition(topic, 0)
    return int(a.list_offsets({tp: OffsetSpec.earliest()})[tp].result(20).offset)


# -- DeleteRecords ----------------------------------------------------------------------------
def test_delete_records_moves_the_log_start_durably(root, broker):
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("dr", 1, 1, config={"segment.bytes": "4096"})])["dr"].result(20)
    _produce(broker.bootstrap, "dr", 300)
    assert _earliest(a, "dr") == 0
    part_dir = os.path.join(root, "dr", "partition-0")
    segments_before = len([f for f in os.listdir(part_dir) if f.endswith(".log")])
    assert segments_before > 3

    tp = ck.TopicPartition("dr", 0, 150)
    got = a.delete_records([tp])[tp].result(20)
    assert got.low_watermark == 150
    assert _earliest(a, "dr") == 150
    assert _first_from_earliest(broker.bootstrap, "dr", "g1") == 150
    with connect(broker) as s:  # below the log start: OFFSET_OUT_OF_RANGE, with the new start
        r = call(s, fetch("dr", 100), 1, 12)
        p = r.responses[0].partitions[0]
        assert p.error_code == OFFSET_OUT_OF_RANGE and p.log_start_offset == 150
        r = call(s, fetch("dr", 150), 1, 12)
        assert r.responses[0].partitions[0].error_code == 0
    # whole segments below 150 are gone from disk; the start is the partition's own mark,
    # which the library's readers honour as the broker does
    assert len([f for f in os.listdir(part_dir) if f.endswith(".log")]) < segments_before
    with pylog.Log(part_dir, readonly=True) as log:
        assert log.start_offset == 150 and next(iter(log)).offset == 150
    assert os.path.exists(os.path.join(part_dir, "log-start-offset"))
    assert not os.path.exists(os.path.join(root, "dr", START_DIR))

    # an offset below the start changes nothing; past the high watermark is out of range
    tp = ck.TopicPartition("dr", 0, 10)
    assert a.delete_records([tp])[tp].result(20).low_watermark == 150
    tp = ck.TopicPartition("dr", 0, 301)
    with pytest.raises(ck.KafkaException) as e:
        a.delete_records([tp])[tp].result(20)
    assert e.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE
    with connect(broker) as s:  # (librdkafka checks the topic itself first)
        r = call(s, frame(21, 2, {"timeout": 5000, "topics": [
            {"name": "no-such-topic", "partitions": [{"partition_index": 0, "offset": 1}]},
            {"name": "dr", "partitions": [{"partition_index": 7, "offset": 1},
                                          {"partition_index": 0, "offset": -2}]}]}),
                 21, 2)
        assert [(p.partition_index, p.error_code, p.low_watermark) for t in r.topics for p in t.partitions] == [
            (0, UNKNOWN_TOPIC_OR_PARTITION, -1), (7, UNKNOWN_TOPIC_OR_PARTITION, -1), (0, OFFSET_OUT_OF_RANGE, -1)]

    # after a restart over the same root: still 150
    assert broker.stop() == 0
    b2 = BrokerProcess(root)
    try:
        a2 = AdminClient({"bootstrap.servers": b2.bootstrap})
        assert _earliest(a2, "dr") == 150
        assert _first_from_earliest(b2.bootstrap, "dr", "g2") == 150
        # -1: up to the high watermark
        tp = ck.TopicPartition("dr", 0, -1)
        assert a2.delete_records([tp])[tp].result(20).low_watermark == 300
        assert _earliest(a2, "dr") == 300
    finally:
        assert b2.stop() == 0


def test_log_remove_before_deletes_whole_sealed_segments_only(tmp_path):
    with pylog.Log(str(tmp_path / "log"), segment_bytes=4096) as log:
        log.append_batch([b"x" * 100] * 200)
        bases = sorted(int(f.split(".")[0]) for f in os.listdir(log.path) if f.endswith(".log"))
        assert len(bases) > 3
        assert log.remove_before(bases[1] - 1) == 0  # inside the first segment: nothing
        assert log.remove_before(bases[2] + 1) == 2  # the two segments wholly below
        assert log.start_offset == bases[2]
        assert log.remove_before(10_000) == len(bases) - 3  # never the active segment
        assert log.start_offset == bases[-1] and log.next_offset == 200
        assert log.read(199).value == b"x" * 100
        with pytest.raises(pylog.errors.ArgumentTypeError):
            log.remove_before("1")  # type: ignore[arg-type]


def test_delete_records_of_a_deleted_then_recreated_topic_starts_afresh(shared):
    a = AdminClient({"bootstrap.servers": shared.bootstrap})
    a.create_topics([NewTopic("dr2", 1, 1)])["dr2"].result(20)
    _produce(shared.bootstrap, "dr2", 20)
    tp = ck.TopicPartition("dr2", 0, 15)
    assert a.delete_records([tp])[tp].result(20).low_watermark == 15
    a.delete_topics(["dr2"])["dr2"].result(20)
    a.create_topics([NewTopic("dr2", 1, 1)])["dr2"].result(20)
    _produce(shared.bootstrap, "dr2", 5)
    assert _earliest(a, "dr2") == 0


# -- OffsetForLeaderEpoch -----------------------------------------------------------------------
UNKNOWN_LEADER_EPOCH = 75


def test_offset_for_leader_epoch_raw(shared):
    _produce(shared.bootstrap, "ep", 12)
    with connect(shared) as s:
        r = call(s, frame(23, 4, {"replica_id": -1, "topics": [
            {"topic": "ep", "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0},
                {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
                {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 3},
                {"partition": 0, "current_leader_epoch": 2, "leader_epoch": 0},
                {"partition": 9, "current_leader_epoch": -1, "leader_epoch": 0}]},
            {"topic": "no-such", "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]}),
                 23, 4)
        got = [(t.topic, p.partition, p.error_code, p.leader_epoch, p.end_offset)
               for t in r.topics for p in t.partitions]
        assert got == [("ep", 0, 0, 0, 12), ("ep", 0, 0, 0, 12), ("ep", 0, 0, -1, -1),
                       ("ep", 0, UNKNOWN_LEADER_EPOCH, -1, -1), ("ep", 9, UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
                       ("no-such", 0, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
        # the leader epoch Metadata reports is the one answered
        md = call(s, frame(3, 12, {"topics": [{"name": "ep"}], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False}), 3, 12)
        assert md.topics[0].partitions[0].leader_epoch == 0


def test_librdkafka_validates_its_position_with_offset_for_leader_epoch(shared):
    """librdkafka (KIP-320) validates a position that carries a leader epoch with
    OffsetForLeaderEpoch before it fetches: the check succeeds and it does not reset."""
    import logging

    _produce(shared.bootstrap, "ep2", 20)
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    lg = logging.getLogger("test_serve_apis.rdkafka")
    lg.addHandler(Keep())
    lg.setLevel(logging.DEBUG)
    c = ck.Consumer({"bootstrap.servers": shared.bootstrap, "group.id": "v", "debug": "fetch,topic",
                     "auto.offset.reset": "latest", "enable.auto.commit": False}, logger=lg)
    try:
        c.assign([ck.TopicPartition("ep2", 0, 5, leader_epoch=0)])
        got: list[int] = []
        end = time.monotonic() + 30
        while len(got) < 15 and time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.offset())
    finally:
        c.close()
    assert got == list(range(5, 20))  # from 5: not reset to latest
    assert any("epoch validation succeeded: broker end offset 20" in x for x in lines), lines[-20:]


def test_librdkafka_validates_its_position_after_a_broker_restart_without_reset(tmp_path):
    """A librdkafka consumer whose broker restarts (same address) validates its position
    with OffsetForLeaderEpoch when it reconnects, and goes on from it: no reset, no
    record twice or missed."""
    import logging
    import socket

    with socket.socket() as s:  # a free port, for the broker to come back on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = str(tmp_path / "root")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    lg = logging.getLogger("test_serve_apis.restart")
    lg.addHandler(Keep())
    lg.setLevel(logging.DEBUG)
    b = BrokerProcess(root, "--port", str(port))
    c = None
    try:
        _produce(b.bootstrap, "rc", 10)
        c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "rc", "auto.offset.reset": "latest",
                         "enable.auto.commit": False, "debug": "fetch,topic"}, logger=lg)
        c.assign([ck.TopicPartition("rc", 0, 0)])
        got: list[int] = []

        def consume(n: int) -> None:
            end = time.monotonic() + 30
            while len(got) < n and time.monotonic() < end:
                m = c.poll(0.3)  # type: ignore[union-attr]
                if m is not None and m.error() is None:
                    got.append(m.offset())

        consume(10)
        assert got == list(range(10))
        assert b.stop() == 0
        b = BrokerProcess(root, "--port", str(port))
        _produce(b.bootstrap, "rc", 10)
        consume(20)
        assert got == list(range(20))
        assert any("validation succeeded: broker end offset" in x for x in lines), lines[-30:]
    finally:
        if c is not None:
            c.close()
        b.stop()


# -- DescribeProducers --------------------------------------------------------------------------
def _describe_producers(b: BrokerProcess, topic: str, partitions: list[int]):  # type: ignore[no-untyped-def]
    with connect(b) as s:
        r = call(s, frame(61, 0, {"topics": [{"name": topic, "partition_indexes": partitions}]}), 61, 0)
    return {p.partition_index: p for p in r.topics[0].partitions}


def test_describe_producers(root, broker):
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    a.create_topics([NewTopic("dp", 2, 1)])["dp"].result(20)
    before = int(time.time() * 1000)
    _produce(broker.bootstrap, "dp", 10, partition=0, **{"enable.idempotence": True})
    _produce(broker.bootstrap, "dp", 3, partition=0)  # not idempotent: no state
    got = _describe_producers(broker, "dp", [0, 1, 5])
    assert got[0].error_code == 0 and len(got[0].active_producers) == 1
    st = got[0].active_producers[0]
    assert st.producer_id >= 0 and st.producer_epoch == 0 and st.last_sequence == 9
    assert before - 1000 <= st.last_timestamp <= int(time.time() * 1000) + 1000
    assert st.coordinator_epoch == -1 and st.current_txn_start_offset == -1
    assert got[1].error_code == 0 and got[1].active_producers == ()
    assert got[5].error_code == UNKNOWN_TOPIC_OR_PARTITION
    # the state is the broker's durable one: the same after a restart
    assert broker.stop() == 0
    b2 = BrokerProcess(root)
    try:
        again = _describe_producers(b2, "dp", [0])[0].active_producers
        assert [(x.producer_id, x.producer_epoch, x.last_sequence) for x in again] == [
            (st.producer_id, 0, 9)]
    finally:
        assert b2.stop() == 0


# -- authorized operations in Metadata (KIP-430) ------------------------------------------------
def _topic_ops(conf: dict[str, object], topic: str) -> set[str]:
    from confluent_kafka import TopicCollection

    a = AdminClient(conf)
    d = a.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic].result(20)
    return {op.name for op in d.authorized_operations}


ALL_TOPIC_OPS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}


def test_authorized_operations_without_users(shared):
    a = AdminClient({"bootstrap.servers": shared.bootstrap})
    a.create_topics([NewTopic("ops", 1, 1)])["ops"].result(20)
    assert _topic_ops({"bootstrap.servers": shared.bootstrap}, "ops") == ALL_TOPIC_OPS
    with connect(shared) as s:
        # v10: topic and cluster operations, each only when asked for
        r = call(s, frame(3, 10, {"topics": [{"name": "ops"}], "allow_auto_topic_creation": False,
                                  "include_cluster_authorized_operations": True,
                                  "include_topic_authorized_operations": True}), 3, 10)
        assert r.topics[0].topic_authorized_operations == 3576  # Kafka's value without an authorizer
        # CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE
        assert r.cluster_authorized_operations == 8096
        r = call(s, frame(3, 10, {"topics": [{"name": "ops"}], "allow_auto_topic_creation": False,
                                  "include_cluster_authorized_operations": False,
                                  "include_topic_authorized_operations": False}), 3, 10)
        assert r.topics[0].topic_authorized_operations == -2147483648
        assert r.cluster_authorized_operations == -2147483648


def test_authorized_operations_honour_the_users_file(tmp_path):
    from pylog.serve import security

    users = str(tmp_path / "users.json")
    security.add_user(users, "admin", "admin-secret")
    security.add_user(users, "reader", "reader-secret", read=["t"], write=[])
    security.add_user(users, "writer", "writer-secret", read=[], write=["t"])
    b = BrokerProcess(str(tmp_path / "root"), "--users", users)
    try:
        def conf(user: str) -> dict[str, object]:
            return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": user + "-secret"}

        a = AdminClient(conf("admin"))
        a.create_topics([NewTopic("t", 1, 1)])["t"].result(20)
        assert _topic_ops(conf("admin"), "t") == ALL_TOPIC_OPS
        assert _topic_ops(conf("reader"), "t") == {"READ", "DESCRIBE", "DESCRIBE_CONFIGS"}
        assert _topic_ops(conf("writer"), "t") == ALL_TOPIC_OPS - {"READ"}
    finally:
        assert b.stop() == 0


# -- fetch sessions (KIP-227) -------------------------------------------------------------------
SESSION_NOT_FOUND, INVALID_SESSION_EPOCH = 70, 71


def _session_fetch(s, sid: int, epoch: int, parts: dict[int, int], forget: list[int] | None = None,
                   topic: str = "fs"):  # type: ignore[no-untyped-def]
    """A Fetch v12 of session ``sid``/``epoch``: ``parts`` maps partition -> fetch offset."""
    r = call(s, frame(1, 12, {"max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                              "session_id": sid, "session_epoch": epoch,
                              "topics": [{"topic": topic, "partitions": [
                                  {"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 20}
                                  for p, o in parts.items()]}] if parts else [],
                              "forgotten_topics_data": [{"topic": topic, "partitions": forget}] if forget else []}),
             1, 12)
    got = {p.partition_index: p for t in r.responses for p in t.partitions}
    return r, got


def _count(p) -> int:  # type: ignore[no-untyped-def]
    from kafka.record.memory_records import MemoryRecords

    n, recs = 0, MemoryRecords(bytes(p.records or b""))
    while recs.has_next():
        n += len(list(recs.next_batch()))
    return n


def test_fetch_session_full_then_incremental(shared):
    with connect(shared) as s:
        create_topic(s, "fs", partitions=3)
        for part, n in ((0, 5), (1, 3)):
            assert produce_result(call(s, produce("fs", batch([b"x"] * n), partition=part), 0, 9))[0] == 0
        # a full fetch opens a session: every partition answered
        r, got = _session_fetch(s, 0, 0, {0: 0, 1: 0, 2: 0})
        sid = r.session_id
        assert r.error_code == 0 and sid != 0
        assert sorted(got) == [0, 1, 2] and [_count(got[i]) for i in range(3)] == [5, 3, 0]
        # incremental: the new fetch offsets; nothing changed, nothing answered
        r, got = _session_fetch(s, sid, 1, {0: 5, 1: 3})
        assert r.error_code == 0 and r.session_id == sid and got == {}
        # records on partition 2 (not in the request): only it is answered, from its session offset
        assert produce_result(call(s, produce("fs", batch([b"y"] * 2), partition=2), 0, 9))[0] == 0
        r, got = _session_fetch(s, sid, 2, {})
        assert sorted(got) == [2] and _count(got[2]) == 2 and got[2].high_watermark == 2
        # the same epoch again, an unknown session
        r, got = _session_fetch(s, sid, 2, {})
        assert r.error_code == INVALID_SESSION_EPOCH and r.session_id == 0 and got == {}
        r, got = _session_fetch(s, sid ^ 0x5A5A, 1, {})
        assert r.error_code == SESSION_NOT_FOUND and got == {}
        # the session survives a wrong epoch; a forgotten partition is no longer answered
        r, got = _session_fetch(s, sid, 3, {2: 2}, forget=[1])
        assert r.error_code == 0 and got == {}
        assert produce_result(call(s, produce("fs", batch([b"z"]), partition=1), 0, 9))[0] == 0
        r, got = _session_fetch(s, sid, 4, {})
        assert got == {}
        r, got = _session_fetch(s, sid, 5, {1: 3})  # added back
        assert sorted(got) == [1] and _count(got[1]) == 1
        # a changed log start offset is answered without records
        r = call(s, frame(21, 2, {"timeout": 5000, "topics": [
            {"name": "fs", "partitions": [{"partition_index": 0, "offset": 2}]}]}), 21, 2)
        assert r.topics[0].partitions[0].error_code == 0
        r, got = _session_fetch(s, sid, 6, {1: 4})
        assert sorted(got) == [0] and got[0].log_start_offset == 2 and _count(got[0]) == 0
        # epoch -1 closes the session (a sessionless full fetch)
        r, got = _session_fetch(s, sid, -1, {0: 5})
        assert r.error_code == 0 and r.session_id == 0 and sorted(got) == [0]
        r, got = _session_fetch(s, sid, 7, {})
        assert r.error_code == SESSION_NOT_FOUND


def test_fetch_session_cache_is_bounded():
    """The cache keeps at most ``slots`` sessions and ``max_partitions`` partitions: a full
    fetch beyond them is answered sessionless, unless the oldest session is idle long enough."""
    import asyncio
    import types

    from pylog.serve import fetch_sessions as fsm

    class FakeBroker:
        async def fetch(self, req, version):  # type: ignore[no-untyped-def]
            return {"error_code": 0, "session_id": 0, "responses": [
                {"topic": t.topic, "partitions": [
                    {"partition_index": p.partition, "error_code": 0, "high_watermark": 0, "last_stable_offset": 0,
                     "log_start_offset": 0, "records": b""} for p in t.partitions]} for t in req.topics]}

    def req(n: int, epoch: int = 0, sid: int = 0):  # type: ignore[no-untyped-def]
        parts = [types.SimpleNamespace(partition=i, fetch_offset=0, partition_max_bytes=1) for i in range(n)]
        return types.SimpleNamespace(session_id=sid, session_epoch=epoch, max_wait=0, min_bytes=0, max_bytes=1,
                                     isolation_level=0, forgotten_topics_data=[],
                                     topics=[types.SimpleNamespace(topic="t", partitions=parts)])

    cache = fsm.FetchSessions(slots=2, max_partitions=10)
    run = asyncio.run
    a = run(cache.fetch(FakeBroker(), req(3), 12))["session_id"]  # type: ignore[arg-type]
    b = run(cache.fetch(FakeBroker(), req(3), 12))["session_id"]  # type: ignore[arg-type]
    assert a and b and len(cache) == 2 and cache.partitions == 6
    assert run(cache.fetch(FakeBroker(), req(1), 12))["session_id"] == 0  # type: ignore[arg-type]  # no slot
    assert run(cache.fetch(FakeBroker(), req(11), 12))["session_id"] == 0  # type: ignore[arg-type]  # too big
    cache._sessions[a].used -= fsm.EVICT_AFTER  # idle long enough: replaced
    c = run(cache.fetch(FakeBroker(), req(4), 12))["session_id"]  # type: ignore[arg-type]
    assert c and a not in cache._sessions and len(cache) == 2 and cache.partitions == 7
    # a session's incremental growth counts too; v6 has no sessions
    run(cache.fetch(FakeBroker(), req(5, epoch=1, sid=c), 12))  # type: ignore[arg-type]
    assert cache.partitions == 8
    assert run(cache.fetch(FakeBroker(), req(2, epoch=-1), 6))["session_id"] == 0  # type: ignore[arg-type]


def test_kafka_python_consumes_many_partitions_through_one_incremental_session(shared):
    kafka = pytest.importorskip("kafka")
    a = AdminClient({"bootstrap.servers": shared.bootstrap})
    a.create_topics([NewTopic("many", 40, 1)])["many"].result(20)
    p = ck.Producer({"bootstrap.servers": shared.bootstrap, "linger.ms": 5})
    for i in range(40):
        for j in range(5):
            p.produce("many", value=b"%d-%d" % (i, j), partition=i)
    assert p.flush(30) == 0
    c = kafka.KafkaConsumer("many", bootstrap_servers=shared.bootstrap, group_id="fs-g",
                            auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        seen: set[bytes] = set()
        end = time.monotonic() + 60
        while len(seen) < 200 and time.monotonic() < end:
            for recs in c.poll(timeout_ms=500).values():
                seen.update(r.value for r in recs)
        assert len(seen) == 200
        for _ in range(5):  # a few more (empty) incremental fetches
            c.poll(timeout_ms=200)
        handlers = c._fetcher._session_handlers
        assert handlers, "no fetch session handler"
        meta = next(iter(handlers.values())).next_metadata
        # a session the broker opened, carried on incrementally (the epoch counts them)
        assert meta.session_id != 0 and meta.epoch > 2, meta
    finally:
        c.close()


# -- the current versions of Produce, Fetch and Metadata ----------------------------------------
UNKNOWN_TOPIC_ID = 100


def test_api_versions_advertise_the_current_versions(shared):
    with connect(shared) as s:
        r = call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
    got = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert got[0] == (3, 13) and got[1] == (4, 18) and got[3] == (0, 13)
    assert got[21] == (0, 2) and got[23] == (2, 4) and got[61] == (0, 0)


def test_produce_fetch_metadata_by_topic_id(shared):
    import uuid

    nowhere = uuid.UUID(int=12345)
    with connect(shared) as s:
        create_topic(s, "ids", partitions=2)
        md = call(s, frame(3, 13, {"topics": [{"name": "ids", "topic_id": None}], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False}), 3, 13)
        assert md.error_code == 0 and md.topics[0].error_code == 0
        tid = md.topics[0].topic_id
        # Metadata by id: the name, or UNKNOWN_TOPIC_ID
        md = call(s, frame(3, 13, {"topics": [{"name": None, "topic_id": tid}, {"name": None, "topic_id": nowhere}],
                                   "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False}), 3, 13)
        assert [(t.name, t.topic_id, t.error_code) for t in md.topics] == [
            ("ids", tid, 0), (None, nowhere, UNKNOWN_TOPIC_ID)]
        # Produce v13 by id
        r = call(s, frame(0, 13, {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
            {"topic_id": tid, "partition_data": [{"index": 1, "records": batch([b"a", b"b", b"c"])}]},
            {"topic_id": nowhere, "partition_data": [{"index": 0, "records": batch([b"d"])}]}]}), 0, 13)
        got = {(t.topic_id, p.index): (p.error_code, p.base_offset) for t in r.responses
               for p in t.partition_responses}
        assert got == {(tid, 1): (0, 0), (nowhere, 0): (UNKNOWN_TOPIC_ID, -1)}
        # Fetch v18 by id, in a session; a forgotten topic by id
        req = {"max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
               "session_epoch": 0, "forgotten_topics_data": [], "rack_id": "",
               "topics": [{"topic_id": tid, "partitions": [
                   {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]},
                   {"topic_id": nowhere, "partitions": [
                       {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
        r = call(s, frame(1, 18, req), 1, 18)
        got = {(t.topic_id, p.partition_index): p for t in r.responses for p in t.partitions}
        assert got[(nowhere, 0)].error_code == UNKNOWN_TOPIC_ID
        assert got[(tid, 1)].error_code == 0 and _count(got[(tid, 1)]) == 3 and got[(tid, 1)].high_watermark == 3
        sid = r.session_id
        assert sid
        r = call(s, frame(1, 18, {**req, "session_id": sid, "session_epoch": 1, "topics": [],
                                  "forgotten_topics_data": [{"topic_id": tid, "partitions": [1]}]}), 1, 18)
        assert r.error_code == 0 and r.responses == ()
        assert produce_result(call(s, produce("ids", batch([b"e"]), partition=1), 0, 9))[0] == 0
        r = call(s, frame(1, 18, {**req, "session_id": sid, "session_epoch": 2, "topics": []}), 1, 18)
        assert r.error_code == 0 and r.responses == ()  # forgotten: not answered


def test_librdkafka_uses_the_current_produce_fetch_and_metadata(shared):
    """librdkafka 2.x negotiates Produce v10+, Fetch v16 (topic ids) and Metadata v13 and
    gets the same records as before."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    lg = logging.getLogger("test_serve_apis.versions")
    lg.addHandler(Keep())
    lg.setLevel(logging.DEBUG)
    p = ck.Producer({"bootstrap.servers": shared.bootstrap, "debug": "protocol", "linger.ms": 5}, logger=lg)
    for i in range(30):
        p.produce("cur", value=b"v%d" % i, key=b"k%d" % i)
    assert p.flush(30) == 0
    c = ck.Consumer({"bootstrap.servers": shared.bootstrap, "group.id": "cur", "auto.offset.reset": "earliest",
                     "debug": "protocol"}, logger=lg)
    try:
        c.subscribe(["cur"])
        got: list[bytes] = []
        end = time.monotonic() + 30
        while len(got) < 30 and time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    assert got == [b"v%d" % i for i in range(30)]

    def versions(name: str) -> set[int]:
        import re

        return {int(m.group(1)) for x in lines for m in [re.search(rf"Sent {name}Request \(v(\d+)", x)] if m}

    assert max(versions("Produce")) >= 10 and max(versions("Fetch")) >= 13 and max(versions("Metadata")) == 13


def test_a_fetch_session_is_used_only_by_the_user_that_opened_it(tmp_path):
    from test_serve_acl import login

    from pylog.serve import security

    users = str(tmp_path / "users.json")
    security.add_user(users, "alice", "alice-secret", read=["shared-t"], write=["shared-t"])
    security.add_user(users, "bob", "bob-secret", read=["shared-t"], write=[])
    b = BrokerProcess(str(tmp_path / "root"), "--users", users)
    try:
        with login(b, "alice") as a, login(b, "bob") as o:
            create_topic(a, "shared-t")
            assert produce_result(call(a, produce("shared-t", batch([b"x"] * 3)), 0, 9))[0] == 0
            r, got = _session_fetch(a, 0, 0, {0: 0}, topic="shared-t")
            sid = r.session_id
            assert sid and _count(got[0]) == 3
            # bob names alice's session: not found for him; alice's session goes on
            r, got = _session_fetch(o, sid, 1, {}, topic="shared-t")
            assert r.error_code == SESSION_NOT_FOUND and r.session_id == 0 and got == {}
            assert produce_result(call(a, produce("shared-t", batch([b"y"])), 0, 9))[0] == 0
            r, got = _session_fetch(a, sid, 1, {0: 3}, topic="shared-t")
            assert r.error_code == 0 and r.session_id == sid and _count(got[0]) == 1
    finally:
        assert b.stop() == 0
