"""pylog serve: what Kafka groups keep beyond the offset (issue 29's group items).

Commit metadata and leader epochs stored beside the offset and returned by OffsetFetch
(also after a restart, and through the admin APIs); a group whose consumers closed is Empty
and deletable at once; members keep their ids across a broker restart (also a kill -9) and
go on consuming; OffsetDelete; ListGroups v5's state and type filters.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from serve_util import BrokerProcess, call, connect, frame, wait_for  # noqa: E402

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


# -- 2. closed consumers leave an Empty, deletable group (librdkafka 0081) ----------------------
def _state(b: BrokerProcess, group: str) -> str:
    with connect(b) as s:
        r = call(s, frame(15, 5, {"groups": [group], "include_authorized_operations": False}), 15, 5)
        return str(r.groups[0].group_state)


def test_group_is_empty_and_deletable_the_moment_the_session_ends(broker):
    """librdkafka 0081: a static member's close commits and sends no LeaveGroup; the test
    deletes the group exactly one session timeout after the close. The broker ends sessions
    on a 0.1 s timer: DeleteGroups at the session's end found the member still there (9 runs
    of 10). Now the sessions that ran out end before a describe, list or delete is answered."""
    _topic(broker, "c6", 1, 3)
    proto = [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]
    with connect(broker) as s:
        for g in ("sd0", "sd1", "sd2"):
            r = call(s, frame(11, 5, {"group_id": g, "session_timeout": 1500, "rebalance_timeout": 1500,
                                      "member_id": "", "group_instance_id": "inst", "protocol_type": "consumer",
                                      "protocols": proto}), 11, 5)
            assert r.error_code == 0
            mid, gen = r.member_id, r.generation_id
            r = call(s, frame(14, 3, {"group_id": g, "generation_id": gen, "member_id": mid,
                                      "group_instance_id": "inst", "assignments": [{"member_id": mid,
                                                                                    "assignment": b""}]}), 14, 3)
            assert r.error_code == 0
            commit = {"group_id": g, "generation_id_or_member_epoch": gen, "member_id": mid,
                      "group_instance_id": "inst", "topics": [{"name": "c6", "partitions": [
                          {"partition_index": 0, "committed_offset": 2, "committed_leader_epoch": -1,
                           "committed_metadata": ""}]}]}
            assert call(s, frame(8, 8, commit), 8, 8).topics[0].partitions[0].error_code == 0
            last = time.monotonic()  # after the broker took the commit: its session ends by last + 1.5 s
            assert _state(broker, g) == "Stable"
            time.sleep(max(0.0, last + 1.5 - time.monotonic()))
            if g == "sd0":
                assert _state(broker, g) == "Empty"
            if g == "sd1":
                r = call(s, frame(16, 4, {"states_filter": ["Stable"]}), 16, 4)
                assert g not in [x.group_id for x in r.groups]
            assert call(s, frame(42, 2, {"groups_names": [g]}), 42, 2).results[0].error_code == 0, g


def test_closed_consumers_leave_an_empty_deletable_group(broker):
    """librdkafka 0081's pattern: consumers consume, close; DescribeConsumerGroups then shows
    the group Empty (dynamic members leave at once; a static member one session timeout after
    its close, its last commit notwithstanding) and DeleteConsumerGroups deletes it."""
    _topic(broker, "c081", 1, 30)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    groups = {"dyn": {}, "stat": {"group.instance.id": "gi-0", "client.id": "client_id_0"}}
    consumers = []
    for g, extra in groups.items():
        c = _consumer(broker, g, **{"enable.auto.commit": True, "session.timeout.ms": 3000, **extra})
        c.subscribe(["c081"])
        n, end = 0, time.monotonic() + 20
        while n < 30 and time.monotonic() < end:
            m = c.poll(0.2)
            n += m is not None and m.error() is None
        assert n == 30
        consumers.append(c)
    d = admin.describe_consumer_groups(list(groups))
    assert {g: f.result(10).state for g, f in d.items()} == dict.fromkeys(groups, ck.ConsumerGroupState.STABLE)
    for c in consumers:
        c.close()
    closed = time.monotonic()
    assert admin.describe_consumer_groups(["dyn"])["dyn"].result(10).state == ck.ConsumerGroupState.EMPTY
    admin.delete_consumer_groups(["dyn"])["dyn"].result(10)
    assert wait_for(lambda: admin.describe_consumer_groups(["stat"])["stat"].result(10).state
                    == ck.ConsumerGroupState.EMPTY, timeout=10, step=0.2)
    assert time.monotonic() - closed < 3 + 4  # the session (3 s) after its close, with a margin
    admin.delete_consumer_groups(["stat"])["stat"].result(10)


# -- 3. membership across a broker restart -------------------------------------------------------
def _restart(b: BrokerProcess, sig: int) -> BrokerProcess:
    """Stop ``b`` with ``sig`` and start a broker on the same root and port."""
    b.stop(sig)
    return BrokerProcess(b.root, "--port", str(b.port))


def test_member_keeps_its_id_and_consumes_across_broker_restarts(tmp_path):
    """A consumer committing each record by hand goes on across a restart and a kill -9 of
    the broker: its member id and generation are still known (no UNKNOWN_MEMBER_ID, no
    rejoin), no record is skipped and none is read twice, and it does not stall."""
    b = BrokerProcess(str(tmp_path / "root"))
    try:
        _topic(b, "rs", 2, 40)
        # a session long enough for a restart on a loaded machine, and quick reconnects
        c = _consumer(b, "rg", **{"session.timeout.ms": 30000, "reconnect.backoff.max.ms": 300})
        c.subscribe(["rs"])
        seen: list[bytes] = []

        def consume(n: int, timeout: float) -> None:
            end = time.monotonic() + timeout
            while len(seen) < n and time.monotonic() < end:
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    seen.append(m.value())
                    c.commit(m, asynchronous=False)

        consume(20, 30)
        assert len(seen) == 20
        member = c.memberid()
        for round_, sig in enumerate((signal.SIGTERM, signal.SIGKILL), 1):
            b = _restart(b, sig)
            p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
            for i in range(20 + 20 * round_, 40 + 20 * round_):
                p.produce("rs", value=f"rs-{i}".encode(), partition=i % 2)
            assert p.flush(20) == 0
            restarted = time.monotonic()
            consume(40 + 20 * round_, 60)
            assert time.monotonic() - restarted < 45, sig  # no stall
            assert c.memberid() == member, sig  # never told UNKNOWN_MEMBER_ID: no rejoin with a new id
        assert sorted(seen) == sorted(f"rs-{i}".encode() for i in range(80))  # none skipped, none twice
        c.close()
        # the group is Empty once its member left: a later restart restores nobody
        b = _restart(b, signal.SIGTERM)
        assert _state(b, "rg") == "Empty"
    finally:
        b.stop()


_KAFKAJS = textwrap.dedent("""
    const { Kafka, logLevel } = require("kafkajs");
    const kafka = new Kafka({ clientId: "kjs", brokers: [process.argv[2]], logLevel: logLevel.NOTHING,
                              retry: { retries: 100, initialRetryTime: 100, maxRetryTime: 1000 } });
    const consumer = kafka.consumer({ groupId: "kjs-group", sessionTimeout: 30000, heartbeatInterval: 500 });
    consumer.on(consumer.events.GROUP_JOIN, e => console.log("JOIN " + e.payload.memberId));
    consumer.on(consumer.events.CRASH, e => console.log("CRASH " + e.payload.error));
    (async () => {
      await consumer.connect();
      await consumer.subscribe({ topic: "kjs", fromBeginning: true });
      await consumer.run({ autoCommit: false, eachMessage: async ({ topic, partition, message }) => {
        console.log("MSG " + message.value.toString());
        await consumer.commitOffsets([{ topic, partition, offset: (BigInt(message.offset) + 1n).toString() }]);
      } });
    })();
    process.on("SIGTERM", async () => { await consumer.disconnect(); process.exit(0); });
""")


@pytest.fixture(scope="module")
def kafkajs(tmp_path_factory):
    """A folder with kafkajs installed (npm); the test is skipped without node, npm or a registry."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the kafkajs test")
    d = tmp_path_factory.mktemp("kafkajs")
    try:
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "kafkajs@2"], cwd=d,
                           capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install kafkajs timed out (offline?)")
    if r.returncode != 0 or not os.path.isdir(d / "node_modules" / "kafkajs"):
        pytest.skip(f"npm install kafkajs failed (offline?): {r.stderr[-300:]}")
    (d / "consume.js").write_text(_KAFKAJS)
    return d


def test_kafkajs_manual_commits_go_on_across_broker_kill(tmp_path, kafkajs):
    """kafkajs committing each record by hand goes on after a kill -9 of the broker (before:
    UNKNOWN_MEMBER_ID, and it stopped for good): every record once, one join."""
    b = BrokerProcess(str(tmp_path / "root"))
    node = None
    lines: list[str] = []
    try:
        _topic(b, "kjs", 2, 40)
        node = subprocess.Popen(["node", "consume.js", b.bootstrap], cwd=kafkajs, stdout=subprocess.PIPE, text=True)
        assert node.stdout is not None
        os.set_blocking(node.stdout.fileno(), False)

        def read(n: int) -> bool:
            while True:
                line = node.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    break
                lines.append(line.strip())
            return sum(x.startswith("MSG ") for x in lines) >= n

        assert wait_for(lambda: read(20), timeout=60, step=0.1), lines[-5:]
        b = _restart(b, signal.SIGKILL)
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        for i in range(40, 80):
            p.produce("kjs", value=f"kjs-{i}".encode(), partition=i % 2)
        assert p.flush(20) == 0
        assert wait_for(lambda: read(80), timeout=60, step=0.1), (len(lines), lines[-5:])
        time.sleep(0.5)
        read(0)
        msgs = [x[4:] for x in lines if x.startswith("MSG ")]
        assert sorted(msgs) == sorted(f"kjs-{i}" for i in range(80))  # none skipped, none twice
        assert [x for x in lines if x.startswith("JOIN ")][1:] == []  # joined once: no rejoin
        assert not [x for x in lines if x.startswith("CRASH ")]
    finally:
        if node is not None:
            node.terminate()
            try:
                node.wait(15)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait(5)
        b.stop()


# -- 4. OffsetDelete, ListGroups v5 -------------------------------------------------------------
def test_offset_delete_through_kafka_python(broker):
    """kafka-python's delete_group_offsets: an empty group's offsets go (the others stay);
    a topic a live member subscribes to, or a pylog consumer of the group reads, is refused
    GROUP_SUBSCRIBED_TO_TOPIC; an unknown group is GROUP_ID_NOT_FOUND."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError, UnknownTopicOrPartitionError
    from kafka.structs import TopicPartition as KTP

    _topic(broker, "oa", 2, 4)
    _topic(broker, "ob", 1, 4)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for g in ("od", "live"):
        req = ConsumerGroupTopicPartitions(g, [TopicPartition("oa", 0, 1), TopicPartition("oa", 1, 2)])
        admin.alter_consumer_group_offsets([req])[g].result(10)
    c = _consumer(broker, "live")
    c.subscribe(["ob"])
    _assigned(c)
    ka = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    store = pylog.LogStore(broker.root)
    try:
        r = ka.delete_group_offsets("od", [KTP("oa", 0), KTP("oa", 7), KTP("nope", 0)])
        assert r == {KTP("oa", 0): NoError, KTP("oa", 7): UnknownTopicOrPartitionError,
                     KTP("nope", 0): UnknownTopicOrPartitionError}
        got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("od")])["od"].result(10)
        assert {tp.partition: tp.offset for tp in got.topic_partitions} == {1: 2}  # oa-0 gone, oa-1 kept
        assert store.describe_group("od", "oa")["partitions"][0]["committed"] is None
        r = ka.delete_group_offsets("live", [KTP("ob", 0), KTP("oa", 1)])
        assert r == {KTP("ob", 0): GroupSubscribedToTopicError, KTP("oa", 1): NoError}
        with store.consumer("oa", group="od"):  # a live pylog member of the group reads oa
            r = ka.delete_group_offsets("od", [KTP("oa", 1)])
            assert r == {KTP("oa", 1): GroupSubscribedToTopicError}
        assert store.describe_group("od", "oa")["partitions"][1]["committed"] == 2
        with pytest.raises(GroupIdNotFoundError):
            ka.delete_group_offsets("never-was", [KTP("oa", 0)])
    finally:
        store.close()
        ka.close()
        c.close()


def test_list_groups_v5_state_and_type_filters(broker):
    _topic(broker, "lf", 1, 2)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    req = ConsumerGroupTopicPartitions("idle", [TopicPartition("lf", 0, 1)])
    admin.alter_consumer_group_offsets([req])["idle"].result(10)
    c = _consumer(broker, "busy")
    c.subscribe(["lf"])
    _assigned(c)
    try:
        def listed(**kw: object) -> dict[str, tuple[object, object]]:
            res = admin.list_consumer_groups(**kw).result(10)
            assert not res.errors, res.errors
            return {g.group_id: (g.state, g.type) for g in res.valid}

        S, T = ck.ConsumerGroupState, ck.ConsumerGroupType
        assert listed() == {"idle": (S.EMPTY, T.CLASSIC), "busy": (S.STABLE, T.CLASSIC)}
        assert set(listed(states={S.STABLE})) == {"busy"}
        assert set(listed(states={S.EMPTY})) == {"idle"}
        assert set(listed(types={T.CLASSIC})) == {"idle", "busy"}
        assert listed(types={T.CONSUMER}) == {}
        assert set(listed(states={S.STABLE}, types={T.CLASSIC})) == {"busy"}
    finally:
        c.close()


def test_offset_delete_needs_group_delete_and_topic_read(tmp_path):
    """With a users file, OffsetDelete needs DELETE on the group (else GROUP_AUTHORIZATION_FAILED
    and nothing deleted) and READ on each topic (else TOPIC_AUTHORIZATION_FAILED for its partitions)."""
    from test_serve_acl import commit, committed, login, metadata

    from pylog.serve import security

    users = str(tmp_path / "users.json")
    security.add_user(users, "admin", "admin-secret")
    security.add_user(users, "dora", "dora-secret", read=["pub"], groups=["dg"])
    security.add_user(users, "eve", "eve-secret", read=["pub"], groups=["dg"], delete_groups=["dg"])
    b = BrokerProcess(str(tmp_path / "root"), "--users", users)
    try:
        with login(b, "admin") as s:
            assert {t.error_code for t in call(s, metadata(["pub", "priv"], auto=True), 3, 12).topics} == {0}
            for t in ("pub", "priv"):
                assert call(s, commit("dg", t, 0), 8, 8).topics[0].partitions[0].error_code == 0
        req = frame(47, 0, {"group_id": "dg", "topics": [{"name": t, "partitions": [{"partition_index": 0}]}
                                                          for t in ("pub", "priv")]})
        with login(b, "dora") as s:
            r = call(s, req, 47, 0)
            assert r.error_code == 30 and not r.topics  # GROUP_AUTHORIZATION_FAILED
        with login(b, "eve") as s:
            r = call(s, req, 47, 0)
            assert r.error_code == 0
            assert {t.name: t.partitions[0].error_code for t in r.topics} == {"pub": 0, "priv": 29}
        with login(b, "admin") as s:
            assert committed(s, "dg", "pub") == -1 and committed(s, "dg", "priv") == 0
    finally:
        b.stop()


def test_dump_shows_commit_metadata(tmp_path):
    import json
    import sys

    from conftest import ROOT, py_env

    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("dm", partitions=1).append_batch([b"a", b"b"])
        with store.consumer("dm", group="g") as c:
            c.commit({0: 2}, metadata="ctx")
    path = os.path.join(root, "dm", "~consumers", "g", "partition-0.offset")
    out = subprocess.run([sys.executable, "-m", "pylog.cli", "dump", path, "--format", "json"], cwd=ROOT,
                         env=py_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert (row["committed_offset"], row["leader_epoch"], row["metadata"]) == (2, -1, "ctx")


def test_damaged_membership_file_is_logged_and_ignored(tmp_path):
    """A membership file that cannot be read (here: garbage) does not stop the broker: it is
    logged and removed, and the group's members rejoin (UNKNOWN_MEMBER_ID) as after a
    restart without membership."""
    root = tmp_path / "root"
    (root / ".serve.groups").mkdir(parents=True)
    (root / ".serve.groups" / "bad.members").write_bytes(b"{not json")
    b = BrokerProcess(str(root))
    try:
        assert _state(b, "bad") == "Dead"
        with connect(b) as s:
            hb = {"group_id": "bad", "generation_id": 1, "member_id": "m-1", "group_instance_id": None}
            assert call(s, frame(12, 3, hb), 12, 3).error_code == 25
    finally:
        b.stop()
    assert "bad.members is unreadable" in b.stderr()
    assert not (root / ".serve.groups" / "bad.members").exists()
