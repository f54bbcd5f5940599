"""Kafka topic configs: every name of Kafka 4.0's topic configs, checked as Kafka checks it
(docs/serve.md, "Topic configs").

Kafka sends every config value as a string. A name pylog has a :class:`~pylog.LogConfig`
field for (:data:`LOG_CONFIGS`) is mapped to it and lives in the topic's ``topic.json``;
every other Kafka topic config (:data:`STORED`) is checked, normalised and kept in the
topic's :data:`KAFKA_FILE`, which also names the configs set explicitly (their source is
DYNAMIC_TOPIC_CONFIG; the others are defaults). Of the stored ones the broker honours the
compaction lags and dirty ratio (:mod:`.cleaner`) and ``compression.type`` (the codec
Fetch answers are encoded with); the rest are stored and reported. A name Kafka does not
know, or a value that does not parse or that LogConfig refuses, is a ConfigError naming
it (Kafka's INVALID_CONFIG).
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pylog import fileutil
from pylog.config import LogConfig
from pylog.errors import ConfigError
from pylog.serve import timestamps

__all__ = ["LOG_CONFIGS", "STORED", "TYPES", "KAFKA_FILE", "check", "log_changes", "to_log_config",
           "from_log_config", "defaults", "Settings"]

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
#: pylog's LogConfig holds times and counts up to this; a Kafka value at or over it means "none"
_NONE_FROM = 1 << 62


def _int(v: str, lo: int = -LONG_MAX - 1, hi: int = LONG_MAX) -> int:
    try:
        n = int(v.strip())
    except (TypeError, ValueError, AttributeError):
        raise ConfigError(f"{v!r} is not an integer") from None
    if not lo <= n <= hi:
        raise ConfigError(f"{n} is out of range [{lo}, {hi}]")
    return n


def _none_below_zero(v: str) -> int | None:
    n = _int(v)
    return None if n < 0 or n >= _NONE_FROM else n


def _bool(v: str) -> bool:
    s = v.strip().lower() if isinstance(v, str) else v
    if s not in ("true", "false"):
        raise ConfigError(f"{v!r} is not true or false")
    return s == "true"


def _flush_messages(v: str) -> dict[str, Any]:
    n = _int(v, 1)
    if n == 1:  # every record is durable before it is acknowledged: group-committed fsync
        return {"fsync": "always", "flush_messages": None}
    return {"fsync": "interval", "flush_messages": None if n >= _NONE_FROM else n}


def _none_at_max(v: str) -> int | None:
    n = _int(v)
    if n < 0:
        raise ConfigError(f"{v!r} must be >= 0")
    return None if n >= 1 << 62 else n  # Kafka's Long.MAX_VALUE: no bound


def _cleanup(v: str) -> str:
    parts = sorted({p.strip() for p in v.split(",") if p.strip()})
    if parts not in (["delete"], ["compact"], ["compact", "delete"]):
        raise ConfigError(f"cleanup.policy={v!r}: pylog has 'delete', 'compact' or both (not none)")
    return ",".join(parts)


#: Kafka topic config name -> function from its string value to LogConfig changes.
LOG_CONFIGS: dict[str, Callable[[str], dict[str, Any]]] = {
    "segment.bytes": lambda v: {"segment_bytes": _int(v)},
    "segment.ms": lambda v: {"segment_ms": _none_below_zero(v)},
    "retention.ms": lambda v: {"retention_ms": _none_below_zero(v)},
    "retention.bytes": lambda v: {"retention_bytes": _none_below_zero(v)},
    "cleanup.policy": lambda v: {"cleanup_policy": _cleanup(v)},
    "flush.messages": _flush_messages,
    "flush.ms": lambda v: {"flush_ms": _none_below_zero(v)},
    "max.message.bytes": lambda v: {"max_record_bytes": _int(v)},
    "delete.retention.ms": lambda v: {"delete_retention_ms": _int(v, 0)},
    "segment.index.bytes": lambda v: {"index_max_bytes": _int(v)},
    "index.interval.bytes": lambda v: {"index_interval_bytes": _int(v)},
    "preallocate": lambda v: {"preallocate": _bool(v)},
    "message.timestamp.type": lambda v: {"timestamps": timestamps.to_mode(v)},
    "message.timestamp.before.max.ms": lambda v: {"timestamp_before_max_ms": _none_at_max(v)},
    "message.timestamp.after.max.ms": lambda v: {"timestamp_after_max_ms": _none_at_max(v)},
}


def _long(lo: int = 0, hi: int = LONG_MAX) -> Callable[[str], str]:
    return lambda v: str(_int(v, lo, hi))


def _one_of(*options: str, fold: bool = False) -> Callable[[str], str]:
    def check(v: str) -> str:
        s = v.strip()
        for o in options:
            if s == o or (fold and s.lower() == o.lower()):
                return o
        raise ConfigError(f"{v!r} is not one of {', '.join(options)}")
    return check


def _boolean(v: str) -> str:
    return "true" if _bool(v) else "false"


def _false_only(why: str) -> Callable[[str], str]:
    def check(v: str) -> str:
        if _bool(v):
            raise ConfigError(f"{v!r}: {why}")
        return "false"
    return check


def _ratio(v: str) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{v!r} is not a number") from None
    if not 0.0 <= x <= 1.0:
        raise ConfigError(f"{x} is out of range [0, 1]")
    return v.strip()


def _gzip_level(v: str) -> str:
    n = _int(v)
    if n != -1 and not 1 <= n <= 9:
        raise ConfigError(f"{n} is not -1 or in [1, 9]")
    return str(n)


def _replicas(v: str) -> str:
    """A throttled replicas list: empty, ``*``, or ``partition:broker`` pairs."""
    s = ",".join(p.strip() for p in v.split(",") if p.strip())
    if s in ("", "*"):
        return s
    for p in s.split(","):
        a, _, b = p.partition(":")
        if not (a.isdigit() and b.isdigit()):
            raise ConfigError(f"{p!r} is not PARTITION:BROKER (nor is the list '*')")
    return s


_TIERED = "tiered storage is not available on this broker (one data root, no remote tier)"

#: Every other Kafka topic config: name -> (Kafka's default, check returning the value stored).
STORED: dict[str, tuple[str, Callable[[str], str]]] = {
    "compression.type": ("producer", _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    "compression.gzip.level": ("-1", _gzip_level),
    "compression.lz4.level": ("9", _long(1, 17)),
    "compression.zstd.level": ("3", _long(-131072, 22)),
    "min.compaction.lag.ms": ("0", _long()),
    "max.compaction.lag.ms": (str(LONG_MAX), _long(1)),
    "min.cleanable.dirty.ratio": ("0.5", _ratio),
    "min.insync.replicas": ("1", _long(1, INT_MAX)),
    "unclean.leader.election.enable": ("false", _boolean),
    "file.delete.delay.ms": ("60000", _long()),
    "segment.jitter.ms": ("0", _long()),
    "message.timestamp.difference.max.ms": (str(LONG_MAX), _long()),
    "message.downconversion.enable": ("true", _boolean),
    "leader.replication.throttled.replicas": ("", _replicas),
    "follower.replication.throttled.replicas": ("", _replicas),
    "remote.storage.enable": ("false", _false_only(_TIERED)),
    "local.retention.ms": ("-2", _long(-2)),
    "local.retention.bytes": ("-2", _long(-2)),
    "remote.log.copy.disable": ("false", _boolean),
    "remote.log.delete.on.disable": ("false", _boolean),
}

#: DescribeConfigs' config_type of each name (Kafka's ConfigType: 1 BOOLEAN, 2 STRING,
#: 3 INT, 5 LONG, 6 DOUBLE, 7 LIST).
TYPES: dict[str, int] = {
    **{n: 5 for n in (*LOG_CONFIGS, *STORED)},
    "segment.bytes": 3, "max.message.bytes": 3, "segment.index.bytes": 3, "index.interval.bytes": 3,
    "compression.gzip.level": 3, "compression.lz4.level": 3, "compression.zstd.level": 3,
    "min.insync.replicas": 3, "cleanup.policy": 7, "compression.type": 2, "message.timestamp.type": 2,
    "min.cleanable.dirty.ratio": 6, "leader.replication.throttled.replicas": 7,
    "follower.replication.throttled.replicas": 7,
    **{n: 1 for n in ("preallocate", "unclean.leader.election.enable", "message.downconversion.enable",
                      "remote.storage.enable", "remote.log.copy.disable", "remote.log.delete.on.disable")},
}

#: The list-typed names (IncrementalAlterConfigs' APPEND and SUBTRACT apply to them).
LISTS = frozenset(n for n, t in TYPES.items() if t == 7)


def check(name: str, value: str | None) -> str:
    """``value`` of topic config ``name`` as stored (normalised); ConfigError naming both if
    Kafka has no such topic config or the value is not one of it."""
    if name not in LOG_CONFIGS and name not in STORED:
        raise ConfigError(f"unknown topic config {name!r}")
    if value is None:
        raise ConfigError(f"topic config {name!r} has no value")
    try:
        if name in STORED:
            return STORED[name][1](value)
        LOG_CONFIGS[name](value)
    except ConfigError as e:
        raise ConfigError(f"{name}={value!r}: {e}") from None
    return value.strip()


def log_changes(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """The LogConfig field changes that ``configs`` (Kafka names -> values) make; the names
    pylog stores instead (:data:`STORED`) are checked and make none. ConfigError as
    :func:`check`."""
    changes: dict[str, Any] = {}
    for name, value in configs.items():
        check(name, value)
        if name in LOG_CONFIGS:
            assert value is not None
            changes.update(LOG_CONFIGS[name](value))
    return changes


def to_log_config(configs: Mapping[str, str | None], base: LogConfig | None = None) -> LogConfig:
    """The LogConfig that ``configs`` (Kafka names -> string values) make of ``base``.

    Raises
    ------
    ConfigError
        An unknown name, or a value that does not parse or that LogConfig refuses; the
        message names it.
    """
    changes = log_changes(configs)
    try:
        # a topic the broker creates keeps producers' timestamps (Kafka's CreateTime)
        return (base or LogConfig(**timestamps.BROKER_DEFAULTS)).replace(**changes)
    except ConfigError as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in configs.items() if k in LOG_CONFIGS)
        raise ConfigError(f"{shown}: {e}") from None


def from_log_config(cfg: LogConfig) -> dict[str, str]:
    """Kafka names -> string values describing ``cfg`` (the :data:`LOG_CONFIGS` names)."""
    def opt(v: int | None) -> str:
        return "-1" if v is None else str(v)

    def opt_max(v: int | None) -> str:
        return str((1 << 63) - 1) if v is None else str(v)

    if cfg.fsync == "always":
        flush_messages = "1"
    elif cfg.fsync == "interval" and cfg.flush_messages is not None:
        flush_messages = str(cfg.flush_messages)
    else:
        flush_messages = str(LONG_MAX)  # Kafka's "never by count"
    return {
        "segment.bytes": str(cfg.segment_bytes),
        "segment.ms": opt(cfg.segment_ms),
        "retention.ms": opt(cfg.retention_ms),
        "retention.bytes": opt(cfg.retention_bytes),
        "cleanup.policy": cfg.cleanup_policy,
        "flush.messages": flush_messages,
        "flush.ms": opt(cfg.flush_ms) if cfg.fsync == "interval" else str(LONG_MAX),
        "max.message.bytes": str(cfg.max_record_bytes),
        "delete.retention.ms": str(cfg.delete_retention_ms),
        "segment.index.bytes": str(cfg.index_max_bytes),
        "index.interval.bytes": str(cfg.index_interval_bytes),
        "preallocate": "true" if cfg.preallocate else "false",
        "message.timestamp.type": timestamps.to_kafka(cfg.timestamps),
        "message.timestamp.before.max.ms": opt_max(cfg.timestamp_before_max_ms),
        "message.timestamp.after.max.ms": opt_max(cfg.timestamp_after_max_ms),
    }


def defaults() -> dict[str, str]:
    """Every topic config's default value: those of a topic the broker creates (pylog's
    LogConfig defaults, Kafka 4.0's for timestamps), Kafka's for the rest."""
    return {**from_log_config(LogConfig(**timestamps.BROKER_DEFAULTS)), **{n: d for n, (d, _) in STORED.items()}}


#: compression.type -> Kafka's codec id in a batch's attributes
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

#: The file in a topic's directory holding its explicitly set Kafka configs.
KAFKA_FILE = "kafka.json"


class Settings:
    """The explicitly set Kafka configs of each topic (``{name: value}``, read from its
    :data:`KAFKA_FILE`, cached). Thread-safe; :meth:`forget` a deleted topic."""

    def __init__(self, root: str) -> None:
        self.root = root
        #: the broker's topic defaults (its ``--config`` file): Kafka name -> value
        self.defaults: dict[str, str] = {}
        self._cache: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def explicit(self, topic: str) -> dict[str, str]:
        """The configs set on ``topic`` (a copy); {} for a topic without the file."""
        got = self._cache.get(topic)
        if got is None:
            try:
                with open(os.path.join(self.root, topic, KAFKA_FILE), "rb") as f:
                    data = json.loads(f.read())
                got = {str(k): str(v) for k, v in data.get("set", {}).items()}
            except FileNotFoundError:
                got = {}
            except (OSError, ValueError, AttributeError):  # unreadable: the defaults (logged by no one)
                got = {}
            with self._lock:
                self._cache[topic] = got
        return dict(got)

    def value(self, topic: str, name: str) -> str:
        """The value of stored config ``name`` (a :data:`STORED` name) on ``topic``: set on
        the topic, else the broker's default, else Kafka's."""
        got = self.explicit(topic).get(name)
        return got if got is not None else self.defaults.get(name, STORED[name][0])

    def codec(self, topic: str) -> tuple[int, int | None]:
        """(Kafka codec id, level or None) Fetch answers of ``topic`` are encoded with: its
        ``compression.type`` (``producer`` and ``uncompressed``: 0, none; pylog keeps the
        records decompressed, so "as produced" is uncompressed)."""
        kind = self.value(topic, "compression.type")
        codec = CODECS.get(kind, 0)
        if not codec or kind == "snappy":  # snappy has no level
            return codec, None
        return codec, int(self.value(topic, f"compression.{kind}.level"))

    @staticmethod
    def files(explicit: Mapping[str, str]) -> dict[str, bytes]:
        """The file a new topic with ``explicit`` configs is created with (file name ->
        bytes, for ``LogStore.create_topic(files=...)``): the topic and its configs appear
        in one step, never one without the other."""
        return {KAFKA_FILE: json.dumps({"version": 1, "set": dict(sorted(explicit.items()))}, indent=1).encode()}

    def save(self, topic: str, explicit: Mapping[str, str]) -> None:
        """Write an existing ``topic``'s explicitly set configs (atomically, durably)."""
        with self._lock:
            fileutil.atomic_write(os.path.join(self.root, topic, KAFKA_FILE), self.files(explicit)[KAFKA_FILE])
            self._cache[topic] = dict(explicit)

    def forget(self, topic: str) -> None:
        """Drop the cached configs of ``topic`` (deleted, or created again)."""
        with self._lock:
            self._cache.pop(topic, None)
