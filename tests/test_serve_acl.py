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
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from conftest import ROOT, py_env  # noqa: E402
from serve_util import BrokerProcess, batch, call, connect, frame, produce, recv_exact  # noqa: E402

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


def scram_login(s, user: str, password: str, nonce: str = "clientnonce"):  # type: ignore[no-untyped-def]
    """A whole SCRAM-SHA-256 login on ``s``: the last SaslAuthenticate answer."""
    r = scram_first(s, user, nonce)
    if r is None or r.error_code:
        return r
    server_first = r.auth_bytes.decode()
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored = hashlib.sha256(client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"n={user},r={nonce},{server_first},{without_proof}".encode()
    proof = bytes(a ^ b for a, b in zip(client_key, hmac.new(stored, auth, hashlib.sha256).digest()))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    return call(s, frame(36, 2, {"auth_bytes": final}), 36, 2)


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
    "carol": {"read": ["*"], "groups": ["carol-app"], "delete_groups": ["carol-app"]},
    "writer": {"read": [], "write": ["public"], "groups": []},
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


def test_users_file_rights_and_the_command(tmp_path):
    path = str(tmp_path / "u.json")
    security.add_user(path, "dan", "pw", groups=["app-*"], delete_groups=["app-tmp"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    u = security.Users(path)
    assert u.may_group("dan", "app-1", "read") and not u.may_group("dan", "other", "read")
    assert u.may_group("dan", "app-tmp", "delete") and not u.may_group("dan", "app-1", "delete")
    assert u.may_group("dan", "app-tmp", "describe") and not u.may_group("dan", "other", "describe")
    assert u.may("dan", "any-topic", False)  # no topic lists: every topic, as before
    with pytest.raises(InvalidArgumentError, match=r"groups: 'a\*b' is not a name or a prefix"):
        security.add_user(path, "eve", "pw", groups=["a*b"])
    out = subprocess.run([sys.executable, "-m", "pylog.serve.security", path, "erin", "--read", "t1",
                          "--groups", "g1,g2", "--delete-groups", "g2"], input="pw\n", text=True,
                         capture_output=True, cwd=ROOT, env=py_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    with open(path) as f:
        entry = json.load(f)["users"]["erin"]
    assert entry["read"] == ["t1"] and entry["groups"] == ["g1", "g2"] and entry["delete_groups"] == ["g2"]
    out = subprocess.run([sys.executable, "-m", "pylog.serve.security", path, "erin", "--group", "g1"],
                         input="pw\n", text=True, capture_output=True, cwd=ROOT, env=py_env(), timeout=60)
    assert out.returncode == 2 and "unknown option '--group'" in out.stderr
    with open(path) as f:
        data = json.load(f)
    data["users"]["erin"]["groups"] = "g1"  # not a list
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ConfigError, match="'groups' must be a list"):
        security.Users(path)
