"""Idempotent producers: InitProducerId and the sequence check on Produce.

A Kafka producer with ``enable.idempotence`` asks InitProducerId for a producer id and
epoch, and numbers its batches per partition (``base_sequence``, counting records). The
broker keeps, per partition and producer id, the epoch and the last five batches appended
(first and last sequence, base offset), as Kafka does:

* a batch whose sequences are one of those five is a **retry**: it is answered with the
  original base offset and is not appended again;
* a batch that starts right after the last sequence is appended;
* any other sequence is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (a gap), an older epoch
  with INVALID_PRODUCER_EPOCH; a newer epoch must start at sequence 0.
* a producer id the partition has no state for (new, or its batches are gone) is taken at
  any sequence.

The state is never older than the log (docs/format.md, "Producer state"): before an
idempotent batch's records are appended, a 40-byte **intent** (producer id, epoch, first
and last sequence, the base offset the records will take, count, a CRC32C digest of the
records as the log will hold them, the entry's CRC32C) is appended to
``TOPIC/~producers/partition-N.producers``, made as durable as the records will be
(fdatasync'd first under ``fsync=always``). An intent says "this batch may be at that
offset"; loading the file checks each one against the log: it counts only if the log holds
records at that offset whose digest matches. So a kill, power cut or failed write between
the intent and the records, or after the records, leaves a state that the log itself
confirms: the records are there and the retry is a duplicate, or they are not and it is
appended. The file is rewritten with only the confirmed entries (the last five batches of
each producer) on load and once it grows past 1 MiB.

Producer ids come from ``ROOT/.serve.producer-ids`` (the next free id, replaced
atomically before an id is handed out), so ids are never reused across restarts.
"""
from __future__ import annotations

import os
import struct
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from kio.schema.errors import ErrorCode as E

from pylog import fileutil, vfs
from pylog import format as fmt
from pylog._backend import impl
from pylog.errors import PylogError
from pylog.serve.records import _HEADER, HEADER_SIZE

if TYPE_CHECKING:
    from pylog.log import Log
    from pylog.topics import LogStore

__all__ = ["Producers", "batch_producer", "records_digest", "PRODUCERS_DIR", "IDS_FILE", "STATE_SUFFIX"]

#: The directory under a topic holding each partition's producer state.
PRODUCERS_DIR = "~producers"
#: The file under the root holding the next producer id.
IDS_FILE = ".serve.producer-ids"
#: The suffix of a partition's producer state file (``partition-N.producers``).
STATE_SUFFIX = ".producers"
_OLD_SUFFIX = ".state"  # the format before intents: entries written after the records
# pid, epoch, reserved, first seq, last seq, base offset, count, digest of the records
_ENTRY = struct.Struct("<qhhiiqiI")
_OLD_ENTRY = struct.Struct("<qhiiqi")
_CRC = struct.Struct("<I")
ENTRY_SIZE = _ENTRY.size + _CRC.size
assert ENTRY_SIZE == 40
KEEP = 5
_COMPACT_AT = 1 << 20
_NULL = np.uint32(fmt.NULL_LEN)


def batch_producer(data: Any) -> tuple[int, int, int, int] | None:
    """(producer id, epoch, first sequence, record count) of the batches in a Produce's
    partition data, or None when they carry no producer id (not idempotent). Several
    batches must be consecutive in sequence, from one producer; otherwise None is returned
    for the caller to refuse as INVALID_RECORD via -1 count."""
    mv = memoryview(data).cast("B")
    pos, n = 0, len(mv)
    out: tuple[int, int, int, int] | None = None
    while pos + HEADER_SIZE <= n:
        (_b, length, _le, _magic, _crc, _attr, _ld, _bt, _mt, pid, epoch, seq, count) = _HEADER.unpack_from(mv, pos)
        if pid < 0:
            return None
        if out is None:
            out = (pid, epoch, seq, count)
        elif out[0] == pid and out[1] == epoch and out[2] + out[3] == seq:
            out = (pid, epoch, out[2], out[3] + count)
        else:
            return (pid, epoch, seq, -1)
        pos += 12 + max(length, 0)
    return out


def records_digest(columns: list[tuple[Any, Any]], timestamps: Any) -> int:
    """CRC32C over the records as a log holds them: for value, key and metadata in that
    order, the little-endian u32 lengths (0xFFFFFFFF for None) then the bytes, then the
    little-endian i64 timestamps. ``columns``: (joined bytes, lengths) of each field."""
    c = 0
    for data, lens in columns:
        c = impl.crc32c(np.ascontiguousarray(lens, dtype="<u4").data, c)
        c = impl.crc32c(data, c)
    return int(impl.crc32c(np.ascontiguousarray(timestamps, dtype="<i8").data, c))


def _log_digest(log: Log, base: int, count: int) -> int | None:
    """:func:`records_digest` of the ``count`` records from ``base`` in ``log``, or None
    when the log does not hold them all (compacted, truncated, never written)."""
    recs: list[Any] = []
    off = base
    while len(recs) < count:
        got = log.read_batch(off, max_bytes=8 << 20, max_records=count - len(recs))
        if not got:
            return None
        recs += got
        off = recs[-1].offset + 1
    if [r.offset for r in recs] != list(range(base, base + count)):
        return None
    cols = []
    for field in ("value", "key", "metadata"):
        items = [getattr(r, field) for r in recs]
        lens = np.fromiter((fmt.NULL_LEN if x is None else len(x) for x in items), np.uint32, count)
        cols.append((b"".join(bytes(x) for x in items if x is not None), lens))
    return records_digest(cols, np.fromiter((r.timestamp for r in recs), np.int64, count))


class _Partition:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        # pid -> (epoch, its last batches: first and last sequence, base offset, count, digest)
        self.producers: dict[int, tuple[int, list[tuple[int, int, int, int, int]]]] = {}
        self.fd = -1
        self.size = 0


class Producers:
    """Producer ids and per-partition producer state of one broker's store."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._lock = threading.Lock()
        self._ids_path = os.path.join(store.root, IDS_FILE)

    # -- InitProducerId ---------------------------------------------------------------------
    def init_producer_id(self, req: Any, version: int) -> dict[str, Any]:
        """InitProducerId: a new producer id (epoch 0), or the same id with the epoch bumped
        when the producer names its current id and epoch (KIP-360). With a transactional id it is
        the transaction coordinator's (:mod:`.txn_coordinator`); without one (a broker used
        without it) that is refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
        fail = {"producer_id": -1, "producer_epoch": -1}
        if req.transactional_id is not None:
            return {**fail, "error_code": E.transactional_id_authorization_failed}
        pid = getattr(req, "producer_id", -1)
        epoch = getattr(req, "producer_epoch", -1)
        if pid >= 0 and epoch >= 0:
            if epoch >= 32766:
                return {**fail, "error_code": E.invalid_producer_epoch}
            return {"error_code": 0, "producer_id": pid, "producer_epoch": epoch + 1}
        try:
            nxt = self.new_id()
        except OSError:
            return {**fail, "error_code": E.kafka_storage_error}
        return {"error_code": 0, "producer_id": nxt, "producer_epoch": 0}

    def new_id(self) -> int:
        """A producer id never handed out before (also across restarts: the next one is
        written durably first). OSError when the ids file cannot be read or written."""
        with self._lock:
            try:
                with open(self._ids_path, "rb") as f:
                    nxt = int(f.read(32).decode() or "0")
            except (FileNotFoundError, ValueError):
                nxt = 0
            nxt = max(nxt, 1000)
            fileutil.atomic_write(self._ids_path, str(nxt + 1).encode())
        return nxt

    # -- state per partition ----------------------------------------------------------------
    def _path(self, topic: str, i: int, suffix: str = STATE_SUFFIX) -> str:
        return os.path.join(self.store.topic(topic).path, PRODUCERS_DIR, f"partition-{i}{suffix}")

    def load(self, topic: str, i: int, log: Log) -> None:
        """Load (once) the producer state of ``topic``/``i``, checked against ``log``: the
        broker calls it before anything is appended to the partition, so that no append
        lands where an intent the log does not confirm points. Raises OSError when the
        file cannot be read or rewritten (the partition then takes no appends)."""
        self._partition(topic, i, log)

    def forget(self, topic: str, i: int) -> None:
        """Drop what is loaded of ``topic``/``i`` (its log is being reopened, with no append
        under way): the next :meth:`load` checks the file against the reopened log again."""
        with self._lock:
            part = self._parts.pop((topic, i), None)
        if part is not None:
            # not under part.lock: the caller may hold it (a produce that reopens the
            # partition), and no intent is written meanwhile (the broker's gate is held)
            self._close_fd(part)

    def forget_topic(self, topic: str) -> None:
        """Drop what is loaded of every partition of ``topic`` (deleted)."""
        with self._lock:
            keys = [k for k in self._parts if k[0] == topic]
        for k in keys:
            self.forget(*k)

    def describe(self, topic: str, i: int, log: Log) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, offset of its last record) of each producer
        with state in ``topic``/``i`` (DescribeProducers), loaded against ``log`` if it was not."""
        part = self._partition(topic, i, log)
        with part.lock:
            return [(pid, epoch, batches[-1][1], batches[-1][2] + batches[-1][3] - 1)
                    for pid, (epoch, batches) in part.producers.items() if batches]

    def _partition(self, topic: str, i: int, log: Log) -> _Partition:
        key = (topic, i)
        with self._lock:
            part = self._parts.get(key)
            # (a topic deleted meanwhile, by another path than the broker's delete_topic)
            if part is not None and os.path.isdir(os.path.dirname(os.path.dirname(part.path))):
                return part
            if part is not None:  # the topic was deleted meanwhile
                self._close_fd(part)
                del self._parts[key]
            part = _Partition(self._path(topic, i))
            self._load(part, log, self._path(topic, i, _OLD_SUFFIX))  # OSError: nothing kept
            self._parts[key] = part
            return part

    def _load(self, part: _Partition, log: Log, old_path: str) -> None:
        data = fileutil.read_if_exists(part.path)
        old = fileutil.read_if_exists(old_path) if data is None else None
        if data is None and old is None:
            return  # no idempotent batch was ever appended here: no file until one is
        end, start = log.next_offset, log.start_offset
        if old is not None:  # the format before intents: each entry follows its records
            self._load_old(part, old, log)
        else:
            # the entries of each producer in file order, a later entry for the same batch
            # replacing an earlier one (a retry's intent after a failed append)
            seen: dict[int, dict[tuple[int, int, int], tuple[int, int, int]]] = {}
            for pos in range(0, len(data or b"") - ENTRY_SIZE + 1, ENTRY_SIZE):
                body = data[pos:pos + _ENTRY.size]  # type: ignore[index]
                if _CRC.unpack_from(data, pos + _ENTRY.size)[0] != impl.crc32c(body):  # type: ignore[arg-type]
                    break  # a torn tail
                pid, epoch, _r, first, last, base, count, digest = _ENTRY.unpack(body)
                batches = seen.setdefault(pid, {})
                batches.pop((epoch, first, last), None)
                batches[(epoch, first, last)] = (base, count, digest)
            for pid, batches in seen.items():
                for (epoch, first, last), (base, count, digest) in list(batches.items())[-KEEP:]:
                    if base + count > end:
                        continue  # its records are not in the log
                    # records retention or compaction removed were in the log: each intent
                    # was checked when it was loaded before, and a load drops what fails
                    if base >= start and _log_digest(log, base, count) != digest:
                        continue  # an intent whose records never made it: other records there
                    self._remember(part, pid, epoch, first, last, base, count, digest)
        self._rewrite(part)
        if old is not None:
            vfs.unlink(old_path)

    def _load_old(self, part: _Partition, data: bytes, log: Log) -> None:
        size, end = _OLD_ENTRY.size + _CRC.size, log.next_offset
        for pos in range(0, len(data) - size + 1, size):
            body = data[pos:pos + _OLD_ENTRY.size]
            if _CRC.unpack_from(data, pos + _OLD_ENTRY.size)[0] != impl.crc32c(body):
                break
            pid, epoch, first, last, base, count = _OLD_ENTRY.unpack(body)
            if base + count <= end:
                digest = _log_digest(log, base, count) if base >= log.start_offset else None
                self._remember(part, pid, epoch, first, last, base, count, 0 if digest is None else digest)

    @staticmethod
    def _remember(part: _Partition, pid: int, epoch: int, first: int, last: int, base: int, count: int,
                  digest: int) -> None:
        old = part.producers.get(pid)
        batches: list[Any] = [] if old is None or old[0] != epoch else old[1]
        batches[:] = [b for b in batches if (b[0], b[1]) != (first, last)]
        batches.append((first, last, base, count, digest))
        del batches[:-KEEP]
        part.producers[pid] = (epoch, batches)

    @staticmethod
    def _make_dir(part: _Partition) -> None:
        """Create ``~producers`` (durably: its parent is fsynced) if it is missing."""
        d = os.path.dirname(part.path)
        if not os.path.isdir(d):
            try:
                vfs.mkdir(d)
            except FileExistsError:
                pass
            fileutil.fsync_dir(os.path.dirname(d))

    def _rewrite(self, part: _Partition) -> None:
        self._make_dir(part)
        data = b"".join(self._entry(pid, epoch, f, la, b, c, d) for pid, (epoch, bs) in part.producers.items()
                        for f, la, b, c, d in bs)
        self._close_fd(part)
        fileutil.atomic_write(part.path, data)
        part.fd = vfs.open(part.path, os.O_WRONLY | os.O_APPEND)
        part.size = len(data)

    @staticmethod
    def _close_fd(part: _Partition) -> None:
        if part.fd >= 0:
            fd, part.fd = part.fd, -1
            vfs.close(fd)

    @staticmethod
    def _entry(pid: int, epoch: int, first: int, last: int, base: int, count: int, digest: int) -> bytes:
        body = _ENTRY.pack(pid, epoch, 0, first, last, base, count, digest & 0xFFFFFFFF)
        return body + _CRC.pack(impl.crc32c(body))

    def check(self, topic: str, i: int, log: Log, producer: tuple[int, int, int, int]) -> tuple[int, int, Any]:
        """Before appending an idempotent batch: (0, -1, part) to append it (the caller
        holds the partition's producer lock until :meth:`release`, and calls
        :meth:`intend` right before the append, :meth:`appended` after it), (0, base
        offset, None) for a retried batch, or (error code, -1, None). OSError when the
        partition's state cannot be loaded."""
        pid, epoch, first, count = producer
        if count < 0:
            return E.invalid_record, -1, None
        part = self._partition(topic, i, log)
        part.lock.acquire()
        code, base = self._decide(part, producer)
        if code or base >= 0:
            part.lock.release()
            return code, base, None
        return 0, -1, part

    @staticmethod
    def _decide(part: _Partition, producer: tuple[int, int, int, int]) -> tuple[int, int]:
        pid, epoch, first, count = producer
        known = part.producers.get(pid)
        if known is None:
            return 0, -1
        kepoch, batches = known
        if epoch < kepoch:
            return E.invalid_producer_epoch, -1
        if epoch > kepoch:
            return (0, -1) if first == 0 else (E.out_of_order_sequence_number, -1)
        last = (first + count - 1) & 0x7FFFFFFF
        for f, la, base, _c, _d in batches:
            if f == first and la == last:
                return 0, base  # a retry: already appended
        if batches and first != (batches[-1][1] + 1) & 0x7FFFFFFF:
            return E.out_of_order_sequence_number, -1
        return 0, -1

    def intend(self, part: _Partition, producer: tuple[int, int, int, int], base: int, count: int,
               digest: int, sync: bool) -> None:
        """Write the intent of a batch about to be appended at ``base`` (``count`` records
        of ``digest``), before its records; fdatasync it with ``sync``. On an OSError the
        partition's state is dropped (reloaded, and so checked again, at the next use) and
        the error raised: the batch must not be appended."""
        pid, epoch, first, _n = producer
        last = (first + _n - 1) & 0x7FFFFFFF
        try:
            if part.fd < 0:
                self._make_dir(part)
                part.fd = vfs.open(part.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                fileutil.fsync_dir(os.path.dirname(part.path))
            fileutil.write_all(part.fd, self._entry(pid, epoch, first, last, base, count, digest))
            part.size += ENTRY_SIZE
            if sync:
                vfs.fdatasync(part.fd)
        except OSError:
            self._drop(part)
            raise

    def _drop(self, part: _Partition) -> None:
        with self._lock:
            for key, p in list(self._parts.items()):
                if p is part:
                    del self._parts[key]
        self._close_fd(part)

    def appended(self, part: _Partition, producer: tuple[int, int, int, int], base: int, count: int,
                 digest: int) -> None:
        """Remember a batch appended at ``base`` (its intent is in the file)."""
        pid, epoch, first, _n = producer
        last = (first + _n - 1) & 0x7FFFFFFF
        self._remember(part, pid, epoch, first, last, base, count, digest)
        if part.size > _COMPACT_AT:
            try:
                self._rewrite(part)
            except (OSError, PylogError):
                self._drop(part)  # the entries are in the old file still: reloaded later

    @staticmethod
    def release(part: _Partition) -> None:
        """Release the partition's producer lock taken by :meth:`check`."""
        part.lock.release()

    def close(self) -> None:
        """Close the state files."""
        with self._lock:
            for part in self._parts.values():
                self._close_fd(part)
            self._parts.clear()
