"""LogStore and Topic: named topics of numbered partitions under one root directory.

Layout (DESIGN.md section 4)::

    ROOT/
      .store.lock                  flock held only while topics are created, changed or deleted
      TOPIC/
        topic.json                 {"version": 1, "partitions": N, "config": {LogConfig fields}}
        partition-0/ ... partition-(N-1)/     one pylog.Log each
        ~consumers/GROUP/          committed offsets and locks of consumer groups (consumer.py)

A topic directory appears under its real name only once it is complete: it is built as
``TOPIC~creating`` and renamed; a deleted topic is renamed to ``TOPIC~deleted`` before its
files go. ``~`` cannot occur in a topic name, so neither can be mistaken for a topic, and
leftovers of a crash are removed the next time the store is opened.

A key picks its partition as Kafka's default partitioner does,
``toPositive(murmur2(key)) % partitions``, so a key lands in the partition Kafka would put it
in. Records without a key go round-robin (``append``) or a whole batch to one partition,
the next batch to the next one (``append_batch``, Kafka's "sticky" partitioner).
"""
from __future__ import annotations

import fcntl
import itertools
import json
import mmap
import os
import re
import shutil
import threading
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from pylog import fileutil, vfs
from pylog._backend import impl
from pylog.config import LogConfig
from pylog.errors import (
    ArgumentTypeError,
    ConfigError,
    InvalidArgumentError,
    InvalidNameError,
    LogClosedError,
    LogLockedError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.log import Log

if TYPE_CHECKING:
    from pylog.compaction import CompactionReport
    from pylog.consumer import Consumer
    from pylog.transactions import Transaction

__all__ = ["LogStore", "Topic", "murmur2", "partition_for_key", "check_name"]

TOPIC_FILE = "topic.json"
STORE_LOCK = ".store.lock"
PARTITION_PREFIX = "partition-"
CONSUMERS_DIR = "~consumers"
CREATING_SUFFIX = "~creating"
DELETED_SUFFIX = "~deleted"
MAX_PARTITIONS = 1 << 16

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


def check_name(name: Any, what: str = "topic") -> str:
    """``name`` if it is a valid topic (or group) name, else :class:`InvalidNameError`.

    Valid: 1 to 249 of ``A-Z a-z 0-9 . _ -``, and not ``.`` or ``..`` (Kafka's rule), so a
    name can never reach outside the data root.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} name must be a str, got {type(name).__name__}")
    if not _NAME_RE.match(name) or name in (".", ".."):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise InvalidNameError(
            f"invalid {what} name {shown!r}: use 1-249 of A-Z a-z 0-9 . _ - (and not '.' or '..')")
    return name


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
        key = bytes(memoryview(key))
    return _positive_hash(key) % partitions


# ----------------------------------------------------------------------------------------
def _partition_dir(topic_dir: str, i: int) -> str:
    return os.path.join(topic_dir, f"{PARTITION_PREFIX}{i}")


def _read_topic_file(topic_dir: str, name: str) -> tuple[int, LogConfig]:
    path = os.path.join(topic_dir, TOPIC_FILE)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise UnknownTopicError(f"unknown topic {name!r}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"topic file of {name!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ConfigError(f"topic file of {name!r} has an unknown layout or version")
    n = data.get("partitions")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise ConfigError(f"topic file of {name!r} names a bad partition count {n!r}")
    cfg = data.get("config")
    if not isinstance(cfg, dict):
        raise ConfigError(f"topic file of {name!r} holds no config object")
    return n, LogConfig.from_dict(cfg)


def _write_topic_file(topic_dir: str, partitions: int, config: LogConfig) -> None:
    body = json.dumps({"version": 1, "partitions": partitions, "config": config.to_dict()},
                      indent=1, sort_keys=True).encode()
    fileutil.atomic_write(os.path.join(topic_dir, TOPIC_FILE), body)


def _check_partitions(partitions: Any) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ArgumentTypeError(f"partitions must be an int, got {type(partitions).__name__}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgumentError(f"partitions={partitions} must be between 1 and {MAX_PARTITIONS}")
    return partitions


def _count_records(segments: list[dict[str, Any]]) -> int:
    """How many records the segments hold: ``next - base`` for each, except in a compacted
    segment (offsets with gaps), whose frames are counted."""
    from pylog import format as fmt

    total = 0
    for s in segments:
        n = s["next_offset"] - s["base_offset"]
        if not s["sealed"] or n == 0:
            total += n
            continue
        try:
            f = open(s["path"], "rb")
        except FileNotFoundError:  # removed meanwhile (retention, compaction)
            continue
        with f:
            size = os.fstat(f.fileno()).st_size
            rc, _base, flags = impl.header_check(f.read(fmt.FILE_HEADER_SIZE), fmt.STORE_MAGIC)
            if rc != impl.OK or not flags & fmt.HEADER_COMPACTED:
                total += n
                continue
            if size <= fmt.FILE_HEADER_SIZE:
                continue
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
            try:
                buf = impl.Buffer(mm)
                pos, expected = fmt.FILE_HEADER_SIZE, s["base_offset"]
                while pos < size:
                    rc, frames, end = impl.scan(buf, size, pos, expected, 1 << 16, (1 << 64) - 1, True)
                    if not len(frames):
                        break
                    total += len(frames)
                    expected = int(frames[-1]["offset"]) + 1
                    pos = int(end)
                    if rc != impl.OK:
                        break
                del buf
            finally:
                try:
                    mm.close()
                except BufferError:
                    pass
    return total


def _locked_by_other(lock_path: str) -> bool:
    """Whether another open file description holds an flock on ``lock_path``."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class LogStore:
    """A data root holding topics; each topic a directory of partitions (one
    :class:`~pylog.Log` each).

    Partitions are opened for writing on first use (taking each partition's writer lock)
    and stay open until :meth:`close`. Another process may use the same root: a partition
    that it writes is locked against writers here (:class:`~pylog.LogLockedError`) but can
    be read by a consumer.

    >>> import pylog, tempfile
    >>> with pylog.LogStore(tempfile.mkdtemp()) as store:
    ...     t = store.create_topic("orders", partitions=3)
    ...     t.append(b"hello", key=b"customer-1")
    (1, 0)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise ArgumentTypeError(f"root must be a str or os.PathLike, got {type(root).__name__}")
        self.root = os.fspath(root)
        if not self.root:
            raise InvalidArgumentError("root must not be empty")
        self._lock = threading.RLock()
        self._topics: dict[str, Topic] = {}
        self._consumers: list[Consumer] = []
        self._closed = False
        vfs.makedirs(self.root)
        if not os.access(self.root, os.R_OK | os.W_OK | os.X_OK):
            raise PermissionError(13, "data root is not readable and writable", self.root)
        self._clean_leftovers()
        if os.path.isdir(os.path.join(self.root, "~txn")):
            from pylog.transactions import recover

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

    def _meta_lock(self) -> "_FileLock":
        return _FileLock(os.path.join(self.root, STORE_LOCK))

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"store {self.root} is closed")

    def _topic_dir(self, name: str) -> str:
        return os.path.join(self.root, check_name(name))

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, config: LogConfig | None = None,
                     **log_config: Any) -> "Topic":
        """Create topic ``name`` with ``partitions`` partitions; returns it.

        ``config`` and keyword options (:class:`~pylog.LogConfig` fields) configure every
        partition; they are persisted with the topic and validated on every reopen.

        Raises InvalidNameError (nothing is touched), TopicExistsError, ConfigError.
        """
        check_name(name)
        _check_partitions(partitions)
        if config is not None and not isinstance(config, LogConfig):
            raise ArgumentTypeError(f"config must be a LogConfig, got {type(config).__name__}")
        cfg = (config or LogConfig()).replace(**log_config)
        self._check_open()
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
                _write_topic_file(tmp, partitions, cfg)
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

    def topic(self, name: str) -> "Topic":
        """The topic ``name`` (UnknownTopicError if there is none)."""
        check_name(name)
        self._check_open()
        with self._lock:
            t = self._topics.get(name)
            if t is not None and not t._closed:
                return t
            n, cfg = _read_topic_file(self._topic_dir(name), name)
            t = Topic(self, name, n, cfg)
            self._topics[name] = t
            return t

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name``, its partitions and its consumer groups' offsets.

        Raises UnknownTopicError, or LogLockedError when another process writes one of its
        partitions or consumes it (nothing is deleted then).
        """
        check_name(name)
        self._check_open()
        d = self._topic_dir(name)
        with self._lock, self._meta_lock():
            if not os.path.isfile(os.path.join(d, TOPIC_FILE)):
                raise UnknownTopicError(f"unknown topic {name!r}")
            t = self._topics.pop(name, None)
            if t is not None:
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
        t = self.topic(name)
        with self._lock, self._meta_lock():
            n, cfg = _read_topic_file(t.path, name)
            total = _check_partitions(n + count)
            for i in range(n, total):
                Log(_partition_dir(t.path, i), config=cfg).close()
            fileutil.fsync_dir(t.path)
            _write_topic_file(t.path, total, cfg)  # the commit point
            t._set_partitions(total)
            return total

    def alter_topic(self, name: str, **changes: Any) -> LogConfig:
        """Change topic ``name``'s config (LogConfig fields); returns the new config. Open
        partitions are reopened with it. ``initial_offset`` of a topic with data cannot change."""
        t = self.topic(name)
        with self._lock, self._meta_lock():
            n, cfg = _read_topic_file(t.path, name)
            new = cfg.replace(**changes)
            if "initial_offset" in changes and new.initial_offset != cfg.initial_offset:
                raise ConfigError("initial_offset of an existing topic cannot change")
            _write_topic_file(t.path, n, new)
            t._reconfigure(new)
            return new

    # -- transactions ------------------------------------------------------------------------
    def transaction(self) -> "Transaction":
        """A new :class:`~pylog.transactions.Transaction`: ``with store.transaction() as tx:
        tx.append("orders", value, key=b"k")`` appends to any topics and partitions
        atomically, committing when the block ends and aborting when it raises."""
        from pylog.transactions import Transaction

        self._check_open()
        return Transaction(self)

    # -- consumers ---------------------------------------------------------------------------
    def consumer(self, topic: str, group: str | None = None, **options: Any) -> "Consumer":
        """A :class:`~pylog.consumer.Consumer` of ``topic`` in consumer group ``group``
        (None: no group, nothing committed). See :mod:`pylog.consumer` for the options."""
        from pylog.consumer import Consumer

        self._check_open()
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

    def _forget_consumer(self, c: "Consumer") -> None:
        with self._lock:
            if c in self._consumers:
                self._consumers.remove(c)

    # -- maintenance -------------------------------------------------------------------------
    def enforce_retention(self, topic: str | None = None) -> dict[tuple[str, int], int]:
        """Apply ``retention_ms`` / ``retention_bytes`` to every partition of every topic
        whose ``cleanup_policy`` is ``"delete"`` (or only of ``topic``). Returns
        ``{(topic, partition): segments deleted}``."""
        return {key: log.enforce_retention() for key, log in self._partitions_under(topic, "delete")}

    def compact(self, topic: str | None = None, **options: Any) -> dict[tuple[str, int], "CompactionReport"]:
        """Compact every partition of every topic whose ``cleanup_policy`` is ``"compact"``
        (or only of ``topic``). Returns ``{(topic, partition): CompactionReport}``."""
        from pylog.compaction import compact

        return {key: compact(log, **options) for key, log in self._partitions_under(topic, "compact")}

    def _partitions_under(self, topic: str | None, policy: str) -> Iterator[tuple[tuple[str, int], Log]]:
        """``((topic, partition), Log)`` of every partition of ``topic`` (default: every
        topic) whose ``cleanup_policy`` is ``policy``."""
        for name in [topic] if topic is not None else self.topics():
            t = self.topic(name)
            if t.config.cleanup_policy == policy:
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

    def __enter__(self) -> "LogStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pylog.LogStore {self.root!r}{' closed' if self._closed else ''}>"


class _FileLock:
    """An exclusive flock on a file, held for a ``with`` block (blocking)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_FileLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        self.fd = -1


class Topic:
    """A named group of partitions. Get one from :meth:`LogStore.create_topic` or
    :meth:`LogStore.topic`."""

    def __init__(self, store: LogStore, name: str, partitions: int, config: LogConfig) -> None:
        self.store = store
        self.name = name
        self.path = os.path.join(store.root, name)
        self.config = config
        self._n = partitions
        self._logs: list[Log | None] = [None] * partitions
        self._readers: dict[int, Log] = {}
        self._rr = itertools.count()
        self._closed = False
        self._open_lock = threading.Lock()

    @property
    def partitions(self) -> int:
        """How many partitions the topic has."""
        return self._n

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"<pylog.Topic {self.name!r} partitions={self._n}>"

    def _check_partition(self, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ArgumentTypeError(f"partition must be an int, got {type(i).__name__}")
        i = int(i)
        if not 0 <= i < self._n:
            raise UnknownPartitionError(f"topic {self.name!r} has no partition {i} (it has {self._n})")
        return i

    def partition(self, i: int) -> Log:
        """The :class:`~pylog.Log` of partition ``i``, open for writing (kept open until the
        store closes). LogLockedError if another process writes it."""
        i = self._check_partition(i)
        log = self._logs[i]
        if log is not None:
            return log
        return self._open(i)

    def _open(self, i: int) -> Log:
        if self._closed or self.store._closed:
            raise LogClosedError(f"topic {self.name!r} is closed")
        with self._open_lock:
            log = self._logs[i]
            if log is None:
                log = Log(_partition_dir(self.path, i), config=self.config)
                self._logs[i] = log
                r = self._readers.pop(i, None)
                if r is not None:
                    r.close()
            return log

    def reader(self, i: int) -> Log:
        """Partition ``i`` for reading: the writer if this store has it open, else a
        read-only Log that follows another process's writes."""
        i = self._check_partition(i)
        log = self._logs[i]
        if log is not None:
            return log
        r = self._readers.get(i)
        if r is None:
            with self._open_lock:
                r = self._readers.get(i)
                if r is None:
                    r = Log(_partition_dir(self.path, i), readonly=True)
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
        if partition is not None or keys is None or all(k is None for k in keys):
            p = self._check_partition(partition) if partition is not None else next(self._rr) % self._n
            first = self.partition(p).append_batch(values, keys, timestamps, metadata)
            return list(zip(itertools.repeat(p, n), range(first, first + n)))
        rr = next(self._rr)
        nparts = self._n
        parts = np.fromiter(
            ((rr % nparts) if k is None else partition_for_key(k, nparts) for k in keys), dtype=np.int64, count=n)
        out: list[tuple[int, int]] = [(0, 0)] * n
        # validate everything before writing anything into any partition
        for p in np.unique(parts).tolist():
            self._check_partition(p)
            self.partition(p)
        for p in np.unique(parts).tolist():
            idx = np.flatnonzero(parts == p).tolist()
            sub = lambda seq: None if seq is None else [seq[j] for j in idx]  # noqa: E731
            first = self._logs[p].append_batch(  # type: ignore[union-attr]
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
        for i in range(self._n):
            yield self.partition(i)

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
                    self._logs[i] = None

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
