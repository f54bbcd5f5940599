"""The config APIs: DescribeConfigs (topics and the broker), IncrementalAlterConfigs (44) and
AlterConfigs (33), and the configs CreateTopics gives a new topic (docs/serve.md, "Topic
configs", "Broker configs").

A topic's configs are its LogConfig under Kafka's names (:data:`.configs.LOG_CONFIGS`) and
the other Kafka topic configs pylog keeps beside it (:class:`.configs.Settings`). Those set
on the topic are reported with source DYNAMIC_TOPIC_CONFIG; the others with
STATIC_BROKER_CONFIG when the broker's ``--config`` file gives a default
(``log.retention.ms`` ...), else DEFAULT_CONFIG. An alteration is checked whole first
(INVALID_CONFIG naming the bad value, nothing changed) and, unless ``validate_only``, then
written: the LogConfig part (open partitions reopen with it) and the explicit set.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog.config import LogConfig
from pylog.errors import ConfigError
from pylog.serve import broker_alter, configs, group_configs, timestamps
from pylog.serve.error_codes import ADMIN_ERRORS, answer

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["new_topic_config", "describe_configs", "incremental_alter_configs", "alter_configs"]

TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE = 2, 4, 32
#: DescribeConfigs' config sources
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def new_topic_config(broker: Broker, given: Mapping[str, str | None]) -> tuple[LogConfig, dict[str, str]]:
    """(LogConfig, explicit configs) of a topic created with ``given`` configs: the broker's
    topic defaults (its ``--config`` file), then ``given``. ConfigError as
    :func:`.configs.check`."""
    explicit = {name: configs.check(name, value) for name, value in given.items()}
    base = LogConfig(**timestamps.BROKER_DEFAULTS)  # Kafka 4.0's CreateTime defaults
    if broker.topic_defaults:
        base = configs.to_log_config(broker.topic_defaults, base)
    return configs.to_log_config(explicit, base), explicit


def _topic_entries(broker: Broker, name: str, wanted: set[str] | None) -> list[dict[str, Any]]:
    topic = broker.topic(name, create=False)
    explicit = broker.settings.explicit(name)
    values = {**configs.defaults(), **configs.from_log_config(topic.config)}
    out = []
    for k in sorted(values):
        if wanted is not None and k not in wanted:
            continue
        if k in configs.STORED:
            v = explicit.get(k, broker.topic_defaults.get(k, configs.STORED[k][0]))
        else:
            v = values[k]
        src = DYNAMIC_TOPIC_CONFIG if k in explicit else STATIC_BROKER_CONFIG if k in broker.topic_defaults \
            else DEFAULT_CONFIG
        out.append({"name": k, "value": v, "read_only": False, "config_source": src, "is_sensitive": False,
                    "synonyms": [], "config_type": configs.TYPES.get(k, 0), "documentation": None})
    return out


def describe_configs(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DescribeConfigs: every Kafka config of a topic (see the module docstring), the
    broker's (``broker.broker_configs``: name -> (value, source, config type), and the
    no-effect ones of :data:`.broker_alter.NO_EFFECT`), or a group's (:mod:`.group_configs`)."""
    out = []
    for res in req.resources:
        r: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
                             "resource_name": res.resource_name, "configs": []}
        wanted = set(res.configuration_keys) if res.configuration_keys else None
        if res.resource_type == TOPIC_RESOURCE:
            try:
                r["configs"] = _topic_entries(broker, res.resource_name, wanted)
            except ADMIN_ERRORS as e:
                answer(r, e)
        elif res.resource_type == BROKER_RESOURCE:
            if res.resource_name not in ("", "0"):
                r["error_code"] = E.invalid_request
                r["error_message"] = f"broker {res.resource_name!r}: this cluster is broker 0 alone"
            else:
                shown = {k: (v, DEFAULT_CONFIG, kind) for k, (v, kind) in broker_alter.NO_EFFECT.items()}
                shown.update(broker.broker_configs)  # (the no-effect ones set: :mod:`.broker_alter`)
                r["configs"] = [{"name": k, "value": v, "read_only": k not in broker_alter.DYNAMIC
                                 and k not in broker_alter.NO_EFFECT,
                                 "config_source": src, "is_sensitive": False, "synonyms": [], "config_type": kind,
                                 "documentation": None}
                                for k, (v, src, kind) in sorted(shown.items())
                                if wanted is None or k in wanted]
        elif res.resource_type == GROUP_RESOURCE:  # any group, known or not, as Kafka 4.0 answers
            try:
                r["configs"] = group_configs.entries(broker, res.resource_name, wanted)
            except ConfigError as e:
                r["error_code"], r["error_message"] = E.kafka_storage_error, str(e)
        else:
            r["error_code"], r["error_message"] = E.invalid_request, f"resource type {res.resource_type}"
        out.append(r)
    return {"results": out}


def _apply(broker: Broker, name: str, explicit: dict[str, str], validate_only: bool) -> None:
    """Make ``explicit`` the configs set on topic ``name`` (the others: defaults)."""
    topic = broker.topic(name, create=False)
    old = broker.settings.explicit(name)
    dflt = {**configs.defaults(), **broker.topic_defaults}
    changed = {k: v for k, v in explicit.items() if k in configs.LOG_CONFIGS and old.get(k) != v}
    changed.update({k: dflt[k] for k in old if k in configs.LOG_CONFIGS and k not in explicit})
    new = configs.to_log_config(changed, topic.config)  # checks the whole LogConfig: nothing written yet
    if validate_only:
        return
    if new != topic.config:
        changes = {f: getattr(new, f) for f in new.to_dict() if getattr(new, f) != getattr(topic.config, f)}
        broker.store.alter_topic(name, **changes)
    broker.settings.save(name, explicit)


def _alter(broker: Broker, req: Any, incremental: bool) -> dict[str, Any]:
    out = []
    for res in req.resources:
        r: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
                             "resource_name": res.resource_name}
        try:
            if res.resource_type == BROKER_RESOURCE:  # (:mod:`.broker_alter`)
                r["error_code"], r["error_message"] = broker_alter.alter(broker, res, incremental, req.validate_only)
            elif res.resource_type == GROUP_RESOURCE:  # (:mod:`.group_configs`)
                r["error_code"], r["error_message"] = group_configs.alter(broker, res, incremental, req.validate_only)
            elif res.resource_type != TOPIC_RESOURCE:
                r["error_code"], r["error_message"] = E.invalid_request, f"resource type {res.resource_type}"
            else:
                name = res.resource_name
                broker.topic(name, create=False)  # UnknownTopicError first
                explicit = broker.settings.explicit(name) if incremental else {}
                for c in res.configs:
                    op = getattr(c, "config_operation", SET)
                    if op == SET:
                        explicit[c.name] = configs.check(c.name, c.value)
                    elif op == DELETE:
                        configs.check(c.name, configs.defaults().get(c.name, ""))  # an unknown name: refused
                        explicit.pop(c.name, None)
                    elif op in (APPEND, SUBTRACT):
                        if c.name not in configs.LISTS:
                            raise ConfigError(f"{c.name}: APPEND and SUBTRACT apply to list configs only")
                        cur = explicit.get(c.name, broker.topic_defaults.get(c.name, configs.defaults()[c.name]))
                        items = [x for x in cur.split(",") if x]
                        extra = [x.strip() for x in (c.value or "").split(",") if x.strip()]
                        items = [*items, *(x for x in extra if x not in items)] if op == APPEND \
                            else [x for x in items if x not in extra]
                        explicit[c.name] = configs.check(c.name, ",".join(items))
                    else:
                        raise ConfigError(f"{c.name}: config operation {op} is unknown")
                _apply(broker, name, explicit, req.validate_only)
        except ADMIN_ERRORS as e:
            answer(r, e)
        out.append(r)
    return {"responses": out}


def incremental_alter_configs(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """IncrementalAlterConfigs: SET, DELETE (back to the default), APPEND and SUBTRACT (list
    configs) on a topic's explicit configs; the others stay."""
    return _alter(broker, req, True)


def alter_configs(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """AlterConfigs: the configs given become the topic's explicit set; every other config
    returns to its default (Kafka's replace semantics)."""
    return _alter(broker, req, False)
