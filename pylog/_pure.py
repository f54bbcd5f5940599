"""The C core's functions in pure Python: the test oracle, and the fallback backend
(``PYLOG_BACKEND=pure``). Same names and results as :mod:`pylog._native`; written for
clarity, not speed.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pylog import format as fmt

# the backend's checksum and hash names ("x as x": re-exported)
from pylog._pure_hash import crc32c as crc32c
from pylog._pure_hash import crc32c_3 as crc32c_3
from pylog._pure_hash import crc32c_batch as crc32c_batch
from pylog._pure_hash import crc32c_clmul as crc32c_clmul
from pylog._pure_hash import crc32c_hw as crc32c_hw
from pylog._pure_hash import crc32c_portable as crc32c_portable
from pylog._pure_hash import crc_clmul_available as crc_clmul_available
from pylog._pure_hash import crc_hw_available as crc_hw_available
from pylog._pure_hash import crc_impl as crc_impl
from pylog._pure_hash import murmur2 as murmur2

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    _Bytes = bytes | bytearray | memoryview

NAME = "pure"

OK = 0
E_SHORT = -1
E_CRC = -2
E_LENGTH = -3
E_OFFSET = -4
E_SPACE = -5
E_NOT_FOUND = -6
E_ARG = -7
E_ATTRIBUTES = -8
E_TIMESTAMP = -9
E_INDEX_FULL = -10
E_SEGMENT_FULL = -11

_FRAME = struct.Struct("<QQqIIIIII")
_PREFIX = struct.Struct("<II")
_HDR = struct.Struct("<IIQqIII")  # length, crc, offset, ts, attrs, klen, mlen
_IDX = struct.Struct("<II")
_TIX = struct.Struct("<qII")
_BODY_FIXED = fmt.FRAME_HEADER_SIZE - fmt.FRAME_PREFIX_SIZE
_INT64_MIN = -(1 << 63)
_U64_MAX = (1 << 64) - 1


class Buffer:
    """A read-only byte buffer (``skip`` bytes at the front are not part of it)."""

    __slots__ = ("obj", "size", "mv", "addr")

    def __init__(self, obj: ReadableBuffer, skip: int = 0, size: int | None = None) -> None:
        self.obj = obj
        #: no C pointer here: the native Buffer's address is for pylog._speedups, which the
        #: pure backend never uses
        self.addr = 0
        mv = memoryview(obj).cast("B")
        self.size = (len(mv) - skip) if size is None else size
        if self.size < 0 or skip + self.size > len(mv):
            raise ValueError("Buffer view lies outside the object")
        self.mv = mv[skip : skip + self.size]


def _decode(mv: memoryview, length: int, pos: int, check_crc: bool = True) -> tuple[int, Any]:
    """(status, frame tuple) of the frame at pos (None instead of the frame on an error)."""
    if pos > length or length - pos < fmt.FRAME_PREFIX_SIZE:
        return E_SHORT, None
    body, crc = _PREFIX.unpack_from(mv, pos)
    if body < _BODY_FIXED or body > fmt.MAX_FRAME_BODY:
        return E_LENGTH, None
    if body > length - pos - fmt.FRAME_PREFIX_SIZE:
        return E_SHORT, None
    if check_crc and crc32c(mv[pos + 8 : pos + 8 + body]) != crc:
        return E_CRC, None
    _, _, offset, ts, attrs, klen, mlen = _HDR.unpack_from(mv, pos)
    if attrs & ~fmt.ATTR_KNOWN:
        return E_ATTRIBUTES, None
    if klen + mlen > body - _BODY_FIXED:
        return E_LENGTH, None
    vlen = body - _BODY_FIXED - klen - mlen
    if (
        (attrs & fmt.ATTR_NULL_KEY and klen)
        or (attrs & fmt.ATTR_NULL_METADATA and mlen)
        or (attrs & fmt.ATTR_NULL_VALUE and vlen)
    ):
        return E_ATTRIBUTES, None
    return OK, (pos, offset, ts, body + 8, attrs, klen, mlen, vlen, crc)


def index_lookup(index: Buffer, n: int, rel: int) -> int:
    lo, hi = 0, n
    mv = index.mv
    while lo < hi:
        mid = (lo + hi) // 2
        if _IDX.unpack_from(mv, mid * 8)[0] <= rel:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def index_entry(index: Buffer, slot: int) -> tuple[int, int]:
    """(relative offset, position) of an index's entry ``slot``."""
    return _IDX.unpack_from(index.mv, slot * 8)


def timeindex_lookup(tindex: Buffer, n: int, ts: int) -> int:
    lo, hi = 0, n
    mv = tindex.mv
    while lo < hi:
        mid = (lo + hi) // 2
        if _TIX.unpack_from(mv, mid * 16)[0] < ts:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def index_check(index: Buffer, n: int, store_len: int) -> int:
    prev = None
    for i in range(n):
        rel, pos = _IDX.unpack_from(index.mv, i * 8)
        if pos < fmt.FILE_HEADER_SIZE or pos + fmt.FRAME_HEADER_SIZE > store_len:
            return i
        if prev is not None and (rel <= prev[0] or pos <= prev[1]):
            return i
        prev = (rel, pos)
    return -1


def timeindex_check(tindex: Buffer, n: int, store_len: int) -> int:
    prev = None
    for i in range(n):
        ts, rel, pos = _TIX.unpack_from(tindex.mv, i * 16)
        if pos < fmt.FILE_HEADER_SIZE or pos + fmt.FRAME_HEADER_SIZE > store_len:
            return i
        if prev is not None and (ts < prev[0] or rel <= prev[1] or pos <= prev[2]):
            return i
        prev = (ts, rel, pos)
    return -1


def find(store: Buffer, store_len: int, index: Buffer | None, n_index: int, base_offset: int,
         target: int, gaps: bool = False) -> tuple[int, Any]:
    if target < base_offset or target - base_offset > 0xFFFFFFFF:
        return E_NOT_FOUND, None
    pos = fmt.FILE_HEADER_SIZE
    if index is not None and n_index:
        slot = index_lookup(index, n_index, target - base_offset)
        if slot >= 0:
            pos = _IDX.unpack_from(index.mv, slot * 8)[1]
    mv = store.mv
    prev = None
    while pos < store_len:
        if store_len - pos < fmt.FRAME_HEADER_SIZE:
            return E_SHORT, None
        body, _, off = struct.unpack_from("<IIQ", mv, pos)
        if body < _BODY_FIXED or body > fmt.MAX_FRAME_BODY:
            return E_LENGTH, None
        if prev is not None and (off <= prev if gaps else off != prev + 1):
            return E_OFFSET, None
        if off == target or (gaps and off > target):
            return _decode(mv, store_len, pos)
        if off > target:
            return E_OFFSET, None
        prev = off
        pos += body + 8
    return E_NOT_FOUND, None


def locator(store: Buffer, store_len: int, index: Buffer | None, n_index: int, base_offset: int,
            gaps: bool = False) -> Callable[[int], int]:
    """``locate(target)``: the position of the CRC-verified frame of ``target`` in this map
    (with ``gaps``, the first frame at or after it), or a negative status."""

    def locate(target: int) -> int:
        rc, f = find(store, store_len, index, n_index, base_offset, target, gaps)
        return rc if rc else int(f[0])

    return locate


def find_time(store: Buffer, store_len: int, tindex: Buffer | None, n_tindex: int, ts: int) -> tuple[int, Any]:
    pos = fmt.FILE_HEADER_SIZE
    if tindex is not None and n_tindex:
        slot = timeindex_lookup(tindex, n_tindex, ts)
        if slot >= 0:
            pos = _TIX.unpack_from(tindex.mv, slot * 16)[2]
    mv = store.mv
    while pos < store_len:
        if store_len - pos < fmt.FRAME_HEADER_SIZE:
            return E_SHORT, None
        body = struct.unpack_from("<I", mv, pos)[0]
        if body < _BODY_FIXED or body > fmt.MAX_FRAME_BODY:
            return E_LENGTH, None
        if struct.unpack_from("<q", mv, pos + 16)[0] >= ts:
            return _decode(mv, store_len, pos)
        pos += body + 8
    return E_NOT_FOUND, None


def _resync_fits(off: int, pos: int, start: int, expected: int, base_offset: int, gaps: bool) -> bool:
    if off < expected or off - base_offset >= 0xFFFFFFFF:
        return False
    return gaps or off - expected <= (pos - start) // fmt.FRAME_HEADER_SIZE


_LE64 = (np.uint64(1) << (np.arange(8, dtype=np.uint64) * np.uint64(8)))


def resync(store: Buffer, store_len: int, start: int, expected: int, base_offset: int,
           gaps: bool = False, search_end: int | None = None) -> tuple[int, Any]:
    """Twin of ``plog_resync`` (the C core's): the first whole, CRC-valid frame after the bad
    one at ``start`` whose offset can follow it, or ``(E_NOT_FOUND, None)``; frames may start
    only before ``search_end`` (default ``store_len``)."""
    mv = store.mv
    end = store_len if search_end is None else min(search_end, store_len)
    if start >= end:
        return E_NOT_FOUND, None
    if store_len - start >= fmt.FRAME_PREFIX_SIZE:
        body = _PREFIX.unpack_from(mv, start)[0]
        hop = start + fmt.FRAME_PREFIX_SIZE + body
        if _BODY_FIXED <= body <= fmt.MAX_FRAME_BODY and hop < end:
            rc, f = _decode(mv, store_len, hop)
            if rc == OK and _resync_fits(f[1], hop, start, expected, base_offset, gaps):
                return OK, f
    # every later position; the offset field of all of them at once (numpy), in chunks
    pos = start + 1
    last = min(store_len - fmt.FRAME_HEADER_SIZE, end - 1)  # the last position a frame may start at
    chunk = 1 << 20
    data = np.frombuffer(mv, dtype=np.uint8, count=store_len)
    while pos <= last:
        n = min(chunk, last - pos + 1)
        win = np.lib.stride_tricks.sliding_window_view(data[pos + 8 : pos + 16 + n - 1], 8)
        offs = (win.astype(np.uint64) * _LE64).sum(axis=1, dtype=np.uint64)
        cand = np.flatnonzero(offs >= np.uint64(expected))
        for i in cand.tolist():
            p = pos + i
            if not _resync_fits(int(offs[i]), p, start, expected, base_offset, gaps):
                continue
            rc, f = _decode(mv, store_len, p)
            if rc == OK:
                return OK, f
        pos += n
    return E_NOT_FOUND, None


def scan(store: Buffer, store_len: int, start: int, expected_offset: int | None, max_out: int,
         max_bytes: int, gaps: bool = False) -> tuple[int, np.ndarray, int]:
    frames: list[tuple[int, ...]] = []
    pos = start
    used = 0
    rc = OK
    mv = store.mv
    while len(frames) < max_out and pos < store_len:
        rc, f = _decode(mv, store_len, pos)
        if rc:
            break
        if expected_offset is not None and f[1] != expected_offset and not (gaps and f[1] > expected_offset):
            rc = E_OFFSET
            break
        if frames and used + f[3] > max_bytes:
            break
        frames.append(f)
        used += f[3]
        pos += f[3]
        if expected_offset is not None:
            expected_offset = f[1] + 1
    out = np.array(frames, dtype=fmt.FRAME_DTYPE) if frames else np.empty(0, dtype=fmt.FRAME_DTYPE)
    return rc, out, pos


def header_encode(magic: bytes, base_offset: int, flags: int = 0) -> bytes:
    head = struct.pack("<8sHHIQI", magic, fmt.FORMAT_VERSION, fmt.FILE_HEADER_SIZE, flags, base_offset, 0)
    return head + struct.pack("<I", crc32c(head))


def header_check(data: ReadableBuffer, magic: bytes) -> tuple[int, Any, Any]:
    """``(status, base offset, flags)``; the last two are None on an error."""
    mv = memoryview(data).cast("B")
    if len(mv) < fmt.FILE_HEADER_SIZE:
        return E_SHORT, None, None
    m, version, hsize, flags, base, _res, crc = struct.unpack_from("<8sHHIQII", mv)
    if m != magic:
        return E_ARG, None, None
    if crc32c(mv[:28]) != crc:
        return E_CRC, None, None
    if version != fmt.FORMAT_VERSION:
        return E_ATTRIBUTES, None, None
    if hsize != fmt.FILE_HEADER_SIZE:
        return E_LENGTH, None, None
    if flags & ~fmt.HEADER_COMPACTED:
        return E_ATTRIBUTES, None, None
    return OK, base, flags


def _real(lens: Any, i: int) -> int:
    if lens is None or int(lens[i]) == fmt.NULL_LEN:
        return 0
    return int(lens[i])


class Appender:
    """Pure-Python twin of :class:`pylog._native.Appender`."""

    __slots__ = ("base_offset", "next_offset", "position", "max_position", "_max_ts", "gaps", "as_given",
                 "index_interval", "bytes_since_index", "index_cap", "_index", "_tindex",
                 "_wbuf", "_wcap", "used", "unit_end", "__weakref__")

    def __init__(self, base_offset: int, *, next_offset: int, position: int, max_position: int,
                 max_timestamp: int | None, index_interval: int, bytes_since_index: int,
                 index_cap: int, buffer_bytes: int, as_given: bool = False) -> None:
        self.base_offset = base_offset
        self.next_offset = next_offset
        self.position = position
        self.max_position = max_position
        self._max_ts = _INT64_MIN if max_timestamp is None else max_timestamp
        self.index_interval = index_interval
        self.bytes_since_index = bytes_since_index
        self.gaps, self.as_given = False, as_given  # as_given: explicit timestamps may go back
        self.index_cap = max(index_cap, 1)
        self._index = bytearray()
        self._tindex = bytearray()
        self._wbuf = bytearray()
        self._wcap = buffer_bytes
        self.used = 0
        self.unit_end = 0  # batch framing: frames below it but the last get ATTR_UNIT_CONTINUES

    @property
    def max_timestamp(self) -> int | None:
        return None if self._max_ts == _INT64_MIN else self._max_ts

    @max_timestamp.setter
    def max_timestamp(self, value: int | None) -> None:
        self._max_ts = _INT64_MIN if value is None else value

    @property
    def index_count(self) -> int:
        return len(self._index) // 8

    def grow_index(self, cap: int) -> None:
        self.index_cap = max(self.index_cap, cap)

    def load_index(self, index_bytes: bytes, timeindex_bytes: bytes, max_cap: int | None = None) -> None:
        n = len(index_bytes) // 8
        if len(timeindex_bytes) // 16 != n:
            raise ValueError("offset and time index entry counts differ")
        self._index = bytearray(index_bytes)
        self._tindex = bytearray(timeindex_bytes)
        cap = max(self.index_cap, n * 2, 64)
        self.index_cap = max(n, 1, min(cap, max_cap)) if max_cap is not None else cap

    def index_bytes(self, start: int, stop: int) -> bytes:
        return bytes(self._index[start * 8 : stop * 8])

    def timeindex_bytes(self, start: int, stop: int) -> bytes:
        return bytes(self._tindex[start * 16 : stop * 16])

    def index_view(self) -> Buffer:
        return Buffer(bytes(self._index))

    def timeindex_view(self) -> Buffer:
        return Buffer(bytes(self._tindex))

    def pending(self) -> memoryview:
        return memoryview(self._wbuf)[: self.used]

    def drain(self) -> None:
        self._wbuf = bytearray()
        self.used = 0

    def reserve(self, nbytes: int) -> None:
        if self.used:
            raise RuntimeError("reserve() needs an empty write buffer")
        self._wcap = max(self._wcap, nbytes)

    @property
    def buffer_capacity(self) -> int:
        return self._wcap

    def _room(self, size: int) -> tuple[int, bool]:
        if self.next_offset - self.base_offset >= 0xFFFFFFFF:
            return E_SEGMENT_FULL, False
        if self.position > fmt.FILE_HEADER_SIZE and self.position + size > self.max_position:
            return E_SEGMENT_FULL, False
        if self.position + size > 0xFFFFFFFF:
            return E_SEGMENT_FULL, False
        need = self.bytes_since_index >= self.index_interval
        if need and self.index_count >= self.index_cap:
            return E_INDEX_FULL, need
        return OK, need

    def _add_index(self, pos: int, ts: int) -> None:
        rel = self.next_offset - self.base_offset
        self._index += _IDX.pack(rel, pos)
        self._tindex += _TIX.pack(ts, rel, pos)
        self.bytes_since_index = 0

    def _emit(self, value: _Bytes | None, key: _Bytes | None, metadata: _Bytes | None, attributes: int, ts: int,
              need_index: bool) -> int:
        k = bytes(key) if key is not None else b""
        m = bytes(metadata) if metadata is not None else b""
        v = bytes(value) if value is not None else b""
        body = _BODY_FIXED + len(k) + len(m) + len(v)
        rest = struct.pack("<QqIII", self.next_offset, ts, attributes, len(k), len(m)) + k + m + v
        frame = struct.pack("<II", body, crc32c(rest)) + rest
        return self._advance(len(frame), ts, need_index, frame)

    def _advance(self, size: int, ts: int, need_index: bool, frame: bytes | None = None) -> int:
        """Count a frame of ``size`` bytes just made (``frame``: also buffer it); its offset.
        All or nothing, like the C core's one call: no call once the changes begin, and
        Python runs a signal handler (Ctrl-C) only at a call or a loop's jump."""
        pos = self.position
        off = self.next_offset
        rel = off - self.base_offset
        ts = max(ts, self._max_ts)  # the time index holds the running maximum
        ientry, tentry = (_IDX.pack(rel, pos), _TIX.pack(ts, rel, pos)) if need_index else (b"", b"")
        since = min(size if need_index else self.bytes_since_index + size, 0xFFFFFFFF)
        # -- no calls from here on --
        if frame is not None:
            self._wbuf += frame
            self.used += size
        self._index += ientry
        self._tindex += tentry
        self.bytes_since_index = since
        self.position = pos + size
        self.next_offset = off + 1
        self._max_ts = ts
        return off

    def frame_value(self, value: _Bytes, timestamp: int) -> int:
        return self.frame(value, None, None, 3, timestamp, True)

    def frame(self, value: _Bytes | None, key: _Bytes | None, metadata: _Bytes | None, attributes: int,
              timestamp: int, clamp: bool = False) -> int:
        if attributes & ~fmt.ATTR_KNOWN:
            return E_ATTRIBUTES
        klen = len(key) if key is not None else 0
        mlen = len(metadata) if metadata is not None else 0
        vlen = len(value) if value is not None else 0
        if (
            (attributes & fmt.ATTR_NULL_KEY and klen)
            or (attributes & fmt.ATTR_NULL_METADATA and mlen)
            or (attributes & fmt.ATTR_NULL_VALUE and vlen)
        ):
            return E_ARG
        body = _BODY_FIXED + klen + mlen + vlen
        if body > fmt.MAX_FRAME_BODY:
            return E_LENGTH
        size = body + 8
        if timestamp < self._max_ts and (clamp or not self.as_given):
            if not clamp:
                return E_TIMESTAMP
            timestamp = self._max_ts
        rc, need = self._room(size)
        if rc:
            return rc
        if self._wcap - self.used < size:
            return E_SPACE
        return self._emit(value, key, metadata, attributes, timestamp, need)

    def _check_batch(self, value_lens: Any, key_lens: Any, meta_lens: Any, timestamps: Any,
                     default_timestamp: int) -> tuple[int, int, int]:
        """``(status, index of the bad record, frames' total size)``."""
        prev = self._max_ts
        total = 0
        for i in range(len(value_lens)):
            ts = int(timestamps[i]) if timestamps is not None else default_timestamp
            if ts < prev and not self.as_given:
                return E_TIMESTAMP, i, total
            prev = max(prev, ts)
            body = _BODY_FIXED + _real(value_lens, i) + _real(key_lens, i) + _real(meta_lens, i)
            if body > fmt.MAX_FRAME_BODY:
                return E_LENGTH, i, total
            total += body + 8
        return OK, len(value_lens), total

    def _attributes(self, value_lens: Any, key_lens: Any, meta_lens: Any, i: int) -> int:
        return ((fmt.ATTR_NULL_KEY if key_lens is None or int(key_lens[i]) == fmt.NULL_LEN else 0)
                | (fmt.ATTR_NULL_METADATA if meta_lens is None or int(meta_lens[i]) == fmt.NULL_LEN else 0)
                | (fmt.ATTR_NULL_VALUE if int(value_lens[i]) == fmt.NULL_LEN else 0)
                | (fmt.ATTR_UNIT_CONTINUES if self.next_offset + 1 < self.unit_end else 0))

    def frame_batch(self, values: Any, value_lens: Any, keys: Any, key_lens: Any, metas: Any, meta_lens: Any,
                    timestamps: Any, default_timestamp: int) -> tuple[int, int]:
        rc, i, _ = self._check_batch(value_lens, key_lens, meta_lens, timestamps, default_timestamp)
        if rc:
            return rc, i
        n = len(value_lens)
        vmv = memoryview(values).cast("B") if values is not None else memoryview(b"")
        kmv = memoryview(keys).cast("B") if keys is not None else memoryview(b"")
        mmv = memoryview(metas).cast("B") if metas is not None else memoryview(b"")
        vp = kp = mp = 0
        for i in range(n):
            vlen, klen, mlen = _real(value_lens, i), _real(key_lens, i), _real(meta_lens, i)
            size = fmt.FRAME_HEADER_SIZE + vlen + klen + mlen
            rc, need = self._room(size)
            if not rc and self._wcap - self.used < size:
                rc = E_SPACE
            if rc:
                return rc, i
            attrs = self._attributes(value_lens, key_lens, meta_lens, i)
            ts = int(timestamps[i]) if timestamps is not None else default_timestamp
            self._emit(vmv[vp : vp + vlen], kmv[kp : kp + klen], mmv[mp : mp + mlen], attrs, ts, need)
            vp += vlen
            kp += klen
            mp += mlen
        return OK, n

    def frame_in_place(self, buf: Any, value_lens: Any, key_lens: Any, meta_lens: Any, timestamps: Any,
                       default_timestamp: int) -> tuple[int, int, int]:
        if self.used:  # the frames go straight after what is written: nothing may be pending
            return E_ARG, 0, 0
        rc, i, total = self._check_batch(value_lens, key_lens, meta_lens, timestamps, default_timestamp)
        if rc:
            return rc, i, 0
        mv = memoryview(buf).cast("B")
        if total != len(mv):
            return E_ARG, 0, 0
        p = 0
        for i in range(len(value_lens)):
            vlen, klen, mlen = _real(value_lens, i), _real(key_lens, i), _real(meta_lens, i)
            size = fmt.FRAME_HEADER_SIZE + vlen + klen + mlen
            rc, need = self._room(size)
            if rc:
                return rc, i, p
            ts = int(timestamps[i]) if timestamps is not None else default_timestamp
            attrs = self._attributes(value_lens, key_lens, meta_lens, i)
            struct.pack_into("<QqIII", mv, p + 8, self.next_offset, ts, attrs, klen, mlen)
            body = size - 8
            struct.pack_into("<II", mv, p, body, crc32c(mv[p + 8 : p + size]))
            self._advance(size, ts, need)
            p += size
        return OK, len(value_lens), p

    def resume_at(self, position: int, next_offset: int) -> None:
        """Continue a walk at ``position`` after stepped-over damage (see the native twin)."""
        if position < self.position or next_offset < self.next_offset:
            raise ValueError("a walk cannot go back")
        self.position = position
        self.next_offset = next_offset
        self.bytes_since_index = self.index_interval

    def recover(self, store: Buffer, store_len: int) -> tuple[int, int]:
        mv = store.mv
        n = 0
        while self.position < store_len:
            rc, f = _decode(mv, store_len, self.position)
            if rc:
                return rc, n
            if f[1] != self.next_offset and not (
                self.gaps and f[1] > self.next_offset and f[1] - self.base_offset < 0xFFFFFFFF
            ):
                return E_OFFSET, n
            self.next_offset = f[1]
            if self.bytes_since_index >= self.index_interval:
                if self.index_count >= self.index_cap:
                    self.grow_index(self.index_cap * 2)
                self._add_index(self.position, max(f[2], self._max_ts))
            self.bytes_since_index = min(self.bytes_since_index + f[3], 0xFFFFFFFF)
            self.position += f[3]
            self.next_offset += 1
            if f[2] > self._max_ts:
                self._max_ts = f[2]
            n += 1
        return OK, n


def scan_columns(store: Buffer, store_len: int, start: int, expected_offset: int | None,
                 stop_offset: int | None, cols: Any, gaps: bool = False) -> tuple[int, int, int]:
    """Pure-Python twin of :func:`pylog._native.scan_columns`: ``(status, rows appended,
    end_position)``, the same bytes written to ``cols``."""
    if cols.rows > cols.capacity:
        return E_ARG, 0, start
    mv = store.mv
    pos = start
    n = before = cols.rows
    binary = ((cols.key, fmt.ATTR_NULL_KEY), (cols.metadata, fmt.ATTR_NULL_METADATA),
              (cols.value, fmt.ATTR_NULL_VALUE))
    for c, _bit in binary:
        if c is not None:
            c.need = 0
            if c.offsets[n] < 0:
                return E_ARG, 0, start
    rc = OK
    while n < cols.capacity and pos < store_len:
        rc, f = _decode(mv, store_len, pos)
        if rc:
            break
        _pos, off, ts, size, attrs, klen, mlen, vlen, _crc = f
        if expected_offset is not None and off != expected_offset and not (gaps and off > expected_offset):
            rc = E_OFFSET
            break
        if stop_offset is not None and off >= stop_offset:
            break
        lens = (klen, mlen, vlen)
        fits = True
        for (c, _bit), length in zip(binary, lens):
            if c is not None and int(c.offsets[n]) + length > min(len(c.data), 0x7FFFFFFF):
                c.need = int(c.offsets[n]) + length
                fits = False
        if not fits:
            rc = E_SPACE
            break
        if cols.offsets is not None:
            cols.offsets[n] = off
        if cols.timestamps is not None:
            cols.timestamps[n] = ts
        if cols.attributes is not None:
            cols.attributes[n] = attrs
        p = pos + fmt.FRAME_HEADER_SIZE
        for (c, bit), length in zip(binary, lens):
            if c is not None:
                at = int(c.offsets[n])
                c.data[at : at + length] = np.frombuffer(mv[p : p + length], np.uint8)
                c.offsets[n + 1] = at + length
                null = bool(attrs & bit)
                mask = 1 << (n & 7)
                byte = 0 if n & 7 == 0 else int(c.validity[n >> 3])
                c.validity[n >> 3] = (byte & ~mask) if null else (byte | mask)
                c.null_count += null
            p += length
        pos += size
        n += 1
        if expected_offset is not None:
            expected_offset = off + 1
    cols.rows = n
    return rc, n - before, pos


# ----------------------------------------------------------------------------------------
# Kafka RecordBatch v2: the twin of csrc/kafka.c (the test oracle of the broker's codec)
KAFKA_BATCH_HEADER_SIZE = 61
_META_HEADER = b"pylog.metadata"


class _Bad(Exception):
    def __init__(self, rc: int) -> None:
        self.rc = rc


def _get_varint(buf: Any, p: int, end: int, maxb: int) -> tuple[int, int]:
    v = shift = 0
    for _ in range(maxb):
        if p >= end:
            raise _Bad(E_LENGTH)
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return (v >> 1) ^ -(v & 1), p
        shift += 7
    raise _Bad(E_LENGTH)


def _put_varint(out: bytearray, x: int) -> None:
    v = ((x << 1) ^ (x >> 63)) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _get_bytes(buf: Any, p: int, end: int, nullable: bool) -> tuple[int, int, int]:
    n, p = _get_varint(buf, p, end, 5)
    if n == -1 and nullable:
        return -1, p, p
    if n < 0 or n > end - p:
        raise _Bad(E_LENGTH)
    return n, p, p + n


def _headers_end(buf: Any, p: int, end: int) -> tuple[int, int]:
    count, p = _get_varint(buf, p, end, 5)
    if count < 0:
        raise _Bad(E_LENGTH)
    for _ in range(count):
        _, _, p = _get_bytes(buf, p, end, False)
        _, _, p = _get_bytes(buf, p, end, True)
    return count, p


def kafka_headers_check(data: ReadableBuffer) -> bool:
    """True when ``data`` is Kafka's record-header encoding (varint count, then each header)."""
    mv = memoryview(data).cast("B")
    try:
        return _headers_end(mv, 0, len(mv))[1] == len(mv)
    except _Bad:
        return False


def kafka_decode(section: ReadableBuffer, count: int) -> tuple[Any, ...]:
    """Decode ``count`` records of an uncompressed RecordBatch v2 records section (see the
    native twin for the result's shape)."""
    mv = memoryview(section).cast("B")
    n = len(mv)
    if count < 0 or count > n:
        return E_LENGTH, None, None, None, None, None
    ts = np.empty(count, np.int64)
    od = np.empty(count, np.int64)
    cols: list[tuple[bytearray, np.ndarray]] = [(bytearray(), np.empty(count, np.uint32)) for _ in range(3)]
    p = 0
    try:
        for i in range(count):
            try:
                rlen, p = _get_varint(mv, p, n, 5)
            except _Bad:
                raise _Bad(E_SHORT) from None
            if rlen < 1 or rlen > n - p:
                raise _Bad(E_SHORT if rlen > n - p else E_LENGTH)
            rend = p + rlen
            p += 1
            ts[i], p = _get_varint(mv, p, rend, 10)
            od[i], p = _get_varint(mv, p, rend, 5)
            for c in (0, 1):
                ln, start, p = _get_bytes(mv, p, rend, True)
                if ln < 0:
                    cols[c][1][i] = fmt.NULL_LEN
                else:
                    cols[c][0].extend(mv[start:p])
                    cols[c][1][i] = ln
            hstart = p
            hcount, p = _headers_end(mv, p, rend)
            if p != rend:
                raise _Bad(E_LENGTH)
            if hcount == 0:
                cols[2][1][i] = fmt.NULL_LEN
            else:
                cols[2][0].extend(mv[hstart:rend])
                cols[2][1][i] = rend - hstart
        if p != n:
            raise _Bad(E_LENGTH)
    except _Bad as e:
        return e.rc, None, None, None, None, None
    out = [(np.frombuffer(bytes(d), np.uint8), lens) for d, lens in cols]
    return OK, ts, od, out[0], out[1], out[2]


def kafka_encode(offsets: Any, timestamps: Any, keys: ReadableBuffer, key_lens: Any, values: ReadableBuffer,
                 value_lens: Any, meta: ReadableBuffer | None = None,
                 meta_lens: Any = None) -> tuple[int, bytearray | None]:
    """Build one RecordBatch v2 (header, records, CRC32C); ``(status, batch)``."""
    n = len(offsets)
    if n == 0:
        return E_ARG, None
    offsets = [int(x) for x in offsets]
    timestamps = [int(x) for x in timestamps]
    kmv, vmv = memoryview(keys).cast("B"), memoryview(values).cast("B")
    mmv = memoryview(meta if meta is not None else b"").cast("B")
    base, base_ts = offsets[0], timestamps[0]
    body = bytearray()
    ko = vo = mo = 0
    for i in range(n):
        od = offsets[i] - base
        if od < 0 or od > 0x7FFFFFFF:
            return E_OFFSET, None
        rec = bytearray(b"\x00")
        _put_varint(rec, timestamps[i] - base_ts)
        _put_varint(rec, od)
        for data, lens, at in ((kmv, key_lens, ko), (vmv, value_lens, vo)):
            ln = int(lens[i])
            if ln == fmt.NULL_LEN:
                _put_varint(rec, -1)
            else:
                _put_varint(rec, ln)
                rec += data[at : at + ln]
        if int(key_lens[i]) != fmt.NULL_LEN:
            ko += int(key_lens[i])
        if int(value_lens[i]) != fmt.NULL_LEN:
            vo += int(value_lens[i])
        ml = fmt.NULL_LEN if meta_lens is None else int(meta_lens[i])
        if ml == fmt.NULL_LEN:
            rec.append(0)
        else:
            m = mmv[mo : mo + ml]
            mo += ml
            if kafka_headers_check(m):
                rec += m
            else:
                _put_varint(rec, 1)
                _put_varint(rec, len(_META_HEADER))
                rec += _META_HEADER
                _put_varint(rec, ml)
                rec += m
        _put_varint(body, len(rec))
        body += rec
    tail = struct.pack(">hiqqqhii", 0, offsets[-1] - base, base_ts, max(timestamps), -1, -1, -1, n) + body
    total = 61 + len(body)
    batch = struct.pack(">qiib", base, total - 12, 0, 2) + struct.pack(">I", crc32c(tail)) + tail
    return OK, bytearray(batch)
