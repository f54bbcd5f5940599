"""Topic and broker configs as Kafka users write them (issue 29 items 7, 8 and 4): every Kafka
topic config accepted and reported, those with a meaning here honoured, IncrementalAlterConfigs
and AlterConfigs on a live topic, ``pylog serve --config`` in server.properties form, and
keyless records refused by a compacted topic. Through confluent-kafka, kafka-python and raw
requests against a real ``pylog serve`` process."""
from __future__ import annotations

import os
import time

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


# -- item 7: topic configs ---------------------------------------------------------------------
ROUTINE = {  # what tools send routinely (issue 29), each not the default
    "compression.type": "lz4", "min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime",
    "unclean.leader.election.enable": "true", "min.compaction.lag.ms": "1000", "max.compaction.lag.ms": "600000",
    "min.cleanable.dirty.ratio": "0.01", "file.delete.delay.ms": "1000", "segment.index.bytes": "65536",
    "index.interval.bytes": "1024", "preallocate": "true", "segment.jitter.ms": "5",
    "message.timestamp.before.max.ms": "86400000", "message.timestamp.after.max.ms": "7200000",
    "retention.ms": "60000", "cleanup.policy": "compact"}


def _admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _describe(admin, name: str) -> dict:
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, name)
    return admin.describe_configs([res])[res].result(20)


def test_create_topics_accepts_every_kafka_topic_config_and_describe_reports_its_source(broker):
    from confluent_kafka.admin import ConfigSource, NewTopic

    from pylog.serve import configs

    a = _admin(broker)
    a.create_topics([NewTopic("routine", 1, 1, config=ROUTINE)])["routine"].result(20)
    got = _describe(a, "routine")
    # every Kafka 4.0 topic config is reported, set ones as DYNAMIC_TOPIC_CONFIG
    assert set(got) == set(configs.LOG_CONFIGS) | set(configs.STORED)
    for k, v in ROUTINE.items():
        assert got[k].value == v, k
        assert got[k].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, k
    assert got["compression.zstd.level"].value == "3"
    assert got["compression.zstd.level"].source == ConfigSource.DEFAULT_CONFIG.value
    # the LogConfig-backed ones reach the partitions
    import pylog

    with pylog.Log(f"{broker.root}/routine/partition-0", readonly=True) as log:
        assert (log.config.index_max_bytes, log.config.index_interval_bytes, log.config.preallocate,
                log.config.cleanup_policy) == (65536, 1024, True, "compact")
    # a bad value is INVALID_CONFIG naming it, and nothing is created
    for bad in ({"min.cleanable.dirty.ratio": "1.5"}, {"compression.type": "brotli"},
                {"message.timestamp.type": "Now"}, {"remote.storage.enable": "true"}, {"no.such": "1"}):
        f = a.create_topics([NewTopic("badcfg", 1, 1, config=bad)])["badcfg"]
        with pytest.raises(ck.KafkaException) as e:
            f.result(20)
        err = e.value.args[0]
        assert err.code() == ck.KafkaError.INVALID_CONFIG, (bad, err)
        assert list(bad)[0] in err.str(), err.str()
    assert "badcfg" not in a.list_topics(timeout=20).topics


def test_create_topics_with_a_replica_assignment_naming_this_broker(broker):
    from confluent_kafka.admin import NewTopic

    a = _admin(broker)
    a.create_topics([NewTopic("assigned", num_partitions=3, replica_assignment=[[0], [0], [0]])])["assigned"].result(20)
    assert len(a.list_topics(timeout=20).topics["assigned"].partitions) == 3
    for bad in ([[1]], [[0, 1]]):
        f = a.create_topics([NewTopic("assigned-bad", num_partitions=len(bad), replica_assignment=bad)])["assigned-bad"]
        with pytest.raises(ck.KafkaException) as e:
            f.result(20)
        assert e.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT, e.value
    assert "assigned-bad" not in a.list_topics(timeout=20).topics


def test_incremental_alter_configs_on_a_live_topic(broker):
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
        NewTopic,
    )

    a = _admin(broker)
    a.create_topics([NewTopic("inc", 1, 1, config={"retention.ms": "60000"})])["inc"].result(20)
    p = ck.Producer({"bootstrap.servers": broker.bootstrap})
    p.produce("inc", b"before")
    assert p.flush(20) == 0

    def alter(*entries, validate_only=False):
        res = ConfigResource(ConfigResource.Type.TOPIC, "inc", incremental_configs=list(entries))
        return a.incremental_alter_configs([res], validate_only=validate_only)[res].result(20)

    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    alter(ConfigEntry("max.message.bytes", "2048", incremental_operation=SET),
          ConfigEntry("min.insync.replicas", "3", incremental_operation=SET))
    got = _describe(a, "inc")
    assert got["max.message.bytes"].value == "2048" and got["min.insync.replicas"].value == "3"
    assert got["retention.ms"].value == "60000"  # untouched
    # the new max.message.bytes holds on the open partition: a 4 KiB record is refused
    errs = []
    p.produce("inc", b"x" * 4096, on_delivery=lambda e, m: errs.append(e))
    p.flush(20)
    assert errs and errs[0] is not None and errs[0].code() == ck.KafkaError.MSG_SIZE_TOO_LARGE, errs
    # validate_only changes nothing; a bad value is INVALID_CONFIG naming it, nothing changed
    alter(ConfigEntry("retention.ms", "1000", incremental_operation=SET), validate_only=True)
    assert _describe(a, "inc")["retention.ms"].value == "60000"
    with pytest.raises(ck.KafkaException) as e:
        alter(ConfigEntry("retention.ms", "1000", incremental_operation=SET),
              ConfigEntry("segment.jitter.ms", "soon", incremental_operation=SET))
    assert e.value.args[0].code() == ck.KafkaError.INVALID_CONFIG and "soon" in e.value.args[0].str()
    assert _describe(a, "inc")["retention.ms"].value == "60000"
    # DELETE: back to the default
    alter(ConfigEntry("max.message.bytes", None, incremental_operation=DELETE))
    got = _describe(a, "inc")
    assert got["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert got["max.message.bytes"].value == str(10 << 20)
    p.produce("inc", b"x" * 4096)
    assert p.flush(20) == 0


def test_alter_configs_replaces_the_set(broker):
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic

    a = _admin(broker)
    a.create_topics([NewTopic("repl", 1, 1, config={"retention.ms": "60000", "segment.jitter.ms": "7"})])[
        "repl"].result(20)
    res = ConfigResource(ConfigResource.Type.TOPIC, "repl", set_config={"compression.type": "gzip"})
    a.alter_configs([res])[res].result(20)
    got = _describe(a, "repl")
    assert got["compression.type"].value == "gzip"
    assert got["compression.type"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert got["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value and got["retention.ms"].value == "-1"
    assert got["segment.jitter.ms"].value == "0"
    bad = ConfigResource(ConfigResource.Type.TOPIC, "repl", set_config={"min.insync.replicas": "0"})
    with pytest.raises(ck.KafkaException) as e:
        a.alter_configs([bad])[bad].result(20)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_CONFIG


def test_compression_type_is_the_codec_fetch_answers_with(broker):
    from confluent_kafka.admin import NewTopic
    from kafka.record.memory_records import MemoryRecords
    from serve_util import fetch

    a = _admin(broker)
    a.create_topics([NewTopic("zst", 1, 1, config={"compression.type": "zstd"})])["zst"].result(20)
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "none"})
    for i in range(50):
        p.produce("zst", b"value-%d" % i * 20, key=b"k%d" % i)
    assert p.flush(20) == 0
    with connect(broker) as s:
        r = call(s, fetch("zst", 0), 1, 12)
    recs = MemoryRecords(bytes(r.responses[0].partitions[0].records))
    batch = recs.next_batch()
    assert batch.compression_type == 4  # zstd
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "zst", "auto.offset.reset": "earliest"})
    try:
        c.assign([ck.TopicPartition("zst", 0, 0)])
        got = []
        wait_for(lambda: got.extend(c.consume(100, 0.5)) or len(got) >= 50, 20)
        assert [m.value() for m in got] == [b"value-%d" % i * 20 for i in range(50)]
    finally:
        c.close()


def test_kafka_python_creates_and_alters_configs(broker):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=20000)
    try:
        a.create_topics([NewTopic("kp", 1, 1, topic_configs={"min.insync.replicas": "1",
                                                             "unclean.leader.election.enable": "false"})])
        def modified() -> dict:
            r = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kp")])
            (entries,) = [v for by_type in r.values() for v in by_type.values()]
            return {k: e["value"] for k, e in entries.items()}  # "modified": the configs set on the topic

        # kafka-python sends IncrementalAlterConfigs when the broker offers it: the others stay
        a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp", configs={"file.delete.delay.ms": "5"})])
        assert modified() == {"min.insync.replicas": "1", "unclean.leader.election.enable": "false",
                              "file.delete.delay.ms": "5"}
        # AlterConfigs (which replaces the set: kafka-python sends the modified keys along)
        a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp", configs={"segment.jitter.ms": "9"})],
                        incremental=False)
        assert modified() == {"min.insync.replicas": "1", "unclean.leader.election.enable": "false",
                              "file.delete.delay.ms": "5", "segment.jitter.ms": "9"}
    finally:
        a.close()


# -- item 8: broker configs in server.properties form -----------------------------------------
def test_serve_config_file_sets_and_reports_broker_configs(tmp_path):
    from confluent_kafka.admin import ConfigResource, ConfigSource

    conf = tmp_path / "server.properties"
    conf.write_text("# a Kafka server.properties\nnum.partitions=4\nauto.create.topics.enable = true\n"
                    "default.replication.factor=1\nlog.segment.bytes=8192\nmessage.max.bytes: 2048\n"
                    "max.connections=50\nsome.unknown.key=1\nlog.retention.hours=2\n\n")
    b = BrokerProcess(str(tmp_path / "root"), "--config", str(conf), "--max-connections", "60")
    try:
        a = _admin(b)
        res = ConfigResource(ConfigResource.Type.BROKER, "0")
        got = a.describe_configs([res])[res].result(20)
        assert got["num.partitions"].value == "4"
        assert got["num.partitions"].source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert got["max.connections"].value == "60"  # the flag overrides the file
        assert got["fetch.max.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
        # an auto-created topic: num.partitions partitions, the file's topic defaults
        p = ck.Producer({"bootstrap.servers": b.bootstrap})
        p.produce("auto-made", b"x")
        assert p.flush(20) == 0
        assert len(a.list_topics(timeout=20).topics["auto-made"].partitions) == 4
        t = _describe(a, "auto-made")
        assert (t["segment.bytes"].value, t["max.message.bytes"].value, t["retention.ms"].value) == (
            "8192", "2048", str(2 * 3600000))
    finally:
        b.stop()
    assert b.stderr().count("some.unknown.key") == 1


@pytest.mark.parametrize("line", ["num.partitions=zero", "default.replication.factor=3", "just-a-word",
                                  "listeners=PLAINTEXT://127.0.0.1:99999", "log.cleanup.policy=shred"])
def test_config_file_bad_line_names_file_line_and_value(tmp_path, line):
    from pylog.serve import brokerconfig

    conf = tmp_path / "bad.properties"
    conf.write_text(f"num.partitions=2\n{line}\n")
    with pytest.raises(brokerconfig.BrokerConfigError) as e:
        brokerconfig.load(str(conf))
    assert str(e.value).startswith(f"{conf}:2: ") and line.split("=")[-1] in str(e.value), e.value


def test_serve_config_file_bad_value_is_one_error_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT, py_env

    conf = tmp_path / "bad.properties"
    conf.write_text("num.partitions=2\nmax.connections=-3\n")
    r = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", str(tmp_path / "root"), "serve", "--port", "0",
                        "--config", str(conf)], cwd=ROOT, env=py_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert f"{conf}:2" in r.stderr and "-3" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


def _messages(b, topic: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of partition 0 of ``topic``, read from the start up to
    its high watermark."""
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "read-" + topic, "enable.auto.commit": False})
    try:
        _, high = c.get_watermark_offsets(ck.TopicPartition(topic, 0), 20)
        c.assign([ck.TopicPartition(topic, 0, 0)])
        got: list[tuple[bytes, bytes]] = []
        last = -1
        end = time.monotonic() + 30
        while last < high - 1 and time.monotonic() < end:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    got.append((m.key(), m.value()))
                    last = m.offset()
        assert last >= high - 1, (topic, last, high)
        return got
    finally:
        c.close()


def test_compaction_lags_and_a_live_alteration_of_them(tmp_path):
    """min.compaction.lag.ms holds compaction off (the ratio alone would run it); lowered on the
    live topic, compaction runs. max.compaction.lag.ms rolls a lone active segment and compacts
    it although its bytes never pass segment.bytes."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    conf = tmp_path / "server.properties"
    conf.write_text("log.cleaner.backoff.ms=100\n")
    b = BrokerProcess(str(tmp_path / "root"), "--config", str(conf))
    try:
        a = _admin(b)
        fs = a.create_topics([
            NewTopic("lagged", 1, 1, config={"cleanup.policy": "compact", "segment.bytes": "4096",
                                             "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "3600000"}),
            NewTopic("rolled", 1, 1, config={"cleanup.policy": "compact", "max.compaction.lag.ms": "300"})])
        for f in fs.values():
            f.result(20)
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        for i in range(100):
            for t in ("lagged", "rolled"):
                p.produce(t, b"v%03d" % i + b"." * 100, key=b"k%d" % (i % 4))
            p.poll(0)
        assert p.flush(20) == 0
        latest = sorted((b"k%d" % k, b"v%03d" % (96 + k) + b"." * 100) for k in range(4))
        # "rolled": one active segment, compacted once its first record is 300 ms old
        assert wait_for(lambda: sorted(_messages(b, "rolled")) == latest, 30, 0.3)
        stores = [f for f in os.listdir(os.path.join(b.root, "rolled", "partition-0")) if f.endswith(".log")]
        assert len(stores) == 2, stores  # rolled: the compacted segment and a new active one
        # "lagged": sealed segments and a ratio of 0.01, but every record is younger than an hour
        time.sleep(1.5)  # 15 looks of the cleaner
        assert len(_messages(b, "lagged")) == 100
        res = ConfigResource(ConfigResource.Type.TOPIC, "lagged", incremental_configs=[
            ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
        a.incremental_alter_configs([res])[res].result(20)
        assert wait_for(lambda: len(_messages(b, "lagged")) < 100, 30, 0.3)
    finally:
        b.stop()


def test_altering_configs_needs_the_topic_write_right(tmp_path):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    from pylog.serve import security

    users = str(tmp_path / "users.json")
    security.add_user(users, "owner", "owner-secret", read=["*"], write=["mine"])
    security.add_user(users, "reader", "reader-secret", read=["*"], write=[])
    b = BrokerProcess(str(tmp_path / "root"), "--users", users)
    try:
        def admin(user: str) -> AdminClient:
            return AdminClient({"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                                "sasl.password": user + "-secret"})

        owner, reader = admin("owner"), admin("reader")
        owner.create_topics([NewTopic("mine", 1, 1)])["mine"].result(20)

        def alter(a: AdminClient, value: str) -> None:
            res = ConfigResource(ConfigResource.Type.TOPIC, "mine", incremental_configs=[
                ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)])
            a.incremental_alter_configs([res])[res].result(20)

        with pytest.raises(ck.KafkaException) as e:
            alter(reader, "1000")
        assert e.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        res = ConfigResource(ConfigResource.Type.TOPIC, "mine", set_config={"retention.ms": "1000"})
        with pytest.raises(ck.KafkaException) as e:
            reader.alter_configs([res])[res].result(20)
        assert e.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert _describe(owner, "mine")["retention.ms"].value == "-1"
        alter(owner, "2000")
        assert _describe(reader, "mine")["retention.ms"].value == "2000"
    finally:
        b.stop()


def test_compact_leaves_segments_younger_than_min_lag(tmp_path):
    """pylog.compaction.compact(min_lag_ms=...): a sealed segment holding a record newer than
    now - min_lag_ms is not rewritten; older ones are (the log layer under min.compaction.lag.ms)."""
    import pylog
    from pylog.compaction import compact

    with pylog.Log(str(tmp_path / "p"), cleanup_policy="compact", segment_bytes=4096) as log:
        for i in range(40):  # old records: timestamps 1000..
            log.append(b"v" * 100, key=b"k%d" % (i % 2), timestamp=1000 + i)
        log.roll()
        for i in range(40):  # young ones: timestamps 100000..
            log.append(b"v" * 100, key=b"k%d" % (i % 2), timestamp=100_000 + i)
        log.roll()
        log.append(b"last", key=b"k0", timestamp=100_100)
        young_before = [s for s in log.segments() if s["sealed"] and s["base_offset"] >= 40]
        report = compact(log, now_ms=100_200, min_lag_ms=10_000)
        assert report.segments_cleaned > 0
        young_after = [s for s in log.segments() if s["sealed"] and s["base_offset"] >= 40]
        assert young_after == young_before  # untouched: younger than the lag
        assert all(s["size_bytes"] < 1000 for s in log.segments() if s["sealed"] and s["next_offset"] <= 40)
        assert compact(log, now_ms=100_200).segments_cleaned > 0  # without the lag they go too


def test_config_file_sets_the_fetch_session_slots(tmp_path):
    """Kafka's max.incremental.fetch.session.cache.slots in --config reaches the Server."""
    from pylog.serve import brokerconfig

    conf = tmp_path / "server.properties"
    conf.write_text("max.incremental.fetch.session.cache.slots=7\n")
    assert brokerconfig.load(str(conf)).server["fetch_session_slots"] == 7
    conf.write_text("max.incremental.fetch.session.cache.slots=-1\n")
    with pytest.raises(brokerconfig.BrokerConfigError, match="-1"):
        brokerconfig.load(str(conf))
