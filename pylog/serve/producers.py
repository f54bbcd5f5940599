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

Producer state survives a broker restart or SIGKILL: every acknowledged idempotent batch
adds a 40-byte entry (producer id, epoch, first and last sequence, base offset, count,
CRC32C) to ``TOPIC/~producers/partition-N.state``, written to the OS before the Produce is
answered (the same step that makes its records visible; fsynced when the topic's policy
fsyncs every message). At start the file is read back; entries whose batch is not in the
log (offset past the log's end, after a power cut) or whose CRC fails (a torn tail) are
dropped, and the file is rewritten with only the last five batches of each producer once
it grows past 1 MiB.

Producer ids come from ``ROOT/.serve.producer-ids`` (the next free id, replaced
atomically before an id is handed out), so ids are never reused across restarts.
"""
from __future__ import annotations

import os
import struct
import threading
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog._backend import impl
from pylog.serve.records import _HEADER, HEADER_SIZE

if TYPE_CHECKING:
    from pylog.log import Log
    from pylog.topics import LogStore

__all__ = ["Producers", "batch_producer", "PRODUCERS_DIR", "IDS_FILE"]

#: The directory under a topic holding each partition's producer state.
PRODUCERS_DIR = "~producers"
#: The file under the root holding the next producer id.
IDS_FILE = ".serve.producer-ids"
_ENTRY = struct.Struct("<qhiiqi")  # pid, epoch, first seq, last seq, base offset, count
_CRC = struct.Struct("<I")
ENTRY_SIZE = _ENTRY.size + _CRC.size
KEEP = 5
_COMPACT_AT = 1 << 20


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


class _Partition:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.producers: dict[int, tuple[int, list[tuple[int, int, int]]]] = {}  # pid -> (epoch, batches)
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
        when the producer names its current id and epoch (KIP-360). Transactional ids are
        refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): transactions are not served."""
        fail = {"producer_id": -1, "producer_epoch": -1}
        if req.transactional_id is not None:
            return {**fail, "error_code": E.transactional_id_authorization_failed}
        pid = getattr(req, "producer_id", -1)
        epoch = getattr(req, "producer_epoch", -1)
        if pid >= 0 and epoch >= 0:
            if epoch >= 32766:
                return {**fail, "error_code": E.invalid_producer_epoch}
            return {"error_code": 0, "producer_id": pid, "producer_epoch": epoch + 1}
        with self._lock:
            try:
                with open(self._ids_path, "rb") as f:
                    nxt = int(f.read(32).decode() or "0")
            except (FileNotFoundError, ValueError):
                nxt = 0
            nxt = max(nxt, 1000)
            try:
                fileutil.atomic_write(self._ids_path, str(nxt + 1).encode())
            except OSError:
                return {**fail, "error_code": E.kafka_storage_error}
        return {"error_code": 0, "producer_id": nxt, "producer_epoch": 0}

    # -- state per partition ----------------------------------------------------------------
    def _partition(self, topic: str, i: int, log: Log) -> _Partition:
        key = (topic, i)
        with self._lock:
            part = self._parts.get(key)
            if part is not None and os.path.isdir(os.path.dirname(part.path)):
                return part
            if part is not None and part.fd >= 0:  # the topic was deleted meanwhile
                os.close(part.fd)
            path = os.path.join(self.store.topic(topic).path, PRODUCERS_DIR, f"partition-{i}.state")
            part = self._parts[key] = _Partition(path)
            self._load(part, log)
            return part

    def _load(self, part: _Partition, log: Log) -> None:
        try:
            with open(part.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = log.next_offset
        for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
            body = data[pos:pos + _ENTRY.size]
            if _CRC.unpack_from(data, pos + _ENTRY.size)[0] != impl.crc32c(body):
                break  # a torn tail
            pid, epoch, first, last, base, count = _ENTRY.unpack(body)
            if base + count > end:
                continue  # its records are not in the log (lost with a power cut)
            self._remember(part, pid, epoch, first, last, base)
        self._rewrite(part)

    @staticmethod
    def _remember(part: _Partition, pid: int, epoch: int, first: int, last: int, base: int) -> None:
        old = part.producers.get(pid)
        batches = [] if old is None or old[0] != epoch else old[1]
        batches.append((first, last, base))
        del batches[:-KEEP]
        part.producers[pid] = (epoch, batches)

    def _rewrite(self, part: _Partition) -> None:
        os.makedirs(os.path.dirname(part.path), exist_ok=True)
        data = b"".join(self._entry(pid, epoch, f, la, b) for pid, (epoch, bs) in part.producers.items()
                        for f, la, b in bs)
        fileutil.atomic_write(part.path, data)
        if part.fd >= 0:
            os.close(part.fd)
        part.fd = os.open(part.path, os.O_WRONLY | os.O_APPEND)
        part.size = len(data)

    @staticmethod
    def _entry(pid: int, epoch: int, first: int, last: int, base: int) -> bytes:
        body = _ENTRY.pack(pid, epoch, first, last, base, last - first + 1)
        return body + _CRC.pack(impl.crc32c(body))

    def check(self, topic: str, i: int, log: Log, producer: tuple[int, int, int, int]) -> tuple[int, int, Any]:
        """Before appending an idempotent batch: (0, -1, lock) to append it (the caller holds
        ``lock`` until :meth:`appended`), (0, base offset, None) for a retried batch, or
        (error code, -1, None)."""
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
        for f, la, base in batches:
            if f == first and la == last:
                return 0, base  # a retry: already appended
        if batches and first != (batches[-1][1] + 1) & 0x7FFFFFFF:
            return E.out_of_order_sequence_number, -1
        return 0, -1

    def appended(self, part: _Partition, producer: tuple[int, int, int, int], base: int, fsync: bool) -> None:
        """Record an appended batch (written to the OS; fsynced with ``fsync``) and release
        the partition's producer lock taken by :meth:`check`."""
        try:
            if base >= 0:
                pid, epoch, first, count = producer
                last = (first + count - 1) & 0x7FFFFFFF
                self._remember(part, pid, epoch, first, last, base)
                os.write(part.fd, self._entry(pid, epoch, first, last, base))
                part.size += ENTRY_SIZE
                if fsync:
                    os.fsync(part.fd)
                if part.size > _COMPACT_AT:
                    self._rewrite(part)
        finally:
            part.lock.release()

    def close(self) -> None:
        """Close the state files."""
        with self._lock:
            for part in self._parts.values():
                if part.fd >= 0:
                    os.close(part.fd)
                    part.fd = -1
            self._parts.clear()
