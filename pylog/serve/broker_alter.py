"""AlterConfigs and IncrementalAlterConfigs of the broker resource (docs/serve.md, "Broker
configs").

What pylog can change live are the broker's defaults for new topics: the ``log.*`` keys,
``message.max.bytes``, ``compression.type`` and ``min.insync.replicas`` of
:data:`.brokerconfig.BROKER_KEYS` (Kafka's dynamic log configs). A change holds for topics
created afterwards (an existing topic keeps its configs: alter the topic); it is kept in
the data root's :data:`FILE` (written atomically and durably before the answer) and applied
again over the ``--config`` file and flags when the broker restarts, as Kafka keeps its
dynamic configs. Kafka's other dynamically updatable broker configs (:data:`NO_EFFECT`: the
listeners' SSL and SASL settings, the log cleaner's, thread counts, connection quotas,
metric reporters, replication throttles) have no effect here, one broker with no cleaner
threads or replicas of its own: they are accepted (their type checked), kept in the same
file and reported by DescribeConfigs, as issue 29 asks ("accept the setting and say what it
means here"). Kafka's password-typed ones stay refused, pylog keeping no secrets in that
file. ``log.cleanup.policy`` and the list configs of :data:`NO_EFFECT` take APPEND and
SUBTRACT too. Every other broker config is read-only here, as Kafka refuses what it cannot
update dynamically: INVALID_REQUEST naming the config; a name pylog does not know, or a bad
value, is INVALID_CONFIG. A request is checked whole first (nothing changes when one config
is refused); ``validate_only`` changes nothing.
"""
from __future__ import annotations

import json
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.errors import ConfigError
from pylog.serve import configs
from pylog.serve.brokerconfig import BROKER_KEYS

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["DYNAMIC", "FILE", "NO_EFFECT", "alter", "restore"]

#: The data root's file of the broker configs changed over the Admin API.
FILE = "broker-configs.json"

#: The broker configs that can change live: key -> (topic config, scale of its value).
DYNAMIC: dict[str, tuple[str, int]] = {
    k: (where[6:].partition("*")[0], int(where.partition("*")[2] or 1))
    for k, (_d, _t, _c, where) in BROKER_KEYS.items() if where.startswith("topic:")}
_B, _S, _I, _L, _D, _LIST, _C = 1, 2, 3, 5, 6, 7, 8  # DescribeConfigs' config types
#: Kafka 4.0's dynamically updatable broker configs that pylog accepts with no effect:
#: key -> (Kafka's default, config type). Each is refused by name when not a valid value of
#: its type; the ones Kafka types PASSWORD are left out (refused, as read-only).
NO_EFFECT: dict[str, tuple[str, int]] = {
    # thread counts
    "background.threads": ("10", _I), "num.io.threads": ("8", _I), "num.network.threads": ("3", _I),
    "num.replica.fetchers": ("1", _I), "num.recovery.threads.per.data.dir": ("2", _I),
    "remote.log.manager.copier.thread.pool.size": ("10", _I),
    # the log cleaner
    "log.cleaner.threads": ("1", _I), "log.cleaner.dedupe.buffer.size": ("134217728", _L),
    "log.cleaner.io.buffer.size": ("524288", _I), "log.cleaner.io.buffer.load.factor": ("0.9", _D),
    "log.cleaner.io.max.bytes.per.second": ("1.7976931348623157E308", _D),
    # connection quotas, throttles, metric reporters
    "max.connections.per.ip.overrides": ("", _S), "max.connection.creation.rate": ("2147483647", _I),
    "leader.replication.throttled.rate": ("9223372036854775807", _L),
    "follower.replication.throttled.rate": ("9223372036854775807", _L),
    "replica.alter.log.dirs.io.max.bytes.per.second": ("9223372036854775807", _L),
    "metric.reporters": ("", _LIST), "unclean.leader.election.enable": ("false", _B),
    "producer.id.expiration.ms": ("86400000", _I),
    # the listeners' SSL settings
    "ssl.keystore.type": ("JKS", _S), "ssl.keystore.location": ("", _S), "ssl.truststore.type": ("JKS", _S),
    "ssl.truststore.location": ("", _S), "ssl.protocol": ("TLSv1.3", _S),
    "ssl.enabled.protocols": ("TLSv1.2,TLSv1.3", _LIST), "ssl.cipher.suites": ("", _LIST),
    "ssl.keymanager.algorithm": ("SunX509", _S), "ssl.trustmanager.algorithm": ("PKIX", _S),
    "ssl.endpoint.identification.algorithm": ("https", _S), "ssl.secure.random.implementation": ("", _S),
    "ssl.client.auth": ("none", _S), "ssl.engine.factory.class": ("", _C),
    "ssl.keystore.certificate.chain": ("", _S), "ssl.truststore.certificates": ("", _S),
    # the listeners' SASL settings
    "sasl.kerberos.service.name": ("", _S), "sasl.kerberos.kinit.cmd": ("/usr/bin/kinit", _S),
    "sasl.kerberos.ticket.renew.window.factor": ("0.8", _D), "sasl.kerberos.ticket.renew.jitter": ("0.05", _D),
    "sasl.kerberos.min.time.before.relogin": ("60000", _L),
    "sasl.kerberos.principal.to.local.rules": ("DEFAULT", _LIST),
    "sasl.login.refresh.window.factor": ("0.8", _D), "sasl.login.refresh.window.jitter": ("0.05", _D),
    "sasl.login.refresh.min.period.seconds": ("60", 4), "sasl.login.refresh.buffer.seconds": ("300", 4),
}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 2, 3
_static: weakref.WeakKeyDictionary[Any, tuple[dict[str, str], dict[str, tuple[str, int, int]]]] = \
    weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _topic_value(key: str, value: str) -> tuple[str, str]:
    name, scale = DYNAMIC[key]
    v = BROKER_KEYS[key][2](value)
    tv = str(v * scale if scale > 1 and isinstance(v, int) and v >= 0 else v)
    return name, configs.check(name, tv)


def _listed(current: str, given: str, op: int) -> str:
    """A list config's value after APPEND or SUBTRACT (``op``) of ``given`` to ``current``."""
    items = [x.strip() for x in current.split(",") if x.strip()]
    extra = [x.strip() for x in given.split(",") if x.strip()]
    return ",".join([*items, *(x for x in extra if x not in items)] if op == APPEND
                    else [x for x in items if x not in extra])


def _check(name: str, value: str) -> str:
    """``value`` if it is one of :data:`NO_EFFECT` config ``name``'s type, else ConfigError."""
    kind = NO_EFFECT[name][1]
    try:
        if kind in (3, 4, 5):
            v = int(value)
            bits = {3: 31, 4: 15, 5: 63}[kind]
            if not -(1 << bits) <= v < 1 << bits:
                raise ValueError
        elif kind == _D:
            float(value)
        elif kind == _B and value.lower() not in ("true", "false"):
            raise ValueError
    except ValueError:
        kinds = {_B: "a boolean", 3: "an int", 4: "a short", 5: "a long", _D: "a double"}
        raise ConfigError(f"{name}: {value!r} is not {kinds[kind]}") from None
    return value.lower() if kind == _B else value


def _no_effect(name: str, op: int, value: str, shown: dict[str, tuple[str, int, int]],
               static: dict[str, tuple[str, int, int]], source: int) -> None:
    """Apply ``op`` of :data:`NO_EFFECT` config ``name`` to ``shown`` (ConfigError as
    :func:`_check`)."""
    kind = NO_EFFECT[name][1]
    if op in (APPEND, SUBTRACT) and kind == _LIST:
        value, op = _listed(shown[name][0] if name in shown else NO_EFFECT[name][0], value, op), SET
    if op == SET:
        shown[name] = (_check(name, value), source, kind)
    elif op == DELETE:
        if name in static:
            shown[name] = static[name]
        else:
            shown.pop(name, None)
    else:
        raise ConfigError(f"{name}: config operation {op} applies to list configs only")


def alter(broker: Broker, res: Any, incremental: bool, validate_only: bool) -> tuple[int, str | None]:
    """(error code, message) of altering the broker resource ``res`` (see the module docstring)."""
    if res.resource_name not in ("", "0"):
        return E.invalid_request, f"broker {res.resource_name!r}: this cluster is broker 0 alone"
    with _lock:
        statics = _static.setdefault(broker, (dict(broker.topic_defaults), dict(broker.broker_configs)))
        defaults = dict(broker.topic_defaults) if incremental else dict(statics[0])
        shown = dict(broker.broker_configs) if incremental else dict(statics[1])
        source = DYNAMIC_BROKER_CONFIG if res.resource_name else DYNAMIC_DEFAULT_BROKER_CONFIG
        try:
            for c in res.configs:
                op = getattr(c, "config_operation", SET)
                if c.name in NO_EFFECT:
                    _no_effect(c.name, op, c.value or "", shown, statics[1], source)
                    continue
                if c.name not in BROKER_KEYS:
                    raise ConfigError(f"{c.name}: not a broker config pylog has")
                if c.name not in DYNAMIC:
                    return E.invalid_request, f"{c.name}: read-only here (the --config file and flags set it)"
                name, _scale = DYNAMIC[c.name]
                given = c.value or ""
                if op in (APPEND, SUBTRACT) and BROKER_KEYS[c.name][1] == _LIST:
                    given, op = _listed(shown[c.name][0] if c.name in shown else "", given, op), SET
                if op == SET:
                    name, value = _topic_value(c.name, given)
                    defaults[name] = value
                    shown[c.name] = (given, source, BROKER_KEYS[c.name][1])
                elif op == DELETE:  # back to the static value
                    if name in statics[0]:
                        defaults[name] = statics[0][name]
                    else:
                        defaults.pop(name, None)
                    if c.name in statics[1]:
                        shown[c.name] = statics[1][c.name]
                else:
                    raise ConfigError(f"{c.name}: config operation {op} applies to list configs only")
            configs.to_log_config({k: v for k, v in defaults.items() if k in configs.LOG_CONFIGS})
        except ConfigError as e:
            return E.invalid_config, str(e)
        if not validate_only:
            dynamic = {k: [v[0], v[1]] for k, v in shown.items()
                       if v[1] in (DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG)}
            fileutil.atomic_write(os.path.join(broker.store.root, FILE), json.dumps(dynamic).encode())
            broker.topic_defaults.clear()
            broker.topic_defaults.update(defaults)  # (the dict the Server and the Settings share)
            broker.broker_configs.clear()
            broker.broker_configs.update(shown)
    return 0, None


class _Entry:
    def __init__(self, name: str, value: str) -> None:
        self.name, self.value, self.config_operation = name, value, SET


class _Resource:
    def __init__(self, name: str, entries: list[_Entry]) -> None:
        self.resource_name, self.configs = name, entries


def restore(broker: Broker) -> None:
    """Apply the configs :data:`FILE` keeps (a broker starting); ConfigError naming the
    file if one no longer applies."""
    path = os.path.join(broker.store.root, FILE)
    try:
        with open(path) as f:
            kept: dict[str, list[Any]] = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    for source, name in ((DYNAMIC_DEFAULT_BROKER_CONFIG, ""), (DYNAMIC_BROKER_CONFIG, "0")):
        entries = [_Entry(k, str(v)) for k, (v, src) in kept.items() if src == source]
        if entries:
            code, msg = alter(broker, _Resource(name, entries), True, False)
            if code:
                raise ConfigError(f"{path}: {msg}")
