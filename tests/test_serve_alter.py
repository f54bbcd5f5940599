"""pylog serve: AlterConfigs and IncrementalAlterConfigs of the configs pylog accepts with no
effect, through confluent-kafka's AdminClient: Kafka's dynamic broker configs of
:data:`pylog.serve.broker_alter.NO_EFFECT` (librdkafka 0081 sets
``sasl.kerberos.min.time.before.relogin`` and ``background.threads``) and the KIP-848 configs
of a group (:mod:`pylog.serve.group_configs`): accepted, checked, durable, reported.
"""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from serve_util import BrokerProcess  # noqa: E402

SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
APPEND, SUBTRACT = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT


def _admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap, "socket.timeout.ms": 5000})


def _incremental(admin: AdminClient, kind: ResourceType, name: str, *ops: tuple[str, str, object]) -> object:
    """None (done) or (error code, message) of one IncrementalAlterConfigs of ``ops``
    (name, value, operation)."""
    res = ConfigResource(kind, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])
    try:
        (fut,) = admin.incremental_alter_configs([res]).values()
        fut.result(20)
        return None
    except ck.KafkaException as e:
        return (e.args[0].code(), e.args[0].str())


def _described(admin: AdminClient, kind: ResourceType, name: str) -> dict[str, tuple[str, bool, int]]:
    (fut,) = admin.describe_configs([ConfigResource(kind, name)]).values()
    return {k: (e.value, e.is_read_only, e.source) for k, e in fut.result(20).items()}


DYN = ConfigSource.DYNAMIC_BROKER_CONFIG.value
DEFAULT = ConfigSource.DEFAULT_CONFIG.value
BROKER = ResourceType.BROKER


def test_no_effect_broker_configs_accepted_reported_durable(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root)
    try:
        admin = _admin(b)
        got = _described(admin, BROKER, "0")
        assert got["sasl.kerberos.min.time.before.relogin"] == ("60000", False, DEFAULT)
        assert got["background.threads"] == ("10", False, DEFAULT)
        # bad values of their type, a password config, a read-only one: refused by name, nothing changed
        code, msg = _incremental(admin, BROKER, "0", ("background.threads", "nine", SET))  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "background.threads" in msg and "nine" in msg
        code, msg = _incremental(admin, BROKER, "0", ("sasl.kerberos.min.time.before.relogin", "58000", SET),
                                 ("ssl.keystore.password", "secret", SET))  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "ssl.keystore.password" in msg
        code, msg = _incremental(admin, BROKER, "0", ("num.partitions", "3", SET))  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_REQUEST and "num.partitions" in msg
        assert _described(admin, BROKER, "0")["sasl.kerberos.min.time.before.relogin"] == ("60000", False, DEFAULT)
        # librdkafka 0081's requests
        assert _incremental(admin, BROKER, "0", ("sasl.kerberos.min.time.before.relogin", "58000", SET)) is None
        assert _incremental(admin, BROKER, "0", ("background.threads", "9", SET),
                            ("log.cleanup.policy", "compact", APPEND)) is None
        got = _described(admin, BROKER, "0")
        assert got["sasl.kerberos.min.time.before.relogin"] == ("58000", False, DYN)
        assert got["background.threads"] == ("9", False, DYN)
        assert got["log.cleanup.policy"] == ("delete,compact", False, DYN)
        assert _incremental(admin, BROKER, "0", ("background.threads", "", DELETE),
                            ("log.cleanup.policy", "compact", SUBTRACT)) is None
        got = _described(admin, BROKER, "0")
        assert got["background.threads"] == ("10", False, DEFAULT)
        assert got["log.cleanup.policy"][0] == "delete"
        assert got["sasl.kerberos.min.time.before.relogin"] == ("58000", False, DYN)
        # AlterConfigs (replace semantics) takes them too
        (fut,) = admin.alter_configs([ConfigResource(BROKER, "0", set_config={
            "sasl.kerberos.min.time.before.relogin": "57000", "num.io.threads": "4"})]).values()
        fut.result(20)
    finally:
        assert b.stop() == 0
    with open(os.path.join(root, "broker-configs.json")) as f:
        kept = json.load(f)
    assert kept["sasl.kerberos.min.time.before.relogin"][0] == "57000" and kept["num.io.threads"][0] == "4"
    b = BrokerProcess(root)  # durable: a restarted broker reports them
    try:
        got = _described(_admin(b), BROKER, "0")
        assert got["sasl.kerberos.min.time.before.relogin"] == ("57000", False, DYN)
        assert got["num.io.threads"] == ("4", False, DYN)
    finally:
        assert b.stop() == 0


def test_group_configs_accepted_reported_durable(tmp_path):
    root = str(tmp_path / "root")
    group = ResourceType.GROUP
    b = BrokerProcess(root)
    try:
        admin = _admin(b)
        # out of Kafka's bounds, not an int, not a group config: refused by name
        code, msg = _incremental(admin, group, "my-group", ("consumer.session.timeout.ms", "1000", SET))  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "consumer.session.timeout.ms" in msg and "1000" in msg
        code, msg = _incremental(admin, group, "my-group", ("consumer.heartbeat.interval.ms", "x", SET))  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "'x'" in msg
        code, msg = _incremental(admin, group, "my-group", ("session.timeout.ms", "50000", SET))  # type: ignore[misc]
        assert code == ck.KafkaError.INVALID_CONFIG and "session.timeout.ms" in msg
        assert _incremental(admin, group, "my-group", ("consumer.session.timeout.ms", "50000", SET)) is None
        assert _incremental(admin, group, "a/b", ("consumer.heartbeat.interval.ms", "6000", SET)) is None
        assert _described(admin, group, "my-group") == {
            "consumer.session.timeout.ms": ("50000", False, ConfigSource.GROUP_CONFIG.value),
            "consumer.heartbeat.interval.ms": ("5000", False, DEFAULT)}
        assert _described(admin, group, "other")["consumer.session.timeout.ms"] == ("45000", False, DEFAULT)
    finally:
        assert b.stop() == 0
    groups = os.path.join(root, ".serve.groups")
    assert sorted(os.listdir(groups)) == ["a%2Fb.configs", "my-group.configs"]
    b = BrokerProcess(root)  # durable; DELETE returns to the default and removes the file
    try:
        admin = _admin(b)
        assert _described(admin, group, "my-group")["consumer.session.timeout.ms"] == \
            ("50000", False, ConfigSource.GROUP_CONFIG.value)
        assert _described(admin, group, "a/b")["consumer.heartbeat.interval.ms"] == \
            ("6000", False, ConfigSource.GROUP_CONFIG.value)
        assert _incremental(admin, group, "my-group", ("consumer.session.timeout.ms", "", DELETE)) is None
        assert _described(admin, group, "my-group")["consumer.session.timeout.ms"] == ("45000", False, DEFAULT)
    finally:
        assert b.stop() == 0
    assert os.listdir(groups) == ["a%2Fb.configs"]
