"""pylog serve: consumer groups with real Kafka clients (confluent-kafka, kafka-python).

Groups rebalance (join, leave, a consumer SIGKILLed), the client-side assignors work, and
the committed offsets are pylog's own: the CLI describes a group Kafka clients committed,
and Kafka clients fetch what pylog's Consumer committed.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from conftest import ROOT, py_env  # noqa: E402
from serve_util import BrokerProcess, call, connect, frame, wait_for  # noqa: E402

import pylog  # noqa: E402


@pytest.fixture()
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    b.stop()


def _topic(b: BrokerProcess, name: str, partitions: int, n: int) -> list[bytes]:
    """Create ``name`` and produce ``n`` records round-robin over its partitions."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    values = [f"{name}-{i}".encode() for i in range(n)]
    for i, v in enumerate(values):
        p.produce(name, value=v, partition=i % partitions)
    assert p.flush(20) == 0
    return values


def _consumer(b: BrokerProcess, group: str, **conf: object) -> ck.Consumer:
    return ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                        "enable.auto.commit": False, "session.timeout.ms": 3000, "heartbeat.interval.ms": 200,
                        **conf})


def _parts(c: ck.Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def _drive(consumers: list, until, timeout: float = 30.0, seen: dict | None = None) -> dict:  # type: ignore[type-arg]
    """Poll every consumer in turn (committing each record) until ``until(seen)``; returns
    ``{consumer index: [(partition, offset, value)]}``."""
    seen = seen if seen is not None else {i: [] for i in range(len(consumers))}
    end = time.monotonic() + timeout
    while not until(seen) and time.monotonic() < end:
        for i, c in enumerate(consumers):
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                seen.setdefault(i, []).append((m.partition(), m.offset(), m.value()))
                try:
                    c.commit(m, asynchronous=False)
                except ck.KafkaException as e:  # a rebalance under way: the next record's commit covers it
                    assert e.args[0].code() in (ck.KafkaError.ILLEGAL_GENERATION,
                                                ck.KafkaError.REBALANCE_IN_PROGRESS,
                                                ck.KafkaError.UNKNOWN_MEMBER_ID), e
    return seen


def _split(consumers: list) -> bool:  # type: ignore[type-arg]
    return all(_parts(c) for c in consumers)


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_two_consumers_split_rebalance_on_leave_and_resume(broker, strategy):
    values = _topic(broker, "t", 4, 40)
    c1 = _consumer(broker, "g", **{"partition.assignment.strategy": strategy})
    c2 = _consumer(broker, "g", **{"partition.assignment.strategy": strategy})
    c1.subscribe(["t"])
    c2.subscribe(["t"])
    seen = _drive([c1, c2], lambda s: sum(map(len, s.values())) >= 20 and _split([c1, c2])
                  and not (_parts(c1) & _parts(c2)) and len(_parts(c1) | _parts(c2)) == 4)
    a1, a2 = _parts(c1), _parts(c2)
    assert a1 and a2 and not (a1 & a2) and a1 | a2 == {0, 1, 2, 3}, (a1, a2)
    # the broker holds pylog's locks for the Kafka members: pylog's tools see who owns what
    out = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", broker.root, "group", "describe", "g",
                          "--format", "json"], cwd=ROOT, env=py_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert len(info["members"]) == 2 and all("kafka member" in m for m in info["members"]), info
    assert all(r["owner"] and "kafka member" in r["owner"] for r in info["partitions"]), info
    # c2 leaves: c1 gets every partition and reads on from the committed offsets
    c2.close()
    # until every value is seen: a record whose commit a rebalance refused comes again, so a count would stop short
    seen = _drive([c1], lambda s: _parts(c1) == {0, 1, 2, 3} and len({v for _, _, v in s[0]}) >= len(values),
                  seen={0: seen.get(0, []) + seen.get(1, [])})
    got = [v for _, _, v in seen[0]]
    c1.close()
    assert set(got) == set(values), "no record lost"
    assert len(got) - len(set(got)) <= 4, "at most a record per partition again (a commit refused mid-rebalance)"


def test_group_protocol_refusals_over_raw_protocol(broker):
    _topic(broker, "r", 1, 1)
    proto = [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]
    with connect(broker) as s:
        join = frame(11, 5, {"group_id": "rg", "session_timeout": 6000, "rebalance_timeout": 6000, "member_id": "",
                             "group_instance_id": None, "protocol_type": "consumer", "protocols": proto})
        r = call(s, join, 11, 5)
        assert r.error_code == 79 and r.member_id  # MEMBER_ID_REQUIRED, as Kafka 2.2+
        mid = r.member_id
        r = call(s, frame(11, 5, {"group_id": "rg", "session_timeout": 6000, "rebalance_timeout": 6000,
                                  "member_id": mid, "group_instance_id": None, "protocol_type": "consumer",
                                  "protocols": proto}), 11, 5)
        assert r.error_code == 0 and r.generation_id == 1 and r.leader == mid and r.protocol_name == "range"
        hb = {"group_id": "rg", "generation_id": 1, "member_id": mid, "group_instance_id": None}
        assert call(s, frame(12, 3, {**hb, "generation_id": 7}), 12, 3).error_code == 22  # ILLEGAL_GENERATION
        assert call(s, frame(12, 3, {**hb, "member_id": "nobody"}), 12, 3).error_code == 25  # UNKNOWN_MEMBER_ID
        r = call(s, frame(14, 3, {**hb, "assignments": [{"member_id": mid, "assignment": b"x"}]}), 14, 3)
        assert r.error_code == 0 and r.assignment == b"x"
        assert call(s, frame(12, 3, hb), 12, 3).error_code == 0
        # a commit from outside a live group is refused; a bad group name is INVALID_GROUP_ID
        commit = {"group_id": "rg", "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
                  "topics": [{"name": "r", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                           "committed_leader_epoch": -1,
                                                           "committed_metadata": ""}]}]}
        r = call(s, frame(8, 8, commit), 8, 8)
        assert r.topics[0].partitions[0].error_code == 25
        r = call(s, frame(8, 8, {**commit, "group_id": "bad/name"}), 8, 8)
        assert r.topics[0].partitions[0].error_code == 24
        # DeleteGroups is refused while the group has a member
        r = call(s, frame(42, 2, {"groups_names": ["rg"]}), 42, 2)
        assert r.results[0].error_code == 68  # NON_EMPTY_GROUP
        # the member stops heartbeating: after its session (6 s) it is gone
        t0 = time.monotonic()
        assert wait_for(lambda: call(s, frame(12, 3, {**hb, "member_id": "x"}), 12, 3) is not None and
                        _described_state(broker, "rg") in ("Empty", "Dead"), timeout=15, step=0.2)
        assert time.monotonic() - t0 > 4.5
        assert call(s, frame(12, 3, hb), 12, 3).error_code == 25
        # now a commit without a generation is taken, and DeleteGroups deletes the group
        assert call(s, frame(8, 8, commit), 8, 8).topics[0].partitions[0].error_code == 0
        assert _describe(broker.root, "rg")["partitions"][0]["committed"] == 1
        assert call(s, frame(42, 2, {"groups_names": ["rg"]}), 42, 2).results[0].error_code == 0
        assert call(s, frame(42, 2, {"groups_names": ["rg"]}), 42, 2).results[0].error_code == 69


def _describe(root: str, group: str) -> dict:  # type: ignore[type-arg]
    """pylog's describe_group (empty partitions while the group has no directory yet)."""
    store = pylog.LogStore(root)
    try:
        return store.describe_group(group)
    except pylog.errors.UnknownGroupError:
        return {"members": [], "partitions": []}
    finally:
        store.close()


def _described_state(b: BrokerProcess, group: str) -> str:
    with connect(b) as s:
        r = call(s, frame(15, 5, {"groups": [group], "include_authorized_operations": False}), 15, 5)
        return r.groups[0].group_state


_KILLABLE = textwrap.dedent("""
    import sys, confluent_kafka as ck
    c = ck.Consumer({"bootstrap.servers": sys.argv[1], "group.id": "kg", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 2000, "heartbeat.interval.ms": 200})
    c.subscribe(["k"])
    for _ in range(100000):
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            # printed before the commit: a kill between the two repeats the record, where the
            # other order lost it from the output (committed, never printed)
            print(m.partition(), m.offset(), m.value().decode(), flush=True)
            c.commit(m, asynchronous=False)
            if len(sys.argv) > 2:  # slow: one record at a time, so the kill lands mid-stream
                import time; time.sleep(0.05)
""")


def test_three_consumers_one_killed_no_loss(broker, tmp_path):
    values = _topic(broker, "k", 6, 120)
    script = tmp_path / "consume.py"
    script.write_text(_KILLABLE)
    procs = [subprocess.Popen([sys.executable, str(script), broker.bootstrap, "slow"], stdout=subprocess.PIPE,
                              text=True, env=py_env()) for _ in range(3)]
    try:
        # wait until all three own partitions (the broker's partition locks name them)
        def owners() -> set[str]:
            d = _describe(broker.root, "kg")
            return {r["owner"].split(" client ")[0] for r in d["partitions"] if r["owner"]}
        assert wait_for(lambda: len(owners()) == 3, timeout=40, step=0.2), owners()
        time.sleep(0.5)
        procs[0].send_signal(signal.SIGKILL)  # no LeaveGroup: its session (2 s) has to run out
        procs[0].wait(10)
        assert wait_for(lambda: len(owners()) == 2, timeout=30, step=0.2), owners()
        assert wait_for(lambda: all(r["committed"] == r["log_end"]
                                    for r in _describe(broker.root, "kg")["partitions"]),
                        timeout=60, step=0.3)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        outs = [p.communicate(timeout=30)[0] for p in procs]
    lines = [ln.split() for out in outs for ln in out.splitlines()]
    got = [v for _, _, v in lines]
    assert set(got) == {v.decode() for v in values}, "no record lost"
    # at-least-once: only the killed consumer's last printed-but-uncommitted records repeat
    assert len(got) - len(set(got)) <= 6


def test_kafka_python_group_and_pylog_consumer_share_offsets(broker):
    kafka = pytest.importorskip("kafka")
    values = _topic(broker, "s", 2, 20)
    c = kafka.KafkaConsumer("s", bootstrap_servers=broker.bootstrap, group_id="kp", auto_offset_reset="earliest",
                            enable_auto_commit=False, consumer_timeout_ms=15000)
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == 12:
            break
    c.commit()
    c.close()
    assert len(got) == 12
    # the CLI sees kafka-python's commit as group kp's offsets
    out = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", broker.root, "group", "describe", "kp",
                          "--format", "json"], cwd=ROOT, env=py_env(), capture_output=True, text=True, timeout=60)
    info = json.loads(out.stdout)
    committed = sum(r["committed"] for r in info["partitions"])
    assert committed == 12 and info["members"] == [], info
    # pylog consume --group kp resumes there: exactly the other 8 records
    out = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", broker.root, "consume", "s", "--group", "kp",
                          "--idle-timeout", "1"], cwd=ROOT, env=py_env(), capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rest = out.stdout.split()
    assert sorted(got + rest) == sorted(values)
    # and a Kafka client fetches the offsets pylog's consumer committed (the log ends)
    c2 = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kp"})
    tps = c2.committed([ck.TopicPartition("s", 0), ck.TopicPartition("s", 1)], timeout=10)
    assert [tp.offset for tp in tps] == [10, 10]
    c2.close()


def test_admin_list_describe_delete_groups(broker):
    _topic(broker, "a", 2, 4)
    c = _consumer(broker, "live")
    c.subscribe(["a"])
    _drive([c], lambda s: len(s[0]) >= 4)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
    assert "live" in listed and str(listed["live"].state).endswith("STABLE")
    d = admin.describe_consumer_groups(["live"])["live"].result(10)
    assert d.partition_assignor == "range" and len(d.members) == 1
    assert {tp.partition for tp in d.members[0].assignment.topic_partitions} == {0, 1}
    with pytest.raises(ck.KafkaException) as e:
        admin.delete_consumer_groups(["live"])["live"].result(10)
    assert e.value.args[0].code() == ck.KafkaError.NON_EMPTY_GROUP
    c.close()
    assert wait_for(lambda: _described_state(broker, "live") == "Empty", timeout=10)
    admin.delete_consumer_groups(["live"])["live"].result(10)
    assert "live" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    assert pylog.LogStore(broker.root).groups() == []


def test_static_member_rejoins_with_its_assignment_and_no_rebalance(broker):
    """A static member (group.instance.id, KIP-345) restarted within its session rejoins
    without a member id: it gets a new one and its old assignment, at once, in the same
    generation (no rebalance); its old member id is gone, and another member id naming the
    same instance is FENCED_INSTANCE_ID."""
    _topic(broker, "st", 1, 1)
    proto = [{"name": "range", "metadata": b"\0\0\0\0\0\0\0\0\0\0"}]
    join = {"group_id": "sg", "session_timeout": 6000, "rebalance_timeout": 6000, "member_id": "",
            "group_instance_id": "host-1", "protocol_type": "consumer", "protocols": proto}
    with connect(broker) as s:
        r = call(s, frame(11, 5, join), 11, 5)
        assert r.error_code == 0 and r.generation_id == 1 and r.leader == r.member_id  # no MEMBER_ID_REQUIRED
        mid = r.member_id
        hb = {"group_id": "sg", "generation_id": 1, "member_id": mid, "group_instance_id": "host-1"}
        r = call(s, frame(14, 3, {**hb, "assignments": [{"member_id": mid, "assignment": b"mine"}]}), 14, 3)
        assert r.error_code == 0 and r.assignment == b"mine"
    with connect(broker) as s:  # the process restarted: same instance id, no member id
        t0 = time.monotonic()
        r = call(s, frame(11, 5, join), 11, 5)
        assert time.monotonic() - t0 < 3, "answered without waiting for a rebalance"
        assert r.error_code == 0 and r.generation_id == 1 and r.member_id != mid and r.leader == r.member_id
        new = r.member_id
        r = call(s, frame(14, 3, {**hb, "member_id": new, "assignments": []}), 14, 3)
        assert r.error_code == 0 and r.assignment == b"mine"
        assert call(s, frame(12, 3, {**hb, "member_id": new}), 12, 3).error_code == 0
        assert call(s, frame(12, 3, hb), 12, 3).error_code == 25  # the old member id is gone
        r = call(s, frame(11, 5, {**join, "member_id": mid}), 11, 5)
        assert r.error_code == 82  # FENCED_INSTANCE_ID
        r = call(s, frame(15, 5, {"groups": ["sg"], "include_authorized_operations": False}), 15, 5)
        g = r.groups[0]
        assert g.group_state == "Stable" and [(m.member_id, m.group_instance_id) for m in g.members] == \
            [(new, "host-1")]


def test_librdkafka_static_member_restart_keeps_partitions(broker):
    """Two librdkafka consumers with group.instance.id; one is closed (a static member does
    not leave) and started again with the same id: it gets its partition back within a few
    seconds and the other member is never revoked (no rebalance)."""
    _topic(broker, "sm", 2, 4)
    conf = {"session.timeout.ms": 10000, "max.poll.interval.ms": 20000}
    revoked: list[object] = []
    c1 = _consumer(broker, "smg", **{**conf, "group.instance.id": "host-1"})
    c2 = _consumer(broker, "smg", **{**conf, "group.instance.id": "host-2"})
    c1.subscribe(["sm"])
    c2.subscribe(["sm"], on_revoke=lambda c, ps: revoked.extend(ps))
    end = time.monotonic() + 30
    while not (len(_parts(c1)) == 1 and len(_parts(c2)) == 1) and time.monotonic() < end:
        c1.poll(0.05)
        c2.poll(0.05)
    mine, theirs = _parts(c1), _parts(c2)
    assert len(mine) == 1 and len(theirs) == 1, (mine, theirs)
    revoked.clear()
    c1.close()
    c1 = _consumer(broker, "smg", **{**conf, "group.instance.id": "host-1"})
    c1.subscribe(["sm"])
    t0 = time.monotonic()
    while _parts(c1) != mine and time.monotonic() - t0 < 8:
        c1.poll(0.05)
        c2.poll(0.05)
    took = time.monotonic() - t0
    for _ in range(20):
        c2.poll(0.05)
    try:
        assert _parts(c1) == mine and took < 8, took
        assert not revoked and _parts(c2) == theirs, revoked
    finally:
        c1.close()
        c2.close()
