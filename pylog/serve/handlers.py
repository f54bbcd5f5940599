"""One handler per API: a kio request entity in, a plain dict for the response out.

The handlers here (but ApiVersions) run in the broker's admin threads
(:meth:`.Broker.admin`), never on the event loop: they open partitions, read topic files,
create and delete topics. They may run concurrently with each other, with appends and
with the loop's fetches; the LogStore's locks order what they change. Each returns a
dict that :func:`.protocol.build` turns into the response of the request's version.
Error codes are Kafka's (``kio.schema.errors.ErrorCode``).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog.errors import ConfigError, InvalidNameError, PylogError, TopicExistsError, UnknownTopicError
from pylog.serve import admin_cluster, configs
from pylog.serve.protocol import SERVED

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3


def topic_id(name: str) -> uuid.UUID:
    """A stable topic id (Metadata v10+): derived from the name, as pylog has no ids."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "pylog-topic:" + name)


def api_versions(broker: Broker | None, req: Any, version: int) -> dict[str, Any]:
    """ApiVersions: the keys and versions in :data:`.protocol.SERVED`."""
    keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, (_, lo, hi) in sorted(SERVED.items())]
    return {"error_code": 0, "api_keys": keys}


class _Limited(Exception):
    """An unknown topic over the auto-creation limits (not created)."""


def metadata(broker: Broker, req: Any, version: int,
             may_create: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Metadata: this one broker leads every partition; unknown topics may be auto-created
    (v0-3 always ask for it), each only when ``may_create(name)`` (the principal may write
    it): else an unknown topic is answered TOPIC_AUTHORIZATION_FAILED, as Kafka does. At
    most ``broker.auto_create_per_request`` are created, and only while the broker's
    auto-creation bucket has tokens: the others are answered UNKNOWN_TOPIC_OR_PARTITION
    (as Kafka answers a topic it does not create; clients ask again)."""
    store = broker.store
    listing = req.topics is None or (version == 0 and not req.topics)  # v0: an empty list means all
    if listing:
        names = store.topics()
    else:
        names = [t.name for t in req.topics if t.name is not None]
    # a listing creates nothing (a topic deleted by another thread since it was listed stays gone)
    auto = bool(getattr(req, "allow_auto_topic_creation", True)) and broker.auto_create and not listing
    topics = []
    created = 0
    for name in names:
        err, parts = 0, []
        create = auto and (may_create is None or may_create(name))
        try:
            try:
                topic = broker.topic(name)
            except UnknownTopicError:
                if not create:
                    raise
                if created >= broker.auto_create_per_request or not broker.take_auto_create():
                    raise _Limited() from None
                created += 1
                topic = broker.topic(name, create=True)
        except _Limited:
            err = E.unknown_topic_or_partition
        except InvalidNameError:
            err = E.invalid_topic_exception
        except UnknownTopicError:
            if listing:
                continue  # deleted since it was listed
            err = E.topic_authorization_failed if auto and not create else E.unknown_topic_or_partition
        except OSError:  # auto-creation on a full or failing disk: that topic only
            err = E.kafka_storage_error
        else:
            parts = [{"error_code": 0, "partition_index": i, "leader_id": 0, "leader_epoch": 0,
                      "replica_nodes": [0], "isr_nodes": [0], "offline_replicas": []}
                     for i in range(topic.partitions)]
        topics.append({"error_code": err, "name": name, "topic_id": topic_id(name), "is_internal": False,
                       "partitions": parts, "topic_authorized_operations": -2147483648})
    return {"brokers": [{"node_id": 0, "host": broker.advertised_host, "port": broker.port, "rack": None}],
            "cluster_id": "pylog", "controller_id": 0, "topics": topics,
            # v8-10 (librdkafka's DescribeCluster asks this way): every operation, narrowed to
            # the user's by acl.filter_response
            "cluster_authorized_operations": admin_cluster.cluster_operations(None, None)
            if getattr(req, "include_cluster_authorized_operations", False) else admin_cluster.NOT_ASKED}


def list_offsets(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """ListOffsets: earliest (-2), latest (-1; the last stable offset under read_committed),
    max timestamp (-3) or the first offset at or after a timestamp (the time index)."""
    committed = getattr(req, "isolation_level", 0) == 1
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r = {"partition_index": p.partition_index, "timestamp": -1, "offset": -1, "leader_epoch": 0}
            key = (t.name, p.partition_index)
            log, err = broker.partition(*key)
            if log is None:
                r["error_code"] = err
            else:
                ts = p.timestamp
                if ts == EARLIEST:
                    r["offset"] = log.start_offset
                elif ts == LATEST:
                    r["offset"] = broker.visible_end(log, committed, key)
                elif ts == MAX_TIMESTAMP:
                    end = broker.visible_end(log, committed, key)
                    if end > log.start_offset:
                        rec = log.read(end - 1)
                        r["offset"], r["timestamp"] = rec.offset, rec.timestamp
                elif ts >= 0:
                    off = log.offset_for_time(ts)
                    if off is not None and off < broker.visible_end(log, committed, key):
                        r["offset"], r["timestamp"] = off, log.read(off).timestamp
                else:
                    r["error_code"] = E.invalid_request
            parts.append(r)
        out.append({"name": t.name, "partitions": parts})
    return {"topics": out}


def create_topics(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """CreateTopics: replication factor 1 (or -1), Kafka config names mapped to LogConfig."""
    out = []
    for t in req.topics:
        r: dict[str, Any] = {"name": t.name, "topic_id": topic_id(t.name), "error_code": 0, "error_message": None}
        n = 1 if t.num_partitions == -1 else t.num_partitions
        try:
            if t.replication_factor not in (-1, 1):
                r["error_code"] = E.invalid_replication_factor
                r["error_message"] = f"replication factor {t.replication_factor}: this broker has one node"
            elif t.assignments:
                r["error_code"] = E.invalid_replica_assignment
                r["error_message"] = "manual replica assignment is not supported"
            elif n < 1:
                r["error_code"] = E.invalid_partitions
                r["error_message"] = f"num_partitions={n} must be >= 1"
            else:
                cfg = configs.to_log_config({c.name: c.value for c in t.configs})
                if not req.validate_only:
                    broker.store.create_topic(t.name, partitions=n, config=cfg)
                r["num_partitions"], r["replication_factor"] = n, 1
                r["configs"] = [{"name": k, "value": v, "read_only": False, "config_source": 5, "is_sensitive": False}
                                for k, v in configs.from_log_config(cfg).items()]
        except TopicExistsError as e:
            r["error_code"], r["error_message"] = E.topic_already_exists, str(e)
        except InvalidNameError as e:
            r["error_code"], r["error_message"] = E.invalid_topic_exception, str(e)
        except ConfigError as e:
            r["error_code"], r["error_message"] = E.invalid_config, str(e)
        except PylogError as e:
            r["error_code"], r["error_message"] = E.invalid_request, str(e)
        except OSError as e:  # a full or failing disk, EMFILE, EACCES: that topic only
            r["error_code"], r["error_message"] = E.kafka_storage_error, str(e)
        if r["error_code"]:
            r["num_partitions"] = r["replication_factor"] = -1
        out.append(r)
    return {"topics": out}


def delete_topics(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DeleteTopics: each topic's partitions and groups, as ``pylog topic delete`` does."""
    out = []
    for name in req.topic_names:
        r: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
        try:
            broker.delete_topic(name)
        except (UnknownTopicError, InvalidNameError) as e:
            r["error_code"], r["error_message"] = E.unknown_topic_or_partition, str(e)
        except PylogError as e:
            r["error_code"], r["error_message"] = E.invalid_request, str(e)
        out.append(r)
    return {"responses": out}


def create_partitions(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """CreatePartitions: grow a topic to ``count`` partitions."""
    out = []
    for t in req.topics:
        r: dict[str, Any] = {"name": t.name, "error_code": 0, "error_message": None}
        try:
            topic = broker.topic(t.name, create=False)
            if t.count <= topic.partitions:
                r["error_code"] = E.invalid_partitions
                r["error_message"] = f"topic {t.name!r} has {topic.partitions} partitions; {t.count} is not more"
            elif t.assignments:
                r["error_code"] = E.invalid_replica_assignment
                r["error_message"] = "manual replica assignment is not supported"
            elif not req.validate_only:
                broker.store.add_partitions(t.name, t.count - topic.partitions)
        except (UnknownTopicError, InvalidNameError) as e:
            r["error_code"], r["error_message"] = E.unknown_topic_or_partition, str(e)
        except PylogError as e:
            r["error_code"], r["error_message"] = E.invalid_partitions, str(e)
        out.append(r)
    return {"results": out}


def describe_configs(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DescribeConfigs: a topic's LogConfig under Kafka's names; a broker has none here."""
    out = []
    for res in req.resources:
        r: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
                             "resource_name": res.resource_name, "configs": []}
        if res.resource_type == TOPIC_RESOURCE:
            try:
                topic = broker.topic(res.resource_name, create=False)
            except (UnknownTopicError, InvalidNameError) as e:
                r["error_code"], r["error_message"] = E.unknown_topic_or_partition, str(e)
            else:
                wanted = set(res.configuration_keys) if res.configuration_keys else None
                r["configs"] = [{"name": k, "value": v, "read_only": False, "config_source": 1,
                                 "is_sensitive": False, "synonyms": [], "config_type": 0, "documentation": None}
                                for k, v in configs.from_log_config(topic.config).items()
                                if wanted is None or k in wanted]
        elif res.resource_type != BROKER_RESOURCE:
            r["error_code"], r["error_message"] = E.invalid_request, f"resource type {res.resource_type}"
        out.append(r)
    return {"results": out}


#: API key -> handler (Produce and Fetch are coroutines in :mod:`.broker`).
HANDLERS: dict[int, Callable[[Broker, Any, int], dict[str, Any]]] = {
    18: api_versions, 3: metadata, 2: list_offsets, 19: create_topics, 20: delete_topics,
    37: create_partitions, 32: describe_configs}
HANDLERS[60] = admin_cluster.describe_cluster  # DescribeCluster
HANDLERS[35] = admin_cluster.describe_log_dirs  # DescribeLogDirs

