"""Transactions: records for several topics and partitions that become visible together, or
never (:meth:`pylog.LogStore.transaction`).

>>> import pylog, tempfile
>>> with pylog.LogStore(tempfile.mkdtemp()) as store:
...     _ = store.create_topic("orders", partitions=2)
...     _ = store.create_topic("audit")
...     with store.transaction() as tx:
...         tx.append("orders", b"o-1", key=b"k")
...         tx.append("audit", b"a-1")
0
0
>>> tx.offsets
{('audit', 0): 0, ('orders', 0): 0}

Layout under the data root::

    ROOT/~txn/
      ID/                         one transaction (ID: 32 hex digits)
        owner.lock                flock held by the process that opened it, until it ends
        external                  instead of owner.lock: coordinated elsewhere (Spark's driver)
        C/TOPIC/P/                a staging Log per contributor C and target partition P
        decision.json             the commit decision: written once, atomically
      sinks.json                  {sink id: last committed batch id} (streaming sinks)
      visible                     a random token, rewritten just before a transaction shows
    ROOT/TOPIC/partition-P/txn.stable   until the transaction shows: the last stable offset

How a commit goes (:meth:`Transaction.commit`):

1. Every contributor's staged records are durable (each staging Log is flushed when its
   contributor prepares). Nothing has touched a partition yet.
2. The committer opens each target partition for writing (its writer lock keeps other
   processes' writers out) and takes each one's in-process lock, in a fixed order; plain
   appends from this process wait until the commit ends. It flushes each partition (so the
   offset where the transaction's records will start is durable) and writes the partition's
   marker ``txn.stable`` holding that offset: from now on every reader stops there.
3. It writes ``decision.json``: per partition, the start offset, the staged Logs and their
   record counts, and the sink batch ids. **This rename is the commit point.**
4. It applies each partition (one run of ``append_batch`` calls) and flushes it; then
   records the sink batch ids in ``sinks.json``.
5. It *publishes* the transaction (``_publish``): rewrites ``ROOT/~txn/visible`` with a
   new token and renames the transaction's directory away. **This rename is the moment the
   transaction shows, in every partition at once**: a reader hides what follows a marker only while the marker's
   transaction directory is there, and reads the token before and after it looks at the
   files, looking again when it changed (:func:`pylog.loader.visible_cap`). Then the
   markers are removed and the staging deleted.

A crash before step 3 leaves no decision: the next :class:`~pylog.LogStore` open discards the
staging of a transaction whose owner is gone, and the next writer of a partition removes a
marker that names an undecided transaction (nothing after it belongs to the transaction). A
crash after step 3: the next writer of a partition that still has an unapplied marker (a
store open, or any ``Log`` writer: the roll forward, :mod:`pylog.txnrecovery`, hooks into
:mod:`pylog.log`) cuts the partition back to the decision's start offset, applies its staged
records again and marks the marker applied (that writer's later appends are never cut);
whoever applies the last partition publishes the transaction (step 5). Re-applying is
idempotent because the decision's start offsets say exactly where the transaction's records go.
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pylog import columnar, fileutil, vfs
from pylog.errors import (
    ArgumentTypeError,
    CorruptRecordError,
    InvalidArgumentError,
    InvalidTimestampError,
    TransactionError,
    UnknownTopicError,
)
from pylog.loader import STABLE_FILE, TXN_DIR, VISIBLE_FILE, drop_stable_file, fence_unfinished, visibility_token
from pylog.log import Log
from pylog.txnio import Syncs, remove_later, wait_removals

if TYPE_CHECKING:
    from pylog.topics import LogStore

__all__ = ["Transaction", "TransactionError", "Stager", "StagedPart", "last_batch_id", "begin_external",
           "discard", "discard_tagged", "consistent", "TXN_DIR", "wait_removals"]

_T = TypeVar("_T")

# TXN_DIR ("~txn": "~" cannot occur in a topic name) is defined in pylog.loader, whose
# read-only refresh looks there to tell whether a marker's transaction has finished
DECISION_FILE = "decision.json"
OWNER_LOCK = "owner.lock"
EXTERNAL_FILE = "external"
SINKS_FILE = "sinks.json"
SINKS_LOCK = "sinks.lock"
_NEW_PREFIX = ".new-"
_DONE_PREFIX = ".done-"
#: An externally coordinated transaction (Spark) untouched this long is discarded at open.
ABANDON_SECONDS = 7 * 24 * 3600
#: Records per append_batch call of an apply, and bytes per column of one call (more only
#: for a single record); several contributors of one partition are read in chunks of a
#: share of these each (pylog.columnar.merged_logs), whatever they staged.
_APPLY_CHUNK = 1 << 16
_APPLY_BYTES = 64 << 20

#: What a contributor staged for one target partition: (topic, partition, path of its
#: staging Log relative to the transaction's directory, record count). Picklable.
StagedPart = tuple[str, int, str, int]



def batch_arguments(values: Any, keys: Any) -> tuple[list[Any], list[Any] | None, int]:
    """``(values, keys, n)`` of a batch append as lists, checked: values a non-empty sequence
    (not one bytes-like), keys None or a sequence of the same length. Shared by
    :meth:`pylog.Topic.append_batch` and :meth:`Transaction.append_batch`."""
    if isinstance(values, (bytes, bytearray, memoryview, str)):
        raise ArgumentTypeError("values must be a sequence of bytes-likes, not a single value")
    values = list(values)
    n = len(values)
    if n == 0:
        raise InvalidArgumentError("append_batch needs at least one value")
    if keys is not None:
        if isinstance(keys, (bytes, bytearray, memoryview, str)):
            raise ArgumentTypeError("keys must be a sequence, not a single value")
        keys = list(keys)
        if len(keys) != n:
            raise InvalidArgumentError(f"keys has {len(keys)} items, values has {n}")
    return values, keys, n

def _txn_root(root: str) -> str:
    return os.path.join(root, TXN_DIR)


def _mode(topic: Any) -> str | None:
    """The staging Logs' ``timestamps`` for records of ``topic``: as given when the topic
    keeps them so (the apply then keeps them as staged), else the default (the apply makes
    them never decrease in the partition)."""
    return "as-given" if topic.config.timestamps == "as-given" else None


def _check_id(txn_id: Any) -> str:
    if not isinstance(txn_id, str) or len(txn_id) != 32 or any(c not in "0123456789abcdef" for c in txn_id):
        raise InvalidArgumentError(f"transaction id must be 32 lowercase hex digits, got {txn_id!r}")
    return txn_id


def _read_json(path: str) -> Any:
    data = fileutil.read_if_exists(path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError as e:
        raise CorruptRecordError(path, 0, None, f"unreadable ({e})") from None


# ----------------------------------------------------------------------------------------
# staging
class Stager:
    """One contributor's staged records of transaction ``txn_id`` under ``root`` (one
    staging :class:`~pylog.Log` per target partition). Another process may stage into the
    same transaction (a Spark task does); :meth:`prepare` makes the records durable and
    returns the :data:`StagedPart` list the committer passes to
    :meth:`Transaction.add_staged`."""

    def __init__(self, root: str, txn_id: str, contributor: str | None = None) -> None:
        self.root = os.fspath(root)
        self.txn_id = _check_id(txn_id)
        self.dir = os.path.join(_txn_root(self.root), txn_id)
        if not os.path.isdir(self.dir):
            raise TransactionError(f"transaction {txn_id} does not exist (ended or discarded)")
        self.contributor = contributor or uuid.uuid4().hex
        self._logs: dict[tuple[str, int], Log] = {}
        self._syncs = Syncs()

    def log_for(self, topic: str, partition: int, max_record_bytes: int | None = None,
                timestamps: str | None = None) -> Log:
        """The staging :class:`~pylog.Log` of ``topic``/``partition`` (made on first use;
        ``max_record_bytes`` should be the target topic's, so a record the partition would
        refuse is refused now, before any commit; ``timestamps``: the staging Log's mode,
        ``"as-given"`` to stage timestamps in any order, the apply orders them as the
        target partition's mode says). Append to it directly for bulk staging."""
        return self._log(topic, partition, max_record_bytes, timestamps)

    def written(self, log: Log) -> None:
        """Say that records were appended to staging Log ``log`` directly: their fdatasync
        begins on a worker thread (unless one of that Log is under way), so the disk writes
        them while more are staged and :meth:`prepare` waits less."""
        self._syncs.kick(log)

    def _log(self, topic: str, partition: int, max_record_bytes: int | None, timestamps: str | None = None) -> Log:
        key = (topic, partition)
        log = self._logs.get(key)
        if log is None:
            rel = os.path.join(self.contributor, topic, str(partition))
            path = os.path.join(self.dir, rel)
            opts: dict[str, Any] = {"fsync": "never", "flush_ms": None}
            if max_record_bytes is not None:
                opts["max_record_bytes"] = max_record_bytes
            if timestamps is not None:
                opts["timestamps"] = timestamps
            # Never recreate the directory of a transaction discarded meanwhile: an external
            # one's contributors hold its "external" file shared while they make a staging
            # Log, and discard() holds it exclusively while it deletes.
            try:
                fd = os.open(os.path.join(self.dir, EXTERNAL_FILE), os.O_RDONLY)
            except FileNotFoundError:
                fd = -1
                if not os.path.exists(os.path.join(self.dir, OWNER_LOCK)):
                    raise TransactionError(f"transaction {self.txn_id} was aborted") from None
            try:
                if fd >= 0:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    if os.fstat(fd).st_nlink == 0:
                        raise TransactionError(f"transaction {self.txn_id} was aborted")
                log = self._logs[key] = Log(path, **opts)
            finally:
                if fd >= 0:
                    os.close(fd)
        return log

    def append(self, topic: str, partition: int, value: Any, key: Any = None, metadata: Any = None,
               timestamp: int | None = None, max_record_bytes: int | None = None, mode: str | None = None) -> None:
        """Stage one record for ``topic``/``partition`` (checked as :meth:`pylog.Log.append`;
        ``mode``: the staging Log's ``timestamps``, as :meth:`log_for`)."""
        self._log(topic, partition, max_record_bytes, mode).append(value, key, metadata, timestamp)

    def append_batch(self, topic: str, partition: int, values: Any, keys: Any = None, timestamps: Any = None,
                     metadata: Any = None, max_record_bytes: int | None = None, mode: str | None = None) -> None:
        """Stage records for ``topic``/``partition`` (as :meth:`pylog.Log.append_batch`;
        ``mode``: the staging Log's ``timestamps``, as :meth:`log_for`)."""
        self._log(topic, partition, max_record_bytes, mode).append_batch(values, keys, timestamps, metadata)

    def prepare(self) -> list[StagedPart]:
        """Make every staged record durable and close the staging Logs; returns what was
        staged. The Stager cannot be used afterwards."""
        out: list[StagedPart] = []
        dirs = set()
        self._syncs.wait()  # the early syncs' failures fail the prepare
        for (topic, p), log in sorted(self._logs.items()):
            count = log.next_offset - log.start_offset
            log.flush()
            log.close()
            out.append((topic, p, os.path.join(self.contributor, topic, str(p)), count))
            dirs.add(os.path.dirname(log.path))
        for d in sorted(dirs):
            fileutil.fsync_dir(d)
        if dirs:
            fileutil.fsync_dir(os.path.join(self.dir, self.contributor))
            fileutil.fsync_dir(self.dir)
        self._logs.clear()
        return out

    def discard(self) -> None:
        """Close the staging Logs and remove what this contributor staged."""
        self._syncs.wait(check=False)
        for log in self._logs.values():
            try:
                log.close()
            except Exception:
                pass
        self._logs.clear()
        shutil.rmtree(os.path.join(self.dir, self.contributor), ignore_errors=True)


# ----------------------------------------------------------------------------------------
# the transaction
class Transaction:
    """An atomic group of appends to topics of one :class:`~pylog.LogStore`.

    Made by :meth:`pylog.LogStore.transaction`. Use it as a context manager: it commits when
    the block ends and aborts when the block raises. Records are staged durably under the
    data root and appended to the partitions only at commit, all of them or (a crash before
    the commit point) none; no reader in any process sees a record of an open, aborted or
    crashed transaction. Not thread-safe: one thread uses a transaction.

    Attributes
    ----------
    id
        The transaction id (32 hex digits); other processes stage into it with
        :class:`Stager` ``(root, id)``.
    offsets
        After a commit: ``{(topic, partition): first offset}`` of the records it appended.
    state
        ``"open"``, ``"committed"`` or ``"aborted"``.
    """

    def __init__(self, store: LogStore, *, txn_id: str | None = None) -> None:
        self.store = store
        self.root = store.root
        self._lock_fd = -1
        if txn_id is None:
            self.id = uuid.uuid4().hex
            self.dir, self._lock_fd = _create_dir(self.root, self.id, None)
        else:  # adopt a transaction begun elsewhere (begin_external)
            self.id = _check_id(txn_id)
            self.dir = os.path.join(_txn_root(self.root), self.id)
            if not os.path.isfile(os.path.join(self.dir, EXTERNAL_FILE)):
                raise TransactionError(f"transaction {self.id} does not exist (ended or discarded)")
        self._late_error = False
        self.state = "open"
        self.offsets: dict[tuple[str, int], int] = {}
        self._stager = Stager(self.root, self.id, "local")
        self._extra: list[StagedPart] = []
        self._sinks: dict[str, int] = {}
        self._rr: dict[str, Any] = {}
        self._ids: dict[str, str | None] = {}  # the id of each topic records were staged for

    # -- staging -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.state != "open":
            raise TransactionError(f"transaction {self.id} is {self.state}")

    def _target(self, topic: str, key: Any, partition: int | None) -> tuple[Any, int]:
        t = self.store.topic(topic)
        self._ids.setdefault(topic, t.id)
        if partition is not None:
            return t, t._check_partition(partition)
        if key is None:
            rr = self._rr.get(topic)
            if rr is None:
                rr = self._rr[topic] = itertools.count(next(t._rr))
            return t, next(rr) % t.partitions
        return t, t.partition_for(key)

    def append(self, topic: str, value: Any, key: Any = None, partition: int | None = None,
               metadata: Any = None, timestamp: int | None = None) -> int:
        """Stage one record for ``topic``; returns the partition it will go to (picked as
        :meth:`pylog.Topic.append` does). Its offset is known after the commit
        (:attr:`offsets`). Bad input raises as ``Log.append`` would, and stages nothing."""
        self._check_open()
        t, p = self._target(topic, key, partition)
        self._stager.append(topic, p, value, key, metadata, timestamp, t.config.max_record_bytes, _mode(t))
        return p

    def append_batch(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None = None,
                     partition: int | None = None, timestamps: Sequence[int] | None = None,
                     metadata: Sequence[Any] | None = None) -> list[int]:
        """Stage many records for ``topic``; returns the partition of each (records with a
        key go where it hashes; without keys the whole batch goes to one partition unless
        ``partition`` is given), as :meth:`pylog.Topic.append_batch` picks them."""
        self._check_open()
        values, keys, n = batch_arguments(values, keys)
        for name, seq in (("timestamps", timestamps), ("metadata", metadata)):
            if seq is not None and len(seq) != n:
                raise InvalidArgumentError(f"{name} has {len(seq)} items, values has {n}")
        if partition is not None or keys is None or all(k is None for k in keys):
            t, p = self._target(topic, None, partition)
            self._stager.append_batch(topic, p, values, keys, timestamps, metadata, t.config.max_record_bytes,
                                      _mode(t))
            return [p] * n
        t = self.store.topic(topic)
        _t, rr = self._target(topic, None, None)
        parts = [rr if k is None else t.partition_for(k) for k in keys]
        arr = np.asarray(parts)
        for p in np.unique(arr).tolist():
            idx = np.flatnonzero(arr == p).tolist()
            def sub(seq: Any, idx: list[int] = idx) -> list[Any] | None:
                return None if seq is None else [seq[j] for j in idx]
            self._stager.append_batch(topic, p, [values[j] for j in idx], sub(keys), sub(timestamps),
                                      sub(metadata), t.config.max_record_bytes, _mode(t))
        return parts

    def add_staged(self, parts: Iterable[StagedPart], topic_ids: dict[str, str | None] | None = None) -> None:
        """Include records other contributors staged (what their :meth:`Stager.prepare`
        returned) in this transaction; ``topic_ids``: the id each topic had when they staged
        (``Topic.id``), so the commit refuses a topic deleted and created again since."""
        self._check_open()
        for topic, tid in (topic_ids or {}).items():
            self._ids.setdefault(str(topic), tid)
        for part in parts:
            topic, p, rel, count = part
            if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split(os.sep):
                raise InvalidArgumentError(f"staged part {part!r} names a path outside the transaction")
            if not os.path.isdir(os.path.join(self.dir, rel)):
                raise TransactionError(f"transaction {self.id}: staged records {rel!r} are missing")
            self._extra.append((str(topic), int(p), rel, int(count)))

    def set_sink(self, sink_id: str, batch_id: int) -> None:
        """Record ``batch_id`` as sink ``sink_id``'s last committed batch, atomically with
        the records (a streaming sink skips batches it already committed:
        :func:`last_batch_id`)."""
        self._check_open()
        self._sinks[str(sink_id)] = int(batch_id)

    # -- ending ------------------------------------------------------------------------------
    def commit(self) -> dict[tuple[str, int], int]:
        """Make every staged record visible, atomically; returns :attr:`offsets`.

        Raises TransactionError (and aborts) when a staged record's topic or partition is
        gone, LogLockedError (and aborts) when another process writes a target partition. A
        failure after the commit point (an I/O error while applying) raises, but the
        transaction stays committed: the partition's next writer finishes it.
        """
        self._check_open()
        try:
            parts = self._stager.prepare() + self._extra
            decided = self._decide(parts)
        except BaseException:
            if self.state == "open":
                self._abort_quietly()
            raise
        self.state = "committed"
        self._finish(decided)
        self._release()
        return self.offsets

    def _decide(self, parts: list[StagedPart]) -> list[tuple[Log, dict[str, Any]]]:
        by_part: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for topic, p, rel, count in parts:
            if count:
                by_part.setdefault((topic, p), []).append((rel, count))
        logs: list[tuple[Log, dict[str, Any]]] = []
        for (topic, p), staged in sorted(by_part.items()):
            try:
                t = self.store.topic(topic)
            except UnknownTopicError:
                raise TransactionError(f"transaction {self.id}: topic {topic!r} does not exist") from None
            if self._ids.get(topic, t.id) != t.id:  # never into a topic created again under the name
                raise TransactionError(f"transaction {self.id}: topic {topic!r} was deleted since records were staged")
            if not 0 <= p < t.partitions:
                raise TransactionError(f"transaction {self.id}: topic {topic!r} has no partition {p}")
            logs.append((t.partition(p), {"topic": topic, "partition": p, "staged": staged}))
        held: list[Log] = []
        marked: list[Log] = []
        try:
            for log, _entry in logs:
                log._lock.acquire()
                held.append(log)
            for log, entry in logs:
                log.flush()  # the start offset must be durable: a recovery never cuts below it
                entry["start"] = log.next_offset
                if self._late_error:
                    _check_late(log, self.dir, entry)
            for log, entry in logs:
                fileutil.atomic_write(os.path.join(log.path, STABLE_FILE),
                                      json.dumps({"txn": self.id, "start": entry["start"]}).encode())
                log._cap = entry["start"]
                marked.append(log)
            decision = {"version": 1, "txn": self.id, "partitions": [e for _l, e in logs], "sinks": self._sinks}
            fileutil.atomic_write(os.path.join(self.dir, DECISION_FILE),
                                  json.dumps(decision, sort_keys=True).encode())  # the commit point
        except BaseException as e:
            decided = os.path.exists(os.path.join(self.dir, DECISION_FILE))
            if not decided:  # every held one: a marker's write may fail after its rename
                for log in held:
                    drop_stable_file(log)
            if decided:  # the decision's rename happened: it stands, the markers stay
                for log in marked:
                    fence_unfinished(log, self.id, e)
            for log in reversed(held):
                log._lock.release()
            if decided:
                self.state = "committed"
                raise TransactionError(f"transaction {self.id} is committed, but failed after its commit point "
                                       f"({e}); it finishes when its partitions are next opened") from e
            raise
        self._held = held
        return logs

    def _finish(self, logs: list[tuple[Log, dict[str, Any]]]) -> None:
        done = None
        try:
            try:
                # each partition's fdatasync runs while the next one (or its next chunk) is
                # applied; a transaction of one chunk in one partition has nothing to
                # overlap: a worker thread would only add to its commit (about 10%)
                one = len(logs) == 1 and sum(c for _rel, c in logs[0][1]["staged"]) <= _APPLY_CHUNK
                with contextlib.nullcontext() if one else Syncs() as syncs:
                    for log, entry in logs:
                        _apply(log, self.dir, entry, syncs)
                        self.offsets[(entry["topic"], entry["partition"])] = entry["start"]
                for log, _entry in logs:
                    log.flush()  # its data synced already: this marks it durable
                _record_sinks(self.root, self._sinks)
                done = _publish(self.dir)  # the transaction shows, everywhere at once
            except BaseException as e:
                # not shown: every partition's marker stays, and its next writer applies
                # the transaction again from the start (no append may come between)
                for log, _entry in logs:
                    fence_unfinished(log, self.id, e)
                raise
            for log, _entry in logs:  # this process's readers: all at once, then the files
                log._cap = None
            for log, _entry in logs:
                drop_stable_file(log)
        finally:
            for log in reversed(self._held):
                log._lock.release()
            self._held = []
        if done is not None:
            remove_later(done)

    def abort(self) -> None:
        """Discard every staged record (nothing was visible). Aborting twice is harmless; a
        committed transaction cannot be aborted (TransactionError)."""
        if self.state == "aborted":
            return
        if self.state == "committed":
            raise TransactionError(f"transaction {self.id} is committed")
        self._abort_quietly()

    def _abort_quietly(self) -> None:
        self.state = "aborted"
        self._stager.discard()
        discard(self.root, self.id)
        self._release()

    def _release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.state != "open":
            return
        if exc_type is None:
            self.commit()
        else:
            self._abort_quietly()

    def __repr__(self) -> str:
        return f"<pylog.Transaction {self.id} {self.state}>"


def _create_dir(root: str, txn_id: str, external: str | None) -> tuple[str, int]:
    """Make transaction ``txn_id``'s directory, whole: built under a temporary name, with
    its ``owner.lock`` flocked (local; the descriptor holding the flock is returned, the
    flock follows the file through the rename) or its ``external`` file holding
    ``external``, then renamed into place. Returns (directory, descriptor or -1)."""
    base = _txn_root(root)
    vfs.makedirs(base)
    tmp = os.path.join(base, _NEW_PREFIX + txn_id)
    vfs.mkdir(tmp, 0o755)
    fd = -1
    try:
        if external is not None:
            with open(os.path.join(tmp, EXTERNAL_FILE), "wb") as f:
                f.write(external.encode())
        else:
            fd = vfs.open(os.path.join(tmp, OWNER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        final = os.path.join(base, txn_id)
        vfs.rename(tmp, final)
        fileutil.fsync_dir(base)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, fd


def begin_external(root: str, tag: str = "") -> str:
    """Begin a transaction coordinated outside a :class:`~pylog.LogStore` (a Spark job's
    driver): its directory is made and its id returned; contributors stage into it with
    :class:`Stager`, and the coordinator commits it with ``Transaction(store, txn_id=id)``
    or discards it with :func:`discard`. ``tag`` (e.g. a sink id) is kept with it
    (:func:`discard_tagged`). Nobody holds it open, so a store open discards it only when
    nothing in it changed for :data:`ABANDON_SECONDS`."""
    txn_id = uuid.uuid4().hex
    _create_dir(os.fspath(root), txn_id, tag)
    return txn_id


def discard(root: str, txn_id: str) -> None:
    """Discard an undecided transaction (its staged records are deleted); a decided one is
    left to finish. Contributors that stage later fail instead of recreating it."""
    d = os.path.join(_txn_root(os.fspath(root)), _check_id(txn_id))
    ext = os.path.join(d, EXTERNAL_FILE)
    try:
        fd = os.open(ext, os.O_RDONLY)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits for contributors creating staging Logs
        if not os.path.exists(os.path.join(d, DECISION_FILE)):
            _remove_txn_dir(d)
    finally:
        if fd >= 0:
            os.close(fd)


def discard_tagged(root: str, tag: str, keep: Iterable[str] = ()) -> list[str]:
    """Discard every undecided external transaction tagged ``tag`` but those in ``keep``
    (a streaming sink's batches run one after another: another undecided one is the
    leftover of an aborted batch). Returns the ids discarded."""
    base = _txn_root(os.fspath(root))
    out: list[str] = []
    keep = set(keep)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return out
    for name in names:
        if len(name) != 32 or name in keep:
            continue
        try:
            with open(os.path.join(base, name, EXTERNAL_FILE), "rb") as f:
                if f.read().decode(errors="replace") != tag:
                    continue
        except (FileNotFoundError, NotADirectoryError):
            continue
        discard(root, name)
        out.append(name)
    return out


def _publish(path: str) -> str | None:
    """Make decided transaction ``path`` (its directory) visible, in every partition at
    once: under an exclusive lock on the store's :data:`VISIBLE_FILE`, its id is written
    there (one ``pwrite`` in place: no temporary file, not fsynced, as the file only tells
    live readers what changed), then the directory is renamed to ``.done-ID`` (the moment
    it shows). Returns the renamed directory (to delete), None if it was gone already.
    Every partition's records must be applied and durable before.

    Readers compare :func:`pylog.loader.visibility_token` (the file's id, and whether that
    directory is still there) before and after they look: the lock keeps another publish
    from writing its id between this one's write and rename, so each publish changes
    what they compare."""
    base = os.path.dirname(path)
    txn_id = os.path.basename(path)
    done = os.path.join(base, _DONE_PREFIX + txn_id)
    fd = vfs.open(os.path.join(base, VISIBLE_FILE), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close (or the process's death)
        if not os.path.isdir(path):
            return None  # published by someone else meanwhile
        vfs.pwrite(fd, txn_id.encode() + b"\n", 0)
        try:
            vfs.rename(path, done)
        except FileNotFoundError:
            return None
    finally:
        vfs.close(fd)
    return done


def consistent(root: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` (reads of several partitions of the store at ``root`` by read-only Logs:
    their refreshes, offsets), called again until no transaction was published while it
    ran, so that every transaction is in all the partitions it read or in none (a
    transaction shows at one moment, when it is published; reads on both sides of it would
    disagree). Spark's planning takes its offsets so."""
    base = _txn_root(os.fspath(root))
    for attempt in itertools.count():
        token = visibility_token(base)
        out = fn()
        if visibility_token(base) == token:
            return out
        if attempt >= 3:
            time.sleep(min(0.001 * attempt, 0.05))
    raise AssertionError("unreachable")


def _remove_txn_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    try:
        fileutil.fsync_dir(os.path.dirname(path))
    except FileNotFoundError:
        pass


def _check_late(log: Log, txn_dir: str, entry: dict[str, Any]) -> None:
    """InvalidTimestampError when a staged record's timestamp is below the partition's
    latest (they would be raised to it: ``lateTimestamps=error`` of the Spark writer)."""
    mx = log._active.app.max_timestamp
    if mx is None or log.config.timestamps == "as-given":  # (kept as given there)
        return
    for rel, _count in entry["staged"]:
        src = Log(os.path.join(txn_dir, rel), readonly=True)
        try:
            if len(src) and src.read(src.start_offset).timestamp < mx:
                raise InvalidTimestampError(
                    f"topic {entry['topic']!r} partition {entry['partition']}: timestamp "
                    f"{src.read(src.start_offset).timestamp} is below the partition's latest timestamp {mx} "
                    "(pylog timestamps never decrease)")
        finally:
            src.close()


def _staged_records(txn_dir: str, staged: list[tuple[str, int]]) -> Iterator[columnar.PackedRows]:
    """The staged records of one partition in chunks, checked against the decision's
    counts, as columns (a CRC-checked C scan of each staged Log: no Python object per
    record). Several staged Logs (contributors) are merged by timestamp (stable), as one
    sorted batch would be, reading each in chunks (bounded memory)."""
    srcs = []
    try:
        for rel, count in staged:
            try:
                srcs.append((Log(os.path.join(txn_dir, rel), readonly=True), rel, count))
            except FileNotFoundError:
                raise CorruptRecordError(os.path.join(txn_dir, rel), 0, None,
                                         "the staged records of a decided transaction are missing") from None
        for src, rel, count in srcs:
            if src.stable_offset - src.start_offset != count:
                raise CorruptRecordError(os.path.join(txn_dir, rel), 0, None,
                                         f"transaction {os.path.basename(txn_dir)}: staged records {rel} hold "
                                         f"{src.stable_offset - src.start_offset} records, the decision says {count}")
        logs = [src for src, _rel, _count in srcs]
        if len(logs) == 1:
            yield from columnar.packed_chunks(logs[0], _APPLY_CHUNK, _APPLY_BYTES)
        else:
            yield from columnar.merged_logs(logs, _APPLY_CHUNK, _APPLY_BYTES)
    finally:
        for src, _rel, _count in srcs:
            src.close()


#: Tests set this to a callable taking ``(log, entry, records applied so far)``: called after
#: each ``append_batch`` of an apply (to slow it, or to pause it at a known point). None in
#: normal use.
apply_hook: Any = None


def _apply(log: Log, txn_dir: str, entry: dict[str, Any], syncs: Syncs | None = None) -> None:
    """Append a decided transaction's staged records to ``log`` at ``entry["start"]``
    (cutting back whatever a torn earlier apply left after it) and make them durable; with
    ``syncs``, write them out and begin their fdatasync there instead (the caller flushes
    the log once it is done). The partition's marker stays (the caller removes it once the
    transaction is published). The caller holds ``log._lock``."""
    start = int(entry["start"])
    with log._lock:
        try:
            nxt = log.next_offset
            if nxt > start:
                log.truncate(start)  # a torn apply: cut back to the start, apply again
            elif nxt < start:
                raise CorruptRecordError(
                    log.path, 0, None, f"holds records up to {nxt}, but transaction {os.path.basename(txn_dir)} "
                    f"was decided to start at {start}; records before it were lost")
            mx = log._active.app.max_timestamp
            last = -1 if mx is None else int(mx)
            for values, keys, metadata, stamps in _staged_records(txn_dir, [tuple(x) for x in entry["staged"]]):
                if log.config.timestamps == "as-given":
                    ts = stamps  # kept as given (Kafka's CreateTime)
                else:
                    ts = np.maximum.accumulate(stamps)
                    ts = np.maximum(ts, last)  # timestamps never decrease in a partition
                    last = int(ts[-1])
                log.append_batch(values, keys, ts, metadata)
                if syncs is not None:
                    syncs.kick(log)  # the disk writes this chunk while the next is read
                if apply_hook is not None:
                    apply_hook(log, entry, log.next_offset - start)
            if syncs is None:
                log.flush()
            else:
                syncs.start(log)
        except BaseException as e:
            fence_unfinished(log, os.path.basename(txn_dir), e)
            raise


def _record_sinks(root: str, sinks: dict[str, int]) -> None:
    if not sinks:
        return
    base = _txn_root(root)
    fd = vfs.open(os.path.join(base, SINKS_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(base, SINKS_FILE)
        state = _read_json(path) or {}
        changed = False
        for k, v in sinks.items():
            if state.get(k) is None or int(state[k]) < v:
                state[k] = v
                changed = True
        if changed:
            fileutil.atomic_write(path, json.dumps(state, sort_keys=True).encode())
    finally:
        os.close(fd)


def last_batch_id(root: str, sink_id: str) -> int | None:
    """The last batch id committed for streaming sink ``sink_id`` under ``root`` (None: none
    yet), counting decided transactions not yet finished."""
    base = _txn_root(os.fspath(root))
    best = (_read_json(os.path.join(base, SINKS_FILE)) or {}).get(sink_id)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return best
    for name in names:
        d = _read_json(os.path.join(base, name, DECISION_FILE)) if len(name) == 32 else None
        if d and sink_id in d.get("sinks", {}):
            v = int(d["sinks"][sink_id])
            best = v if best is None else max(int(best), v)
    return None if best is None else int(best)


