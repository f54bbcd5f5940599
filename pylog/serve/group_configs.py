"""The configs of a consumer group (GROUP config resources): DescribeConfigs,
IncrementalAlterConfigs and AlterConfigs (docs/serve.md, "Group configs").

Kafka 4.0's group configs are KIP-848's, of groups of the consumer protocol:
:data:`GROUP_CONFIGS`, with Kafka's defaults and bounds. pylog serves the classic protocol,
where each member's JoinGroup gives its session timeout and its heartbeats their pace; a
classic group is not changed by them in Kafka 4.0 either. They are accepted, checked as Kafka
checks them (INVALID_CONFIG naming a bad value or an unknown name), kept durably per group in
``ROOT/.serve.groups/GROUP.configs`` (JSON, replaced atomically and fsynced before the
answer; the group's name percent-encoded where it has characters a file name cannot) and
reported by DescribeConfigs of the group, for any group, known or not, as Kafka answers.
"""
from __future__ import annotations

import json
import os
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.errors import ConfigError
from pylog.serve.membership import GROUPS_DIR

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["GROUP_CONFIGS", "SUFFIX", "alter", "entries"]

#: Kafka 4.0's group configs: name -> (default, least, greatest), in milliseconds.
GROUP_CONFIGS: dict[str, tuple[int, int, int]] = {
    "consumer.heartbeat.interval.ms": (5000, 5000, 15000),
    "consumer.session.timeout.ms": (45000, 45000, 60000),
}
#: The suffix of a group's config file in the data root's ``.serve.groups/``.
SUFFIX = ".configs"
DYNAMIC_GROUP_CONFIG, DEFAULT_CONFIG = 8, 5
SET, DELETE = 0, 1
_lock = threading.Lock()


def _path(broker: Broker, group: str) -> str:
    return os.path.join(broker.store.root, GROUPS_DIR, urllib.parse.quote(group, safe="") + SUFFIX)


def _load(broker: Broker, group: str) -> dict[str, str]:
    path = _path(broker, group)
    try:
        with open(path) as f:
            kept = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    if not isinstance(kept, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return {str(k): str(v) for k, v in kept.items() if k in GROUP_CONFIGS}


def entries(broker: Broker, group: str, wanted: set[str] | None) -> list[dict[str, Any]]:
    """DescribeConfigs' entries of ``group``: each of :data:`GROUP_CONFIGS`, the ones set
    with source DYNAMIC_GROUP_CONFIG, the others with their default (ConfigError naming the
    file if it cannot be read)."""
    kept = _load(broker, group)
    return [{"name": k, "value": kept.get(k, str(d)), "read_only": False,
             "config_source": DYNAMIC_GROUP_CONFIG if k in kept else DEFAULT_CONFIG,
             "is_sensitive": False, "synonyms": [], "config_type": 3, "documentation": None}
            for k, (d, _lo, _hi) in GROUP_CONFIGS.items() if wanted is None or k in wanted]


def _check(name: str, value: str) -> str:
    if name not in GROUP_CONFIGS:
        raise ConfigError(f"{name}: not a group config (Kafka 4.0's are {', '.join(GROUP_CONFIGS)})")
    _d, lo, hi = GROUP_CONFIGS[name]
    try:
        v = int(value)
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not an int") from None
    if not lo <= v <= hi:
        raise ConfigError(f"{name}: {v} is not in [{lo}, {hi}]")
    return str(v)


def alter(broker: Broker, res: Any, incremental: bool, validate_only: bool) -> tuple[int, str | None]:
    """(error code, message) of altering group ``res.resource_name``'s configs: SET and
    DELETE (back to the default) on the configs kept (``incremental``), or the configs given
    replace them (AlterConfigs). Checked whole first; ``validate_only`` writes nothing."""
    group = res.resource_name
    if not group:
        return E.invalid_request, "a group resource needs a group id"
    with _lock:
        try:
            kept = _load(broker, group) if incremental else {}
            for c in res.configs:
                op = getattr(c, "config_operation", SET)
                if op == SET:
                    kept[c.name] = _check(c.name, c.value or "")
                elif op == DELETE:
                    _check(c.name, str(GROUP_CONFIGS[c.name][0]) if c.name in GROUP_CONFIGS else "")
                    kept.pop(c.name, None)
                else:
                    raise ConfigError(f"{c.name}: config operation {op} applies to list configs only")
        except ConfigError as e:
            return E.invalid_config, str(e)
        if validate_only:
            return 0, None
        path = _path(broker, group)
        try:
            if kept:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fileutil.atomic_write(path, json.dumps(kept, sort_keys=True).encode())
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    return 0, None
                fileutil.fsync_dir(os.path.dirname(path))
        except OSError as e:
            return E.kafka_storage_error, f"group {group!r}: its configs could not be written ({e})"
    return 0, None
