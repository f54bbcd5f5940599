"""DeleteRecords, OffsetForLeaderEpoch and DescribeProducers, and the broker's log start
offsets that DeleteRecords moves.

**Log start offsets.** Kafka's DeleteRecords moves a partition's log start offset to any
offset up to its high watermark; segments wholly below it are deleted, and the records left
below it in the first kept segment are never served again. The broker asks the partition's
Log for it (:meth:`pylog.Log.delete_records`: a durable ``log-start-offset`` mark in the
partition directory, fsynced before the request is answered), so every reader of the data
root honours it as the broker does: ListOffsets EARLIEST answers it, a Fetch below it is
OFFSET_OUT_OF_RANGE, Produce and Fetch report it as ``log_start_offset``, and pylog's own
readers (the library, the CLI, Spark) start there too. Brokers before it kept the offset in
``TOPIC/~log-start/partition-N`` (the offset in ASCII): such a file is still honoured, and
moved into the partition's own mark the first time the broker opens the partition to write.

**OffsetForLeaderEpoch.** One broker leads every partition at leader epoch 0 (what Metadata
reports), so epoch 0 ends at the log end offset, as Kafka answers for a partition whose
whole history has one leader epoch; any other epoch is undefined (epoch and end offset -1,
no error, as Kafka answers an epoch it has no entry for). A ``current_leader_epoch`` above
0 is UNKNOWN_LEADER_EPOCH.

**DescribeProducers.** The idempotent producers of each partition (:mod:`.producers`): id,
epoch, last sequence and the timestamp of its last record; pylog has no transactions over
the protocol, so the coordinator epoch and transaction start offset are always -1.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.errors import PylogError

if TYPE_CHECKING:
    from pylog.log import Log
    from pylog.serve.broker import Broker
    from pylog.topics import LogStore

__all__ = ["LogStarts", "START_DIR", "LEADER_EPOCH", "delete_records", "offset_for_leader_epoch",
           "describe_producers"]

_log = logging.getLogger("pylog.serve")

#: The directory under a topic holding the log start offsets DeleteRecords set.
START_DIR = "~log-start"
#: The leader epoch of every partition (Metadata reports it).
LEADER_EPOCH = 0
HIGH_WATERMARK = -1


class LogStarts:
    """The log start offsets of the partitions (see the module docstring): the Log's own,
    and the offsets older brokers kept under ``TOPIC/~log-start``."""

    def __init__(self, store: LogStore) -> None:
        self.store = store  # (the partitions' files are found through their Logs)
        self._legacy: dict[tuple[str, int], int] = {}  # loaded: the old file's offset, 0 for none
        self._lock = threading.Lock()

    @staticmethod
    def _path(log: Log) -> str:
        """``TOPIC/~log-start/partition-N`` beside the partition's directory (not through the
        store, whose lock a topic storm may hold)."""
        return os.path.join(os.path.dirname(log.path), START_DIR, os.path.basename(log.path))

    def _loaded(self, topic: str, i: int, log: Log) -> int:
        """The old broker's offset of ``topic``/``i`` (0: none), moved into the Log's mark
        when ``log`` is the writer."""
        got = self._legacy.get((topic, i))
        if got is not None and (got == 0 or log.readonly):
            return got
        with self._lock:
            if got is None:
                data = fileutil.read_if_exists(self._path(log))
                try:
                    got = int(data.decode()) if data else 0
                except ValueError:  # cannot happen (atomic replace); served from the log's start
                    _log.warning("%s: not an offset: %r", self._path(log), data)
                    got = 0
            if got and not log.readonly:
                log.delete_records(min(got, log.stable_offset))
                os.unlink(self._path(log))
                fileutil.fsync_dir(os.path.dirname(self._path(log)))
                got = 0
            self._legacy[(topic, i)] = got
            return got

    def start(self, topic: str, i: int, log: Log) -> int:
        """The log start offset of ``topic``/``i`` whose writer or reader is ``log``."""
        try:
            floor = self._loaded(topic, i, log)  # first: it may move the Log's own start
        except (OSError, PylogError):
            floor = 0
        start = log.start_offset
        return start if floor <= start else min(floor, log.next_offset)

    def advance(self, topic: str, i: int, log: Log, offset: int) -> None:
        """Make ``offset`` the log start of ``topic``/``i`` (whose writer is ``log``), durably
        before it is served; an offset at or below the present one changes nothing. Deleting
        the segments below it is best effort (the mark is what is served)."""
        self._loaded(topic, i, log)
        try:
            log.delete_records(offset)
        except (OSError, PylogError) as e:
            if log.start_offset < offset:  # the mark itself failed
                raise
            _log.warning("partition %s-%d: deleting segments below %d: %s", topic, i, offset, e)

    def forget_topic(self, topic: str) -> None:
        """Drop what is loaded of ``topic`` (deleted: a topic made again starts afresh)."""
        with self._lock:
            for key in [k for k in self._legacy if k[0] == topic]:
                del self._legacy[key]


def delete_records(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DeleteRecords: move each partition's log start offset up to ``offset`` (-1: the high
    watermark); answers the new low watermark. An offset past the high watermark, or
    negative, is OFFSET_OUT_OF_RANGE; one below the log start changes nothing."""
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r: dict[str, Any] = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": 0}
            key = (t.name, p.partition_index)
            log, err = broker.partition(*key)
            if log is None:
                r["error_code"] = err
                parts.append(r)
                continue
            try:
                high = broker.visible_end(log, False, key)
                offset = high if p.offset == HIGH_WATERMARK else p.offset
                if not 0 <= offset <= high:
                    r["error_code"] = E.offset_out_of_range
                else:
                    broker.starts.advance(t.name, p.partition_index, log, offset)
                    r["low_watermark"] = broker.starts.start(t.name, p.partition_index, log)
            except (OSError, PylogError) as e:
                _log.warning("DeleteRecords of %s-%d: %s", *key, e)
                r["error_code"] = E.kafka_storage_error
            parts.append(r)
        out.append({"name": t.name, "partitions": parts})
    return {"topics": out}


def offset_for_leader_epoch(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """OffsetForLeaderEpoch: epoch 0 (the only one) ends at the log end offset."""
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r: dict[str, Any] = {"partition": p.partition, "error_code": 0, "leader_epoch": -1, "end_offset": -1}
            current = p.current_leader_epoch  # -1: not checked
            log, err = broker.partition(t.topic, p.partition, read=True)
            if log is None:
                r["error_code"] = err
            elif current > LEADER_EPOCH:
                r["error_code"] = E.unknown_leader_epoch
            elif 0 <= current < LEADER_EPOCH:  # (none while the one epoch is 0)
                r["error_code"] = E.fenced_leader_epoch
            elif p.leader_epoch == LEADER_EPOCH:  # another epoch is undefined here: -1, -1
                try:
                    r["end_offset"] = broker.visible_end(log, False, (t.topic, p.partition))
                    r["leader_epoch"] = LEADER_EPOCH
                except (OSError, PylogError):
                    r["error_code"] = E.kafka_storage_error
            parts.append(r)
        out.append({"topic": t.topic, "partitions": parts})
    return {"topics": out}


def describe_producers(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DescribeProducers: each partition's idempotent producers (see the module docstring)."""
    out = []
    for t in req.topics:
        parts = []
        for i in t.partition_indexes:
            r: dict[str, Any] = {"partition_index": i, "error_code": 0, "error_message": None, "active_producers": []}
            log, err = broker.partition(t.name, i)
            if log is None:
                r["error_code"] = err
                parts.append(r)
                continue
            try:
                states = broker.producers.describe(t.name, i, log)
            except (OSError, PylogError) as e:
                r["error_code"], r["error_message"] = E.kafka_storage_error, str(e)
                parts.append(r)
                continue
            rows = []
            for pid, epoch, last_seq, last_offset in states:
                try:
                    ts = log.read(last_offset).timestamp
                except PylogError:  # deleted or compacted away since
                    ts = -1
                rows.append({"producer_id": pid, "producer_epoch": epoch, "last_sequence": last_seq,
                             "last_timestamp": ts, "coordinator_epoch": -1, "current_txn_start_offset": -1})
            r["active_producers"] = rows
            parts.append(r)
        out.append({"name": t.name, "partitions": parts})
    return {"topics": out}
