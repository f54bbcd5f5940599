"""``pylog serve --config FILE``: a broker's configs in Kafka's ``server.properties`` form
(docs/serve.md, "Broker configs").

Each line is ``key=value`` (or ``key: value``); blank lines and ``#``/``!`` comments are
skipped. A known key with a bad value, or a line that is not a key and a value, is a
:class:`BrokerConfigError` naming the file, line and value (``pylog serve`` exits 2); an
unknown key is ignored, as Kafka ignores it, with one warning naming them all.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pylog.errors import ConfigError
from pylog.serve import configs

__all__ = ["BrokerConfigError", "Loaded", "load", "parse", "BROKER_KEYS", "describe"]


class BrokerConfigError(ValueError):
    """A malformed line or a bad value in a broker config file."""


def _int(lo: int, hi: int = (1 << 63) - 1) -> Callable[[str], int]:
    def conv(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise ConfigError(f"{v!r} is not an integer") from None
        if not lo <= n <= hi:
            raise ConfigError(f"{n} is out of range [{lo}, {hi}]")
        return n
    return conv


def _bool(v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise ConfigError(f"{v!r} is not true or false")
    return v.lower() == "true"


def _one(v: str) -> int:
    if v.strip() != "1":
        raise ConfigError(f"{v!r}: this broker is the only replica of every partition (use 1)")
    return 1


def _node(v: str) -> int:
    if v.strip() != "0":
        raise ConfigError(f"{v!r}: this broker is node 0")
    return 0


def _listener(v: str) -> tuple[str, int]:
    items = [x.strip() for x in v.split(",") if x.strip()]
    if len(items) != 1:
        raise ConfigError(f"{v!r}: pylog serve has one listener")
    proto, sep, rest = items[0].partition("://")
    host, _, port = rest.rpartition(":")
    if not sep or proto.upper() not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL") or not port.isdigit() \
            or int(port) > 65535:
        raise ConfigError(f"{v!r} is not PROTOCOL://HOST:PORT (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)")
    return host or "127.0.0.1", int(port)


#: key -> (default shown, config type, converter, where it goes: "server:<kwarg>" or
#: "topic:<topic config>", with an optional scale for durations in seconds)
BROKER_KEYS: dict[str, tuple[str, int, Callable[[str], Any], str]] = {
    "num.partitions": ("1", 3, _int(1, 1 << 16), "server:num_partitions"),
    "auto.create.topics.enable": ("true", 1, _bool, "server:auto_create"),
    "default.replication.factor": ("1", 4, _one, ""),
    "node.id": ("0", 3, _node, ""),
    "broker.id": ("0", 3, _node, ""),
    "listeners": ("PLAINTEXT://127.0.0.1:9092", 7, _listener, "server:listener"),
    "advertised.listeners": ("", 7, _listener, "server:advertised"),
    "message.max.bytes": (str(10 << 20), 3, _int(0), "topic:max.message.bytes"),
    "fetch.max.bytes": (str(55 << 20), 3, _int(1), "server:fetch_max_bytes"),
    "socket.request.max.bytes": (str(100 << 20), 3, _int(1), "server:max_request_bytes"),
    "queued.max.request.bytes": (str(100 << 20), 5, _int(1), "server:queued_max_request_bytes"),
    "max.connections": ("1000", 3, _int(1), "server:max_connections"),
    "max.connections.per.ip": ("1000", 3, _int(1), "server:max_connections_per_ip"),
    "connections.max.idle.ms": ("600000", 5, _int(1), "server:idle_timeout/1000"),
    "connection.failed.authentication.delay.ms": ("100", 3, _int(0, 60000), "server:failed_auth_delay_ms"),
    "log.retention.check.interval.ms": ("300000", 5, _int(1), "server:cleanup_interval/1000"),
    "log.cleaner.backoff.ms": ("15000", 5, _int(1), "server:cleaner_backoff/1000"),
    "transactional.id.expiration.ms": ("604800000", 3, _int(1), "server:transactional_id_expiration/1000"),
    "max.incremental.fetch.session.cache.slots": ("1000", 3, _int(0), "server:fetch_session_slots"),
    "log.retention.ms": ("-1", 5, _int(-1), "topic:retention.ms"),
    "log.retention.minutes": ("", 3, _int(-1), "topic:retention.ms*60000"),
    "log.retention.hours": ("", 3, _int(-1), "topic:retention.ms*3600000"),
    "log.retention.bytes": ("-1", 5, _int(-1), "topic:retention.bytes"),
    "log.segment.bytes": (str(1 << 30), 3, _int(4096), "topic:segment.bytes"),
    "log.roll.ms": ("-1", 5, _int(-1), "topic:segment.ms"),
    "log.roll.hours": ("", 3, _int(1), "topic:segment.ms*3600000"),
    "log.cleanup.policy": ("delete", 7, str, "topic:cleanup.policy"),
    "log.cleaner.min.cleanable.ratio": ("0.5", 6, str, "topic:min.cleanable.dirty.ratio"),
    "log.cleaner.min.compaction.lag.ms": ("0", 5, str, "topic:min.compaction.lag.ms"),
    "log.cleaner.max.compaction.lag.ms": (str((1 << 63) - 1), 5, str, "topic:max.compaction.lag.ms"),
    "log.cleaner.delete.retention.ms": ("86400000", 5, str, "topic:delete.retention.ms"),
    "log.flush.interval.messages": (str((1 << 63) - 1), 5, str, "topic:flush.messages"),
    "log.flush.interval.ms": ("1000", 5, str, "topic:flush.ms"),
    "log.index.size.max.bytes": (str(10 << 20), 3, str, "topic:segment.index.bytes"),
    "log.index.interval.bytes": ("4096", 3, str, "topic:index.interval.bytes"),
    "log.preallocate": ("false", 1, str, "topic:preallocate"),
    "log.message.timestamp.type": ("CreateTime", 2, str, "topic:message.timestamp.type"),
    "compression.type": ("producer", 2, str, "topic:compression.type"),
    "min.insync.replicas": ("1", 3, str, "topic:min.insync.replicas"),
}


@dataclass
class Loaded:
    """What a broker config file says: ``server`` (keyword arguments of the CLI / Server,
    plus ``listener`` and ``advertised`` as (host, port)), ``topic_defaults`` (Kafka topic
    configs of new topics), ``given`` (key -> value as written) and ``unknown`` keys."""

    server: dict[str, Any] = field(default_factory=dict)
    topic_defaults: dict[str, str] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)


def parse(text: str, source: str = "config") -> list[tuple[int, str, str]]:
    """``(line number, key, value)`` of each setting of a server.properties text."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s[0] in "#!":
            continue
        cut = min((i for i in (s.find("="), s.find(":")) if i >= 0), default=-1)
        key = s[:cut].strip() if cut > 0 else ""
        if not key or any(c.isspace() for c in key):
            raise BrokerConfigError(f"{source}:{n}: {line.strip()!r} is not KEY=VALUE")
        out.append((n, key, s[cut + 1 :].strip()))
    return out


def load(path: str) -> Loaded:
    """The settings of the file at ``path``; BrokerConfigError (file, line, value) or OSError."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    got = Loaded()
    retention: dict[str, tuple[int, str]] = {}  # ms beats minutes beats hours, as in Kafka
    for n, key, value in parse(text, path):
        spec = BROKER_KEYS.get(key)
        if spec is None:
            got.unknown.append(key)
            continue
        _, _, conv, where = spec
        try:
            v = conv(value)
            if where.startswith("topic:"):
                name, _, scale = where[6:].partition("*")
                tv = str(v * int(scale) if scale and v >= 0 else v)
                tv = configs.check(name, tv)
                rank = {"": 0, "60000": 1, "3600000": 2}[scale]
                if name not in retention or rank <= retention[name][0]:
                    retention[name] = (rank, tv)
                    got.topic_defaults[name] = tv
            elif where.startswith("server:"):
                kw, _, div = where[7:].partition("/")
                got.server[kw] = v / int(div) if div else v
        except ConfigError as e:
            raise BrokerConfigError(f"{path}:{n}: {key}={value!r}: {e}") from None
        got.given[key] = value
    try:
        configs.to_log_config({k: v for k, v in got.topic_defaults.items() if k in configs.LOG_CONFIGS})
    except ConfigError as e:
        raise BrokerConfigError(f"{path}: {e}") from None
    return got


def describe(given: dict[str, str], effective: dict[str, str]) -> dict[str, tuple[str, int, int]]:
    """What DescribeConfigs of the broker reports: key -> (value, source, type); ``given``
    (the file's and flags' values) are STATIC_BROKER_CONFIG (4), the rest DEFAULT_CONFIG
    (5) with ``effective`` values where the broker knows them."""
    out = {}
    for key, (default, kind, _, _) in BROKER_KEYS.items():
        if key in given:
            out[key] = (given[key], 4, kind)
        else:
            out[key] = (effective.get(key, default), 5, kind)
    return out
