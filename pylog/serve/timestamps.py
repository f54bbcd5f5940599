"""Record timestamps as Kafka keeps them: ``message.timestamp.type`` (docs/serve.md).

A topic's ``LogConfig.timestamps`` says what the broker does with a producer's timestamps:

* ``"as-given"`` (Kafka's ``CreateTime``, the default of the topics the broker creates):
  kept as produced, also when older than the partition's newest record;
* ``"append-time"`` (``LogAppendTime``): every record of a Produce gets the broker's clock
  (never below the partition's newest timestamp), the Produce response says which
  (``log_append_time_ms``) and Fetch answers carry the batch attribute bit 3 (timestamp type);
* ``"monotonic"`` (a topic the library created with its default): a record stamped before
  its predecessor takes the predecessor's time.

``message.timestamp.before.max.ms`` / ``after.max.ms`` (``LogConfig.timestamp_before_max_ms``
/ ``timestamp_after_max_ms``) bound a CreateTime: a Produce with a timestamp out of them is
answered INVALID_TIMESTAMP. Topics the broker creates take Kafka 4.0's defaults
(:data:`BROKER_DEFAULTS`).
"""
from __future__ import annotations

import datetime
from typing import Any

from pylog import _backend
from pylog.errors import ConfigError
from pylog.log import Log
from pylog.serve.records import HEADER_SIZE, encode_records, fit_batch

__all__ = ["BROKER_DEFAULTS", "KAFKA_TYPES", "to_mode", "to_kafka", "mark_log_append_time", "append_time_records",
           "log_append_time", "max_timestamp_offset"]

#: LogConfig fields of a topic the broker creates (CreateTopics, auto-creation), as Kafka
#: 4.0's defaults: CreateTime, timestamps at most an hour ahead of the broker's clock.
BROKER_DEFAULTS: dict[str, Any] = {"timestamps": "as-given", "timestamp_after_max_ms": 3_600_000}

#: Kafka's ``message.timestamp.type`` values -> ``LogConfig.timestamps``.
KAFKA_TYPES = {"CreateTime": "as-given", "LogAppendTime": "append-time"}

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_TIMESTAMP_TYPE = 0x08  # RecordBatch attribute bit 3: the timestamps are LogAppendTime


def to_mode(value: str) -> str:
    """``LogConfig.timestamps`` for a ``message.timestamp.type`` value; ConfigError otherwise."""
    mode = KAFKA_TYPES.get(value)
    if mode is None:
        raise ConfigError(f"message.timestamp.type={value!r} is not one of {', '.join(KAFKA_TYPES)}")
    return mode


def to_kafka(mode: str) -> str:
    """``message.timestamp.type`` describing ``LogConfig.timestamps`` (``monotonic``: CreateTime)."""
    return "LogAppendTime" if mode == "append-time" else "CreateTime"


def mark_log_append_time(batch: Any) -> bytes:
    """``batch`` (one RecordBatch v2 whose records share one timestamp) with attribute bit
    3 set and its CRC32C (over attributes to the end) recomputed."""
    b = bytearray(batch)
    b[22] |= _TIMESTAMP_TYPE  # attributes: int16 at 21, the bit in its low byte
    b[17:21] = int(_backend.impl.crc32c(bytes(b[21:]))).to_bytes(4, "big")
    return bytes(b)


def append_time_records(log: Log, off: int, end: int, limit: int, oversize: bool) -> bytes:
    """The records from ``off`` (below ``end``) of a LogAppendTime partition, at most
    ``limit`` bytes (the first batch alone may pass it when ``oversize``): one batch per run
    of records appended together (one timestamp), each marked LogAppendTime, since a client
    gives every record of such a batch the batch's max timestamp."""
    recs = [r for r in log.read_batch(off, max_bytes=max(limit, 1)) if r.offset < end]
    out: list[bytes] = []
    used = 0
    i = 0
    while i < len(recs):
        j = i + 1
        while j < len(recs) and recs[j].timestamp == recs[i].timestamp:
            j += 1
        run = recs[i:j]

        def encode(k: int, run: list[Any] = run) -> bytes:
            return encode_records(run[:k])

        data = fit_batch(encode, len(run), limit - used, oversize and not out)
        if data is None:
            break
        out.append(mark_log_append_time(data))
        used += len(data)
        if _rows(data) < len(run) or limit - used <= HEADER_SIZE:
            break
        i = j
    return b"".join(out)


def _rows(batch: Any) -> int:
    return int.from_bytes(bytes(batch[57:61]), "big")


def log_append_time(log: Log | None, base: int) -> datetime.datetime | None:
    """A Produce response's ``log_append_time_ms``: the time the broker stamped on the
    records from ``base`` of a LogAppendTime partition, else None (-1: CreateTime)."""
    if log is None or base < 0 or log.config.timestamps != "append-time":
        return None
    return _EPOCH + datetime.timedelta(milliseconds=log.read(base).timestamp)


def max_timestamp_offset(log: Log, end: int) -> tuple[int, int] | None:
    """ListOffsets' MAX_TIMESTAMP (-3): (offset, timestamp) of the FIRST record below ``end``
    holding the largest timestamp (KAFKA-16310), None when there is none."""
    start = log.start_offset
    if end <= start:
        return None
    top = log.max_timestamp()
    if top is not None:
        off = log.offset_for_time(top)
        if off is not None and start <= off < end:
            return off, log.read(off).timestamp
    # the largest timestamp lies past end (not yet stable) or before the start: the records
    # that are visible, in order
    best: tuple[int, int] | None = None
    for rec in log.scan(start, end):
        if best is None or rec.timestamp > best[1]:
            best = (rec.offset, rec.timestamp)
    return best
