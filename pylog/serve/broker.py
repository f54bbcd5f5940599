"""The broker's state over one data root, and its Produce and Fetch.

:class:`Broker` owns a :class:`~pylog.LogStore` and is the writer of every partition it
serves. Appends run in a small thread pool so that a Produce waiting for its fsync
(``flush.messages=1``) does not stop other clients, and so that concurrent producers'
appends share fsyncs (the Log's group commit). Fetches read in a pool of their own (a read
may wait for the partition's lock while the flusher fsyncs it) and long-poll on the event
loop, on an event set by every append.

The event loop never waits on disk or admin work: opening (and recovering) a partition,
creating, growing and deleting topics, and the other admin APIs run in a second pool,
the admin threads (:meth:`Broker.admin`), so that an admin storm neither stalls the loop
nor takes the append threads. The loop itself only uses partitions already open
(:meth:`Broker.ready`: a dict lookup); :meth:`Broker.partitions` opens the others in an
admin thread first.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
from kio.schema.errors import ErrorCode as E

from pylog.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidTimestampError,
    LogClosedError,
    LogFencedError,
    LogLockedError,
    OffsetOutOfRangeError,
    PylogError,
    RecordTooLargeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.log import Log, PackedBytes
from pylog.serve import configs
from pylog.serve.admin_records import LogStarts
from pylog.serve.cleaner import Cleaner
from pylog.serve.fencing import TRANSIENT_ERRNOS, Fence, Gate, errno_of
from pylog.serve.pool import RESPONSE_HOLD, Pool
from pylog.serve.producers import Producers, batch_producer, records_digest
from pylog.serve.reads import RECORDS_KEY, batch_records, read_batches, wanted
from pylog.serve.records import (
    BatchError,
    Budget,
    RecordErrors,
    check_keyed,
    compress_batches,
    decode_records,
)
from pylog.serve.timestamps import log_append_time
from pylog.serve.txn_coordinator import is_transactional
from pylog.topics import LogStore, Topic

__all__ = ["Broker", "SERVE_LOCK"]

_log = logging.getLogger("pylog.serve")

#: The file under the root that a broker holds locked (flock) while it serves.
SERVE_LOCK = ".serve.lock"
_T = TypeVar("_T")


#: The least a Fetch response waits for from the response pool (less when it asks for less).
RESPONSE_LEAST = 1 << 20




class Broker:
    """Kafka's Produce/Fetch and topic bookkeeping over a LogStore at ``root``.

    Parameters
    ----------
    root
        The data root (as ``pylog.LogStore``).
    host, port
        What Metadata tells clients to connect to.
    auto_create
        Create an unknown topic (one partition) when Metadata asks for it with
        ``allow_auto_topic_creation`` (Kafka's ``auto.create.topics.enable``).
    max_decompressed_bytes
        The most the compressed batches of one Produce request may decompress to, summed
        over all its batches and partitions (docs/serve.md, "Limits and defaults").
    fetch_max_bytes
        The most record bytes of one Fetch response, whatever the request asks (Kafka's
        ``fetch.max.bytes``; its first record may go over it, KIP-74).
    append_threads
        Threads that append (and wait for fsyncs); with one, concurrent producers could not
        share an fsync.
    fence_backoff
        Seconds after an I/O error fenced a partition before a produce may reopen it
        (docs/serve.md, "Storage errors"); transient errors (EMFILE, ENFILE, ENOMEM) wait none.
    admin_threads
        Threads for the work kept off the event loop and out of the append threads:
        opening and recovering partitions, CreateTopics, DeleteTopics, CreatePartitions,
        Metadata (and its auto-creation), the other admin APIs.
    auto_create_per_request, auto_create_rate
        At most this many topics auto-created by one Metadata request, and a token bucket
        of ``auto_create_rate`` topics a second (a burst of one second's worth) over all
        requests; an unknown topic beyond either is answered UNKNOWN_TOPIC_OR_PARTITION and
        not created (a client asks again: its next Metadata may create it).
    """

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 9092, auto_create: bool = True,
                 max_decompressed_bytes: int = 32 << 20, append_threads: int = 4, admin_threads: int = 4,
                 fetch_max_bytes: int = 55 << 20, fence_backoff: float = 5.0,
                 auto_create_per_request: int = 100, auto_create_rate: float = 100.0) -> None:
        if isinstance(auto_create_per_request, bool) or not isinstance(auto_create_per_request, int) \
                or auto_create_per_request < 0:
            raise InvalidArgumentError(f"auto_create_per_request={auto_create_per_request!r} must be an int >= 0")
        if isinstance(auto_create_rate, bool) or not isinstance(auto_create_rate, (int, float)) \
                or not 0 < auto_create_rate < float("inf"):
            raise InvalidArgumentError(f"auto_create_rate={auto_create_rate!r} must be a number of topics "
                                       f"a second > 0")
        self.store = LogStore(root)
        # one broker per root: it is the writer of every partition, so a second one would
        # fail partition by partition; it fails here instead, before it listens
        self._lock_fd = os.open(os.path.join(self.store.root, SERVE_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self.store.close()
            raise LogLockedError(f"another pylog serve is serving {root}") from None
        self.advertised_host = host
        self.port = port
        self.auto_create = auto_create
        self.max_decompressed_bytes = max_decompressed_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.closing = False  # set by the server when it stops: long polls return at once
        #: Fetch responses take their bytes from this pool (set by the server) while built and
        #: written; without it (the library's own use) they take none
        self.responses: Pool | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(append_threads, thread_name_prefix="pylog-append")
        self._admin = concurrent.futures.ThreadPoolExecutor(admin_threads, thread_name_prefix="pylog-admin")
        # two: a read may wait for a partition's lock (the flusher's fsync), and each builds up
        # to fetch.max.bytes of response at once (more threads, a higher peak of memory)
        self._reads = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pylog-fetch")
        self._handles: dict[str, Topic] = {}  # see topic()
        #: (topic, partition) -> (Topic, its open writer Log): what the loop may use as is
        self._ready: dict[tuple[str, int], tuple[Topic, Log]] = {}
        self.auto_create_per_request = auto_create_per_request
        self.auto_create_rate = float(auto_create_rate)
        self._tokens = max(self.auto_create_rate, 1.0)
        self._tokens_at = time.monotonic()
        self._tokens_lock = threading.Lock()
        self._last_ts: dict[tuple[str, int], int] = {}
        self._appended: asyncio.Event | None = None
        self.producers = Producers(self.store)  # idempotent producers' state (producers.py)
        self.txns: Any = None  # the transaction coordinator (txn_coordinator.py), set by the server
        self.starts = LogStarts(self.store)  # log start offsets DeleteRecords set (admin_records.py)
        self._gates: dict[tuple[str, int], Gate] = {}
        self.fence_backoff = fence_backoff
        self._fences: dict[tuple[str, int], Fence] = {}
        self._fenced_logs: dict[Log, tuple[str, int]] = {}
        # per partition, the end of the records the broker acknowledged (or found at open):
        # while the partition is fenced reads stop there, and its reopen cuts what recovery
        # finds past it (refused appends)
        self._acked: dict[tuple[str, int], int] = {}
        self._open_errors: dict[tuple[str, int], int | None] = {}
        # Kafka configs (configs.py, admin_configs.py): each topic's explicit set; the topic
        # defaults, the partitions of a new topic and the broker's own configs (its --config)
        self.settings = configs.Settings(self.store.root)
        self.topic_defaults: dict[str, str] = {}
        self.default_partitions = 1
        self.broker_configs: dict[str, tuple[str, int, int]] = {}
        self.cleaner = Cleaner(self)

    # -- the admin threads -------------------------------------------------------------------
    async def admin(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in an admin thread (see the module docstring)."""
        return await asyncio.get_running_loop().run_in_executor(self._admin, functools.partial(fn, *args))

    def take_auto_create(self) -> bool:
        """Take a token of the auto-creation bucket (``auto_create_rate`` a second, at most
        one second's worth saved): False when it is empty. Thread-safe."""
        with self._tokens_lock:
            now = time.monotonic()
            cap = max(self.auto_create_rate, 1.0)
            self._tokens = min(cap, self._tokens + (now - self._tokens_at) * self.auto_create_rate)
            self._tokens_at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    # -- topics and partitions -------------------------------------------------------------
    def topic(self, name: str, create: bool = False) -> Topic:
        """The topic ``name``; with ``create``, an unknown one is made with one partition.
        A topic looked up before is answered from the broker's handles, without the store's
        lock (which an admin thread holds while it creates or deletes a topic: 43 s for a
        topic of 1,000 partitions): Metadata of known topics never waits for a storm."""
        t = self._handles.get(name)
        if t is not None:
            try:
                t.partitions  # noqa: B018  (the property notices a delete: UnknownTopicError)
                return t
            except UnknownTopicError:
                self._handles.pop(name, None)
        try:
            t = self.store.topic(name)
        except UnknownTopicError:
            if not create:
                raise
            try:
                # the broker's topic defaults (--config) over Kafka 4.0's (CreateTime)
                cfg = configs.to_log_config(self.topic_defaults)
                t = self.store.create_topic(name, partitions=self.default_partitions, config=cfg)
                self.settings.forget(name)
            except PylogError:
                t = self.store.topic(name)
        self._handles[name] = t
        return t

    def partition(self, name: str, i: int, read: bool = False) -> tuple[Log | None, int]:
        """(the writer Log of ``name``/``i``, 0) or (None, Kafka error code). Opens (and
        recovers) the partition on first use: call it in a thread, not on the loop. An
        OSError opening or recovering it (a full disk, EMFILE, EACCES) is
        KAFKA_STORAGE_ERROR, logged once per cause, and tried again at the next request;
        with ``read``, the partition is then read through a read-only Log (which writes
        nothing), so it still serves what it holds, until a produce opens the writer (reads
        do not run its recovery again and again). A fenced partition, for any caller, is
        its fenced writer or that read-only Log: only :meth:`_reopen` opens its writer again."""
        if self._fences or (read and self._open_errors):
            key = (name, i)
            # a fenced partition's writer is replaced by _reopen only (it cuts the refused
            # appends that recovery finds), never opened here behind its back
            if key in self._fences or (read and key in self._open_errors):
                try:  # what it holds, capped by visible_end while fenced
                    topic = self.store.topic(name)
                    return topic._logs[i] or topic.reader(i), 0
                except (PylogError, OSError):
                    return None, E.kafka_storage_error
        log = self.ready(name, i, check=True)
        if log is not None:
            return log, 0
        try:
            topic = self.topic(name)
            log = topic.partition(i)
        except (UnknownTopicError, UnknownPartitionError, InvalidNameError, TypeError):
            return None, E.unknown_topic_or_partition
        except LogClosedError:
            return None, E.not_leader_or_follower  # the broker is closing
        except (PylogError, OSError) as e:
            key = (name, i)
            no = errno_of(e)
            if self._open_errors.get(key, -1) != no:
                self._open_errors[key] = no
                _log.warning("partition %s-%d cannot be opened for writing: %s", name, i, e)
            if read:
                try:
                    return self.store.topic(name).reader(i), 0
                except (PylogError, OSError):
                    pass
            return None, E.kafka_storage_error
        if self._open_errors:
            self._open_errors.pop((name, i), None)
        self._ready[(name, i)] = (topic, log)
        return log, 0

    def ready(self, name: str, i: int, check: bool = False) -> Log | None:
        """The writer Log of ``name``/``i`` if it is open already, else None (open it with
        :meth:`partition` in a thread, or :meth:`partitions`). A dict lookup, safe on the
        loop: it takes no lock an admin thread may hold (the store's is held while a topic
        is created or deleted). ``check`` also looks for changes other processes made to
        the topic (a ``stat`` at most every ``metadata_refresh_ms``; may close and reopen
        the partition for a new config): not on the loop."""
        got = self._ready.get((name, i))
        if got is None:
            return None
        topic, log = got
        try:
            if check and i >= topic.partitions:  # the property looks at topic.json
                raise UnknownPartitionError(f"topic {name!r} has no partition {i}")
        except PylogError:
            self._ready.pop((name, i), None)
            return None
        if log.closed:  # deleted, or reopened for a new config
            self._ready.pop((name, i), None)
            return None
        return log

    async def partitions(self, keys: Iterable[tuple[str, int]], read: bool = False,
                         ) -> dict[tuple[str, int], tuple[Log | None, int]]:
        """``{(topic, partition): (Log or None, error code)}`` as :meth:`partition` (``read``
        as there), those not yet open opened in an admin thread (the loop waits for none of
        it)."""
        out: dict[tuple[str, int], tuple[Log | None, int]] = {}
        todo = []
        for key in keys:
            if key not in out:
                log = self.ready(*key)
                if log is None:
                    todo.append(key)
                out[key] = (log, 0)
        if todo:
            opened = await self.admin(lambda: [self.partition(*k, read=read) for k in todo])
            out.update(zip(todo, opened))
        return out

    def _writable(self, name: str, i: int) -> tuple[Log | None, int]:
        """:meth:`partition` for an append: a fenced partition is reopened first when its
        back-off is over (at once after a transient error), else KAFKA_STORAGE_ERROR."""
        fence = self._fences.get((name, i))
        if fence is not None:
            return self._reopen(name, i, fence)
        return self.partition(name, i)

    def _fence(self, key: tuple[str, int], log: Log, e: BaseException) -> None:
        """Note that ``log`` refused an append with ``e``: logged once, reads stop at what was
        acknowledged, appends are refused until :meth:`_reopen`."""
        cause = getattr(log, "_fenced", None) or e
        no = errno_of(cause)
        transient = no in TRANSIENT_ERRNOS
        if key in self._fences:
            return
        self._fences[key] = Fence(str(cause), transient, time.monotonic())
        self._fenced_logs[log] = key
        if transient:
            _log.warning("partition %s-%d refused an append (%s): it is reopened at the next produce", *key, cause)
        else:
            _log.warning("partition %s-%d is fenced after a failed write or fsync (%s): appends are refused, "
                         "reads stop at offset %d; a produce after %g s reopens it", *key, cause,
                         self._acked.get(key, -1), self.fence_backoff)

    def _reopen(self, name: str, i: int, fence: Fence) -> tuple[Log | None, int]:
        """Reopen a fenced partition (recovery from what is on disk), cut what recovery
        finds past the acknowledged end (refused appends), reload its producer state."""
        key = (name, i)
        if not fence.transient and time.monotonic() - fence.since < self.fence_backoff:
            return None, E.kafka_storage_error
        gate = self._gate(key)
        gate.enter(exclusive=True)  # no append of this partition is under way
        try:
            if self._fences.get(key) is not fence:  # another thread reopened it meanwhile
                return self.partition(name, i)
            log: Log | None = None
            try:
                topic = self.store.topic(name)
                with topic._open_lock:  # Topic has no public way to drop one writer (yet)
                    old, topic._logs[i] = topic._logs[i], None
                if old is not None:
                    self._fenced_logs.pop(old, None)
                    try:
                        old.close()
                    except (OSError, PylogError):
                        pass  # fenced: what it held past the acknowledged end was refused
                log = topic.partition(i)
                acked = self._acked.get(key, log.next_offset)
                if log.next_offset > acked:
                    _log.warning("partition %s-%d: cutting offsets %d-%d, refused appends that recovery found",
                                 name, i, acked, log.next_offset - 1)
                    log.truncate(acked)
                self.producers.forget(name, i)
                self.producers.load(name, i, log)
            except (OSError, PylogError) as e:
                fence.since = time.monotonic()
                fence.reason = str(e)
                if log is not None:
                    self._fenced_logs[log] = key
                return None, E.kafka_storage_error
            self._fences.pop(key, None)  # (a DeleteTopics may have dropped it meanwhile)
            self._last_ts.pop(key, None)
            _log.warning("partition %s-%d reopened", name, i)
            return log, 0
        finally:
            gate.leave(exclusive=True)

    def delete_topic(self, name: str) -> None:
        """Delete a topic (its open partitions are closed first). In an admin thread."""
        try:
            self.store.delete_topic(name)
        finally:
            self._handles.pop(name, None)
            for key in [k for k in list(self._ready) if k[0] == name]:
                self._ready.pop(key, None)
        for d in (self._last_ts, self._acked, self._fences, self._gates):
            for key in [k for k in list(d) if k[0] == name]:
                d.pop(key, None)
        for log in [g for g, k in list(self._fenced_logs.items()) if k[0] == name]:
            self._fenced_logs.pop(log, None)
        self.producers.forget_topic(name)
        self.settings.forget(name)
        self.starts.forget_topic(name)

    def fenced(self, key: tuple[str, int]) -> bool:
        """Whether partition ``key`` is fenced or could not be opened for writing."""
        return key in self._fences or key in self._open_errors

    @property
    def fenced_partitions(self) -> list[tuple[str, int]]:
        """The partitions fenced now (metrics)."""
        return list(self._fences)

    def visible_end(self, log: Log, read_committed: bool, key: tuple[str, int] | None = None) -> int:
        """The offset a consumer reads up to: the last stable offset under read_committed
        (``Log.last_stable_offset``: below a transaction being applied), else the next offset;
        of a fenced partition (``key``, or ``log`` a fenced writer), at most the end of what
        was acknowledged: a refused append is never served."""
        end = log.last_stable_offset if read_committed else log.next_offset
        if self._fences:
            key = key or self._fenced_logs.get(log)
            if key is not None and key in self._fences:
                end = min(end, self._acked.get(key, end))
        return end

    def cleanup(self) -> None:
        """Retention of ``delete`` topics and compaction of ``compact`` topics (what Kafka's
        log cleaner and retention check do in the background); run by the server every
        ``cleanup_interval`` seconds, in an admin thread."""
        for what, run in (("retention", self.store.enforce_retention), ("compaction", self.cleaner.run)):
            try:
                done: dict[tuple[str, int], Any] = run()
            except (PylogError, OSError) as e:
                _log.warning("%s failed: %s", what, e)
                continue
            if what == "retention" and any(done.values()):
                _log.info("retention deleted %d segments", sum(done.values()))

    async def run_cleanup(self) -> None:
        """:meth:`cleanup` in an admin thread (it may open every partition)."""
        await self.admin(self.cleanup)

    def close(self) -> None:
        """Wait for appends and admin work in flight, then flush and close every partition. A
        partition that cannot be closed cleanly (a full disk, a fenced log) is logged and
        recovered at the next start: closing never raises for it."""
        self._pool.shutdown(wait=True)
        self._reads.shutdown(wait=True)
        self._admin.shutdown(wait=True, cancel_futures=True)  # admin work not started is dropped
        self.producers.close()
        try:
            self.store.close()
        except (OSError, PylogError) as e:
            _log.warning("closing the partitions: %s (they are recovered at the next start)", e)
        os.close(self._lock_fd)  # releases the root

    # -- produce -----------------------------------------------------------------------------
    def _gate(self, key: tuple[str, int]) -> Gate:
        g = self._gates.get(key)
        return g if g is not None else self._gates.setdefault(key, Gate())

    def _append(self, name: str, i: int, records: Any, budget: Budget | None = None,
                idem: tuple[tuple[int, int, int, int], Any] | None = None,
                log: Log | None = None) -> tuple[int, int, int]:
        """Decode and append one partition's data, all or nothing: (error, base offset, start).
        ``budget``: what the request may still decompress (a fresh one when None).
        ``idem``: (producer, state) of an idempotent batch that :meth:`Producers.check`
        let through, and ``log`` the partition it was checked against; its intent is
        written right before the records (producers.py)."""
        if log is None:
            log, err = self._writable(name, i)
            if log is None:
                return err, -1, -1
        try:
            d = decode_records(records, budget or Budget(self.max_decompressed_bytes))
        except BatchError as e:
            return e.code, -1, -1
        if d.transactional:  # (with no transaction coordinator, or not the batch's first)
            return E.invalid_txn_state, -1, -1
        if "compact" in log.config.cleanup_policy.split(","):  # RecordErrors: answered per record, nothing appended
            check_keyed(d, f"{name}-{i}")
        try:
            # before anything is appended to the partition, its producer state is checked
            # against the log: no record may land where an unconfirmed intent points
            self.producers.load(name, i, log)
        except (OSError, PylogError):
            return E.kafka_storage_error, -1, -1
        now = int(time.time() * 1000)
        ts = d.timestamps
        mode = log.config.timestamps  # message.timestamp.type (pylog.serve.timestamps)
        if d.log_append_time or mode == "append-time":
            ts[:] = now
        else:
            ts[ts < 0] = now
            try:  # message.timestamp.before/after.max.ms
                log.config.check_time_bounds(int(ts.min()), int(ts.max()), now)
            except InvalidTimestampError:
                return E.invalid_timestamp, -1, -1
        # CreateTime is kept as produced; in a monotonic or LogAppendTime topic a record stamped
        # before its predecessor takes the predecessor's time (docs/serve.md)
        key = (name, i)
        last = self._last_ts.get(key)
        gate = self._gate(key)
        try:
            self._acked.setdefault(key, log.next_offset)  # before the broker's first append
        except LogClosedError:  # deleted (DeleteTopics) since it was opened
            return E.not_leader_or_follower, -1, -1
        # an idempotent batch's intent names the offset its records will take: nothing else
        # may append to the partition between the two (other batches share the gate)
        gate.enter(exclusive=idem is not None)
        try:
            for attempt in range(8):
                if mode == "as-given":
                    pass
                elif last is None and log.next_offset > log.start_offset:
                    try:
                        last = log.read(log.next_offset - 1).timestamp
                    except PylogError:  # compacted or truncated away: the log checks it anyway
                        last = None
                if last is not None and mode != "as-given":
                    ts[0] = max(int(ts[0]), last)
                if mode != "as-given":
                    np.maximum.accumulate(ts, out=ts)
                try:
                    if idem is not None:
                        base = log.next_offset
                        digest = records_digest([d.values, d.keys, d.headers], ts)
                        try:
                            self.producers.intend(idem[1], idem[0], base, d.count, digest,
                                                  sync=log.config.fsync == "always")
                        except OSError:  # the state file failed, not the log: nothing appended
                            return E.kafka_storage_error, -1, -1
                    first = log.append_batch(PackedBytes(*d.values), keys=PackedBytes(*d.keys), timestamps=ts,
                                             metadata=PackedBytes(*d.headers))
                    # acknowledged records go to the OS now (fsynced before this when the policy
                    # says so), so library readers in other processes see what Kafka clients were
                    # told is written.
                    log.write_out()
                    break
                except InvalidTimestampError:
                    # another producer's append to this partition landed in between with a later
                    # time: take the log's newest time again (nothing was appended)
                    last = None
                    if attempt == 7:
                        return E.invalid_timestamp, -1, -1
                except RecordTooLargeError:
                    return E.message_too_large, -1, -1
                except LogClosedError:
                    return E.not_leader_or_follower, -1, -1
                except (PylogError, OSError) as e:
                    if isinstance(e, (OSError, LogFencedError)):
                        self._fence(key, log, e)
                    return E.kafka_storage_error, -1, -1
            # inside the gate: a reopen (which cuts what is past it) waits for this
            self._acked[key] = max(self._acked.get(key, 0), first + d.count)
            if idem is not None:
                if first != base:  # cannot happen while the broker is the one writer
                    self.producers.intend(idem[1], idem[0], first, d.count, digest, sync=False)
                self.producers.appended(idem[1], idem[0], first, d.count, digest)
            start = self.starts.start(name, i, log)
        except OSError:  # the second intent
            return E.kafka_storage_error, -1, -1
        except LogClosedError:  # deleted since the gate was entered
            return E.not_leader_or_follower, -1, -1
        finally:
            gate.leave(exclusive=idem is not None)
        self._last_ts[key] = max(int(ts.max()), self._last_ts.get(key, 0))
        return 0, first, start

    def _append_checked(self, name: str, i: int, records: Any, budget: Budget | None = None) -> tuple[int, int, int]:
        """:meth:`_append`, inside the idempotent producer check (:mod:`.producers`): a
        retried batch is answered with its first append's base offset, not appended again."""
        if self.txns is not None and is_transactional(records):  # staged, not appended
            return self.txns.produce(name, i, records, budget)  # type: ignore[no-any-return]
        prod = batch_producer(records)
        if prod is None:
            return self._append(name, i, records, budget)
        log, err = self._writable(name, i)
        if log is None:
            return err, -1, -1
        try:
            code, base, part = self.producers.check(name, i, log, prod)
        except (OSError, PylogError):
            return E.kafka_storage_error, -1, -1
        if part is None:
            return (0, base, self.starts.start(name, i, log)) if not code else (code, -1, -1)
        try:
            # the intent is written before the records, as durable as they will be
            # (fdatasync'd first under fsync=always): the state is never older than the log
            return self._append(name, i, records, budget, (prod, part), log)
        finally:
            self.producers.release(part)

    async def produce(self, req: Any, version: int) -> dict[str, Any]:
        """Produce: every partition's batches appended in one call each (all or nothing)."""
        loop = asyncio.get_running_loop()
        jobs = []
        for t in req.topic_data:
            for p in t.partition_data:
                jobs.append((t.name, p.index, p.records))

        # partitions not yet open are opened (recovered) in an admin thread first: the
        # append threads never wait for another partition's recovery
        opened = await self.partitions((n, i) for n, i, _ in jobs)
        errors = {(n, i): e for (n, i), (_, e) in opened.items() if e}

        def one(n: str, i: int, r: Any, budget: Budget) -> tuple[int, int, int, RecordErrors | None]:
            if (n, i) in errors or r is None:
                return errors.get((n, i), E.corrupt_message), -1, -1, None
            try:
                return (*self._append_checked(n, i, r, budget), None)
            except RecordErrors as e:
                return e.code, -1, -1, e

        def run() -> tuple[list[tuple[int, int, int, RecordErrors | None]], list[Any]]:
            budget = Budget(self.max_decompressed_bytes)  # one for the whole request
            res = [one(n, i, r, budget) for n, i, r in jobs]
            return res, [log_append_time(opened[(n, i)][0], b) if not e else None
                         for (n, i, _), (e, b, _s, _r) in zip(jobs, res)]

        results, stamps = await loop.run_in_executor(self._pool, run)
        self.notify()
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (name, i, _), (err, base, start, rec), stamp in zip(jobs, results, stamps):
            by_topic.setdefault(name, []).append({
                "index": i, "error_code": err, "base_offset": base, "log_start_offset": start,
                "record_errors": [{"batch_index": j, "batch_index_error_message": m} for j, m in rec.rows]
                if rec else [], "error_message": str(rec) if rec else None, "log_append_time": stamp})
        return {"responses": [{"name": n, "partition_responses": ps} for n, ps in by_topic.items()]}

    # -- fetch -------------------------------------------------------------------------------
    def notify(self) -> None:
        """Wake the fetches waiting for data."""
        if self._appended is not None:
            self._appended.set()
            self._appended = None

    def _fetch_limit(self, req: Any) -> int:
        """The request's max_bytes, within the broker's own cap (fetch.max.bytes)."""
        return min(max(req.max_bytes, 0) if hasattr(req, "max_bytes") else 1 << 30, self.fetch_max_bytes)

    def _read_all(self, req: Any, opened: dict[tuple[str, int], tuple[Log | None, int]],
                  budget: int | None = None) -> tuple[list[dict[str, Any]], int]:
        committed = getattr(req, "isolation_level", 0) == 1
        if budget is None:
            budget = self._fetch_limit(req)
        total = 0
        out = []
        for topic, partitions in wanted(req):
            parts = []
            for p in partitions:
                r: dict[str, Any] = {"partition_index": p.partition, "error_code": 0, "high_watermark": -1,
                                     "last_stable_offset": -1, "log_start_offset": -1,
                                     "aborted_transactions": [], "preferred_read_replica": -1, "records": b""}
                log, err = opened[(topic, p.partition)]
                if log is None or log.closed:  # closed: deleted (or reconfigured) since it was opened
                    r["error_code"] = err or E.not_leader_or_follower
                    parts.append(r)
                    continue
                try:
                    key = (topic, p.partition)
                    end, high = self.visible_end(log, committed, key), self.visible_end(log, False, key)
                    r["high_watermark"], r["last_stable_offset"] = high, end
                    r["log_start_offset"] = start = self.starts.start(topic, p.partition, log)
                    off = p.fetch_offset
                    if off < start or off > high:
                        r["error_code"] = E.offset_out_of_range
                    elif off < end and (budget > 0 or total == 0):
                        # at most partition_max_bytes and what is left of max_bytes; more only for
                        # the first record of the response's first non-empty partition (KIP-74)
                        limit = max(0, min(p.partition_max_bytes, budget))
                        try:
                            data = read_batches(log, off, end, limit, total == 0)
                        except OffsetOutOfRangeError:
                            r["error_code"] = E.offset_out_of_range
                            data = b""
                        except CorruptRecordError:
                            r["error_code"] = E.kafka_storage_error
                            data = b""
                        if data:
                            data = compress_batches(data, *self.settings.codec(topic))
                            r["records"] = data
                            r[RECORDS_KEY] = batch_records(data)  # here, not on the loop (metrics)
                            total += len(data)
                            budget -= len(data)
                except (LogClosedError, OSError, PylogError) as e:
                    # closed: deleted by an admin thread or reopened while it was read (the
                    # client asks for metadata again); else a failing disk
                    _log.debug("fetch of %s-%d: %s", topic, p.partition, e)
                    r["error_code"] = E.not_leader_or_follower if log.closed else E.kafka_storage_error
                    r["records"] = b""
                parts.append(r)
            out.append({"topic": topic, "partitions": parts})
        return out, total

    async def fetch(self, req: Any, version: int) -> dict[str, Any]:
        """Fetch: up to max_bytes; waits up to max_wait for min_bytes (a long poll)."""
        wait_ms = req.max_wait.total_seconds() * 1000
        deadline = time.monotonic() + max(wait_ms, 0) / 1000
        limit = self._fetch_limit(req)
        pool = self.responses
        hold = RESPONSE_HOLD.get(None) if pool is not None else None
        keys = [(t.topic, p.partition) for t in req.topics for p in t.partitions]
        loop = asyncio.get_running_loop()
        while True:
            opened = await self.partitions(keys, read=True)
            got = limit
            if pool is not None and hold is not None:
                # its bytes while it is built and written: under pressure a smaller response
                # (at least RESPONSE_LEAST), or a wait holding nothing
                got = await pool.take_upto(limit, min(limit, RESPONSE_LEAST))
            # taken before the read: an append answered while the read runs sets it
            if self._appended is None:
                self._appended = asyncio.Event()
            appended = self._appended
            # the read in a fetch thread: it may wait for a partition's lock (held while the
            # flusher fsyncs the partition: seconds on a busy disk) or fault pages in from disk
            try:
                out, total = await loop.run_in_executor(self._reads, self._read_all, req, opened, got)
            except BaseException:
                if pool is not None and hold is not None:
                    pool.give(got)
                raise
            left = deadline - time.monotonic()
            done = total >= req.min_bytes or left <= 0 or self.closing  # closing: answer now
            if pool is not None and hold is not None:
                if done:
                    pool.settle(got, total)
                    hold[0] += total
                else:
                    out = []
                    pool.give(got)
            if done:
                break
            try:
                await asyncio.wait_for(appended.wait(), left)
            except asyncio.TimeoutError:
                pass
        return {"error_code": 0, "session_id": 0, "responses": out}
