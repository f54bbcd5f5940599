"""The reading half of Fetch: which partitions a request names, and whole RecordBatches of
a partition's records within a byte limit, encoded straight from the mapped segments.

Runs in the broker's fetch threads (:meth:`.Broker.fetch`); it reads, never writes.
"""
from __future__ import annotations

import struct
from typing import Any

from pylog import _backend
from pylog.log import Log
from pylog.serve.records import HEADER_SIZE, encode_columns_within, encode_records, fit_batch
from pylog.serve.timestamps import append_time_records

try:  # the columnar scan behind fast fetches allocates through pyarrow
    from pylog import arrow as _arrow
except ImportError:  # pragma: no cover
    _arrow = None  # type: ignore[assignment]

__all__ = ["wanted", "read_batches", "batch_rows", "batch_records", "RECORDS_KEY"]

#: The key of a Fetch partition answer (a dict) holding the records its ``records`` hold,
#: counted here, in the fetch thread, for the metrics (:meth:`.Metrics.fetched` adds it up
#: on the loop without walking the batches); :func:`.protocol.build` drops the key.
RECORDS_KEY = "pylog_records"

_WANT = ("key", "metadata", "value", "timestamp")
_MIN_RECORD = 7  # the wire size of an empty record (no key, value or headers)
_MIN_BATCH = HEADER_SIZE + _MIN_RECORD
#: a RecordBatch v2 header's batchLength (bytes 8-11) and record count (57-60 of its 61)
_LENGTH_COUNT = struct.Struct(">8xi45xi")


def batch_rows(batch: Any) -> int:
    """The record count in a RecordBatch v2's header (its last 4 header bytes)."""
    return int.from_bytes(memoryview(batch)[HEADER_SIZE - 4 : HEADER_SIZE], "big")


def batch_records(data: Any) -> int:
    """The records in a run of RecordBatch v2 (the counts in their headers)."""
    size = len(data)
    n = 0
    pos = 0
    unpack = _LENGTH_COUNT.unpack_from
    while pos + HEADER_SIZE <= size:
        length, count = unpack(data, pos)
        n += count
        pos += 12 + length
    return n


def wanted(req: Any) -> list[tuple[str, list[Any]]]:
    """A Fetch's partitions, each once, grouped by topic as Kafka's broker answers them:
    a partition named twice keeps its first place and its last fetch offset and limit
    (Kafka reads the request into a map), so a request cannot multiply its response."""
    wanted: dict[tuple[str, int], Any] = {}
    for t in req.topics:
        for p in t.partitions:
            wanted[(t.topic, p.partition)] = p  # an update keeps the first place
    out: list[tuple[str, list[Any]]] = []
    for (topic, _), p in wanted.items():
        if not out or out[-1][0] != topic:
            out.append((topic, []))
        out[-1][1].append(p)
    return out


def read_batches(log: Log, off: int, end: int, limit: int, oversize: bool = True) -> Any:
    """Whole RecordBatches of the records from ``off`` (below ``end``), at most ``limit``
    bytes in all, as many records as fit; when not even the first record fits, that
    record alone if ``oversize`` (the response holds nothing yet: Kafka returns a first
    batch larger than the limits so that a consumer can make progress), else b"".
    A LogAppendTime topic's batches: :func:`pylog.serve.timestamps.append_time_records`.

    A columnar scan of the segments encoded in C, no Record objects; without pyarrow
    (whose allocator the scan uses), or when the scan stops at a bad frame before any
    record, through ``Log.read_batch`` (which raises CorruptRecordError for a bad frame)."""
    if log.config.timestamps == "append-time":
        return append_time_records(log, off, end, limit, oversize)
    if _arrow is not None:
        out: list[Any] = []
        used = 0
        full = bad = False
        for part in _arrow._parts(log, off, end, 1):
            left = max(limit - used, 1)
            scan = _arrow.scan_buffer(part.map.buf, part.map.length, part.pos, part.off, part.stop,
                                      part.buffer_next, part.seg.gaps, _WANT, left // _MIN_RECORD + 1,
                                      lambda c: c, batch_bytes=left)
            try:
                while not full:
                    cols = next(scan)
                    n = cols.rows
                    data = encode_columns_within(cols, limit - used, oversize and not out)
                    if data is None:
                        full = True
                        break
                    out.append(data)
                    used += len(data)
                    # a cut batch, or no room for another: the response is full
                    full = batch_rows(data) < n or limit - used < _MIN_BATCH
            except StopIteration as stop:
                if stop.value[0] != _backend.impl.OK:
                    full = bad = True  # a bad frame: what came before it, else read_batch raises
            scan.close()
            if full:
                break
        if out:
            return out[0] if len(out) == 1 else b"".join(out)
        if full and not bad:  # not even one record fits
            return b""
    recs = [x for x in log.read_batch(off, max_bytes=max(limit, 1)) if x.offset < end]
    if not recs:
        return b""
    data = fit_batch(lambda k: encode_records(recs[:k]), len(recs), limit, oversize)
    return b"" if data is None else data
