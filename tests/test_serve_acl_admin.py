"""pylog serve: the security admin APIs through confluent-kafka's AdminClient:
Describe/AlterUserScramCredentials over the users file (who may, durability, new logins).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
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
        with open(os.path.join(root, "scram-users.json")) as f:
            dora = json.load(f)["users"]["dora"]
        assert dora["iterations"] == 10000 and dora["read"] == [] and "stored_key" in dora
        assert "eve" not in json.load(open(os.path.join(root, "scram-users.json")))["users"]
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
