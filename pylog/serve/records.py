"""Record batches on the wire (Kafka RecordBatch v2) <-> pylog records.

A Produce's records are parsed batch by batch: the 61-byte header here (struct), the CRC32C
of the batch, decompression (gzip, snappy, lz4, zstd through their own packages, with the
output bounded), then all records of a batch in one call of the backend's
``kafka_decode`` (csrc/kafka.c). A Fetch's records are built by ``kafka_encode`` in one call
per partition. Nothing loops over records in Python.

A record's Kafka headers are its pylog ``metadata``, byte for byte as on the wire (varint
count, then each header; docs/format.md "Kafka headers"); a record without headers has no
metadata. Library metadata in another encoding reaches Kafka clients as one header named
``pylog.metadata``.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from pylog import _backend, crc32c
from pylog import format as fmt

__all__ = ["BatchError", "Decoded", "decode_records", "encode_records", "encode_columns"]

_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
assert HEADER_SIZE == 61
_impl: Any = _backend.impl

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_XERIAL = b"\x82SNAPPY\x00"


class BatchError(Exception):
    """A record batch the broker refuses; ``code`` is the Kafka error code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


CORRUPT_MESSAGE = 2
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43


@dataclass
class Decoded:
    """The records of one partition's Produce, as columns ready for ``Log.append_batch``."""

    count: int
    timestamps: np.ndarray  # int64 ms; -1 where the producer gave none
    log_append_time: bool
    keys: tuple[np.ndarray, np.ndarray]
    values: tuple[np.ndarray, np.ndarray]
    headers: tuple[np.ndarray, np.ndarray]
    transactional: bool


def _bounded(chunks_out: int, limit: int) -> None:
    if chunks_out > limit:
        raise BatchError(CORRUPT_MESSAGE, f"a batch decompresses to more than {limit} bytes")


def _snappy_raw(data: bytes, limit: int) -> bytes:
    import cramjam

    n = shift = 0
    for i, b in enumerate(data[:5]):  # the uncompressed length, a varint, heads a raw block
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    _bounded(n, limit)
    return bytes(cramjam.snappy.decompress_raw(data))


def decompress(codec: int, data: bytes, limit: int) -> bytes:
    """The records section of a batch compressed with ``codec``, at most ``limit`` bytes."""
    try:
        if codec == GZIP:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = d.decompress(data, limit + 1)
            _bounded(len(out), limit)
            return out
        if codec == SNAPPY:
            if data.startswith(_XERIAL):  # the Java client's framing: 16-byte header, then blocks
                parts, p, total = [], 16, 0
                while p < len(data):
                    (n,) = struct.unpack_from(">i", data, p)
                    if n < 0 or p + 4 + n > len(data):
                        raise BatchError(CORRUPT_MESSAGE, "a snappy block overruns its batch")
                    block = _snappy_raw(data[p + 4 : p + 4 + n], limit - total)
                    total += len(block)
                    parts.append(block)
                    p += 4 + n
                return b"".join(parts)
            return _snappy_raw(data, limit)
        if codec == LZ4:
            import lz4.frame

            dec = lz4.frame.LZ4FrameDecompressor()
            out = dec.decompress(data, max_length=limit + 1)
            _bounded(len(out), limit)
            return out
        if codec == ZSTD:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as r:
                chunks, total = [], 0
                while True:  # read in steps: a frame's claimed size is never allocated
                    chunk = r.read(min(1 << 20, limit + 1 - total))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
                    _bounded(total, limit)
                    if total > limit:
                        break
            return b"".join(chunks)
    except BatchError:
        raise
    except Exception as e:  # each codec raises its own types for a corrupt stream
        raise BatchError(CORRUPT_MESSAGE, f"{CODECS[codec]} data does not decompress: {e}") from e
    raise BatchError(UNSUPPORTED_COMPRESSION_TYPE, f"compression codec {codec} is unknown")


def decode_records(data: bytes | memoryview, max_decompressed: int) -> Decoded:
    """Every batch of a Produce's partition data, checked and decoded into one set of columns.

    Raises
    ------
    BatchError
        A batch that is not RecordBatch v2, fails its CRC32C, is truncated, lies about a
        length, or does not decompress; nothing of the partition's data is then appended.
    """
    mv = memoryview(data).cast("B")
    pos, n = 0, len(mv)
    parts = []
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise BatchError(CORRUPT_MESSAGE, f"{n - pos} bytes at {pos} are less than a batch header")
        (base_offset, length, _epoch, magic, crc, attributes, last_delta, base_ts, _max_ts, _pid,
         _pepoch, _seq, count) = _HEADER.unpack_from(mv, pos)
        if magic != 2:
            raise BatchError(UNSUPPORTED_FOR_MESSAGE_FORMAT, f"record batch magic {magic}: only v2 is served")
        end = pos + 12 + length
        if length < HEADER_SIZE - 12 or end > n:
            raise BatchError(CORRUPT_MESSAGE, f"batch at {pos} claims {length} bytes, {n - pos - 12} are there")
        if crc32c(mv[pos + 21 : end]) != crc:
            raise BatchError(CORRUPT_MESSAGE, f"batch at {pos} fails its CRC32C")
        if attributes & 0x20:  # a control batch (transaction marker) is not a producer's data
            raise BatchError(INVALID_RECORD, "control batches are not accepted from producers")
        codec = attributes & 7
        section: Any = mv[pos + HEADER_SIZE : end]
        if codec:
            section = decompress(codec, bytes(section), max_decompressed)
        rc, ts, od, keys, values, headers = _impl.kafka_decode(section, count)
        if rc != 0:
            raise BatchError(CORRUPT_MESSAGE, f"batch at {pos}: its {count} records do not parse (status {rc})")
        if count and (od[-1] != last_delta or bool((od != np.arange(count)).any())):
            raise BatchError(INVALID_RECORD, f"batch at {pos}: offset deltas are not 0..{count - 1}")
        stamps = ts + base_ts
        if base_ts < 0:
            stamps[:] = -1
        parts.append((count, stamps, bool(attributes & 0x08), keys, values, headers, bool(attributes & 0x10)))
        pos = end
    if not parts:
        raise BatchError(CORRUPT_MESSAGE, "no record batch")
    if len(parts) == 1:
        c, s, lat, k, v, h, tx = parts[0]
        return Decoded(c, s, lat, k, v, h, tx)

    def cat(i: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.concatenate([p[i][0] for p in parts]), np.concatenate([p[i][1] for p in parts]))

    return Decoded(sum(p[0] for p in parts), np.concatenate([p[1] for p in parts]),
                   any(p[2] for p in parts), cat(3), cat(4), cat(5), any(p[6] for p in parts))


def encode_records(records: list[Any]) -> bytes:
    """One RecordBatch v2 holding ``records`` (pylog Records, consecutive or with gaps)."""
    n = len(records)
    offsets = np.fromiter((r.offset for r in records), np.int64, n)
    stamps = np.fromiter((r.timestamp for r in records), np.int64, n)
    cols = []
    for field in (2, 3, 4):  # key, value, metadata
        items = [r[field] for r in records]
        lens = np.fromiter((fmt.NULL_LEN if x is None else len(x) for x in items), np.uint32, n)
        cols.append((b"".join(x for x in items if x is not None), lens))
    rc, out = _impl.kafka_encode(offsets, stamps, cols[0][0], cols[0][1], cols[1][0], cols[1][1],
                                 cols[2][0], cols[2][1])
    if rc != 0:
        raise RuntimeError(f"kafka_encode failed with status {rc}")
    return bytes(out)


def _column(c: Any, n: int) -> tuple[Any, np.ndarray]:
    """(joined data, uint32 lengths with NULL_LEN for nulls) of an Arrow-layout BinaryColumn."""
    offs = c.offsets[: n + 1]
    lens = np.diff(offs).astype(np.uint32)
    if c.null_count:
        valid = np.unpackbits(c.validity[: (n + 7) // 8], bitorder="little")[:n]
        lens[valid == 0] = fmt.NULL_LEN
    return c.data[: int(offs[n])], lens


def encode_columns(cols: Any) -> Any:
    """One RecordBatch v2 of the rows of a :class:`pylog._columns.Columns` (a columnar scan:
    no Record objects), in one C call."""
    n = cols.rows
    k, kl = _column(cols.key, n)
    v, vl = _column(cols.value, n)
    m, ml = _column(cols.metadata, n)
    rc, out = _impl.kafka_encode(cols.offsets[:n], cols.timestamps[:n], k, kl, v, vl, m, ml)
    if rc != 0:
        raise RuntimeError(f"kafka_encode failed with status {rc}")
    return out  # a buffer, not copied again
