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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pylog import _backend, crc32c
from pylog import format as fmt

__all__ = ["BatchError", "Budget", "Decoded", "decode_records", "encode_records", "encode_columns",
           "encode_columns_within", "fit_batch"]

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
MESSAGE_TOO_LARGE = 10
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43


class RecordErrors(BatchError):
    """Records of a partition's data the broker refuses one by one (Produce v8+ reports them
    as ``record_errors``): ``rows`` holds (index of the record in the data, message)."""

    def __init__(self, code: int, message: str, rows: list[tuple[int, str]]) -> None:
        super().__init__(code, message)
        self.rows = rows


def check_keyed(d: Decoded, where: str) -> None:
    """Raise :class:`RecordErrors` (INVALID_RECORD, one per keyless record) if a record of
    ``d`` has no key: a ``cleanup.policy=compact`` topic keeps the latest record per key, so
    Kafka refuses a record without one (``where``: the topic-partition, for the message)."""
    null = np.flatnonzero(d.keys[1] == np.uint32(fmt.NULL_LEN)).tolist()
    if null:
        msg = f"Compacted topic cannot accept message without key in topic partition {where}."
        raise RecordErrors(INVALID_RECORD, msg, [(i, msg) for i in null])


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


class Budget:
    """The bytes a request may still decompress: one budget is shared by every batch of
    every partition of a Produce (docs/serve.md, "Limits and defaults"), so a request of
    many small bombs is held to the same total as one large one."""

    __slots__ = ("limit", "left")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self, n: int) -> None:
        """Count ``n`` more decompressed bytes against the budget."""
        self.left -= n


def _bounded(chunks_out: int, limit: int) -> None:
    if chunks_out > limit:
        raise BatchError(MESSAGE_TOO_LARGE, f"compressed data decompresses to more than the {limit} bytes "
                                            f"left of the request's decompression budget")


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
            out: bytes = d.decompress(data, limit + 1)
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


def decode_records(data: bytes | memoryview, max_decompressed: int | Budget) -> Decoded:
    """Every batch of a Produce's partition data, checked and decoded into one set of columns.
    ``max_decompressed``: the bytes its compressed batches may decompress to in all, or the
    request's :class:`Budget` (shared with its other partitions, and taken from).

    Raises
    ------
    BatchError
        A batch that is not RecordBatch v2, fails its CRC32C, is truncated, lies about a
        length, or does not decompress (CORRUPT_MESSAGE), or decompresses past the budget
        (MESSAGE_TOO_LARGE); nothing of the partition's data is then appended.
    """
    budget = max_decompressed if isinstance(max_decompressed, Budget) else Budget(max_decompressed)
    mv = memoryview(data).cast("B")
    pos, n = 0, len(mv)
    parts: list[tuple[Any, ...]] = []
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
            section = decompress(codec, bytes(section), max(budget.left, 0))
            budget.take(len(section))
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


def encode_columns(cols: Any, rows: int | None = None) -> Any:
    """One RecordBatch v2 of the rows of a :class:`pylog._columns.Columns` (a columnar scan:
    no Record objects), in one C call; ``rows``: only the first ``rows`` of them."""
    n = cols.rows if rows is None else min(rows, cols.rows)
    k, kl = _column(cols.key, n)
    v, vl = _column(cols.value, n)
    m, ml = _column(cols.metadata, n)
    rc, out = _impl.kafka_encode(cols.offsets[:n], cols.timestamps[:n], k, kl, v, vl, m, ml)
    if rc != 0:
        raise RuntimeError(f"kafka_encode failed with status {rc}")
    return out  # a buffer, not copied again


_VARINT_STEPS = [1 << (7 * i) for i in range(1, 10)]


def _varint_sizes(x: np.ndarray) -> np.ndarray:
    """Bytes of each zigzag varint of the int64s ``x`` (Kafka's record fields): one pass
    per 7 bits that some value needs (most fields need one to three)."""
    x = x.astype(np.int64, copy=False)
    zz = ((x << 1) ^ (x >> 63)).view(np.uint64)
    top = int(zz.max()) if len(zz) else 0
    sizes = np.ones(len(zz), np.int64)
    for step in _VARINT_STEPS:
        if top < step:
            break
        sizes += zz >= np.uint64(step)
    return sizes


def _record_sizes(offsets: np.ndarray, stamps: np.ndarray, kl: np.ndarray, vl: np.ndarray,
                  ml: np.ndarray) -> np.ndarray:
    """Each record's wire size in a batch that starts at its first row, as kafka_encode
    builds it, taking metadata to be Kafka headers already (a library's other metadata goes
    in one wrapping header, a few bytes more: these are then lower bounds)."""
    null = np.uint32(fmt.NULL_LEN)

    def field(lens: np.ndarray) -> np.ndarray | int:
        nulls = lens == null
        if nulls.all():
            return 1  # varint -1
        n = lens.astype(np.int64)
        if nulls.any():
            n[nulls] = -1
            return _varint_sizes(n) + np.maximum(n, 0)
        return _varint_sizes(n) + n

    heads = ml.astype(np.int64)
    heads[ml == null] = 1  # varint 0: no headers
    body = heads + field(kl)
    body += field(vl)
    body += _varint_sizes(stamps - stamps[0])
    body += _varint_sizes(offsets - offsets[0])
    body += 1  # attributes
    body += _varint_sizes(body)
    return body


def encode_columns_within(cols: Any, limit: int, oversize: bool) -> Any:
    """:func:`encode_columns` of the most leading rows of ``cols`` whose batch is at most
    ``limit`` bytes (:func:`fit_batch`'s rule for a first row over it): the rows are counted
    from their sizes computed beforehand, so it usually takes one encode."""
    n = cols.rows
    k, kl = _column(cols.key, n)
    v, vl = _column(cols.value, n)
    m, ml = _column(cols.metadata, n)
    offsets, stamps = cols.offsets[:n], cols.timestamps[:n]

    def encode(r: int) -> Any:
        rc, out = _impl.kafka_encode(offsets[:r], stamps[:r], k, kl[:r], v, vl[:r], m, ml[:r])
        if rc != 0:
            raise RuntimeError(f"kafka_encode failed with status {rc}")
        return out

    ends = HEADER_SIZE + np.cumsum(_record_sizes(offsets, stamps, kl, vl, ml))
    fit = int(np.searchsorted(ends, limit, side="right"))  # rows whose batch is <= limit (at least)
    if fit == 0:
        return encode(1) if oversize else None
    data = encode(fit)
    if len(data) <= limit:
        return data  # and the next row does not fit: its size is at least its bound
    return fit_batch(encode, fit, limit, oversize)


def fit_batch(encode: Callable[[int], Any], rows: int, limit: int, oversize: bool) -> Any:
    """The batch ``encode(k)`` of the most leading rows ``k <= rows`` that is at most
    ``limit`` bytes; when even one row is larger, that one-row batch if ``oversize`` (a
    Fetch's first batch: Kafka returns it whole so that the consumer can make progress),
    else None. A search between a row count known to fit and one known not to: encoded
    sizes grow nearly in proportion to rows, so it interpolates (uniform records take three
    encodes), and bisects after two tries (at most about log2(rows) more)."""
    data = encode(rows)
    if len(data) <= limit:
        return data
    lo, lo_data, lo_len = 0, None, HEADER_SIZE  # rows known to fit (0: none yet)
    hi, hi_data = rows, data  # rows known not to fit
    tries = 0
    while hi - lo > 1:
        tries += 1
        if tries <= 2:
            k = lo + (hi - lo) * (limit - lo_len) // max(len(hi_data) - lo_len, 1)
        else:
            k = (lo + hi) // 2
        k = min(max(k, lo + 1), hi - 1)
        d = encode(k)
        if len(d) <= limit:
            lo, lo_data, lo_len = k, d, len(d)
        else:
            hi, hi_data = k, d
    if lo_data is not None:
        return lo_data
    return hi_data if oversize else None  # hi == 1: the first row alone is over the limit


_XERIAL = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 << 10


def compress(codec: int, data: Any, level: int | None = None) -> bytes:
    """``data`` (a batch's records section) compressed with Kafka codec ``codec`` (1 gzip,
    2 snappy in the Java client's xerial framing, 3 lz4 frame, 4 zstd) at ``level`` (None:
    the codec's default)."""
    raw = bytes(data)
    if codec == GZIP:
        c = zlib.compressobj(6 if level in (None, -1) else level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(raw) + c.flush()
    if codec == SNAPPY:
        import cramjam

        out = [_XERIAL]
        for i in range(0, len(raw), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(raw[i : i + _XERIAL_BLOCK]))
            out += [struct.pack(">i", len(block)), block]
        return b"".join(out)
    if codec == LZ4:
        import lz4.frame

        return bytes(lz4.frame.compress(raw, compression_level=9 if level is None else level))
    if codec == ZSTD:
        import zstandard

        return bytes(zstandard.ZstdCompressor(level=3 if level is None else level).compress(raw))
    raise ValueError(f"compression codec {codec} is unknown")


def compress_batches(data: Any, codec: int, level: int | None = None) -> Any:
    """The RecordBatches of ``data`` (uncompressed, as a Fetch builds them) with each one's
    records section compressed with ``codec`` (a topic's ``compression.type``), their
    length, attributes and CRC32C rewritten; ``data`` itself when ``codec`` is 0."""
    if not codec:
        return data
    mv = memoryview(data).cast("B")
    out = bytearray()
    pos, n = 0, len(mv)
    while pos + HEADER_SIZE <= n:
        (length,) = struct.unpack_from(">i", mv, pos + 8)
        end = pos + 12 + length
        packed = compress(codec, mv[pos + HEADER_SIZE : end], level)
        start = len(out)
        out += mv[pos : pos + HEADER_SIZE]
        out += packed
        struct.pack_into(">i", out, start + 8, HEADER_SIZE - 12 + len(packed))
        (attributes,) = struct.unpack_from(">h", out, start + 21)
        struct.pack_into(">h", out, start + 21, (attributes & ~7) | codec)
        struct.pack_into(">I", out, start + 17, crc32c(bytes(out[start + 21 :])))
        pos = end
    return bytes(out)
