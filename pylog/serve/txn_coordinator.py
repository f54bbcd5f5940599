"""Kafka transactions over the wire: the transaction coordinator of ``pylog serve``.

A Kafka transaction is a pylog :class:`~pylog.Transaction` (docs/serve.md,
"Transactions"): the records a transactional producer sends are *staged* (a staging Log
per partition under ``ROOT/~txn/``), not appended to the partition; EndTxn(commit) commits
the pylog transaction, which appends them to every partition at once behind the
partitions' stable markers; EndTxn(abort) discards the staging. No reader (Kafka
read_committed or read_uncommitted, the library, ``pylog consume``, Spark) ever sees a
record of an open or aborted transaction, because it never reaches a partition: Fetch has
no aborted transactions to list and no control records to skip.

The coordinator's state per transactional id (producer id, epoch, state, partitions,
timeout, the offsets TxnOffsetCommit gave) is kept in ``ROOT/.serve.txns/ID.json`` (ID:
a SHA-256 of the transactional id), written atomically and fsynced at each change of
state. The EndTxn(commit) of transaction number N of an id writes state PrepareCommit
(with its offsets) first, then commits the pylog transaction with sink
``kafka-txn:<transactional id>`` set to N (the pylog decision holds it: it is committed
exactly when :func:`pylog.transactions.last_batch_id` says N), then writes the group
offsets and state CompleteCommit.

A transaction in flight survives a restart: its pylog transaction is an external one
(:func:`pylog.transactions.begin_external`, tag :data:`TXN_TAG`), which the store's open
keeps, and a transactional Produce is answered once its staged records are as durable as
a plain Produce's. At start, a PrepareCommit whose pylog transaction committed is completed
(its offsets written again); an Ongoing one is re-attached to its staging (the producer
continues it; the first sequence staged per partition, in the state, and the staged count
give its sequences); a PrepareCommit whose pylog transaction was not decided is committed
from its staging. One whose staging is gone is aborted and its epoch marked *lost*: the
producer's next request at that epoch is answered UNKNOWN_PRODUCER_ID (an abortable error:
the client aborts, bumps its epoch with InitProducerId and carries on).
``transaction.timeout.ms`` expiring (counted from the transaction's start, across restarts)
aborts a transaction the same way; an abort removes the staging.

Fencing: InitProducerId bumps the epoch (aborting an open transaction); requests of an
older epoch are answered PRODUCER_FENCED (Produce: INVALID_PRODUCER_EPOCH).
KIP-890's defence: a transactional Produce to a partition AddPartitionsToTxn did not add
to the open transaction is refused (INVALID_TXN_STATE), and the sequence numbers of each
partition continue across the transactions of an epoch, so a late retry of an earlier
transaction's batch is a duplicate (answered, not staged) or out of order (refused),
never staged into a newer one.
"""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.consumer import encode_offset
from pylog.errors import (
    InvalidNameError,
    InvalidTimestampError,
    PylogError,
    RecordTooLargeError,
    TransactionError,
    UnknownTopicError,
)
from pylog.log import PackedBytes
from pylog.serve.producers import batch_producer
from pylog.serve.records import _HEADER, HEADER_SIZE, BatchError, Budget, check_keyed, decode_records
from pylog.serve.txn_limits import TxnLimits
from pylog.serve.txn_state import COMPLETE_ABORT, COMPLETE_COMMIT, EMPTY, ONGOING, PREPARE_COMMIT, TxnState
from pylog.topics import CONSUMERS_DIR, check_name
from pylog.transactions import Transaction, begin_external, discard, discard_tagged, last_batch_id

if TYPE_CHECKING:
    from pylog.serve.broker import Broker
    from pylog.serve.coordinator import GroupCoordinator

__all__ = ["TxnCoordinator", "STATE_DIR", "SINK_PREFIX", "is_transactional"]

#: The directory under the root holding each transactional id's state.
STATE_DIR = ".serve.txns"
#: The prefix of the pylog sink recording the number of a committed Kafka transaction.
SINK_PREFIX = "kafka-txn:"
#: The tag of the broker's pylog transactions (external: kept across restarts, see
#: :func:`pylog.transactions.begin_external`).
TXN_TAG = "pylog-serve-kafka-txn"
#: Kafka's transaction.max.timeout.ms default: a longer transaction.timeout.ms is refused.
MAX_TIMEOUT_MS = 900_000
_KEEP = 5  # batches remembered per partition for retries, as Kafka's producer state
_TXN_BIT = 0x10  # the transactional bit of a RecordBatch's attributes
_NO_TIME = datetime.datetime.fromtimestamp(-0.001, datetime.timezone.utc)  # written as -1


def is_transactional(records: Any) -> bool:
    """Whether the first RecordBatch of a Produce's partition data is transactional."""
    if records is None:
        return False
    mv = memoryview(records).cast("B")
    if len(mv) < HEADER_SIZE:
        return False
    return bool(_HEADER.unpack_from(mv, 0)[5] & _TXN_BIT)


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


class TxnCoordinator:
    """The transaction coordinator of one broker (see the module docstring)."""

    def __init__(self, broker: Broker, groups: GroupCoordinator | None = None,
                 limits: TxnLimits | None = None) -> None:
        self.broker = broker
        self.limits = limits or TxnLimits()
        self.groups = groups
        self.root = broker.store.root
        self.dir = os.path.join(self.root, STATE_DIR)
        self._txns: dict[str, TxnState] = {}
        self._by_pid: dict[int, TxnState] = {}
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._load()

    # -- durable state --------------------------------------------------------------------
    def _path(self, tid: str) -> str:
        return os.path.join(self.dir, hashlib.sha256(tid.encode()).hexdigest() + ".json")

    def _save(self, st: TxnState) -> None:
        if not os.path.isdir(self.dir):
            os.makedirs(self.dir, exist_ok=True)
            fileutil.fsync_dir(self.root)
        st.used = time.time()
        fileutil.atomic_write(self._path(st.tid), json.dumps(st.to_json(), sort_keys=True).encode())

    def _load(self) -> None:
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return
        keep: set[str] = set()
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    d = json.loads(f.read())
                st = TxnState.from_json(d)
                pylog_txn = d.get("pylog_txn")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # a damaged state file: that id starts afresh
            for client, n in st.held_by.items():  # counted (an end below releases them)
                self.limits.count(client, n)
            committed = st.state == PREPARE_COMMIT and (last_batch_id(self.root, SINK_PREFIX + st.tid) or 0) >= st.seq
            if not committed and st.state in (ONGOING, PREPARE_COMMIT) and pylog_txn \
                    and self._restore(st, str(pylog_txn)):
                # Ongoing: the producer continues it; PrepareCommit: start() commits it
                keep.add(str(pylog_txn))
                self._txns[st.tid] = st
                self._by_pid[st.pid] = st
                continue
            if committed:
                self._write_offsets(st)  # it committed: its offsets again (idempotent)
                self._complete(st, COMPLETE_COMMIT)
            elif st.state in (ONGOING, PREPARE_COMMIT):
                if st.state == PREPARE_COMMIT:
                    st.seq -= 1  # that number never committed
                if pylog_txn:
                    try:
                        discard(self.root, pylog_txn)
                    except (OSError, PylogError):
                        pass
                st.lost = True
                self._complete(st, COMPLETE_ABORT)
            self._txns[st.tid] = st
            self._by_pid[st.pid] = st
        while len(self._txns) > self.limits.max_ids:  # (the bound was lowered since)
            victims = self.limits.evictable(self._txns.values(), time.time(), full=True)
            if not victims:
                break
            self._forget(victims)
        try:  # staging no transaction refers to (a crash between its begin and the state's write)
            discard_tagged(self.root, TXN_TAG, keep)
        except (OSError, PylogError):
            pass

    def _restore(self, st: TxnState, pylog_txn: str) -> bool:
        """Re-attach an Ongoing transaction found at start to its pylog transaction (its
        staged records); False when that is gone (the caller aborts it)."""
        try:
            st.txn = Transaction(self.broker.store, txn_id=pylog_txn)
        except (OSError, PylogError):
            return False
        st.lost = False
        return True

    def _staging(self, st: TxnState, key: tuple[str, int], log: Any) -> Any:
        """The staging Log of ``key`` in ``st``'s open transaction (``log``: the partition's),
        reopened after a restart with its sequences: what the open transaction staged there
        runs from the durable first sequence for as many records as the staging holds."""
        assert st.txn is not None
        slog = st.txn._stager.log_for(key[0], key[1], log.config.max_record_bytes, timestamps="as-given")
        if key not in st.seqs and key in st.first:
            n = slog.next_offset - slog.start_offset
            s0 = st.first[key]
            st.seqs[key] = [(s0, (s0 + n - 1) & 0x7FFFFFFF)] if n else []
        return slog

    def _clear(self, st: TxnState) -> None:
        """Forget the open transaction's partitions, groups and offsets (no longer charged
        to the clients that added them)."""
        for client, n in st.held_by.items():
            self.limits.release(client, n)
        st.held_by.clear()
        st.refused = False
        st.partitions.clear()
        st.groups.clear()
        st.offsets.clear()
        st.first.clear()
        st.synced.clear()
        st.txn = None

    def _complete(self, st: TxnState, state: str) -> None:
        st.state = state
        self._clear(st)
        self._save(st)

    # -- the loop side ----------------------------------------------------------------------
    def start(self) -> None:
        """Start expiring transactions past their ``transaction.timeout.ms`` (on the loop)."""
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._expire_forever())

    async def close(self) -> None:
        """Stop the expiry; close the open transactions' staging Logs (kept on disk: the
        next start re-attaches them)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        for st in list(self._txns.values()):
            with st.lock:
                stager = st.txn._stager if st.txn is not None else None
                if stager is not None:
                    for log in list(stager._logs.values()):
                        try:
                            log.close()
                        except (OSError, PylogError):
                            pass
                    stager._logs.clear()

    async def _expire_forever(self) -> None:
        for st in [st for st in list(self._txns.values()) if st.state == PREPARE_COMMIT]:
            await self.broker.admin(self._finish_prepared, st)
        looked = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            if time.monotonic() - looked >= min(60.0, self.limits.id_expiration / 2):
                looked = time.monotonic()  # ids idle past their expiration (every minute at most)
                await self.broker.admin(self._expire_ids)
            now = time.time()
            for st in list(self._txns.values()):
                if st.state == ONGOING and now - st.started > st.timeout_ms / 1000:
                    await self.broker.admin(self._expire, st)
                elif st.state == PREPARE_COMMIT:  # one an I/O error stopped
                    await self.broker.admin(self._finish_prepared, st)

    def _finish_prepared(self, st: TxnState) -> int:
        """Complete a transaction in PrepareCommit: found so at start (its EndTxn(commit)
        was answered with nothing or not at all), or left so by an I/O error after its
        PrepareCommit was written. As in Kafka, a prepared commit completes; 0 once it has,
        else the error (it is tried again every half second)."""
        with st.lock:
            if st.state != PREPARE_COMMIT or st.txn is None:
                return 0
            try:
                code = self._commit(st, again=True)
            except (OSError, PylogError):
                return E.kafka_storage_error  # the pylog decision stands or not: tried again
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.broker.notify)
            return code

    def _expire(self, st: TxnState) -> None:
        with st.lock:
            if st.state == ONGOING and time.time() - st.started > st.timeout_ms / 1000:
                self._abort(st)
                st.lost = True
                self._save(st)

    # -- InitProducerId -----------------------------------------------------------------------
    def init_producer_id(self, req: Any, client: str = "") -> dict[str, Any]:
        """InitProducerId with a transactional id: a new producer id, or the id's epoch
        bumped (an open transaction of the id is aborted: the previous instance is fenced).
        ``client``: who asks (:class:`~pylog.serve.txn_limits.TxnLimits`): a new id is kept
        as that client's."""
        fail = {"producer_id": -1, "producer_epoch": -1}
        tid = req.transactional_id
        timeout = _ms(req.transaction_timeout)
        if not 0 < timeout <= MAX_TIMEOUT_MS:
            return {**fail, "error_code": E.invalid_transaction_timeout}
        pid_given = getattr(req, "producer_id", -1)
        epoch_given = getattr(req, "producer_epoch", -1)
        with self._lock:
            st = self._txns.get(tid)
            if st is None:
                if len(self._txns) >= self.limits.max_ids:  # an idle id of the biggest holder makes way
                    self._forget(self.limits.evictable(self._txns.values(), time.time(), full=True))
                    if len(self._txns) >= self.limits.max_ids:  # each has a transaction open
                        return {**fail, "error_code": E.concurrent_transactions}
                try:
                    st = TxnState(tid, self.broker.producers.new_id(), 0, timeout)
                    st.client = client
                    # an id forgotten before: its transactions' numbers go on (a restart
                    # judges a PrepareCommit by them)
                    st.seq = last_batch_id(self.root, SINK_PREFIX + tid) or 0
                    self._save(st)
                except OSError:
                    return {**fail, "error_code": E.kafka_storage_error}
                self._txns[tid] = st
                self._by_pid[st.pid] = st
                return {"error_code": 0, "producer_id": st.pid, "producer_epoch": 0}
        with st.lock:
            if self._txns.get(tid) is not st:  # forgotten meanwhile (idle): retriable, a new id next
                return {**fail, "error_code": E.concurrent_transactions}
            if pid_given >= 0 and (pid_given, epoch_given) != (st.pid, st.epoch):
                # KIP-360: only the current producer may bump its own epoch
                return {**fail, "error_code": E.producer_fenced}
            if st.state == PREPARE_COMMIT and self._finish_prepared(st):  # completed first
                return {**fail, "error_code": E.concurrent_transactions}  # retriable
            try:
                if st.state == ONGOING:
                    self._abort(st)
                old = st.pid
                if st.epoch >= 32766:  # epochs are int16: a new id
                    st.pid, st.epoch = self.broker.producers.new_id(), 0
                else:
                    st.epoch += 1
                st.timeout_ms = timeout
                st.lost = False
                st.seqs.clear()
                st.state = EMPTY
                self._save(st)
            except OSError:
                return {**fail, "error_code": E.kafka_storage_error}
            with self._lock:
                self._by_pid.pop(old, None)
                self._by_pid[st.pid] = st
            return {"error_code": 0, "producer_id": st.pid, "producer_epoch": st.epoch}

    def _forget(self, states: list[TxnState]) -> None:
        """Forget idle ids (no transaction open; under ``self._lock``): their state files
        go, and a request naming their producer id is answered as for an unknown one."""
        for st in states:
            if not st.lock.acquire(blocking=False):  # in use (and the lock order is st.lock, then _lock)
                continue
            try:
                if st.open:
                    continue
                try:
                    os.unlink(self._path(st.tid))
                except FileNotFoundError:
                    pass
                except OSError:
                    continue  # kept: the next look tries again
                self._txns.pop(st.tid, None)
                if self._by_pid.get(st.pid) is st:
                    del self._by_pid[st.pid]
            finally:
                st.lock.release()

    def _expire_ids(self) -> None:
        """Forget the ids idle past ``transactional.id.expiration.ms`` (an admin thread)."""
        with self._lock:
            self._forget(self.limits.evictable(list(self._txns.values()), time.time(), full=False))

    # -- checks -----------------------------------------------------------------------------
    def _check(self, tid: str, pid: int, epoch: int) -> tuple[TxnState | None, int]:
        """(state, 0) when ``pid``/``epoch`` is the id's current producer, else (None, code)."""
        st = self._txns.get(tid)
        if st is None or st.pid != pid:
            return None, E.invalid_producer_id_mapping
        if epoch < st.epoch:
            return None, E.producer_fenced
        if epoch > st.epoch:
            return None, E.invalid_producer_epoch
        if st.lost:
            return None, E.unknown_producer_id
        return st, 0

    def _begin(self, st: TxnState, owner: str) -> None:
        """Open a transaction (Empty or completed) for the id, begun by ``owner``; its
        state is written later."""
        if st.state != ONGOING:
            # external: no process holds it, so a restart's open keeps its staging
            txn = Transaction(self.broker.store, txn_id=begin_external(self.root, TXN_TAG))
            self._clear(st)
            st.state = ONGOING
            st.started = time.time()
            st.owner = owner
            st.txn = txn

    # -- AddPartitionsToTxn, AddOffsetsToTxn --------------------------------------------------
    def add_partitions(self, req: Any, owner: str = "") -> dict[str, Any]:
        """AddPartitionsToTxn (v0-3): the partitions the open transaction may write.
        ``owner``: the client asking (a SASL user or an IP address), whom a new transaction's
        partitions are charged to (:class:`~pylog.serve.txn_limits.TxnLimits`)."""
        topics = req.v3_and_below_topics
        wanted = [(t.name, p) for t in topics for p in t.partitions]
        codes: dict[tuple[str, int], int] = {}
        st, err = self._check(req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                              req.v3_and_below_producer_epoch)
        if st is not None:
            with st.lock:
                if self._txns.get(st.tid) is not st:  # forgotten meanwhile (idle)
                    err = E.invalid_producer_id_mapping
                elif st.state not in (EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT):
                    err = E.concurrent_transactions
                else:
                    for key in wanted:
                        codes[key] = self._partition_error(*key)
                    if any(codes.values()):  # Kafka: the others are not attempted
                        codes = {k: c or E.operation_not_attempted for k, c in codes.items()}
                    else:
                        ongoing = st.state == ONGOING
                        new = set(wanted) - st.partitions if ongoing else set(wanted)
                        code = self.limits.take(owner, st.held if ongoing else 0, len(new))
                        if code:
                            codes = dict.fromkeys(wanted, code)
                            st.refused = True  # the client aborts: EndTxn(abort) answered 0
                        else:
                            try:
                                self._begin(st, owner)
                            except (OSError, PylogError):
                                self.limits.release(owner, len(new))
                                codes = dict.fromkeys(wanted, E.kafka_storage_error)
                            else:
                                st.held_by[owner] += len(new)
                                st.partitions |= new
                                try:
                                    if new:
                                        self._save(st)
                                except OSError:
                                    codes = dict.fromkeys(wanted, E.kafka_storage_error)
        return {"results_by_topic_v3_and_below": [
            {"name": t.name, "results_by_partition": [
                {"partition_index": p, "partition_error_code": codes.get((t.name, p), err)} for p in t.partitions]}
            for t in topics]}

    def _partition_error(self, topic: str, p: int) -> int:
        try:
            t = self.broker.topic(topic)
        except (UnknownTopicError, InvalidNameError):
            return E.unknown_topic_or_partition
        return 0 if 0 <= p < t.partitions else E.unknown_topic_or_partition

    def add_offsets(self, req: Any, owner: str = "") -> dict[str, Any]:
        """AddOffsetsToTxn: the group whose offsets the transaction commits (``owner``: as
        for :meth:`add_partitions`)."""
        try:
            check_name(req.group_id, "group")
        except InvalidNameError:
            return {"error_code": E.invalid_group_id}
        st, err = self._check(req.transactional_id, req.producer_id, req.producer_epoch)
        if st is None:
            return {"error_code": err}
        with st.lock:
            if self._txns.get(st.tid) is not st:  # forgotten meanwhile (idle)
                return {"error_code": E.invalid_producer_id_mapping}
            if st.state not in (EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT):
                return {"error_code": E.concurrent_transactions}  # a commit being completed
            ongoing = st.state == ONGOING
            more = 0 if ongoing and req.group_id in st.groups else 1  # a group counts as a partition
            code = self.limits.take(owner, st.held if ongoing else 0, more)
            if code:
                st.refused = True
                return {"error_code": code}
            try:
                self._begin(st, owner)
            except (OSError, PylogError):
                self.limits.release(owner, more)
                return {"error_code": E.kafka_storage_error}
            st.held_by[owner] += more
            try:
                if req.group_id not in st.groups:
                    st.groups.add(req.group_id)
                    self._save(st)
            except OSError:
                return {"error_code": E.kafka_storage_error}
        return {"error_code": 0}

    # -- TxnOffsetCommit -----------------------------------------------------------------------
    def _member_error(self, req: Any) -> int:
        """The group coordinator's check of the member (KIP-447, v3: a dict lookup, safe off
        the loop), 0 when the request names none or the group is not live."""
        member = getattr(req, "member_id", "")
        generation = getattr(req, "generation_id", -1)
        g = self.groups.groups.get(req.group_id) if self.groups is not None else None
        if self.groups is None or g is None or not g.members or (not member and generation < 0):
            return 0
        _g, err = self.groups._check_member(req.group_id, member, generation)
        return int(err)

    def txn_offset_commit(self, req: Any, client: str = "") -> dict[str, Any]:
        """TxnOffsetCommit: offsets that the group gets when the transaction commits
        (``client``: who asks, charged for the offsets it adds)."""
        st, err = self._check(req.transactional_id, req.producer_id, req.producer_epoch)
        err = err or self._member_error(req)
        codes: dict[tuple[str, int], int] = {}
        if st is not None and not err:
            with st.lock:
                if st.state != ONGOING or req.group_id not in st.groups:
                    err = E.invalid_txn_state  # (AddOffsetsToTxn first)
                else:
                    good: dict[tuple[str, str, int], tuple[int, int, str]] = {}
                    for t in req.topics:
                        for p in t.partitions:
                            code = self._partition_error(t.name, p.partition_index)
                            meta = p.committed_metadata or ""
                            if not code and p.committed_offset < 0:
                                code = E.invalid_request
                            if not code and len(meta) > 4096:
                                code = E.offset_metadata_too_large
                            if not code:
                                good[(req.group_id, t.name, p.partition_index)] = (
                                    p.committed_offset, getattr(p, "committed_leader_epoch", -1), meta)
                            codes[(t.name, p.partition_index)] = code
                    more = len(good.keys() - st.offsets.keys())  # each offset held counts as a partition
                    refused = self.limits.take(client, st.held, more)
                    if refused:
                        codes = {k: c or refused for k, c in codes.items()}
                    else:
                        st.held_by[client] += more
                        st.offsets.update(good)
        return {"topics": [{"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": codes.get((t.name, p.partition_index), err)}
            for p in t.partitions]} for t in req.topics]}

    def _write_offsets(self, st: TxnState) -> None:
        now = time.time_ns() // 1_000_000
        for (group, topic, p), (off, epoch, meta) in sorted(st.offsets.items()):
            try:
                path = os.path.join(self.broker.topic(topic).path, CONSUMERS_DIR, group, f"partition-{p}.offset")
            except (UnknownTopicError, InvalidNameError):
                continue  # deleted since
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fileutil.atomic_write(path, encode_offset(off, now, meta, epoch))

    # -- EndTxn -------------------------------------------------------------------------------
    def end_txn(self, req: Any) -> dict[str, Any]:
        """EndTxn: commit (every staged record appended at once, the offsets written) or
        abort (the staging discarded). A retry of the one that completed is answered 0."""
        tid, commit = req.transactional_id, bool(req.committed)
        st = self._txns.get(tid)
        if st is not None and st.lost and commit is False and st.pid == req.producer_id \
                and st.epoch == req.producer_epoch:
            with st.lock:  # aborted by the broker already: the abort the client asks for
                if self._txns.get(tid) is not st:  # forgotten meanwhile (idle)
                    return {"error_code": E.invalid_producer_id_mapping}
                st.lost = False
                try:
                    self._complete(st, COMPLETE_ABORT)
                except OSError:
                    return {"error_code": E.kafka_storage_error}
                return {"error_code": 0}
        st, err = self._check(tid, req.producer_id, req.producer_epoch)
        if st is None:
            return {"error_code": err}
        with st.lock:
            if st.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
                return {"error_code": 0}  # a retry
            if st.state == PREPARE_COMMIT:  # a commit an I/O error or a restart left: completed now
                code = self._finish_prepared(st)
                return {"error_code": code if commit or code else E.invalid_txn_state}
            if not commit and st.refused and st.state != ONGOING:
                st.refused = False  # the abort of a transaction a bound refused to begin: nothing to do
                return {"error_code": 0}
            if st.state != ONGOING:
                return {"error_code": E.invalid_txn_state}
            try:
                if not commit:
                    self._abort(st)
                    self._save(st)
                    return {"error_code": 0}
                code = self._commit(st)
                if not code and self._loop is not None:  # wake the fetches waiting for data
                    self._loop.call_soon_threadsafe(self.broker.notify)
                return {"error_code": code}
            except OSError:
                return {"error_code": E.kafka_storage_error}

    def _abort(self, st: TxnState) -> None:
        if st.txn is not None:
            try:
                st.txn.abort()
            except PylogError:
                pass
        st.state = COMPLETE_ABORT
        self._clear(st)

    def _commit(self, st: TxnState, again: bool = False) -> int:
        tx = st.txn
        assert tx is not None
        keys = sorted(st.partitions)
        try:
            for key in keys:  # staged before a restart, not reopened since
                if os.path.isdir(os.path.join(tx._stager.dir, tx._stager.contributor, key[0], str(key[1]))):
                    plog, err = self.broker.partition(*key)
                    if plog is None:
                        return err
                    self._staging(st, key, plog)
        except PylogError:
            return E.kafka_storage_error
        if not again:  # (again: PrepareCommit written before a restart, or an I/O error since)
            st.seq += 1
            st.state = PREPARE_COMMIT
            try:
                self._save(st)  # with the offsets: a restart completes them
            except OSError:
                st.seq -= 1  # not prepared: the client's retry commits it
                st.state = ONGOING
                raise
        broker = self.broker
        gates = [broker._gate(k) for k in keys]
        entered = []
        try:
            # no idempotent batch between its intent and its records meanwhile
            for g in gates:
                g.enter(exclusive=True)
                entered.append(g)
            try:
                if tx.state == "open":  # (committed already: an I/O error came after)
                    tx.set_sink(SINK_PREFIX + st.tid, st.seq)
                    tx.commit()
            except (TransactionError, PylogError, OSError):
                if tx.state != "committed":  # before the commit point: nothing shows
                    st.seq -= 1
                    self._abort(st)
                    st.lost = True
                    self._save(st)
                    return E.unknown_producer_id  # abortable: the client aborts and retries
            for key in keys:  # what the broker acknowledged now includes the records
                log = broker.ready(*key)
                if log is not None:
                    broker._acked[key] = max(broker._acked.get(key, 0), log.next_offset)
                broker._last_ts.pop(key, None)
        finally:
            for g in reversed(entered):
                g.leave(exclusive=True)
        self._write_offsets(st)
        self._complete(st, COMPLETE_COMMIT)
        return 0

    # -- Produce ------------------------------------------------------------------------------
    def produce(self, name: str, i: int, records: Any, budget: Budget | None) -> tuple[int, int, int]:
        """Stage one partition's transactional batches (an append thread): (error, base
        offset: -1, the records have none until the commit, log start offset)."""
        prod = batch_producer(records)
        if prod is None:  # no producer id: no transaction can hold it
            return E.invalid_txn_state, -1, -1
        if prod[3] < 0:
            return E.invalid_record, -1, -1
        pid, epoch, first, count = prod
        st = self._by_pid.get(pid)
        if st is None:
            return E.unknown_producer_id, -1, -1
        with st.lock:
            if epoch < st.epoch:
                return E.invalid_producer_epoch, -1, -1
            if epoch > st.epoch:
                return E.invalid_producer_epoch, -1, -1
            if st.lost:
                return E.unknown_producer_id, -1, -1
            key = (name, i)
            if st.state != ONGOING or key not in st.partitions or st.txn is None:
                return E.invalid_txn_state, -1, -1  # KIP-890: never into a transaction it was not added to
            log, err = self.broker._writable(name, i)
            if log is None:
                return err, -1, -1
            start = self.broker.starts.start(name, i, log)
            last = (first + count - 1) & 0x7FFFFFFF
            try:
                slog = self._staging(st, key, log)
            except (PylogError, OSError):
                return E.kafka_storage_error, -1, -1
            batches = st.seqs.get(key)
            if batches:
                if (first, last) in batches or any(a <= first <= last <= b for a, b in batches):
                    return 0, -1, start  # a retry: staged already
                if first != (batches[-1][1] + 1) & 0x7FFFFFFF:
                    return E.out_of_order_sequence_number, -1, -1
            try:
                d = decode_records(records, budget or Budget(self.broker.max_decompressed_bytes))
            except BatchError as e:
                return e.code, -1, -1
            if log.config.cleanup_policy == "compact":
                check_keyed(d, f"{name}-{i}")  # RecordErrors: answered per record
            now = int(time.time() * 1000)
            ts = d.timestamps
            if d.log_append_time or log.config.timestamps == "append-time":
                ts[:] = now
            else:
                ts[ts < 0] = now
                try:
                    log.config.check_time_bounds(int(ts.min()), int(ts.max()), now)
                except InvalidTimestampError:
                    return E.invalid_timestamp, -1, -1
            try:
                if key not in st.first:  # durable before the records: a restart counts from it
                    st.first[key] = first
                    self._save(st)
                slog.append_batch(PackedBytes(*d.values), keys=PackedBytes(*d.keys),
                                  timestamps=np.ascontiguousarray(ts, dtype=np.int64),
                                  metadata=PackedBytes(*d.headers))
                # acknowledged as a plain append is: synced under fsync="always" (the
                # staging's directories too, once), else handed to the OS (a killed broker
                # keeps them; the restart re-attaches them)
                if log.config.fsync == "always":
                    slog.flush()
                    if key not in st.synced:
                        for dpath in (slog.path, os.path.dirname(slog.path),
                                      os.path.dirname(os.path.dirname(slog.path)), st.txn.dir):
                            fileutil.fsync_dir(dpath)
                        st.synced.add(key)
                else:
                    slog.write_out()
            except RecordTooLargeError:
                return E.message_too_large, -1, -1
            except (PylogError, OSError):
                return E.kafka_storage_error, -1, -1
            batches = st.seqs.setdefault(key, [])
            batches.append((first, last))
            del batches[:-_KEEP]
            return 0, -1, start

    # -- what DescribeTransactions and ListTransactions show (txn_handlers.py) ----------------
    def known(self, tid: str) -> TxnState | None:
        """The state of transactional id ``tid``, None if the broker does not know it."""
        return self._txns.get(tid)

    def states(self) -> list[TxnState]:
        """The state of every transactional id known."""
        return list(self._txns.values())
