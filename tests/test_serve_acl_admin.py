"""pylog serve: the security admin APIs through confluent-kafka's AdminClient:
Describe/AlterUserScramCredentials over the users file (who may, durability, new logins),
Create/Describe/DeleteAcls (bindings stored in the users file, DENY first, with or without SASL).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from serve_util import BrokerProcess  # noqa: E402

from pylog.serve import security  # noqa: E402

SHA256 = ScramMechanism.SCRAM_SHA_256


def _admin(b: BrokerProcess, user: str | None = None, password: str = "") -> AdminClient:
    conf = {"bootstrap.servers": b.bootstrap, "socket.timeout.ms": 5000}
    if user is not None:
        conf.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                     "sasl.username": user, "sasl.password": password})
    return AdminClient(conf)


def _upsert(user: str, password: str, iterations: int = 10000,
            mechanism: ScramMechanism = SHA256) -> UserScramCredentialUpsertion:
    return UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, iterations), password.encode(),
                                        b"some-salt")


def _alter(admin: AdminClient, alterations: list) -> dict[str, object]:  # type: ignore[type-arg]
    """user -> None (done) or the KafkaError code."""
    out: dict[str, object] = {}
    for user, fut in admin.alter_user_scram_credentials(alterations, request_timeout=20).items():
        try:
            fut.result(30)
            out[user] = None
        except ck.KafkaException as e:
            out[user] = e.args[0].code()
    return out


def _describe(admin: AdminClient, users: list[str]) -> dict[str, object]:
    """user -> [(mechanism, iterations)] or the KafkaError code."""
    out: dict[str, object] = {}
    for user, fut in admin.describe_user_scram_credentials(users, request_timeout=20).items():
        try:
            out[user] = [(i.mechanism, i.iterations) for i in fut.result(30).scram_credential_infos]
        except ck.KafkaException as e:
            out[user] = e.args[0].code()
    return out


def _can_login(b: BrokerProcess, user: str, password: str) -> bool:
    try:
        _admin(b, user, password).list_topics(timeout=5)
        return True
    except ck.KafkaException:
        return False


def test_scram_credentials_without_users_file_kept_in_root(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root)
    try:
        admin = _admin(b)
        assert _describe(admin, ["dora"]) == {"dora": ck.KafkaError.RESOURCE_NOT_FOUND}
        assert _alter(admin, [_upsert("dora", "pw1")]) == {"dora": None}
        assert _describe(admin, ["dora"]) == {"dora": [(SHA256, 10000)]}
        # what is not served or not acceptable, per user
        assert _alter(admin, [_upsert("eve", "pw", mechanism=ScramMechanism.SCRAM_SHA_512),
                              _upsert("fay", "pw", iterations=1000)]) == {
            "eve": ck.KafkaError.UNSUPPORTED_SASL_MECHANISM, "fay": ck.KafkaError.UNACCEPTABLE_CREDENTIAL}
        assert _alter(admin, [UserScramCredentialDeletion("gus", SHA256)]) == {
            "gus": ck.KafkaError.RESOURCE_NOT_FOUND}
        with open(os.path.join(root, "users.json")) as f:
            dora = json.load(f)["users"]["dora"]
        assert dora["iterations"] == 10000 and dora["read"] == [] and "stored_key" in dora
        assert "eve" not in json.load(open(os.path.join(root, "users.json")))["users"]
        assert _alter(admin, [UserScramCredentialDeletion("dora", SHA256)]) == {"dora": None}
        assert _describe(admin, ["dora"]) == {"dora": ck.KafkaError.RESOURCE_NOT_FOUND}
    finally:
        assert b.stop() == 0


def test_scram_alter_admin_only_live_and_durable(tmp_path):
    users = str(tmp_path / "users.json")
    security.add_user(users, "root", "root-pw")
    security.add_user(users, "bob", "bob-pw")
    data = json.load(open(users))
    data["users"]["root"]["admin"] = True
    with open(users, "w") as f:
        json.dump(data, f)
    b = BrokerProcess(str(tmp_path / "data"), "--users", users, "--max-failed-logins", "0")
    try:
        bob = _admin(b, "bob", "bob-pw")
        assert _alter(bob, [_upsert("carol", "c1")]) == {"carol": ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED}
        # (the request-level error through .exception(): confluent-kafka 2.x crashes raising it)
        err = bob.describe_user_scram_credentials(["bob"], request_timeout=20)["bob"].exception(30)
        assert err.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
        assert "carol" not in json.load(open(users))["users"]

        root = _admin(b, "root", "root-pw")
        assert _alter(root, [_upsert("carol", "c1")]) == {"carol": None}
        assert _can_login(b, "carol", "c1")  # the next login sees it
        assert _alter(root, [_upsert("carol", "c2", iterations=4096)]) == {"carol": None}
        assert not _can_login(b, "carol", "c1") and _can_login(b, "carol", "c2")
        assert _describe(root, ["carol", "bob"]) == {"carol": [(SHA256, 4096)], "bob": [(SHA256, 4096)]}
        # one user twice in a request: refused, nothing changed
        assert _alter(root, [_upsert("bob", "x"), UserScramCredentialDeletion("bob", SHA256)]) == {
            "bob": ck.KafkaError.DUPLICATE_RESOURCE}
        assert _can_login(b, "bob", "bob-pw")
    finally:
        assert b.stop() == 0
    assert oct(os.stat(users).st_mode & 0o777) == "0o600"
    # durable: a restarted broker logs carol in with her new password
    b = BrokerProcess(str(tmp_path / "data"), "--users", users, "--max-failed-logins", "0")
    try:
        assert _can_login(b, "carol", "c2")
        root = _admin(b, "root", "root-pw")
        assert _alter(root, [UserScramCredentialDeletion("carol", SHA256)]) == {"carol": None}
        assert not _can_login(b, "carol", "c2")
        assert json.load(open(users))["users"]["carol"]["read"] == []  # rights kept, no credential
    finally:
        status = b.stop()
        sys.stderr.write(b.stderr()[-2000:])
        assert status == 0


def _binding(principal: str, topic: str, op: str, permission: str = "DENY", pattern: str = "LITERAL",
             host: str = "*", rtype: str = "TOPIC") -> AclBinding:
    return AclBinding(getattr(ResourceType, rtype), topic, getattr(ResourcePatternType, pattern), principal, host,
                      getattr(AclOperation, op), getattr(AclPermissionType, permission))


def _one(futures: dict) -> object:  # type: ignore[type-arg]
    """The result of the one future of an admin call."""
    (fut,) = futures.values()
    return fut.result(20)


def _produce_error(bootstrap: str, topic: str, extra: dict | None = None) -> object:  # type: ignore[type-arg]
    """The delivery error code of one record (None: delivered)."""
    errs: list[object] = []
    p = ck.Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000, **(extra or {})})
    p.produce(topic, b"v", on_delivery=lambda err, _m: errs.append(err and err.code()))
    p.flush(20)
    return errs[0] if errs else "no report"


def test_acls_deny_without_users_file_durable(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root)
    try:
        admin = _admin(b)
        for fut in admin.create_topics([NewTopic("secret", 1), NewTopic("open", 1)]).values():
            fut.result(20)
        assert _produce_error(b.bootstrap, "secret") is None
        # a binding pylog cannot enforce is refused, naming what is wrong
        with pytest.raises(ck.KafkaException, match="host '10.0.0.1'"):
            _one(admin.create_acls([_binding("User:*", "secret", "READ", host="10.0.0.1")]))
        with pytest.raises(ck.KafkaException, match="operation 5 on TOPIC"):
            _one(admin.create_acls([_binding("User:*", "secret", "CREATE")]))
        deny = _binding("User:*", "secret", "ALL")
        for fut in admin.create_acls([deny]).values():
            fut.result(20)
        assert _produce_error(b.bootstrap, "secret") == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert _produce_error(b.bootstrap, "open") is None
        any_topic = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None,
                                     AclOperation.ANY, AclPermissionType.ANY)
        assert admin.describe_acls(any_topic).result(20) == [deny]
    finally:
        assert b.stop() == 0
    b = BrokerProcess(root)  # the binding is durable
    try:
        admin = _admin(b)
        assert _produce_error(b.bootstrap, "secret") == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert _one(admin.delete_acls([any_topic])) == [deny]
        assert _produce_error(b.bootstrap, "secret") is None
        assert admin.describe_acls(any_topic).result(20) == []
    finally:
        assert b.stop() == 0


def test_acls_with_users_admin_only_deny_wins(tmp_path):
    users = str(tmp_path / "users.json")
    security.add_user(users, "root", "root-pw", read=[], write=[])
    security.add_user(users, "bob", "bob-pw", read=["*"], write=["*"])
    security.add_user(users, "cy", "cy-pw", read=[], write=[])
    b = BrokerProcess(str(tmp_path / "data"), "--users", users, "--max-failed-logins", "0")
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256"}
    try:
        bob = _admin(b, "bob", "bob-pw")
        bob.create_topics([NewTopic("t", 1)])["t"].result(20)
        with pytest.raises(ck.KafkaException) as e:
            _one(bob.create_acls([_binding("User:bob", "t", "WRITE")]))
        assert e.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
        # root becomes an admin by a binding written into the users file by hand, as an operator does
        data = json.load(open(users))
        data["acls"] = [{"resource_type": 4, "resource_name": "kafka-cluster", "resource_pattern_type": 3,
                         "principal": "User:root", "host": "*", "operation": 7, "permission_type": 3}]
        with open(users, "w") as f:
            json.dump(data, f)
        b.stop()
        b = BrokerProcess(str(tmp_path / "data"), "--users", users, "--max-failed-logins", "0")
        root = _admin(b, "root", "root-pw")
        for fut in root.create_acls([_binding("User:bob", "t", "WRITE"),
                                     _binding("User:cy", "t", "WRITE", permission="ALLOW", pattern="PREFIXED"),
                                     ]).values():
            fut.result(20)
        bob_conf = {**sasl, "sasl.username": "bob", "sasl.password": "bob-pw"}
        cy_conf = {**sasl, "sasl.username": "cy", "sasl.password": "cy-pw"}
        # DENY beats bob's write list; ALLOW gives cy (who has no rights listed) the topic
        assert _produce_error(b.bootstrap, "t", bob_conf) == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert _produce_error(b.bootstrap, "t", cy_conf) is None
        assert len(json.load(open(users))["acls"]) == 3
    finally:
        assert b.stop() == 0


def test_describe_configs_of_a_group(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    try:
        admin = _admin(b)
        (fut,) = admin.describe_configs([ConfigResource(ResourceType.GROUP, "no-such-group")]).values()
        got = {k: (e.value, e.is_read_only, e.source) for k, e in fut.result(20).items()}
        assert got == {"consumer.session.timeout.ms": ("45000", False, ck.admin.ConfigSource.DEFAULT_CONFIG.value),
                       "consumer.heartbeat.interval.ms": ("5000", False, ck.admin.ConfigSource.DEFAULT_CONFIG.value)}
    finally:
        assert b.stop() == 0


def test_alter_broker_configs_live(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    try:
        admin = _admin(b)

        def incremental(**cfg: str) -> object:
            res = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
                ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
                for k, v in cfg.items()])
            try:
                _one(admin.incremental_alter_configs([res]))
                return None
            except ck.KafkaException as e:
                return (e.args[0].code(), e.args[0].str())

        def broker_config(name: str) -> tuple[str, bool, int]:
            (fut,) = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
            e = fut.result(20)[name]
            return e.value, e.is_read_only, e.source

        # read-only, unknown, a bad value: refused naming the config, nothing changed
        code, msg = incremental(num_partitions="3")  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_REQUEST and "num.partitions" in msg
        code, msg = incremental(log_retention_ms="3600000", no_such_config="60000")  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "no.such.config" in msg
        code, msg = incremental(log_retention_ms="3600000", log_segment_bytes="12")  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "12" in msg
        assert broker_config("log.retention.ms")[0] == "-1"
        # a dynamic one: reported, and the default of the topics created afterwards
        assert incremental(log_retention_ms="3600000") is None
        assert broker_config("log.retention.ms") == ("3600000", False,
                                                    ck.admin.ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        _one(admin.create_topics([NewTopic("after", 1)]))
        (fut,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "after")]).values()
        assert fut.result(20)["retention.ms"].value == "3600000"
    finally:
        assert b.stop() == 0
    # durable: a restarted broker starts with the change
    b = BrokerProcess(str(tmp_path / "root"))
    try:
        admin = _admin(b)
        assert broker_config("log.retention.ms") == ("3600000", False,
                                                    ck.admin.ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        _one(admin.create_topics([NewTopic("later", 1)]))
        (fut,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "later")]).values()
        assert fut.result(20)["retention.ms"].value == "3600000"
    finally:
        assert b.stop() == 0
