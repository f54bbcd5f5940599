"""Consumers and consumer groups: Kafka-style pull consumers whose positions survive restarts.

A :class:`Consumer` reads one topic. Its *position* in each partition it owns is the offset
of the next record :meth:`Consumer.poll` returns; :meth:`Consumer.commit` stores positions
durably as the group's *committed offsets*, from which the next consumer of the group starts.

Files, under ``ROOT/TOPIC/~consumers/GROUP/``::

    partition-N.offset   the committed offset of partition N (36 bytes, below), replaced
                         atomically (temp file, fsync, rename, fsync of the directory)
    partition-N.lock     flock'ed by the one consumer of the group that owns partition N
    member-K.lock        flock'ed by a live member of the group (slot K)

``partition-N.offset``: ``8s magic b"PYLOGOFF" | u16 version 1 | u16 0 | u32 0 |
u64 offset | i64 commit time (ms) | u32 crc32c of bytes 0..31`` (36 bytes); a commit with
metadata or a leader epoch (Kafka's OffsetCommit carries both) is version 2: ``8s magic |
u16 version 2 | u16 0 | i32 leader epoch (-1: none) | u64 offset | i64 commit time (ms) |
u32 metadata length | metadata (UTF-8) | u32 crc32c of everything before``. Both versions
are read. A damaged file is ignored (with a warning) and the partition starts per
``auto_offset_reset``: never a wrong offset.

Assignment is static and needs no coordinator: each live member holds the lock of one member
slot; with M live members, the member of rank r (by slot number) owns the partitions p with
``p % M == r``. Members re-check the membership every ``rebalance_ms`` while polling, and a
partition changes hands only through its lock, so two live consumers of a group never own
the same partition. A killed consumer's locks are released by the kernel; the others take
its partitions over on their next check, from the committed offsets.

Partitions added to the topic (by any process) are noticed within the store's
``metadata_refresh_ms``: a consumer without a group takes them at once, group members at the
next membership check. A partition added after the consumer started, with nothing committed
for it, starts at its earliest offset whatever ``auto_offset_reset`` says, so records written
to it before the consumer noticed it are not skipped. A deleted topic makes :meth:`poll`
raise :class:`~pylog.UnknownTopicError`.

Only what was handed out is committed: :meth:`Consumer.commit` without arguments stores the
positions, i.e. the offset after the last record :meth:`poll` returned per partition; an
application that hands records on (a printer, a forwarder) and may stop part-way through a
batch commits ``{partition: offset after the last record it really handed on}`` instead
(``pylog consume`` does so).

A consumer is not thread-safe (as Kafka's is not): use one per thread.
"""
from __future__ import annotations

import fcntl
import os
import struct
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pylog import fileutil, vfs
from pylog._backend import impl
from pylog.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    LogClosedError,
    LogLockedError,
    NotAssignedError,
    OffsetOutOfRangeError,
)
from pylog.record import Record
from pylog.topics import CONSUMERS_DIR, check_name

if TYPE_CHECKING:
    from pylog.log import Log
    from pylog.topics import LogStore, Topic

__all__ = ["Consumer"]

_OFS = struct.Struct("<8sHHIQq")
_OFS2 = struct.Struct("<8sHHiQqI")
_CRC = struct.Struct("<I")
OFFSET_MAGIC = b"PYLOGOFF"
OFFSET_FILE_SIZE = _OFS.size + _CRC.size
#: The longest commit metadata, in characters (Kafka's ``offset.metadata.max.bytes`` default).
MAX_METADATA_CHARS = 4096
#: The largest committed-offset file (version 2 with the longest metadata, 4 UTF-8 bytes a character).
OFFSET_FILE_MAX = _OFS2.size + 4 * MAX_METADATA_CHARS + _CRC.size
RESETS = ("earliest", "latest", "none")


def encode_offset(offset: int, when_ms: int, metadata: str = "", leader_epoch: int = -1) -> bytes:
    """The bytes of a ``partition-N.offset`` file: version 1 without metadata and leader
    epoch, else version 2 (see the module docstring)."""
    if not metadata and leader_epoch < 0:
        body = _OFS.pack(OFFSET_MAGIC, 1, 0, 0, offset, when_ms)
    else:
        text = metadata.encode("utf-8")
        body = _OFS2.pack(OFFSET_MAGIC, 2, 0, max(leader_epoch, -1), offset, when_ms, len(text)) + text
    return body + _CRC.pack(impl.crc32c(body))


def decode_commit(data: bytes) -> tuple[int, int, str] | None:
    """``(offset, leader epoch, metadata)`` of a ``partition-N.offset`` file's bytes (either
    version; epoch -1 and metadata ``""`` when the commit had none), or None when they
    are damaged."""
    if len(data) < OFFSET_FILE_SIZE or len(data) > OFFSET_FILE_MAX:
        return None
    body = data[: -_CRC.size]
    if _CRC.unpack(data[-_CRC.size :])[0] != impl.crc32c(body):
        return None
    magic, version = body[:8], int.from_bytes(body[8:10], "little")
    if magic != OFFSET_MAGIC:
        return None
    if version == 1 and len(body) == _OFS.size:
        offset = _OFS.unpack(body)[4]
        epoch, meta = -1, ""
    elif version == 2 and len(body) >= _OFS2.size:
        _m, _v, _a, epoch, offset, _when, n = _OFS2.unpack_from(body)
        if len(body) != _OFS2.size + n:
            return None
        try:
            meta = body[_OFS2.size :].decode("utf-8")
        except UnicodeDecodeError:
            return None
    else:
        return None
    if offset >= 1 << 63:
        return None
    return int(offset), int(epoch), meta


def decode_offset(data: bytes) -> int | None:
    """The offset in a ``partition-N.offset`` file's bytes, or None when they are damaged."""
    found = decode_commit(data)
    return None if found is None else found[0]


def read_commit(path: str) -> tuple[int, int, str] | None:
    """:func:`decode_commit` of the file at ``path``; None when it is missing or damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read(OFFSET_FILE_MAX + 1)
    except FileNotFoundError:
        return None
    return decode_commit(data)


def _try_lock(path: str) -> int:
    """An fd holding an exclusive flock on ``path``, or -1 if someone else holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mark_owner(fd: int, who: str) -> None:
    """Write who holds a lock file into it (``member-K pid P host H``), for
    :func:`pylog.groups.describe_group`. Only a hint: the flock is what counts."""
    import socket

    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{who} pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
    except OSError:
        pass


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Consumer:
    """Reads a topic from per-partition positions; see the module docstring.

    Get one with :meth:`pylog.LogStore.consumer`.

    Parameters
    ----------
    group
        Consumer group name (same rules as topic names), or None: a consumer on its own,
        owning every partition, that cannot commit.
    auto_offset_reset
        Where a partition starts when the group has no committed offset for it, or the
        committed offset is no longer in the log (retention removed it): ``"earliest"``
        (``start_offset``), ``"latest"`` (``next_offset``: only new records) or ``"none"``
        (raise OffsetOutOfRangeError).
    partitions
        Own exactly these partitions (manual assignment) instead of sharing the topic with
        the group's other members. With a group, a partition another member owns raises
        LogLockedError.
    max_bytes
        Byte budget of one partition's fetch in :meth:`poll`.
    rebalance_ms
        How often a group member re-checks the membership while polling.

    Attributes
    ----------
    last_poll : dict[int, list[Record]]
        The records the last :meth:`poll` returned, by partition (which partition each
        record came from; a Record does not carry it).
    store, topic, group
        The LogStore, the Topic and the group name (None: no group) of the consumer.
    """

    def __init__(self, store: LogStore, topic: Topic, group: str | None = None, *,
                 auto_offset_reset: str = "earliest", partitions: Iterable[int] | None = None,
                 max_bytes: int = 8 << 20, rebalance_ms: int = 500) -> None:
        if group is not None:
            check_name(group, "group")
        if auto_offset_reset not in RESETS:
            raise InvalidArgumentError(f"auto_offset_reset={auto_offset_reset!r} is not one of {', '.join(RESETS)}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidArgumentError(f"max_bytes={max_bytes!r} must be an int >= 1")
        self.store = store
        self.topic = topic
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.max_bytes = max_bytes
        self.rebalance_ms = rebalance_ms
        self._pos: dict[int, int | None] = {}  # owned partition -> position (None: not yet known)
        self._locks: dict[int, int] = {}  # owned partition -> lock fd
        self._committed_cache: dict[int, tuple[int, str]] = {}
        self._member_fd = -1
        self._member_slot: int | None = None
        self._manual = partitions is not None
        self._closed = False
        self._next_rebalance = 0.0
        self._rr = 0
        self._known_n = topic._n  # partitions of the topic when last looked at
        self._added: set[int] = set()  # partitions added to the topic after we started
        #: The records of the last :meth:`poll`, by partition.
        self.last_poll: dict[int, list[Record]] = {}
        self.dir = os.path.join(topic.path, CONSUMERS_DIR, group) if group is not None else None
        try:
            if self.dir is not None:
                # Under the store lock, after a fresh look at the topic: the group's directory
                # is made inside this very topic, never in one a delete just removed, and the
                # member lock makes delete_topic refuse from now on.
                with store._meta_lock():
                    topic._check_meta(force=True)
                    vfs.makedirs(self.dir)
                    if partitions is None:
                        self._join()
                    else:
                        self._claim(partitions)
            if partitions is not None:
                if self.dir is None:
                    self._claim(partitions)
            elif self.dir is None:
                for p in range(topic.partitions):
                    self._acquire(p)
            else:
                self._rebalance()
        except BaseException:
            self._release_all()
            raise

    def _claim(self, partitions: Iterable[int]) -> None:
        """Manual assignment: own exactly ``partitions``."""
        wanted = sorted({self.topic._check_partition(p) for p in partitions})
        for p in wanted:
            if not self._acquire(p):
                raise LogLockedError(f"partition {p} of topic {self.topic.name!r} is owned by another "
                                     f"consumer of group {self.group!r}")

    # -- group membership ------------------------------------------------------------------
    def _join(self) -> None:
        assert self.dir is not None
        k = 0
        while True:
            fd = _try_lock(os.path.join(self.dir, f"member-{k}.lock"))
            if fd >= 0:
                self._member_fd, self._member_slot = fd, k
                _mark_owner(fd, f"member-{k}")
                return
            k += 1

    def _live_members(self) -> list[int]:
        assert self.dir is not None
        live = []
        for name in os.listdir(self.dir):
            if not (name.startswith("member-") and name.endswith(".lock")):
                continue
            try:
                k = int(name[7:-5])
            except ValueError:
                continue
            if k == self._member_slot:
                live.append(k)
                continue
            fd = _try_lock(os.path.join(self.dir, name))
            if fd < 0:
                live.append(k)
            else:
                os.close(fd)
        return sorted(live)

    def _rebalance(self) -> None:
        """Re-check the membership; release partitions no longer ours, claim new ones."""
        self._next_rebalance = time.monotonic() + self.rebalance_ms / 1000
        if self._manual or self.dir is None:
            return
        live = self._live_members()
        if self._member_slot not in live:  # cannot happen while we hold the slot's lock
            live = sorted([*live, self._member_slot])  # type: ignore[list-item]
        m = len(live)
        rank = live.index(self._member_slot)  # type: ignore[arg-type]
        n = self.topic.partitions
        desired = {p for p in range(n) if p % m == rank}
        for p in list(self._pos):
            if p not in desired:
                self._release(p)
        for p in sorted(desired):
            if p not in self._pos:
                self._acquire(p)

    def _acquire(self, p: int) -> bool:
        if self.dir is not None:
            fd = _try_lock(os.path.join(self.dir, f"partition-{p}.lock"))
            if fd < 0:
                return False
            self._locks[p] = fd
            _mark_owner(fd, "manual" if self._member_slot is None else f"member-{self._member_slot}")
        self._pos[p] = None  # resolved at the next poll / position()
        return True

    def _release(self, p: int) -> None:
        self._pos.pop(p, None)
        self._committed_cache.pop(p, None)
        fd = self._locks.pop(p, None)
        if fd is not None:
            os.close(fd)

    def _release_all(self) -> None:
        for p in list(self._locks):
            self._release(p)
        self._pos.clear()
        if self._member_fd >= 0:
            os.close(self._member_fd)
            self._member_fd = -1

    # -- positions -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("consumer is closed")

    def _owned(self, p: Any) -> int:
        self._check_open()
        i = self.topic._check_partition(p)
        if i not in self._pos:
            raise NotAssignedError(f"partition {i} of topic {self.topic.name!r} is not assigned to this consumer "
                                   f"(it owns {sorted(self._pos)})")
        return i

    def _reader(self, p: int) -> Log:
        return self.topic.reader(p)

    def _reset(self, p: int, log: Log, pos: int | None = None) -> int:
        """Where partition ``p`` starts per ``auto_offset_reset``: it has no position (``pos``
        None: nothing committed), or ``pos`` is outside the log."""
        if log.readonly:
            log.refresh()
        if self.auto_offset_reset == "earliest":
            return log.start_offset
        if self.auto_offset_reset == "latest":
            return log.stable_offset  # not past a transaction's records still being applied
        where = f"partition {p} of topic {self.topic.name!r}"
        if pos is None:
            why = (f"group {self.group!r} has no committed offset for {where}" if self.group is not None
                   else f"a consumer without a group has no position in {where}")
        else:
            why = f"position {pos} in {where} is outside the log [{log.start_offset}, {log.stable_offset})"
        raise OffsetOutOfRangeError(-1 if pos is None else pos, log.start_offset, log.stable_offset,
                                    f"{why}, and auto_offset_reset='none'")

    def _resolve(self, p: int) -> int:
        pos = self._pos[p]
        if pos is None:
            c = self._read_committed(p)
            if c is not None:
                pos = c
            elif p in self._added:  # new since we started: nothing in it may be skipped
                log = self._reader(p)
                if log.readonly:
                    log.refresh()
                pos = log.start_offset
            else:
                pos = self._reset(p, self._reader(p))
            self._pos[p] = pos
        return pos

    def _check_topic(self) -> None:
        """Notice another process's changes to the topic (at most every
        ``metadata_refresh_ms``): new partitions are taken (no group) or shared out at once
        (group); a deleted topic raises UnknownTopicError."""
        self.topic._check_meta()
        n = self.topic._n
        if n == self._known_n:
            return
        self._added.update(range(self._known_n, n))
        self._known_n = n
        if self._manual:
            return
        if self.dir is None:
            for p in range(n):
                if p not in self._pos:
                    self._acquire(p)
        else:
            self._next_rebalance = 0.0

    def assignment(self) -> list[int]:
        """The partitions this consumer owns now, sorted."""
        self._check_open()
        return sorted(self._pos)

    def position(self, partition: int) -> int:
        """The offset of the next record :meth:`poll` returns from ``partition``."""
        return self._resolve(self._owned(partition))

    def seek(self, partition: int, offset: int) -> None:
        """Make ``offset`` the position of ``partition`` (an offset outside the log is
        handled at the next poll, by ``auto_offset_reset``)."""
        p = self._owned(partition)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise ArgumentTypeError(f"offset must be an int, got {type(offset).__name__}")
        if offset < 0:
            log = self._reader(p)
            raise OffsetOutOfRangeError(offset, log.start_offset, log.next_offset,
                                        f"offset {offset} is out of range: an offset is >= 0 (partition {p} "
                                        f"holds [{log.start_offset}, {log.next_offset}))")
        self._pos[p] = offset

    def _targets(self, partitions: Iterable[int] | None) -> list[int]:
        self._check_open()
        return sorted(self._pos) if partitions is None else [self._owned(p) for p in partitions]

    def seek_to_beginning(self, partitions: Iterable[int] | None = None) -> None:
        """Position ``partitions`` (default: all owned) at their ``start_offset``."""
        self._seek_edge(partitions, "start_offset")

    def seek_to_end(self, partitions: Iterable[int] | None = None) -> None:
        """Position ``partitions`` (default: all owned) at their last stable offset (their
        ``next_offset`` unless a transaction is being applied there)."""
        self._seek_edge(partitions, "stable_offset")

    def _seek_edge(self, partitions: Iterable[int] | None, edge: str) -> None:
        for p in self._targets(partitions):
            log = self._reader(p)
            if log.readonly:
                log.refresh()
            self._pos[p] = getattr(log, edge)

    def offsets_for_time(self, timestamp_ms: int, partitions: Iterable[int] | None = None) -> dict[int, int | None]:
        """Per partition, the first offset whose timestamp is >= ``timestamp_ms`` (None: no
        such record yet)."""
        out = {}
        for p in self._targets(partitions):
            log = self._reader(p)
            if log.readonly:
                log.refresh()
            out[p] = log.offset_for_time(timestamp_ms)
        return out

    def seek_to_timestamp(self, timestamp_ms: int, partitions: Iterable[int] | None = None) -> None:
        """Position ``partitions`` (default: all owned) at their first record with a
        timestamp >= ``timestamp_ms`` (at the end where there is none)."""
        for p, off in self.offsets_for_time(timestamp_ms, partitions).items():
            self._pos[p] = off if off is not None else self._reader(p).stable_offset

    # -- polling ---------------------------------------------------------------------------
    def poll(self, max_records: int = 500, timeout_ms: int = 0) -> list[Record]:
        """Up to ``max_records`` records from the owned partitions, advancing positions.

        With ``timeout_ms`` > 0, waits up to that long for records when there are none.
        Which partition each record came from is in :attr:`last_poll`
        (``{partition: [records]}``); :meth:`poll_partitions` returns that mapping.
        """
        by_part = self.poll_partitions(max_records, timeout_ms)
        if len(by_part) == 1:
            for recs in by_part.values():
                return recs
        out: list[Record] = []
        for recs in by_part.values():
            out.extend(recs)
        return out

    def poll_partitions(self, max_records: int = 500, timeout_ms: int = 0) -> dict[int, list[Record]]:
        """Like :meth:`poll`, but returns ``{partition: [records]}``."""
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise InvalidArgumentError(f"max_records={max_records!r} must be an int >= 1")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise InvalidArgumentError(f"timeout_ms={timeout_ms!r} must be a number >= 0")
        self._check_open()
        deadline = time.monotonic() + timeout_ms / 1000
        pause = 0.001
        while True:
            self._check_topic()
            if not self._manual and self.dir is not None and time.monotonic() >= self._next_rebalance:
                self._rebalance()
            got = self._fetch(max_records)
            self.last_poll = got
            if got or timeout_ms <= 0:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)

    def _fetch(self, max_records: int) -> dict[int, list[Record]]:
        owned = list(self._pos)
        if not owned:
            return {}
        k = self._rr % len(owned)
        self._rr += 1
        out: dict[int, list[Record]] = {}
        left = max_records
        for p in owned[k:] + owned[:k]:
            pos = self._pos[p]
            if pos is None:
                pos = self._resolve(p)
            log = self._reader(p)
            try:
                try:
                    batch = log.read_batch(pos, self.max_bytes, left)
                except OffsetOutOfRangeError:
                    pos = self._pos[p] = self._reset(p, log, pos)
                    batch = log.read_batch(pos, self.max_bytes, left)
            except FileNotFoundError:
                self.topic._check_meta(force=True)  # the topic was deleted: UnknownTopicError
                raise
            if batch:
                out[p] = batch
                self._pos[p] = batch[-1][0] + 1
                left -= len(batch)
                if left <= 0:
                    break
        return out

    def __iter__(self) -> Any:
        """Records forever (each poll waits up to a second); stop with ``break``. A position
        moves past a record only once the record is yielded, so :meth:`commit` after a
        ``break`` commits only what the loop took (not the rest of the poll's batch). A
        :meth:`seek` inside the loop drops the rest of that partition's batch."""
        while True:
            batch = self.poll_partitions(timeout_ms=1000)
            for p, recs in batch.items():
                self._pos[p] = recs[0][0]  # back to the first record not yet handed out
            for p, recs in batch.items():
                want = recs[0][0]
                for r in recs:
                    if self._pos.get(p) != want:
                        break  # sought meanwhile, or revoked
                    self._pos[p] = want = r[0] + 1  # handed out as it is yielded
                    yield r

    # -- committing ------------------------------------------------------------------------
    def _offset_path(self, p: int) -> str:
        assert self.dir is not None
        return os.path.join(self.dir, f"partition-{p}.offset")

    def _read_committed(self, p: int) -> int | None:
        found = self._read_commit(p)
        return None if found is None else found[0]

    def _read_commit(self, p: int) -> tuple[int, int, str] | None:
        if self.dir is None:
            return None
        path = self._offset_path(p)
        try:
            with open(path, "rb") as f:
                data = f.read(OFFSET_FILE_MAX + 1)
        except FileNotFoundError:
            return None
        found = decode_commit(data)
        if found is None:
            warnings.warn(f"committed offset file {path} is damaged; ignoring it "
                          f"(auto_offset_reset={self.auto_offset_reset!r})", RuntimeWarning, stacklevel=4)
        return found

    def commit(self, offsets: dict[int, int] | None = None, *,
               metadata: str | Mapping[int, str] | None = None) -> None:
        """Store positions (or the given ``{partition: offset}``) as the group's committed
        offsets, durably: when this returns, they survive a crash of this process or of
        the machine. Only partitions this consumer owns can be committed.

        ``metadata``: a text stored beside each committed offset (as Kafka's
        ``OffsetAndMetadata`` does; a str for every partition committed, or
        ``{partition: str}``), at most 4096 characters; read it back with
        :meth:`committed_metadata`. Kafka clients of ``pylog serve`` see it too.
        Without it a commit stores no metadata.

        An offset past the partition's ``next_offset`` raises OffsetOutOfRangeError and
        nothing is committed: the next consumer of the group would find it outside the log
        and start over per its ``auto_offset_reset`` (re-reading the partition, by default).
        """
        self._check_open()
        if self.dir is None:
            raise NotAssignedError("a consumer without a group cannot commit offsets")
        if offsets is None:
            todo = {p: self._resolve(p) for p in list(self._pos)}
        else:
            todo = {}
            for p, off in offsets.items():
                p = self._owned(p)
                if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                    raise InvalidArgumentError(f"offset {off!r} for partition {p} must be an int >= 0")
                todo[p] = off
        texts = self._commit_metadata(metadata, todo)
        for p, off in sorted(todo.items()):
            log = self._reader(p)
            if off > log.next_offset and log.readonly:
                log.refresh()
            if off > log.next_offset:
                raise OffsetOutOfRangeError(
                    off, log.start_offset, log.next_offset,
                    f"cannot commit offset {off} for partition {p} of topic {self.topic.name!r}: it is past the "
                    f"log end {log.next_offset} (the next consumer would start over per auto_offset_reset); "
                    "nothing was committed")
        now = _now_ms()
        for p, off in sorted(todo.items()):
            text = texts.get(p, "")
            if self._committed_cache.get(p) == (off, text):
                continue
            fileutil.atomic_write(self._offset_path(p), encode_offset(off, now, text))
            self._committed_cache[p] = (off, text)

    def _commit_metadata(self, metadata: str | Mapping[int, str] | None, todo: dict[int, int]) -> dict[int, str]:
        """``{partition: metadata}`` of :meth:`commit`'s ``metadata`` argument, checked."""
        if metadata is None:
            return {}
        if isinstance(metadata, str):
            given: dict[int, Any] = dict.fromkeys(todo, metadata)
        elif isinstance(metadata, Mapping):
            given = {}
            for p, text in metadata.items():
                p = self._owned(p)
                if p not in todo:
                    raise InvalidArgumentError(f"metadata for partition {p}, which this commit does not commit")
                given[p] = text
        else:
            raise ArgumentTypeError(f"metadata={metadata!r} must be a str or a {{partition: str}} dict")
        for p, text in given.items():
            if not isinstance(text, str):
                raise ArgumentTypeError(f"metadata {text!r} for partition {p} must be a str")
            if len(text) > MAX_METADATA_CHARS:
                raise InvalidArgumentError(f"metadata for partition {p} is {len(text)} characters; "
                                           f"at most {MAX_METADATA_CHARS} are stored")
        return given

    def committed(self, partition: int | None = None) -> Any:
        """The group's committed offset of ``partition`` (None: nothing committed), or
        with no argument ``{partition: offset or None}`` for every partition of the topic."""
        self._check_open()
        if partition is not None:
            return self._read_committed(self.topic._check_partition(partition))
        return {p: self._read_committed(p) for p in range(self.topic.partitions)}

    def committed_metadata(self, partition: int) -> str | None:
        """The metadata stored with the group's committed offset of ``partition`` (``""``
        when the commit had none; None when nothing is committed)."""
        self._check_open()
        found = self._read_commit(self.topic._check_partition(partition))
        return None if found is None else found[2]

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Leave the group and release every partition (positions not committed are lost).
        Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._release_all()
        self.store._forget_consumer(self)

    @property
    def closed(self) -> bool:
        """Whether close() was called on the consumer."""
        return self._closed

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pylog.Consumer topic={self.topic.name!r} group={self.group!r} partitions={sorted(self._pos)}>"
