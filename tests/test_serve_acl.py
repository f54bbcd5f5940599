"""pylog serve: rights on groups and topics beyond Produce/Fetch (issue 25, items 8-10), the
data root's modes against a second local user, and failed logins.

Group APIs, DescribeConfigs, Metadata and OffsetFetch are driven with raw frames after a
SCRAM-SHA-256 login written here (loopback without TLS: SCRAM only), and with
confluent-kafka / kafka-python consumers; the data root is read by the real ``nobody`` user
(``setpriv``) and failed logins are counted on brokers of their own.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from serve_util import BrokerProcess, batch, call, connect, create_topic, frame, produce, recv_exact  # noqa: E402

import pylog  # noqa: E402
from pylog.errors import ConfigError, InvalidArgumentError  # noqa: E402
from pylog.serve import security  # noqa: E402

GROUP_DENIED, TOPIC_DENIED, SASL_FAILED = 30, 29, 58


# -- a SCRAM-SHA-256 client (RFC 5802), raw frames -------------------------------------------
def scram_first(s, user: str, nonce: str = "clientnonce"):  # type: ignore[no-untyped-def]
    """SaslHandshake and the client-first message: the server-first answer (or refusal)."""
    r = call(s, frame(17, 1, {"mechanism": "SCRAM-SHA-256"}), 17, 1)
    assert r.error_code == 0, r
    return call(s, frame(36, 2, {"auth_bytes": f"n,,n={user},r={nonce}".encode()}), 36, 2)


def scram_final(server_first: str, user: str, password: str, nonce: str = "clientnonce") -> bytes:
    """The client-final frame (with its proof) answering ``server_first``."""
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored = hashlib.sha256(client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"n={user},r={nonce},{server_first},{without_proof}".encode()
    proof = bytes(a ^ b for a, b in zip(client_key, hmac.new(stored, auth, hashlib.sha256).digest()))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    return frame(36, 2, {"auth_bytes": final})


def scram_login(s, user: str, password: str, nonce: str = "clientnonce"):  # type: ignore[no-untyped-def]
    """A whole SCRAM-SHA-256 login on ``s``: the last SaslAuthenticate answer."""
    r = scram_first(s, user, nonce)
    if r is None or r.error_code:
        return r
    return call(s, scram_final(r.auth_bytes.decode(), user, password, nonce), 36, 2)


def login(b: BrokerProcess, user: str, password: str | None = None):  # type: ignore[no-untyped-def]
    s = connect(b)
    r = scram_login(s, user, password or user + "-secret")
    assert r is not None and r.error_code == 0, r
    return s


def _rk(b: BrokerProcess, user: str, password: str | None = None, **kw):  # type: ignore[no-untyped-def]
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": password if password is not None else user + "-secret", **kw}


# -- frames of the group APIs ----------------------------------------------------------------
def commit(group: str, topic: str, offset: int) -> bytes:
    return frame(8, 8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                            {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                             "committed_metadata": ""}]}]})


def fetch_offsets(group: str, topics: list[str] | None = None) -> bytes:
    return frame(9, 7, {"group_id": group, "require_stable": False,
                        "topics": None if topics is None else [{"name": t, "partition_indexes": [0]} for t in topics]})


def committed(s, group: str, topic: str) -> int:  # type: ignore[no-untyped-def]
    r = call(s, fetch_offsets(group, [topic]), 9, 7)
    assert r.error_code == 0
    return r.topics[0].partitions[0].committed_offset


def metadata(topics: list[str] | None, auto: bool = False) -> bytes:
    return frame(3, 12, {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                         "allow_auto_topic_creation": auto, "include_topic_authorized_operations": False})


USERS = {  # name: add_user's rights
    "admin": {},
    "bob": {"read": ["public"], "write": ["public"], "groups": ["bob-*"]},
    "carol": {"read": ["*"], "groups": ["carol-app"], "delete_groups": ["carol-app"], "transactional_ids": ["carol-*"]},
    "writer": {"read": [], "write": ["public"], "groups": [], "transactional_ids": ["writer-tx"]},
}


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("acl")
    users = str(d / "users.json")
    for name, rights in USERS.items():
        security.add_user(users, name, name + "-secret", **rights)
    # a user of a users file written before group rights: read/write lists, no "groups"
    with open(users) as f:
        data = json.load(f)
    data["users"]["legacy"] = {k: v for k, v in data["users"]["bob"].items() if k != "groups"}
    with open(users, "w") as f:
        json.dump(data, f)
    b = BrokerProcess(str(d / "root"), "--users", users, "--max-failed-logins", "0")
    with login(b, "admin") as s:
        assert {t.error_code for t in call(s, metadata(["public", "private"], auto=True), 3, 12).topics} == {0}
        for topic in ("public", "private"):
            r = call(s, produce(topic, batch([b"%s-%d" % (topic.encode(), i) for i in range(5)])), 0, 9)
            assert r.responses[0].partition_responses[0].error_code == 0
            for group in ("alice-app", "bob-app", "carol-app"):
                assert call(s, commit(group, topic, 3), 8, 8).topics[0].partitions[0].error_code == 0
    yield b
    try:
        assert b.stop() == 0
    finally:
        sys.stderr.write(b.stderr()[-3000:])


def test_group_without_rights_cannot_be_seen_joined_moved_or_deleted(acl_broker):
    """bob may use the groups "bob-*" only: every group API on "alice-app" is answered
    GROUP_AUTHORIZATION_FAILED and changes nothing; his own group works."""
    b = acl_broker
    with login(b, "bob") as s:
        r = call(s, frame(10, 3, {"key": "alice-app", "key_type": 0}), 10, 3)
        assert r.error_code == GROUP_DENIED and r.node_id == -1
        r = call(s, frame(10, 4, {"key_type": 0, "coordinator_keys": ["alice-app", "bob-app"]}), 10, 4)
        assert {c.key: c.error_code for c in r.coordinators} == {"alice-app": GROUP_DENIED, "bob-app": 0}
        r = call(s, frame(11, 5, {"group_id": "alice-app", "session_timeout": 10000, "rebalance_timeout": 10000,
                                  "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                  "protocols": [{"name": "range", "metadata": b""}]}), 11, 5)
        assert r.error_code == GROUP_DENIED and r.generation_id == -1
        r = call(s, frame(14, 3, {"group_id": "alice-app", "generation_id": 1, "member_id": "m",
                                  "group_instance_id": None, "assignments": []}), 14, 3)
        assert r.error_code == GROUP_DENIED
        r = call(s, frame(12, 3, {"group_id": "alice-app", "generation_id": 1, "member_id": "m",
                                  "group_instance_id": None}), 12, 3)
        assert r.error_code == GROUP_DENIED
        r = call(s, frame(13, 3, {"group_id": "alice-app", "members": [{"member_id": "m",
                                                                        "group_instance_id": None}]}), 13, 3)
        assert r.error_code == GROUP_DENIED
        # move: OffsetCommit refused on every partition, the offset stays
        r = call(s, commit("alice-app", "public", 0), 8, 8)
        assert r.topics[0].partitions[0].error_code == GROUP_DENIED
        r = call(s, fetch_offsets("alice-app", ["public"]), 9, 7)
        assert r.error_code == GROUP_DENIED and not r.topics
        r = call(s, frame(9, 8, {"groups": [{"group_id": "alice-app", "topics": None},
                                            {"group_id": "bob-app", "topics": None}], "require_stable": False}), 9, 8)
        by = {g.group_id: g for g in r.groups}
        assert by["alice-app"].error_code == GROUP_DENIED and not by["alice-app"].topics
        assert by["bob-app"].error_code == 0
        # see: DescribeGroups refused, ListGroups leaves it out
        r = call(s, frame(15, 5, {"groups": ["alice-app", "bob-app"], "include_authorized_operations": False}), 15, 5)
        assert {g.group_id: g.error_code for g in r.groups} == {"alice-app": GROUP_DENIED, "bob-app": 0}
        r = call(s, frame(16, 4, {"states_filter": []}), 16, 4)
        assert {g.group_id for g in r.groups} == {"bob-app"}
        # delete: bob has no delete_groups, so none (not even his own)
        r = call(s, frame(42, 2, {"groups_names": ["alice-app", "bob-app"]}), 42, 2)
        assert {x.group_id: x.error_code for x in r.results} == {"alice-app": GROUP_DENIED, "bob-app": GROUP_DENIED}
        # his own group: commit and fetch work
        assert call(s, commit("bob-app", "public", 4), 8, 8).topics[0].partitions[0].error_code == 0
        assert committed(s, "bob-app", "public") == 4
    with login(b, "admin") as s:  # nothing of alice-app moved
        assert committed(s, "alice-app", "public") == 3
        assert committed(s, "alice-app", "private") == 3
        r = call(s, frame(16, 4, {"states_filter": []}), 16, 4)
        assert {"alice-app", "bob-app", "carol-app"} <= {g.group_id for g in r.groups}


def test_transactional_ids_have_rights(acl_broker):
    """FindCoordinator of a transactional id and InitProducerId with one need the id's right
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53); a restricted user without the list has none."""
    def find(s, ids):  # type: ignore[no-untyped-def]
        r = call(s, frame(10, 4, {"key_type": 1, "coordinator_keys": ids}), 10, 4)
        return {c.key: c.error_code for c in r.coordinators}

    with login(acl_broker, "carol") as s:
        assert find(s, ["carol-tx", "other-tx"]) == {"carol-tx": 0, "other-tx": 53}
        assert call(s, frame(10, 3, {"key": "other-tx", "key_type": 1}), 10, 3).error_code == 53
    with login(acl_broker, "bob") as s:
        assert find(s, ["bob-tx"]) == {"bob-tx": 53}
        r = call(s, frame(22, 4, {"transactional_id": "bob-tx", "transaction_timeout": 60000, "producer_id": -1,
                                  "producer_epoch": -1}), 22, 4)
        assert r.error_code == 53 and r.producer_id == -1
        r = call(s, frame(22, 4, {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
                                  "producer_epoch": -1}), 22, 4)
        assert r.error_code == 0 and r.producer_id >= 0  # idempotent producers need no id
    with login(acl_broker, "admin") as s:
        assert find(s, ["any-tx"]) == {"any-tx": 0}


def test_transaction_apis_need_the_ids_right(acl_broker):
    """AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn need WRITE on the
    transactional id (53), AddPartitionsToTxn WRITE on each topic (29, the others not
    attempted: 55), the offsets APIs READ on the group (30); ListTransactions shows the ids
    the user may use."""
    with login(acl_broker, "admin") as s:
        create_topic(s, "txn-acl")
        r = call(s, frame(22, 4, {"transactional_id": "admin-tx", "transaction_timeout": 60000, "producer_id": -1,
                                  "producer_epoch": -1}), 22, 4)
        assert r.error_code == 0
    def add(s, tid: str, pid: int, epoch: int, topic: str) -> list[int]:  # type: ignore[no-untyped-def]
        r = call(s, frame(24, 3, {"v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
                                  "v3_and_below_producer_epoch": epoch,
                                  "v3_and_below_topics": [{"name": topic, "partitions": [0]}]}), 24, 3)
        return [x.partition_error_code for t in r.results_by_topic_v3_and_below for x in t.results_by_partition]

    def init(s, tid: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
        r = call(s, frame(22, 4, {"transactional_id": tid, "transaction_timeout": 60000, "producer_id": -1,
                                  "producer_epoch": -1}), 22, 4)
        assert r.error_code == 0
        return r.producer_id, r.producer_epoch

    with login(acl_broker, "writer") as s:  # writes "public" only
        pid, epoch = init(s, "writer-tx")
        assert add(s, "writer-tx", pid, epoch, "txn-acl") == [29]
        assert add(s, "writer-tx", pid, epoch, "public") == [0]
    with login(acl_broker, "carol") as s:  # carol-* ids, the group carol-app
        pid, epoch = init(s, "carol-tx")
        assert add(s, "admin-tx", pid, epoch, "txn-acl") == [53]
        assert add(s, "carol-tx", pid, epoch, "txn-acl") == [0]
        offsets = {"transactional_id": "carol-tx", "producer_id": pid, "producer_epoch": epoch}
        assert call(s, frame(25, 3, {**offsets, "group_id": "bob-app"}), 25, 3).error_code == 30
        assert call(s, frame(25, 3, {**offsets, "group_id": "carol-app"}), 25, 3).error_code == 0
        r = call(s, frame(28, 3, {**offsets, "group_id": "bob-app", "generation_id": -1, "member_id": "",
                                  "group_instance_id": None, "topics": [{"name": "txn-acl", "partitions": [
                                      {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                                       "committed_metadata": None}]}]}), 28, 3)
        assert r.topics[0].partitions[0].error_code == 30
        assert call(s, frame(26, 3, {**offsets, "transactional_id": "admin-tx", "committed": False}),
                    26, 3).error_code == 53
        assert call(s, frame(26, 3, {**offsets, "committed": False}), 26, 3).error_code == 0
        r = call(s, frame(66, 1, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1}), 66, 1)
        assert [t.transactional_id for t in r.transaction_states] == ["carol-tx"]


def test_delete_groups_needs_the_delete_right(acl_broker):
    """The reported hole: a user with no rights on a topic wiped another group's committed
    offset on it with DeleteGroups. A legacy user (no "groups" in the file) keeps using every
    group but deletes none; carol deletes only the group she is given."""
    b = acl_broker
    with login(b, "legacy", "bob-secret") as s:  # bob's keys, without "groups"
        r = call(s, frame(42, 2, {"groups_names": ["alice-app"]}), 42, 2)
        assert r.results[0].error_code == GROUP_DENIED
        r = call(s, frame(15, 5, {"groups": ["alice-app"], "include_authorized_operations": False}), 15, 5)
        assert r.groups[0].error_code == 0  # may see and use every group, as before
    with login(b, "carol") as s:
        r = call(s, frame(42, 2, {"groups_names": ["alice-app", "carol-app"]}), 42, 2)
        assert {x.group_id: x.error_code for x in r.results} == {"alice-app": GROUP_DENIED, "carol-app": 0}
    with login(b, "admin") as s:
        assert committed(s, "alice-app", "private") == 3
        assert committed(s, "carol-app", "private") == -1  # deleted


def test_describe_configs_metadata_and_offset_fetch_hide_what_the_user_may_not_see(acl_broker):
    b = acl_broker
    with login(b, "bob") as s:
        r = call(s, frame(32, 4, {"resources": [{"resource_type": 2, "resource_name": n, "configuration_keys": None}
                                                for n in ("private", "public")],
                                  "include_synonyms": False, "include_documentation": False}), 32, 4)
        by = {x.resource_name: x for x in r.results}
        assert by["private"].error_code == TOPIC_DENIED and not by["private"].configs
        assert by["public"].error_code == 0 and {c.name for c in by["public"].configs} >= {"retention.ms"}
        # all-topics Metadata leaves "private" out; naming it is answered 29
        names = {t.name for t in call(s, metadata(None), 3, 12).topics}
        assert "public" in names and "private" not in names
        r = call(s, metadata(["private"]), 3, 12)
        assert r.topics[0].error_code == TOPIC_DENIED and not r.topics[0].partitions
        # OffsetFetch of every topic: bob-app has offsets on both, bob sees only "public"
        r = call(s, fetch_offsets("bob-app"), 9, 7)
        assert r.error_code == 0 and {t.name for t in r.topics} == {"public"}
        r = call(s, fetch_offsets("bob-app", ["private"]), 9, 7)
        assert r.topics[0].partitions[0].error_code == TOPIC_DENIED
        assert r.topics[0].partitions[0].committed_offset == -1
    with login(b, "writer") as s:  # WRITE implies DESCRIBE: a producer-only user sees its topic
        r = call(s, metadata(["public"]), 3, 12)
        assert r.topics[0].error_code == 0 and len(r.topics[0].partitions) == 1
        assert {t.name for t in call(s, metadata(None), 3, 12).topics} == {"public"}
        r = call(s, produce("public", batch([b"from writer"])), 0, 9)
        assert r.responses[0].partition_responses[0].error_code == 0


def test_consumer_clients_refused_a_group_they_have_no_rights_on(acl_broker):
    b = acl_broker
    errors: list = []
    c = ck.Consumer(_rk(b, "bob", **{"group.id": "alice-app", "auto.offset.reset": "earliest",
                                     "error_cb": errors.append}))
    c.subscribe(["public"])
    got = []
    for _ in range(100):
        m = c.poll(0.1)
        if m is not None:
            got.append(m)
            if m.error() is not None:
                break
    c.close()
    assert any(m.error() is not None and m.error().code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED
               for m in got) or any(e.code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED for e in errors), (got, errors)
    assert not any(m.error() is None for m in got)  # no record
    kc = kafka.KafkaConsumer("public", bootstrap_servers=b.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob",
                             sasl_plain_password="bob-secret", group_id="bob-app", auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    values = [m.value for m in kc]  # his own group: from its committed offset 4
    kc.close()
    assert values[0] == b"public-4"


def test_users_file_rights_and_the_command(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "u.json")
    security.add_user(path, "dan", "pw", groups=["app-*"], delete_groups=["app-tmp"], transactional_ids=["tx"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    u = security.Users(path)
    assert u.may_group("dan", "app-1", "read") and not u.may_group("dan", "other", "read")
    assert u.may_group("dan", "app-tmp", "delete") and not u.may_group("dan", "app-1", "delete")
    assert u.may_group("dan", "app-tmp", "describe") and not u.may_group("dan", "other", "describe")
    assert u.may("dan", "any-topic", False)  # no topic lists: every topic, as before
    assert u.may_transact("dan", "tx") and not u.may_transact("dan", "tx2")
    with pytest.raises(InvalidArgumentError, match=r"groups: 'a\*b' is not a name or a prefix"):
        security.add_user(path, "eve", "pw", groups=["a*b"])
    # the command (python -m pylog.serve.security), password on stdin
    monkeypatch.setattr(sys, "stdin", io.StringIO("pw\n"))
    assert security._main([path, "erin", "--read", "t1", "--groups", "g1,g2", "--delete-groups", "g2",
                           "--transactional-ids", "erin-*"]) == 0
    with open(path) as f:
        entry = json.load(f)["users"]["erin"]
    assert entry["read"] == ["t1"] and entry["groups"] == ["g1", "g2"] and entry["delete_groups"] == ["g2"]
    assert entry["transactional_ids"] == ["erin-*"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("pw\n"))
    assert security._main([path, "erin", "--group", "g1"]) == 2
    assert "unknown option '--group'" in capsys.readouterr().err
    with open(path) as f:
        data = json.load(f)
    data["users"]["erin"]["groups"] = "g1"  # not a list
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ConfigError, match="'groups' must be a list"):
        security.Users(path)


# -- the data root against a second local user (item 9) -------------------------------------
def _setpriv_ok() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    try:
        import pwd

        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return True


needs_nobody = pytest.mark.skipif(not _setpriv_ok(), reason="needs root, setpriv and the user nobody")


def as_nobody(*cmd: str, gid: str = "nogroup") -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """Run ``cmd`` as the local user ``nobody`` (group ``gid``, no supplementary groups)."""
    return subprocess.run(["setpriv", "--reuid=nobody", f"--regid={gid}", "--clear-groups", *cmd],
                          capture_output=True, timeout=30)


@pytest.fixture
def open_dir():
    """A directory every local user may traverse (0755), as a root's parent often is
    (pytest's own temporary directories are 0700, which would hide the root anyway)."""
    d = tempfile.mkdtemp(prefix="pylog-acl-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _modes(root: str) -> dict[str, int]:
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            out[os.path.relpath(os.path.join(d, n), root)] = stat.S_IMODE(os.lstat(os.path.join(d, n)).st_mode)
    out["."] = stat.S_IMODE(os.stat(root).st_mode)
    return out


def _segments(root: str, topic: str) -> list[str]:
    d = os.path.join(root, topic, "partition-0")
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".log")]


def _fill(b: BrokerProcess, topic: str, idempotent: bool = True) -> None:
    """Records, a committed group offset and an idempotent producer's state under ``topic``."""
    with connect(b) as s:
        assert call(s, metadata([topic], auto=True), 3, 12).topics[0].error_code == 0
        r = call(s, produce(topic, batch([b"top secret %d" % i for i in range(3)])), 0, 9)
        assert r.responses[0].partition_responses[0].error_code == 0
        assert call(s, commit("g", topic, 1), 8, 8).topics[0].partitions[0].error_code == 0
    if idempotent:
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        p.produce(topic, b"top secret, idempotent")
        assert p.flush(30) == 0


@needs_nobody
def test_data_root_private_to_the_broker_user(open_dir):
    """Every file and directory the broker makes, itself or through the library (segments,
    indexes, group offsets, producer state, checkpoints), is 0600/0700: ``nobody`` can
    neither list the root nor read a segment. (Before: 0644/0755, and nobody read them.)"""
    root = os.path.join(open_dir, "root")
    b = BrokerProcess(root)
    try:
        _fill(b, "secret")
    finally:
        assert b.stop() == 0
    modes = _modes(root)
    kinds = {os.path.basename(n).rsplit(".", 1)[-1] for n in modes}
    assert {"log", "offset"} <= kinds, sorted(modes)  # segments and the group's offset at least
    assert any("producer" in n for n in modes), sorted(modes)
    loose = {n: oct(m) for n, m in modes.items() if m & 0o077}
    assert not loose, loose
    seg = _segments(root, "secret")[0]
    with open(seg, "rb") as f:
        assert b"top secret" in f.read()  # the broker's user reads it
    r = as_nobody("ls", root)
    assert r.returncode != 0 and b"Permission denied" in r.stderr, r
    r = as_nobody("cat", seg)
    assert r.returncode != 0 and b"top secret" not in r.stdout, r
    os.chmod(root, 0o755)  # even through an opened root, the files themselves are 0600
    r = as_nobody("cat", seg)
    assert r.returncode != 0 and b"Permission denied" in r.stderr, r


@needs_nobody
def test_existing_open_root_is_tightened_and_library_follows_umask(open_dir):
    """A root the library made under umask 022 (0755, segments 0644: the library follows the
    process umask) is readable by nobody; the broker tightens the root to 0700 and says so,
    after which nobody reaches none of it."""
    root = os.path.join(open_dir, "root")
    old = os.umask(0o022)
    try:
        st = pylog.LogStore(root)
        st.create_topic("old", partitions=1).append(b"old secret", partition=0)
        st.close()
    finally:
        os.umask(old)
    seg = _segments(root, "old")[0]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755 and stat.S_IMODE(os.stat(seg).st_mode) == 0o644
    assert b"old secret" in as_nobody("cat", seg).stdout  # the library's files follow its umask
    b = BrokerProcess(root)
    assert b.stop() == 0
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert "was 0755, now 0700" in b.stderr()
    r = as_nobody("cat", seg)
    assert r.returncode != 0 and b"old secret" not in r.stdout, r


@needs_nobody
def test_group_data_mode_lets_the_root_group_read(open_dir):
    root = os.path.join(open_dir, "root")
    b = BrokerProcess(root, "--data-mode", "group")
    try:
        _fill(b, "shared", idempotent=False)
    finally:
        assert b.stop() == 0
    modes = _modes(root)
    assert modes["."] == 0o750
    loose = {n: oct(m) for n, m in modes.items() if m & 0o027}
    assert not loose, loose
    seg = _segments(root, "shared")[0]
    assert stat.S_IMODE(os.stat(seg).st_mode) == 0o640
    gid = str(os.stat(root).st_gid)
    assert b"top secret" in as_nobody("cat", seg, gid=gid).stdout  # a member of the root's group reads
    r = as_nobody("cat", seg)
    assert r.returncode != 0 and b"top secret" not in r.stdout, r


# -- failed logins (item 10) -------------------------------------------------------------------
@pytest.fixture
def users_file(tmp_path):
    path = str(tmp_path / "users.json")
    for name in ("admin", "alice"):
        security.add_user(path, name, name + "-secret")
    return path


def _read_answer(s, key: int, version: int):  # type: ignore[no-untyped-def]
    """The next response on ``s`` (a request already sent), or None if it closed."""
    import struct

    from kio.index import load_response_schema
    from kio.serial import entity_reader

    head = recv_exact(s, 4)
    if head is None:
        return None
    body = recv_exact(s, struct.unpack(">i", head)[0])
    cls = load_response_schema(key, version)
    _hdr, used = entity_reader(cls.__header_schema__)(body, 0)
    return entity_reader(cls)(body, used)[0]


def test_failed_login_is_delayed_without_stopping_other_clients(tmp_path, users_file):
    """A failed login is answered only after the delay (5 s here, to be far above any noise);
    meanwhile another client's requests are answered: the wait is not on the event loop."""
    b = BrokerProcess(str(tmp_path / "root"), "--users", users_file, "--failed-auth-delay-ms", "5000",
                      "--max-failed-logins", "0")
    try:
        with login(b, "admin") as good, connect(b) as bad:
            r = scram_first(bad, "alice")
            final = scram_final(r.auth_bytes.decode(), "alice", "wrong password")
            t0 = time.monotonic()
            bad.sendall(final)
            for _ in range(5):
                assert {t.error_code for t in call(good, metadata(None), 3, 12).topics} <= {0}
            poller = select.poll()  # not select(): late in a full run this process's descriptors pass 1024
            poller.register(bad, select.POLLIN)
            unanswered = poller.poll(0) == []
            r = _read_answer(bad, 36, 2)
            waited = time.monotonic() - t0
            assert unanswered, "the failed login was answered before the other client's requests"
            assert r.error_code == SASL_FAILED and waited >= 4.95, (r, waited)
            assert recv_exact(bad, 4) is None  # then closed
    finally:
        assert b.stop() == 0


def test_failed_logins_limited_per_address(tmp_path, users_file):
    """Past --max-failed-logins failures from an address within a minute, its logins fail
    without their credentials being checked, even a right password; the broker logs it once.
    Each failure is answered after the default 100 ms delay."""
    b = BrokerProcess(str(tmp_path / "root"), "--users", users_file, "--max-failed-logins", "3")
    try:
        for _ in range(3):
            with connect(b) as s:
                t0 = time.monotonic()
                r = scram_login(s, "alice", "guess")
                assert r.error_code == SASL_FAILED and "invalid credentials" in r.error_message
                assert time.monotonic() - t0 >= 0.09
        for source in ("127.0.0.1", "127.0.0.1", "127.0.0.2"):  # locked out: the right password fails too;
            # another loopback address is the same client address
            with socket.create_connection(("127.0.0.1", b.port), timeout=20, source_address=(source, 0)) as s:
                r = scram_login(s, "alice", "alice-secret")
                assert r.error_code == SASL_FAILED and "too many failed logins from loopback" in r.error_message
        errors: list = []
        reports: list = []
        p = ck.Producer(_rk(b, "alice", **{"error_cb": errors.append, "message.timeout.ms": 3000}))
        p.produce("t", b"x", on_delivery=lambda err, msg: reports.append(err))
        p.flush(8)
        del p
        assert len(reports) == 1 and reports[0] is not None  # not delivered
        assert any(e.code() == ck.KafkaError._AUTHENTICATION and "too many failed logins" in e.str()
                   for e in errors), errors
    finally:
        assert b.stop() == 0
    err = b.stderr()
    assert err.count("failed logins from loopback within 60 s") == 1, err[-3000:]


def test_login_limit_frees_an_address_after_the_window(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(security.time, "monotonic", lambda: now[0])
    logins = security.Logins(delay=0, max_failures=2, window=60)
    logins.failed("10.0.0.1")
    now[0] += 30
    logins.failed("10.0.0.1")
    assert logins.blocked("10.0.0.1") == pytest.approx(30) and logins.blocked("10.0.0.2") == 0
    now[0] += 30.5  # the first failure is over a minute old
    assert logins.blocked("10.0.0.1") == 0
    assert security.Logins(max_failures=0).blocked("10.0.0.1") == 0  # 0: no limit
    logins.checking("10.0.0.2", 1)  # logins being checked count: a burst cannot pass the limit
    logins.checking("10.0.0.2", 1)
    assert logins.blocked("10.0.0.2") > 0
    logins.checking("10.0.0.2", -1)
    assert logins.blocked("10.0.0.2") == 0


def test_failed_logins_counted_per_client_address():
    """A local client may bind any loopback address, an IPv6 client any address of its /64:
    those count as one address."""
    key = security.client_address
    assert key("127.0.0.1") == key("127.0.0.2") == key("127.255.0.9") == key("::1") == key("::ffff:127.0.0.5")
    assert key("2001:db8::1") == key("2001:db8::ffff:2") != key("2001:db8:0:1::1")
    assert key("10.0.0.1") != key("10.0.0.2") and key("::ffff:10.0.0.1") == key("10.0.0.1") == "10.0.0.1"


def test_scram_unknown_user_fails_at_the_proof_like_a_wrong_password(acl_broker):
    """RFC 5802 5.1: an unknown user gets a salt and iteration count (the same at every probe
    of a name) and is refused at the proof with the wrong password's answer."""
    def first(user: str) -> dict[str, str]:
        with connect(acl_broker) as s:
            r = scram_first(s, user, nonce="n0nce")
            assert r.error_code == 0, r
            return dict(a.split("=", 1) for a in r.auth_bytes.decode().split(","))

    known, ghost, ghost2, other = first("admin"), first("mallory"), first("mallory"), first("trudy")
    assert ghost["s"] == ghost2["s"] and ghost["i"] == ghost2["i"] == known["i"] == "4096"
    assert len(base64.b64decode(ghost["s"])) == len(base64.b64decode(known["s"])) == 16
    assert len({known["s"], ghost["s"], other["s"]}) == 3
    answers = []
    for user in ("admin", "mallory"):
        with connect(acl_broker) as s:
            r = scram_login(s, user, "not the password")
            answers.append((r.error_code, r.error_message))
            assert recv_exact(s, 4) is None
    assert answers[0] == answers[1] and answers[0][0] == SASL_FAILED


def test_plain_derives_a_key_for_unknown_users_too(tmp_path, users_file, monkeypatch):
    """PLAIN: an unknown user costs the same key derivation (same salt length and iteration
    count) as a known one; before, it was refused at once (15x faster, so told apart)."""
    users = security.Users(users_file)
    calls = []
    real = security._keys

    def spy(password, salt, iterations):  # type: ignore[no-untyped-def]
        calls.append((len(salt), iterations))
        return real(password, salt, iterations)

    monkeypatch.setattr(security, "_keys", spy)
    assert not users.check_plain("alice", "wrong") and calls == [(16, 4096)]
    assert not users.check_plain("mallory", "wrong") and calls == [(16, 4096)] * 2
    assert users.check_plain("alice", "alice-secret")
    monkeypatch.setattr(security, "_keys", real)

    def median(user: str) -> float:  # CPU time of this thread: little noise from other processes
        times = []
        for _ in range(15):
            t0 = time.thread_time()
            users.check_plain(user, "wrong")
            times.append(time.thread_time() - t0)
        return sorted(times)[7]

    ratio = median("mallory") / median("alice")
    assert 0.25 < ratio < 4, ratio  # the same work; generous bounds for a shared machine


def test_server_in_process_sets_and_restores_the_umask(tmp_path):
    """The umask is the process's: Server sets the data mode's while it runs, restores it at
    stop(), and refuses an unknown mode."""
    import asyncio

    from pylog.serve.server import Server

    async def run() -> int:
        server = Server(str(tmp_path / "root"), port=0, cleanup_interval=None, data_mode="group")
        await server.start()
        inside = os.umask(0o022)
        os.umask(inside)
        await server.stop()
        return inside

    before = os.umask(0o022)
    os.umask(before)
    assert asyncio.run(run()) == 0o027
    after = os.umask(0o022)
    os.umask(after)
    assert after == before
    assert stat.S_IMODE(os.stat(tmp_path / "root").st_mode) == 0o750
    with pytest.raises(InvalidArgumentError, match="data mode 'public'"):
        Server(str(tmp_path / "root"), port=0, data_mode="public")


def test_root_that_cannot_be_tightened_is_a_warning(tmp_path, monkeypatch, caplog):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)

    def refuse(path, mode):  # type: ignore[no-untyped-def]
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(security.os, "chmod", refuse)
    old = security.protect_root(str(root))
    try:
        assert os.umask(old) == 0o077
    finally:
        os.umask(old)
    assert "is 0755 and cannot be made 0700 (Operation not permitted): other local users may read it" in caplog.text
