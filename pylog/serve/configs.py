"""Kafka topic config names <-> pylog's LogConfig fields (docs/serve.md, "Config mapping").

Kafka sends every config value as a string. A name not in :data:`TOPIC_CONFIGS`, or a value
that does not parse or that LogConfig refuses, is answered with Kafka's INVALID_CONFIG.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pylog.config import LogConfig
from pylog.errors import ConfigError
from pylog.serve import timestamps

__all__ = ["TOPIC_CONFIGS", "to_log_config", "from_log_config"]


def _int(v: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{v!r} is not an integer") from None


def _none_below_zero(v: str) -> int | None:
    n = _int(v)
    return None if n < 0 else n


def _flush_messages(v: str) -> dict[str, Any]:
    n = _int(v)
    if n < 1:
        raise ConfigError(f"flush.messages={v!r} must be >= 1")
    if n == 1:  # every record is durable before it is acknowledged: group-committed fsync
        return {"fsync": "always", "flush_messages": None}
    return {"fsync": "interval", "flush_messages": n}


def _none_at_max(v: str) -> int | None:
    n = _int(v)
    if n < 0:
        raise ConfigError(f"{v!r} must be >= 0")
    return None if n >= 1 << 62 else n  # Kafka's Long.MAX_VALUE: no bound


def _cleanup(v: str) -> str:
    if v not in ("delete", "compact"):
        raise ConfigError(f"cleanup.policy={v!r}: pylog has 'delete' or 'compact', not both")
    return v


#: Kafka topic config name -> function from its string value to LogConfig changes.
TOPIC_CONFIGS: dict[str, Callable[[str], dict[str, Any]]] = {
    "segment.bytes": lambda v: {"segment_bytes": _int(v)},
    "segment.ms": lambda v: {"segment_ms": _none_below_zero(v)},
    "retention.ms": lambda v: {"retention_ms": _none_below_zero(v)},
    "retention.bytes": lambda v: {"retention_bytes": _none_below_zero(v)},
    "cleanup.policy": lambda v: {"cleanup_policy": _cleanup(v)},
    "flush.messages": _flush_messages,
    "flush.ms": lambda v: {"flush_ms": _none_below_zero(v)},
    "max.message.bytes": lambda v: {"max_record_bytes": _int(v)},
    "delete.retention.ms": lambda v: {"delete_retention_ms": _int(v)},
    "message.timestamp.type": lambda v: {"timestamps": timestamps.to_mode(v)},
    "message.timestamp.before.max.ms": lambda v: {"timestamp_before_max_ms": _none_at_max(v)},
    "message.timestamp.after.max.ms": lambda v: {"timestamp_after_max_ms": _none_at_max(v)},
}


def to_log_config(configs: dict[str, str | None], base: LogConfig | None = None) -> LogConfig:
    """The LogConfig that ``configs`` (Kafka names -> string values) make of ``base``.

    Raises
    ------
    ConfigError
        An unknown name, or a value that does not parse or that LogConfig refuses; the
        message names it.
    """
    changes: dict[str, Any] = {}
    for name, value in configs.items():
        conv = TOPIC_CONFIGS.get(name)
        if conv is None:
            raise ConfigError(f"unknown topic config {name!r} (served: {', '.join(TOPIC_CONFIGS)})")
        if value is None:
            raise ConfigError(f"topic config {name!r} has no value")
        try:
            changes.update(conv(value))
        except ConfigError as e:
            raise ConfigError(f"{name}={value!r}: {e}") from None
    # a topic the broker creates keeps producers' timestamps (Kafka's CreateTime)
    return (base or LogConfig(**timestamps.BROKER_DEFAULTS)).replace(**changes)


def from_log_config(cfg: LogConfig) -> dict[str, str]:
    """Kafka names -> string values describing ``cfg`` (DescribeConfigs)."""
    def opt(v: int | None) -> str:
        return "-1" if v is None else str(v)

    def opt_max(v: int | None) -> str:
        return str((1 << 63) - 1) if v is None else str(v)

    if cfg.fsync == "always":
        flush_messages = "1"
    elif cfg.fsync == "interval" and cfg.flush_messages is not None:
        flush_messages = str(cfg.flush_messages)
    else:
        flush_messages = str((1 << 63) - 1)  # Kafka's "never by count"
    return {
        "segment.bytes": str(cfg.segment_bytes),
        "segment.ms": opt(cfg.segment_ms),
        "retention.ms": opt(cfg.retention_ms),
        "retention.bytes": opt(cfg.retention_bytes),
        "cleanup.policy": cfg.cleanup_policy,
        "flush.messages": flush_messages,
        "flush.ms": opt(cfg.flush_ms) if cfg.fsync == "interval" else str((1 << 63) - 1),
        "max.message.bytes": str(cfg.max_record_bytes),
        "delete.retention.ms": str(cfg.delete_retention_ms),
        "message.timestamp.type": timestamps.to_kafka(cfg.timestamps),
        "message.timestamp.before.max.ms": opt_max(cfg.timestamp_before_max_ms),
        "message.timestamp.after.max.ms": opt_max(cfg.timestamp_after_max_ms),
    }
