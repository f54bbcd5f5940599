"""AlterConfigs and IncrementalAlterConfigs of the broker resource (docs/serve.md, "Broker
configs").

What pylog can change live are the broker's defaults for new topics: the ``log.*`` keys,
``message.max.bytes``, ``compression.type`` and ``min.insync.replicas`` of
:data:`.brokerconfig.BROKER_KEYS` (Kafka's dynamic log configs). A change holds for topics
created afterwards (an existing topic keeps its configs: alter the topic); it is kept in
the data root's :data:`FILE` (written atomically and durably before the answer) and applied
again over the ``--config`` file and flags when the broker restarts, as Kafka keeps its
dynamic configs. Every other
broker config is read-only here, as Kafka refuses what it cannot update dynamically:
INVALID_REQUEST naming the config; a name pylog does not know, or a bad value, is
INVALID_CONFIG. A request is checked whole first (nothing changes when one config is
refused); ``validate_only`` changes nothing.
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

__all__ = ["DYNAMIC", "FILE", "alter", "restore"]

#: The data root's file of the broker configs changed over the Admin API.
FILE = "broker-configs.json"

#: The broker configs that can change live: key -> (topic config, scale of its value).
DYNAMIC: dict[str, tuple[str, int]] = {
    k: (where[6:].partition("*")[0], int(where.partition("*")[2] or 1))
    for k, (_d, _t, _c, where) in BROKER_KEYS.items() if where.startswith("topic:")}
SET, DELETE = 0, 1
DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 2, 3
_static: weakref.WeakKeyDictionary[Any, tuple[dict[str, str], dict[str, tuple[str, int, int]]]] = \
    weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _topic_value(key: str, value: str) -> tuple[str, str]:
    name, scale = DYNAMIC[key]
    v = BROKER_KEYS[key][2](value)
    tv = str(v * scale if scale > 1 and isinstance(v, int) and v >= 0 else v)
    return name, configs.check(name, tv)


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
                if c.name not in BROKER_KEYS:
                    raise ConfigError(f"{c.name}: not a broker config pylog has")
                if c.name not in DYNAMIC:
                    return E.invalid_request, f"{c.name}: read-only here (the --config file and flags set it)"
                name, _scale = DYNAMIC[c.name]
                if op == SET:
                    name, value = _topic_value(c.name, c.value or "")
                    defaults[name] = value
                    shown[c.name] = (c.value or "", source, BROKER_KEYS[c.name][1])
                elif op == DELETE:  # back to the static value
                    if name in statics[0]:
                        defaults[name] = statics[0][name]
                    else:
                        defaults.pop(name, None)
                    if c.name in statics[1]:
                        shown[c.name] = statics[1][c.name]
                else:
                    raise ConfigError(f"{c.name}: config operation {op} applies to list configs of topics only")
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
