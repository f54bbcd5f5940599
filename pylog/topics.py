"""LogStore and Topic: named topics of numbered partitions under one root directory.

Layout (DESIGN.md section 4)::

    ROOT/
      .store.lock                  flock held only while topics are created, changed or deleted
      TOPIC/
        topic.json                 {"version": 1, "id": "<32 hex>", "partitions": N,
                                    "config": {LogConfig fields}}
        partition-0/ ... partition-(N-1)/     one pylog.Log each
        ~consumers/GROUP/          committed offsets and locks of consumer groups (consumer.py)

A topic directory appears under its real name only once it is complete: it is built as
``TOPIC~creating`` and renamed; a deleted topic is renamed to ``TOPIC~deleted`` before its
files go. ``~`` cannot occur in a topic name, so neither can be mistaken for a topic, and
leftovers of a crash are removed the next time the store is opened (for writing).

A topic's ``id`` (random, written at creation) tells a topic from a later one of the same
name. Handles notice changes made by other processes (added partitions, config, deletion)
by a ``stat`` of ``topic.json`` at most once every ``metadata_refresh_ms`` (like Kafka's
metadata refresh): a handle of a deleted (or deleted and recreated) topic raises
:class:`~pylog.UnknownTopicError` and never writes a file of it again. Opening a partition
for writing happens under the store lock after a fresh check, so it cannot recreate a topic
deleted meanwhile; :meth:`LogStore.delete_topic` refuses while any process writes a
partition of the topic or has a live group consumer of it.

A key picks its partition as Kafka's default partitioner does,
``toPositive(murmur2(key)) % partitions``, so a key lands in the partition Kafka would put it
in. Records without a key go round-robin (``append``) or a whole batch to one partition,
the next batch to the next one (``append_batch``, Kafka's "sticky" partitioner).
"""
from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pylog import fileutil, vfs
from pylog._backend import impl
from pylog.config import LogConfig
from pylog.errors import (
    ArgumentTypeError,
    ConfigError,
    InvalidArgumentError,
    LogClosedError,
    LogLockedError,
    ReadOnlyLogError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.log import Log

# topic.json and the name rule live in topicmeta; tests and pylog.spark read them from here
from pylog.topicmeta import (  # noqa: F401  (re-exported)
    _NAME_RE,
    MAX_PARTITIONS,
    PARTITION_PREFIX,
    TOPIC_FILE,
    _check_partitions,
    _count_records,
    _FileLock,
    _partition_dir,
    _read_topic_file,
    _read_topic_meta,
    _stamp,
    _write_topic_file,
    check_name,
    check_store_root,
    topic_contains,
)

if TYPE_CHECKING:
    from pylog.compaction import CompactionReport
    from pylog.consumer import Consumer
    from pylog.transactions import Transaction

__all__ = ["LogStore", "Topic", "murmur2", "partition_for_key", "check_name"]

STORE_LOCK = ".store.lock"
CONSUMERS_DIR = "~consumers"
CREATING_SUFFIX = "~creating"
DELETED_SUFFIX = "~deleted"
#: default of ``LogStore(metadata_refresh_ms=)``: how stale a handle's view of a topic may be
METADATA_REFRESH_MS = 100

# ----------------------------------------------------------------------------------------
# Kafka's partitioner
#: Kafka's ``Utils.murmur2`` (in the C core; ``pylog._pure.murmur2`` is its oracle).
murmur2 = impl.murmur2


def _positive_hash(key: bytes) -> int:
    return murmur2(key) & 0x7FFFFFFF


def partition_for_key(key: Any, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``:
    ``toPositive(murmur2(key)) % partitions``."""
    if type(key) is not bytes:
        if isinstance(key, str):
            raise ArgumentTypeError("key must be bytes-like, got str (encode it first)")
        try:
            key = bytes(memoryview(key))
        except TypeError:  # None (a keyless record has no partition of its own), an int...
            raise ArgumentTypeError(f"key must be bytes-like, got {type(key).__name__}") from None
    return _positive_hash(key) % partitions


# ----------------------------------------------------------------------------------------


def _locked_by_other(lock_path: str) -> bool:
    """Whether another open file description holds an flock on ``lock_path`` (False when
    the file is gone)."""
    return fileutil.flock_held(lock_path) is True


class LogStore:
    """A data root holding topics; each topic a directory of partitions (one
    :class:`~pylog.Log` each).

    Partitions are opened for writing on first use (taking each partition's writer lock)
    and stay open until :meth:`close`. Another process may use the same root: a partition
    that it writes is locked against writers here (:class:`~pylog.LogLockedError`, after
    waiting up to ``lock_timeout`` seconds for it) but can be read by a consumer.

    >>> import pylog, tempfile
    >>> with pylog.LogStore(tempfile.mkdtemp()) as store:
    ...     t = store.create_topic("orders", partitions=3)
    ...     t.append(b"hello", key=b"customer-1")
    (1, 0)

    Parameters
    ----------
    root
        The data root (created if missing, unless ``readonly``).
    readonly
        Read a root this process may not (or must not) write: topics, partitions
        (:meth:`Topic.reader`) and consumers without a group. Takes no lock that needs
        writing and never creates, changes or deletes a file; every writing call raises
        :class:`~pylog.ReadOnlyLogError`.
    metadata_refresh_ms
        Handles look for changes other processes made to a topic (partitions added, config
        altered, topic deleted) at most this often, by one ``stat`` of its ``topic.json``;
        0 looks on every call. Default 100.
    lock_timeout
        Seconds to wait for a partition's writer lock held by another writer before
        :class:`~pylog.LogLockedError` (default 0: fail at once).
    """

    def __init__(self, root: str | os.PathLike[str], readonly: bool = False, *,
                 metadata_refresh_ms: int = METADATA_REFRESH_MS, lock_timeout: float = 0.0) -> None:
        self.root = check_store_root(root)  # a path, not empty, not a Log's or a topic's directory
        if (isinstance(metadata_refresh_ms, bool) or not isinstance(metadata_refresh_ms, int)
                or metadata_refresh_ms < 0):
            raise InvalidArgumentError(f"metadata_refresh_ms={metadata_refresh_ms!r} must be an int >= 0")
        if (isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float))
                or not 0 <= lock_timeout < float("inf")):
            raise InvalidArgumentError(f"lock_timeout={lock_timeout!r} must be a number of seconds >= 0")
        self.readonly = bool(readonly)
        #: see the class docstring
        self.metadata_refresh_ms = metadata_refresh_ms
        #: see the class docstring
        self.lock_timeout = float(lock_timeout)
        self._lock = threading.RLock()
        self._topics: dict[str, Topic] = {}
        self._consumers: list[Consumer] = []
        self._closed = False
        if self.readonly:
            if not os.path.isdir(self.root):
                raise FileNotFoundError(2, "no such data root", self.root)
            if not os.access(self.root, os.R_OK | os.X_OK):
                raise PermissionError(13, "data root is not readable", self.root)
            return
        vfs.makedirs(self.root)
        if not os.access(self.root, os.R_OK | os.W_OK | os.X_OK):
            raise PermissionError(13, "data root is not readable and writable (open it with readonly=True "
                                  "to read it)", self.root)
        self._clean_leftovers()
        if os.path.isdir(os.path.join(self.root, "~txn")):
            from pylog.txnrecovery import recover

            recover(self.root)  # finish or discard what crashed transactions left

    # -- housekeeping ----------------------------------------------------------------------
    def _clean_leftovers(self) -> None:
        """Remove half-created and half-deleted topics a crash left behind."""
        removed = False
        for name in os.listdir(self.root):
            if name.endswith((CREATING_SUFFIX, DELETED_SUFFIX)):
                p = os.path.join(self.root, name)
                with self._meta_lock():
                    if os.path.isdir(p):
                        shutil.rmtree(p, ignore_errors=True)
                        removed = True
        if removed:
            fileutil.fsync_dir(self.root)

    def _meta_lock(self) -> _FileLock:
        return _FileLock(os.path.join(self.root, STORE_LOCK))

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"store {self.root} is closed")

    def _check_writable(self, what: str) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyLogError(f"cannot {what}: store {self.root} is open read-only")

    def _topic_dir(self, name: str) -> str:
        return os.path.join(self.root, check_name(name))

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, config: LogConfig | None = None,
                     files: Mapping[str, bytes] | None = None, **log_config: Any) -> Topic:
        """Create topic ``name`` with ``partitions`` partitions; returns it.

        ``config`` and keyword options (:class:`~pylog.LogConfig` fields) configure every
        partition; they are persisted with the topic and validated on every reopen.
        ``files`` (file name -> bytes, e.g. a broker's configs) are written durably into the
        topic's directory before the topic appears: it appears with them, or not at all.

        Raises InvalidNameError (nothing is touched), TopicExistsError, ConfigError.
        """
        check_name(name)
        _check_partitions(partitions)
        if config is not None and not isinstance(config, LogConfig):
            raise ArgumentTypeError(f"config must be a LogConfig, got {type(config).__name__}")
        cfg = (config or LogConfig()).replace(**log_config)
        self._check_writable(f"create topic {name!r}")
        final = self._topic_dir(name)
        with self._lock, self._meta_lock():
            if os.path.exists(final):
                raise TopicExistsError(f"topic {name!r} already exists")
            tmp = final + CREATING_SUFFIX
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
            vfs.mkdir(tmp, 0o755)
            try:
                for i in range(partitions):
                    Log(_partition_dir(tmp, i), config=cfg).close()
                _write_topic_file(tmp, partitions, cfg, uuid.uuid4().hex)
                for fname, data in (files or {}).items():
                    fileutil.atomic_write(os.path.join(tmp, check_name(fname, "file")), data, sync=True)
                fileutil.fsync_dir(tmp)
                vfs.rename(tmp, final)
                fileutil.fsync_dir(self.root)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return self.topic(name)

    def topics(self) -> list[str]:
        """Names of the topics under the root, sorted."""
        self._check_open()
        out = []
        for name in os.listdir(self.root):
            if _NAME_RE.match(name) and name not in (".", "..") and os.path.isfile(
                    os.path.join(self.root, name, TOPIC_FILE)):
                out.append(name)
        return sorted(out)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.topics()

    def topic(self, name: str) -> Topic:
        """The topic ``name`` (UnknownTopicError if there is none)."""
        check_name(name)
        self._check_open()
        with self._lock:
            t = self._topics.get(name)
            if t is not None and not t._closed:
                try:
                    t._check_meta()  # a delete elsewhere shows within metadata_refresh_ms
                    return t
                except UnknownTopicError:
                    pass  # deleted, perhaps created again: a new handle below (or unknown)
            d = self._topic_dir(name)
            stamp = _stamp(d)  # before the read: a change in between is seen at the next check
            if stamp is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            n, cfg, tid = _read_topic_meta(d, name)
            t = Topic(self, name, n, cfg, tid, stamp)
            self._topics[name] = t
            return t

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name``, its partitions and its consumer groups' offsets.

        Raises UnknownTopicError, or LogLockedError when another process writes one of its
        partitions or consumes it (nothing is deleted then).
        """
        check_name(name)
        self._check_writable(f"delete topic {name!r}")
        d = self._topic_dir(name)
        with self._lock, self._meta_lock():
            if not os.path.isfile(os.path.join(d, TOPIC_FILE)):
                raise UnknownTopicError(f"unknown topic {name!r}")
            t = self._topics.pop(name, None)
            if t is not None:
                t._deleted = True
                t._close()
            for c in list(self._consumers):
                if c.topic.name == name:
                    c.close()
            for entry in os.listdir(d):
                p = os.path.join(d, entry)
                if entry.startswith(PARTITION_PREFIX) and _locked_by_other(os.path.join(p, ".lock")):
                    raise LogLockedError(f"topic {name!r}: {entry} is open for writing elsewhere")
            cdir = os.path.join(d, CONSUMERS_DIR)
            if os.path.isdir(cdir):
                for group in os.listdir(cdir):
                    gdir = os.path.join(cdir, group)
                    for f in os.listdir(gdir):
                        if f.endswith(".lock") and _locked_by_other(os.path.join(gdir, f)):
                            raise LogLockedError(f"topic {name!r} has a live consumer in group {group!r}")
            gone = d + DELETED_SUFFIX
            if os.path.exists(gone):
                shutil.rmtree(gone)
            vfs.rename(d, gone)
            fileutil.fsync_dir(self.root)
            shutil.rmtree(gone)
            fileutil.fsync_dir(self.root)

    def add_partitions(self, name: str, count: int) -> int:
        """Add ``count`` partitions to topic ``name``; returns the new partition count.
        (Like Kafka, this moves where keys land: ``murmur2(key) % partitions`` changes.)"""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidArgumentError(f"count={count!r} must be an int >= 1")
        self._check_writable(f"add partitions to topic {name!r}")
        t = self.topic(name)
        with self._lock, self._meta_lock():
            t._check_meta(force=True)  # deleted meanwhile: UnknownTopicError, nothing written
            n, cfg, tid = _read_topic_meta(t.path, name)
            total = _check_partitions(n + count)
            for i in range(n, total):
                Log(_partition_dir(t.path, i), config=cfg).close()
            fileutil.fsync_dir(t.path)
            _write_topic_file(t.path, total, cfg, tid)  # the commit point
            t._set_partitions(total)
            t._next_check = 0.0
            return total

    def alter_topic(self, name: str, **changes: Any) -> LogConfig:
        """Change topic ``name``'s config (LogConfig fields); returns the new config. Open
        partitions are reopened with it. ``initial_offset`` of a topic with data cannot change."""
        self._check_writable(f"alter topic {name!r}")
        t = self.topic(name)
        with self._lock, self._meta_lock():
            t._check_meta(force=True)
            n, cfg, tid = _read_topic_meta(t.path, name)
            new = cfg.replace(**changes)
            if "initial_offset" in changes and new.initial_offset != cfg.initial_offset:
                raise ConfigError("initial_offset of an existing topic cannot change")
            _write_topic_file(t.path, n, new, tid)
            t._reconfigure(new)
            t._next_check = 0.0
            return new

    # -- transactions ------------------------------------------------------------------------
    def transaction(self) -> Transaction:
        """A new :class:`~pylog.transactions.Transaction`: ``with store.transaction() as tx:
        tx.append("orders", value, key=b"k")`` appends to any topics and partitions
        atomically, committing when the block ends and aborting when it raises."""
        from pylog.transactions import Transaction

        self._check_writable("start a transaction")
        return Transaction(self)

    # -- consumers ---------------------------------------------------------------------------
    def consumer(self, topic: str, group: str | None = None, **options: Any) -> Consumer:
        """A :class:`~pylog.consumer.Consumer` of ``topic`` in consumer group ``group``
        (None: no group, nothing committed). See :mod:`pylog.consumer` for the options."""
        from pylog.consumer import Consumer

        self._check_open()
        if group is not None and self.readonly:
            raise ReadOnlyLogError(f"a consumer group commits offsets, which a read-only store cannot "
                                   f"(store {self.root}); consume without a group")
        c = Consumer(self, self.topic(topic), group, **options)
        with self._lock:
            self._consumers.append(c)
        return c

    # -- consumer groups (pylog.groups) -------------------------------------------------------
    def groups(self, topic: str | None = None) -> list[str]:
        """The consumer groups of ``topic`` (default: of every topic), sorted."""
        from pylog import groups

        self._check_open()
        return groups.groups(self, topic)

    def describe_group(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """Committed offset, log end, lag and live owner of each partition group ``group``
        consumes; see :func:`pylog.groups.describe_group`."""
        from pylog import groups

        self._check_open()
        return groups.describe_group(self, group, topic)

    def reset_group(self, group: str, topic: str, **how: Any) -> list[dict[str, Any]]:
        """Reset group ``group``'s committed offsets on ``topic`` (``to_earliest=True``,
        ``to_latest=True``, ``to_offset=N``, ``to_datetime=...`` or ``shift_by=N``;
        ``dry_run=True``); see :func:`pylog.groups.reset_group`."""
        from pylog import groups

        self._check_open()
        return groups.reset_group(self, group, topic, **how)

    def delete_group(self, group: str, topic: str | None = None) -> list[str]:
        """Delete group ``group``'s committed offsets (from ``topic``, default every topic);
        see :func:`pylog.groups.delete_group`."""
        from pylog import groups

        self._check_open()
        return groups.delete_group(self, group, topic)

    def _forget_consumer(self, c: Consumer) -> None:
        with self._lock:
            if c in self._consumers:
                self._consumers.remove(c)

    # -- maintenance -------------------------------------------------------------------------
    def enforce_retention(self, topic: str | None = None) -> dict[tuple[str, int], int]:
        """Apply ``retention_ms`` / ``retention_bytes`` to every partition of every topic
        whose ``cleanup_policy`` is ``"delete"`` (or only of ``topic``). Returns
        ``{(topic, partition): segments deleted}``."""
        self._check_writable("enforce retention")
        return {key: log.enforce_retention() for key, log in self._partitions_under(topic, "delete")}

    def compact(self, topic: str | None = None, **options: Any) -> dict[tuple[str, int], CompactionReport]:
        """Compact every partition of every topic whose ``cleanup_policy`` is ``"compact"``
        (or only of ``topic``). Returns ``{(topic, partition): CompactionReport}``."""
        from pylog.compaction import compact

        self._check_writable("compact")
        return {key: compact(log, **options) for key, log in self._partitions_under(topic, "compact")}

    def _partitions_under(self, topic: str | None, policy: str) -> Iterator[tuple[tuple[str, int], Log]]:
        """``((topic, partition), Log)`` of every partition of ``topic`` (default: every
        topic) whose ``cleanup_policy`` is or includes ``policy``."""
        for name in [topic] if topic is not None else self.topics():
            t = self.topic(name)
            if policy in t.config.cleanup_policy.split(","):
                for i in range(t.partitions):
                    yield (name, i), t.partition(i)

    def flush(self) -> None:
        """Flush every open partition (everything appended so far becomes durable)."""
        with self._lock:
            for t in list(self._topics.values()):
                t.flush()

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close every consumer and partition this store opened, releasing every lock.
        Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            for c in list(self._consumers):
                try:
                    c.close()
                except Exception as e:  # keep closing the rest
                    errors.append(e)
            for t in list(self._topics.values()):
                try:
                    t._close()
                except Exception as e:
                    errors.append(e)
            self._topics.clear()
            if errors:
                raise errors[0]

    @property
    def closed(self) -> bool:
        """Whether close() was called on the store."""
        return self._closed

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pylog.LogStore {self.root!r}{' closed' if self._closed else ''}>"


class Topic:
    """A named group of partitions. Get one from :meth:`LogStore.create_topic` or
    :meth:`LogStore.topic`."""

    def __init__(self, store: LogStore, name: str, partitions: int, config: LogConfig,
                 topic_id: str | None = None, stamp: tuple[int, int, int] | None = None) -> None:
        self.store = store
        self.name = name
        self.path = os.path.join(store.root, name)
        self.config = config
        #: the id in topic.json (None for a topic created before ids): a topic deleted and
        #: created again under the same name has another id, and is another topic
        self.id = topic_id
        self._n = partitions
        self._logs: list[Log | None] = [None] * partitions
        self._readers: dict[int, Log] = {}
        self._rr = itertools.count()
        self._closed = False
        self._deleted = False
        self._stamp = stamp
        self._next_check = time.monotonic() + store.metadata_refresh_ms / 1000
        self._open_lock = threading.RLock()

    @property
    def partitions(self) -> int:
        """How many partitions the topic has (another process's additions show within
        ``metadata_refresh_ms``)."""
        self._check_meta()
        return self._n

    # -- metadata ----------------------------------------------------------------------------
    def _check_meta(self, force: bool = False) -> None:
        """Pick up another process's changes to the topic, at most once every
        ``metadata_refresh_ms`` (always with ``force``): one ``stat`` of topic.json, and a
        read only when it changed. UnknownTopicError when the topic was deleted."""
        if self._deleted:
            raise UnknownTopicError(f"topic {self.name!r} was deleted")
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self._next_check = now + self.store.metadata_refresh_ms / 1000
        stamp = _stamp(self.path)
        if stamp is not None and stamp == self._stamp:
            return
        with self._open_lock:
            if stamp is None:
                self._gone("was deleted")
            try:
                n, cfg, tid = _read_topic_meta(self.path, self.name)
            except UnknownTopicError:
                self._gone("was deleted")
            if tid != self.id:
                self._gone("was deleted (a new topic of that name exists now: get a new handle "
                           "with LogStore.topic)")
            if n > self._n:
                self._set_partitions(n)
            if cfg != self.config:
                self._reconfigure(cfg)
            self._stamp = stamp

    def _gone(self, why: str) -> None:
        """The topic this handle names is gone: close its partitions, raise UnknownTopicError
        now and at every later use."""
        self._deleted = True
        try:
            self._close()
        except Exception:
            pass  # its files are gone; nothing of it is written again
        raise UnknownTopicError(f"topic {self.name!r} {why}")

    def __len__(self) -> int:
        return self._n

    __contains__ = topic_contains  # `log in topic`; `offset in topic` raises (offsets are per partition)

    def __repr__(self) -> str:
        return f"<pylog.Topic {self.name!r} partitions={self._n}>"

    def _check_partition(self, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ArgumentTypeError(f"partition must be an int, got {type(i).__name__}")
        n: int = int(i)
        self._check_meta()
        if not 0 <= n < self._n:
            raise UnknownPartitionError(f"topic {self.name!r} has no partition {n} (it has {self._n})")
        return n

    def partition(self, i: int) -> Log:
        """The :class:`~pylog.Log` of partition ``i``, open for writing (kept open until the
        store closes). LogLockedError if another process writes it (after waiting up to the
        store's ``lock_timeout``); ReadOnlyLogError in a read-only store."""
        i = self._check_partition(i)
        log = self._logs[i]
        if log is not None:
            return log
        return self._open(i)

    def _open(self, i: int) -> Log:
        if self._deleted:
            raise UnknownTopicError(f"topic {self.name!r} was deleted")
        if self._closed or self.store._closed:
            raise LogClosedError(f"topic {self.name!r} is closed")
        if self.store.readonly:
            raise ReadOnlyLogError(f"cannot write partition {i} of topic {self.name!r}: "
                                   f"store {self.store.root} is open read-only")
        timeout = self.store.lock_timeout
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            # Under the store lock (delete_topic takes it too; taken before the topic's, as
            # add_partitions and alter_topic do: the other order deadlocks), after a fresh look
            # at topic.json: a partition opened here is one of this very topic, never a
            # directory recreated after a delete.
            with self.store._meta_lock(), self._open_lock:
                log = self._logs[i] if i < len(self._logs) else None
                if log is not None:
                    return log
                self._check_meta(force=True)
                if i >= self._n:
                    raise UnknownPartitionError(f"topic {self.name!r} has no partition {i} (it has {self._n})")
                try:
                    log = Log(_partition_dir(self.path, i), config=self.config)
                except LogLockedError:
                    log = None
                if log is not None:
                    self._logs[i] = log
                    r = self._readers.pop(i, None)
                    if r is not None:
                        r.close()
                    return log
            left = deadline - time.monotonic()
            if left <= 0:
                waited = f" (waited {timeout:g} s)" if timeout else ""
                raise LogLockedError(f"partition {i} of topic {self.name!r} is locked by another writer{waited}")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.1)

    def reader(self, i: int) -> Log:
        """Partition ``i`` for reading: the writer if this store has it open, else a
        read-only Log that follows another process's writes."""
        i = self._check_partition(i)
        log = self._logs[i]
        if log is not None:
            return log
        r = self._readers.get(i)
        if r is None:
            if self._closed or self.store._closed:  # else a reader no one would ever close
                raise LogClosedError(f"topic {self.name!r} is closed")
            with self._open_lock:
                r = self._readers.get(i)
                if r is None:
                    try:
                        r = Log(_partition_dir(self.path, i), readonly=True)
                    except FileNotFoundError:
                        self._check_meta(force=True)  # deleted: UnknownTopicError
                        raise
                    self._readers[i] = r
        return r

    def partition_for(self, key: Any) -> int:
        """The partition ``key`` maps to (Kafka's murmur2 partitioner)."""
        return partition_for_key(key, self._n)

    def append(self, value: Any, key: Any = None, partition: int | None = None, metadata: Any = None,
               timestamp: int | None = None) -> tuple[int, int]:
        """Append one record; returns ``(partition, offset)``.

        ``partition`` None picks it: by Kafka's murmur2 hash of ``key``, or round-robin for
        records without a key. Other arguments as :meth:`pylog.Log.append`.
        """
        if self._deleted or self._next_check <= time.monotonic():
            self._check_meta()
        if partition is None:
            if key is None:
                p = next(self._rr) % self._n
            elif type(key) is bytes:
                p = _positive_hash(key) % self._n
            else:
                p = partition_for_key(key, self._n)
        else:
            p = self._check_partition(partition)
        log = self._logs[p]
        if log is None:
            log = self._open(p)
        return p, log.append(value, key, metadata, timestamp)

    def append_batch(self, values: Sequence[Any], keys: Sequence[Any] | None = None,
                     partition: int | None = None, timestamps: Sequence[int] | None = None,
                     metadata: Sequence[Any] | None = None) -> list[tuple[int, int]]:
        """Append many records with one :meth:`pylog.Log.append_batch` per partition.

        Returns ``(partition, offset)`` per record, in input order. Records with a key go
        where their key hashes; without ``keys`` the whole batch goes to one partition (the
        next one each batch), unless ``partition`` is given.
        """
        from pylog.transactions import batch_arguments

        values, keys, n = batch_arguments(values, keys)
        self._check_meta()
        if partition is not None or keys is None or all(k is None for k in keys):
            p = self._check_partition(partition) if partition is not None else next(self._rr) % self._n
            first = self.partition(p).append_batch(values, keys, timestamps, metadata)
            return list(zip(itertools.repeat(p, n), range(first, first + n)))
        rr = next(self._rr)
        nparts = self._n
        parts = np.fromiter(
            ((rr % nparts) if k is None else partition_for_key(k, nparts) for k in keys), dtype=np.int64, count=n)
        out: list[tuple[int, int]] = [(0, 0)] * n
        # validate everything before writing anything into any partition, and open every
        # partition it goes to: a metadata refresh while opening one of them that finds the
        # config changed by another process reopens the partitions (closing those opened
        # before it), so open them again until all are open at once
        uniq = np.unique(parts).tolist()
        for p in uniq:
            self._check_partition(p)
        while True:
            logs = {p: self.partition(p) for p in uniq}
            if not any(log.closed for log in logs.values()):
                break
        for p in uniq:
            idx = np.flatnonzero(parts == p).tolist()
            def sub(seq: Any, idx: list[int] = idx) -> list[Any] | None:
                return None if seq is None else [seq[j] for j in idx]
            first = logs[p].append_batch(
                [values[j] for j in idx], sub(keys), sub(timestamps), sub(metadata))
            for r, j in enumerate(idx):
                out[j] = (p, first + r)
        return out

    def flush(self) -> None:
        """Flush every partition open for writing."""
        for log in self._logs:
            if log is not None and not log.closed:
                log.flush()

    def describe(self) -> dict[str, Any]:
        """Partitions, offsets, segments and sizes, as a dict (what ``pylog topic describe``
        prints). Opens each partition read-only if this store does not write it."""
        self._check_meta(force=True)
        parts = []
        for i in range(self._n):
            log = self.reader(i)
            if log.readonly:
                log.refresh()
            segs = log.segments()
            parts.append({
                "partition": i, "start_offset": log.start_offset, "next_offset": log.next_offset,
                "records": _count_records(segs), "size_bytes": log.size_bytes, "segments": len(segs),
                "segment_list": [{k: v for k, v in s.items() if k != "path"} for s in segs],
            })
        from pylog.groups import groups

        return {"name": self.name, "partitions": self._n, "config": self.config.to_dict(),
                "groups": groups(self.store, self.name), "partition_info": parts}

    def __iter__(self) -> Iterator[Log]:
        """Every partition: open for writing, or read-only in a read-only store."""
        for i in range(self.partitions):
            yield self.reader(i) if self.store.readonly else self.partition(i)

    # -- internals -------------------------------------------------------------------------
    def _set_partitions(self, total: int) -> None:
        with self._open_lock:
            self._logs.extend([None] * (total - self._n))
            self._n = total

    def _reconfigure(self, config: LogConfig) -> None:
        with self._open_lock:
            self.config = config
            for i, log in enumerate(self._logs):
                if log is not None:
                    log.close()
                    self._logs[i] = None  # reopened with the new config at the next use

    def _close(self) -> None:
        self._closed = True
        first: BaseException | None = None
        for log in [*self._logs, *self._readers.values()]:
            if log is not None:
                try:
                    log.close()
                except Exception as e:
                    first = first or e
        self._logs = [None] * self._n
        self._readers.clear()
        if first is not None:
            raise first
