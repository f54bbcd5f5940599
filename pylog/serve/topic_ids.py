"""Topic ids in Produce v13+ and Fetch v13+ (KIP-516): the versions today's clients prefer
name topics by id, not by name.

pylog's topic ids are derived from the names (:func:`.handlers.topic_id`, what Metadata
and CreateTopics answer), so an id is resolved by computing the ids of the topics the
broker knows: those Metadata answered (remembered as it answers them, on the loop), else a
listing of the store in an admin thread. A request by ids is turned into the request of
the last version by names (v12 of both), so that the rights check (:mod:`.acl`), the fetch
sessions and the handlers see names as before; its answer gets each topic's id back. A
topic id the broker does not know is answered UNKNOWN_TOPIC_ID per partition, as Kafka
does.
"""
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E
from kio.schema.fetch.v12 import request as f12
from kio.schema.produce.v12 import request as p12
from kio.schema.types import BrokerId, TopicName

from pylog.serve.handlers import topic_id

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["ID_VERSION", "TopicIds", "Unknown"]

#: The first version of Produce (0) and Fetch (1) naming topics by id.
ID_VERSION = {0: 13, 1: 13}
#: The topics of a request whose ids the broker does not know: (topic id, partitions).
Unknown = list[tuple[uuid.UUID, list[int]]]


class TopicIds:
    """Topic id -> name of the topics a broker knows (see the module docstring)."""

    def __init__(self) -> None:
        self._names: dict[uuid.UUID, str] = {}

    def note(self, name: str) -> uuid.UUID:
        """Remember ``name``'s id; returns it."""
        tid = topic_id(name)
        self._names[tid] = name
        return tid

    async def names(self, broker: Broker, ids: list[uuid.UUID | None]) -> dict[uuid.UUID, str]:
        """The names of the ``ids`` the broker knows (the store is listed in an admin thread
        when one is not remembered)."""
        if any(i is not None and i not in self._names for i in ids):
            for name in await broker.admin(broker.store.topics):
                self.note(name)
        return {i: self._names[i] for i in ids if i is not None and i in self._names}

    async def by_name(self, broker: Broker, key: int, body: Any) -> tuple[Any, Unknown]:
        """The Produce/Fetch ``body`` by ids as the v12 request by names, and its unknown ids."""
        if key == 0:
            names = await self.names(broker, [t.topic_id for t in body.topic_data])
            unknown = [(t.topic_id, [p.index for p in t.partition_data])
                       for t in body.topic_data if t.topic_id not in names]
            topics = tuple(p12.TopicProduceData(name=TopicName(names[t.topic_id]), partition_data=tuple(
                p12.PartitionProduceData(index=p.index, records=p.records) for p in t.partition_data))
                for t in body.topic_data if t.topic_id in names)
            return p12.ProduceRequest(transactional_id=body.transactional_id, acks=body.acks, timeout=body.timeout,
                                      topic_data=topics), unknown
        names = await self.names(broker, [t.topic_id for t in (*body.topics, *body.forgotten_topics_data)])
        unknown = [(t.topic_id, [p.partition for p in t.partitions]) for t in body.topics if t.topic_id not in names]
        fetch = tuple(f12.FetchTopic(topic=TopicName(names[t.topic_id]), partitions=tuple(
            f12.FetchPartition(partition=p.partition, current_leader_epoch=p.current_leader_epoch,
                               fetch_offset=p.fetch_offset, last_fetched_epoch=p.last_fetched_epoch,
                               log_start_offset=p.log_start_offset, partition_max_bytes=p.partition_max_bytes)
            for p in t.partitions)) for t in body.topics if t.topic_id in names)
        forgotten = tuple(f12.ForgottenTopic(topic=TopicName(names[t.topic_id]), partitions=t.partitions)
                          for t in body.forgotten_topics_data if t.topic_id in names)
        return f12.FetchRequest(cluster_id=body.cluster_id, replica_id=BrokerId(-1), max_wait=body.max_wait,
                                min_bytes=body.min_bytes, max_bytes=body.max_bytes,
                                isolation_level=body.isolation_level, session_id=body.session_id,
                                session_epoch=body.session_epoch, topics=fetch, forgotten_topics_data=forgotten,
                                rack_id=body.rack_id), unknown

    def to_ids(self, key: int, data: dict[str, Any], unknown: Unknown) -> None:
        """Give each topic of a Produce/Fetch answer ``data`` its id, and answer the unknown ids."""
        name_field = "name" if key == 0 else "topic"
        parts_field, index = ("partition_responses", "index") if key == 0 else ("partitions", "partition_index")
        rows = data.setdefault("responses", [])
        for t in rows:
            t["topic_id"] = self.note(t[name_field])
        for tid, parts in unknown:
            rows.append({"topic_id": tid, parts_field: [
                {index: p, "error_code": E.unknown_topic_id, "base_offset": -1, "log_start_offset": -1,
                 "high_watermark": -1, "last_stable_offset": -1, "records": b"",
                 "record_errors": [], "error_message": None, "aborted_transactions": [],
                 "preferred_read_replica": -1} for p in parts]})
