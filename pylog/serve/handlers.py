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

from pylog.errors import InvalidNameError, PylogError, UnknownTopicError
from pylog.serve import admin_cluster, admin_configs, admin_records, configs, timestamps, txn_handlers
from pylog.serve.error_codes import ADMIN_ERRORS, answer
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
    ids: list[uuid.UUID] = []
    unknown_ids: list[uuid.UUID] = []
    if listing:
        names = store.topics()
    else:
        names = [t.name for t in req.topics if t.name is not None]
        ids = [t.topic_id for t in req.topics if t.name is None and getattr(t, "topic_id", None)]
        if ids:  # v10+ by topic id (KIP-516): resolved from the names of the store's topics
            known = {topic_id(n): n for n in store.topics()}
            names += [known[i] for i in ids if i in known]
            unknown_ids = [i for i in ids if i not in known]
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
    if unknown_ids:
        topics += [{"error_code": E.unknown_topic_id, "name": None, "topic_id": i, "is_internal": False,
                    "partitions": [], "topic_authorized_operations": -2147483648} for i in unknown_ids]
    return {"brokers": [{"node_id": 0, "host": broker.advertised_host, "port": broker.port, "rack": None}],
            "cluster_id": "pylog", "controller_id": 0, "topics": topics,
            # v8-10 when asked (librdkafka's DescribeCluster asks this way): the server fills
            # in the user's (authorized.fill_metadata)
            "cluster_authorized_operations": -2147483648}


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
                    r["offset"] = broker.starts.start(t.name, p.partition_index, log)
                elif ts == LATEST:
                    r["offset"] = broker.visible_end(log, committed, key)
                elif ts == MAX_TIMESTAMP:  # the FIRST offset of the largest timestamp (KAFKA-16310)
                    found = timestamps.max_timestamp_offset(log, broker.visible_end(log, committed, key))
                    if found is not None:
                        r["offset"], r["timestamp"] = found
                elif ts >= 0:
                    off = log.offset_for_time(ts)
                    if off is not None and off < broker.visible_end(log, committed, key):
                        r["offset"], r["timestamp"] = off, log.read(off).timestamp
                else:
                    r["error_code"] = E.invalid_request
            parts.append(r)
        out.append({"name": t.name, "partitions": parts})
    return {"topics": out}


def _assignment_error(t: Any) -> str | None:
    """Why CreateTopics' explicit replica assignment of ``t`` cannot be (None: it names
    partitions 0..n-1, each on this broker, node 0, alone)."""
    if t.num_partitions != -1 or t.replication_factor != -1:
        return "with a replica assignment, num_partitions and replication_factor must be -1"
    parts = sorted(a.partition_index for a in t.assignments)
    if parts != list(range(len(parts))):
        return f"the assignment names partitions {parts}, not 0..{len(parts) - 1}"
    for a in t.assignments:
        if list(a.broker_ids) != [0]:
            return (f"partition {a.partition_index} assigned to brokers {list(a.broker_ids)}: "
                    "this cluster is broker 0 alone")
    return None


def create_topics(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """CreateTopics: replication factor 1 (or -1), or an explicit assignment of every
    partition to this broker (node 0); every Kafka topic config (:mod:`.admin_configs`)."""
    out = []
    for t in req.topics:
        r: dict[str, Any] = {"name": t.name, "topic_id": topic_id(t.name), "error_code": 0, "error_message": None}
        n = broker.default_partitions if t.num_partitions == -1 else t.num_partitions
        if t.assignments:
            n = len(t.assignments)
        try:
            why = _assignment_error(t) if t.assignments else None
            if why is not None:
                r["error_code"] = E.invalid_request if "must be -1" in why else E.invalid_replica_assignment
                r["error_message"] = why
            elif t.replication_factor not in (-1, 1):
                r["error_code"] = E.invalid_replication_factor
                r["error_message"] = f"replication factor {t.replication_factor}: this broker has one node"
            elif n < 1:
                r["error_code"] = E.invalid_partitions
                r["error_message"] = f"num_partitions={n} must be >= 1"
            else:
                cfg, explicit = admin_configs.new_topic_config(broker, {c.name: c.value for c in t.configs})
                if not req.validate_only:
                    # its configs in its directory before it appears (a crash leaves both or neither)
                    broker.store.create_topic(t.name, partitions=n, config=cfg, files=broker.settings.files(explicit))
                    broker.settings.forget(t.name)
                r["num_partitions"], r["replication_factor"] = n, 1
                src = {k: admin_configs.DYNAMIC_TOPIC_CONFIG for k in explicit}
                r["configs"] = [{"name": k, "value": v, "read_only": False, "is_sensitive": False,
                                 "config_source": src.get(k, admin_configs.DEFAULT_CONFIG)}
                                for k, v in {**configs.defaults(), **configs.from_log_config(cfg), **{
                                    k: v for k, v in explicit.items() if k in configs.STORED}}.items()]
        except ADMIN_ERRORS as e:
            answer(r, e, {InvalidNameError: E.invalid_topic_exception})
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
        except ADMIN_ERRORS as e:
            answer(r, e)
        out.append(r)
    return {"responses": out}


def create_partitions(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """CreatePartitions: grow a topic to ``count`` partitions (an explicit assignment must
    put each new partition on this broker, node 0, alone)."""
    out = []
    for t in req.topics:
        r: dict[str, Any] = {"name": t.name, "error_code": 0, "error_message": None}
        try:
            topic = broker.topic(t.name, create=False)
            if t.count <= topic.partitions:
                r["error_code"] = E.invalid_partitions
                r["error_message"] = f"topic {t.name!r} has {topic.partitions} partitions; {t.count} is not more"
            elif t.assignments and len(t.assignments) != t.count - topic.partitions:
                r["error_code"] = E.invalid_replica_assignment
                r["error_message"] = (f"{len(t.assignments)} replica assignments for "
                                      f"{t.count - topic.partitions} new partitions")
            elif t.assignments and any(list(a.broker_ids) != [0] for a in t.assignments):
                r["error_code"] = E.invalid_replica_assignment
                bad = next(list(a.broker_ids) for a in t.assignments if list(a.broker_ids) != [0])
                r["error_message"] = f"a new partition assigned to brokers {bad}: this cluster is broker 0 alone"
            elif not req.validate_only:
                broker.store.add_partitions(t.name, t.count - topic.partitions)
        except ADMIN_ERRORS as e:
            answer(r, e, {PylogError: E.invalid_partitions})
        out.append(r)
    return {"results": out}


#: API key -> handler (Produce and Fetch are coroutines in :mod:`.broker`).
HANDLERS: dict[int, Callable[[Broker, Any, int], dict[str, Any]]] = {
    18: api_versions, 3: metadata, 2: list_offsets, 19: create_topics, 20: delete_topics,
    37: create_partitions,
    32: admin_configs.describe_configs,  # DescribeConfigs
    33: admin_configs.alter_configs,  # AlterConfigs
    44: admin_configs.incremental_alter_configs,  # IncrementalAlterConfigs
    21: admin_records.delete_records,  # DeleteRecords
    23: admin_records.offset_for_leader_epoch,  # OffsetForLeaderEpoch
    61: admin_records.describe_producers,  # DescribeProducers
    60: admin_cluster.describe_cluster,  # DescribeCluster
    35: admin_cluster.describe_log_dirs,  # DescribeLogDirs
    22: txn_handlers.init_producer_id,  # InitProducerId
    24: txn_handlers.add_partitions_to_txn,  # AddPartitionsToTxn
    25: txn_handlers.add_offsets_to_txn,  # AddOffsetsToTxn
    26: txn_handlers.end_txn,  # EndTxn
    28: txn_handlers.txn_offset_commit,  # TxnOffsetCommit
    65: txn_handlers.describe_transactions,  # DescribeTransactions
    66: txn_handlers.list_transactions,  # ListTransactions
}
