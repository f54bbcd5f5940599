"""The C core, reached through cffi. The only module that touches ``ffi`` / ``lib``.

Thin, 1:1 wrappers with one shared shape: :mod:`pylog._pure` implements exactly the same
names in pure Python, and :mod:`pylog._backend` picks one of the two.

* :class:`Appender`: the writing state of an active segment (plog_appender), its user-space
  write buffer and its in-memory sparse index entries.
* :class:`Buffer`: a read-only byte buffer (usually an mmap) with its C pointer made once.
* free functions: CRC32C, frame scan / find / recover, index search and checks, headers.

Status codes (``PLOG_E_*``) are returned as ints; :mod:`pylog.segment` is the one place
that turns them into exceptions.
"""
from __future__ import annotations

import functools
import os
import struct
import threading

import numpy as np

from pylog import format as fmt
from pylog._cffi import ffi, lib

NAME = "native"

OK = lib.PLOG_OK
E_SHORT = lib.PLOG_E_SHORT
E_CRC = lib.PLOG_E_CRC
E_LENGTH = lib.PLOG_E_LENGTH
E_OFFSET = lib.PLOG_E_OFFSET
E_SPACE = lib.PLOG_E_SPACE
E_NOT_FOUND = lib.PLOG_E_NOT_FOUND
E_ARG = lib.PLOG_E_ARG
E_ATTRIBUTES = lib.PLOG_E_ATTRIBUTES
E_TIMESTAMP = lib.PLOG_E_TIMESTAMP
E_INDEX_FULL = lib.PLOG_E_INDEX_FULL
E_SEGMENT_FULL = lib.PLOG_E_SEGMENT_FULL

# The C struct and the numpy dtype must agree byte for byte.
assert ffi.sizeof("plog_frame") == fmt.FRAME_DTYPE.itemsize, "plog_frame / FRAME_DTYPE mismatch"
assert lib.PLOG_FRAME_HEADER_SIZE == fmt.FRAME_HEADER_SIZE
assert lib.PLOG_FILE_HEADER_SIZE == fmt.FILE_HEADER_SIZE

lib.plog_crc32c_select(lib.PLOG_CRC_SELECT_PORTABLE if os.environ.get("PYLOG_CRC32C_FORCE_PORTABLE") == "1"
                       else lib.PLOG_CRC_SELECT_NO_CLMUL if os.environ.get("PYLOG_CRC32C_NO_CLMUL") == "1"
                       else lib.PLOG_CRC_SELECT_BEST)

_CRC_NAMES = {lib.PLOG_CRC_PORTABLE: "portable", lib.PLOG_CRC_SSE42: "sse4.2", lib.PLOG_CRC_ARMV8: "armv8-crc",
              lib.PLOG_CRC_SSE42_CLMUL: "sse4.2+vpclmulqdq"}
_FRAME = struct.Struct("<QQqIIIIII")
_raw_alloc = ffi.new_allocator(should_clear_after_alloc=False)
_EMPTY = b""
_INT64_MIN = -(1 << 63)


def crc_impl() -> str:
    """Name of the CRC32C implementation in use: ``sse4.2+vpclmulqdq``, ``sse4.2``,
    ``armv8-crc`` or ``portable``."""
    return _CRC_NAMES[lib.plog_crc32c_impl()]


def crc_hw_available() -> bool:
    """Whether this CPU has CRC32C instructions pylog can use."""
    return bool(lib.plog_crc32c_hw_available())


def crc_clmul_available() -> bool:
    """Whether this CPU has the carry-less multiply (VPCLMULQDQ, AVX2) folding path."""
    return bool(lib.plog_crc32c_clmul_available())


def _ptr(data):
    return data if type(data) is bytes else ffi.from_buffer("uint8_t[]", data)


def crc32c(data, value: int = 0) -> int:
    """CRC32C of ``data`` (any bytes-like), continuing from ``value``."""
    return lib.plog_crc32c(value, _ptr(data), len(memoryview(data).cast("B")) if type(data) is not bytes else len(data))


def crc32c_portable(data, value: int = 0) -> int:
    """CRC32C through the portable slicing-by-8 path, whatever the CPU."""
    mv = memoryview(data).cast("B")
    return lib.plog_crc32c_portable(value, ffi.from_buffer("uint8_t[]", mv), len(mv))


def crc32c_hw(data, value: int = 0) -> int:
    """CRC32C through the hardware path (the portable one when the CPU has none)."""
    mv = memoryview(data).cast("B")
    return lib.plog_crc32c_hw(value, ffi.from_buffer("uint8_t[]", mv), len(mv))


def crc32c_clmul(data, value: int = 0) -> int:
    """CRC32C through the folding path (the hardware one when the CPU has none)."""
    mv = memoryview(data).cast("B")
    return lib.plog_crc32c_clmul(value, ffi.from_buffer("uint8_t[]", mv), len(mv))


def crc32c_3(a, b, c) -> tuple[int, int, int]:
    """The CRC32C of three bytes-likes at once: the interleaved path batch framing takes."""
    mvs = [memoryview(x).cast("B") for x in (a, b, c)]
    ptrs = [ffi.from_buffer("uint8_t[]", m) for m in mvs]
    out = ffi.new("uint32_t[3]")
    lib.plog_crc32c_3(ptrs, [len(m) for m in mvs], out)
    return out[0], out[1], out[2]


def crc32c_batch(buf, positions, lengths) -> np.ndarray:
    """CRC32C of ``buf[positions[i]:positions[i]+lengths[i]]`` for every i, in one call."""
    pos = np.ascontiguousarray(positions, dtype=np.uint64)
    lens = np.ascontiguousarray(lengths, dtype=np.uint32)
    if pos.shape != lens.shape:
        raise ValueError("positions and lengths differ in length")
    out = np.empty(len(pos), dtype=np.uint32)
    mv = memoryview(buf).cast("B")
    rc = lib.plog_crc32c_batch(
        ffi.from_buffer("uint8_t[]", mv), len(mv),
        ffi.from_buffer("uint64_t[]", pos), ffi.from_buffer("uint32_t[]", lens), len(pos),
        ffi.from_buffer("uint32_t[]", out, require_writable=True),
    )
    if rc != OK:
        raise ValueError("a (position, length) pair lies outside the buffer")
    return out


def murmur2(data) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``: a signed 32-bit int, as Java returns it."""
    h = lib.plog_murmur2(_ptr(data), len(data))
    return h - 0x100000000 if h & 0x80000000 else h


class Buffer:
    """A read-only byte buffer that C can read, its pointer made once.

    ``obj`` is anything with the buffer protocol (an ``mmap``, ``bytes``...). ``skip`` bytes
    at the front are not part of the view (the 32-byte file header of an index file).
    Dropping the last reference to a Buffer releases its hold on ``obj``; pylog never calls
    ``release`` while a C call may be running on it.
    """

    __slots__ = ("obj", "size", "_base", "ptr", "addr")

    def __init__(self, obj, skip: int = 0, size: int | None = None) -> None:
        self.obj = obj
        total = len(memoryview(obj).cast("B")) if type(obj) is not bytes else len(obj)
        self.size = (total - skip) if size is None else size
        if self.size < 0 or skip + self.size > total:
            raise ValueError("Buffer view lies outside the object")
        self._base = ffi.from_buffer("uint8_t[]", obj) if total else ffi.NULL
        self.ptr = self._base + skip if total else ffi.NULL
        #: ``ptr`` as an int, for pylog._speedups (which reads through the same pointer)
        self.addr = int(ffi.cast("uintptr_t", self.ptr))

    @classmethod
    def raw(cls, cdata, size: int) -> Buffer:
        """A Buffer over memory cffi owns (``cdata`` is kept alive by the Buffer)."""
        b = object.__new__(cls)
        b.obj = b._base = b.ptr = cdata
        b.size = size
        b.addr = int(ffi.cast("uintptr_t", cdata))
        return b


_tls = threading.local()


def _out():
    try:
        return _tls.out
    except AttributeError:
        raw = bytearray(_FRAME.size)
        _tls.out = o = (raw, ffi.from_buffer("plog_frame *", raw, require_writable=True))
        return o


def find(store: Buffer, store_len: int, index: Buffer | None, n_index: int, base_offset: int,
         target: int, gaps: bool = False):
    """(status, frame tuple or None) of the frame at offset ``target`` (with ``gaps``: the
    first frame at or after it), CRC verified."""
    try:
        raw, p = _tls.out
    except AttributeError:
        raw, p = _out()
    rc = lib.plog_find(store.ptr, store_len, index.ptr if index is not None else ffi.NULL,
                       n_index, base_offset, target, gaps, p)
    if rc:
        return rc, None
    return OK, _FRAME.unpack(raw)


def locator(store: Buffer, store_len: int, index: Buffer | None, n_index: int, base_offset: int,
            gaps: bool = False):
    """``locate(target)``: the position of the CRC-verified frame of ``target`` in this map
    (with ``gaps``, the first frame at or after it), or a negative status.

    The map's pointers are set once in a ``plog_view``, so each call passes two arguments
    (a random read's cffi call costs ~45 ns per argument). The returned callable keeps
    ``store`` and ``index`` alive."""
    v = ffi.new("plog_view *")
    v.buf = store.ptr
    v.len = store_len
    v.index = index.ptr if index is not None else ffi.NULL
    v.n_index = n_index
    v.base_offset = base_offset
    v.gaps = 1 if gaps else 0
    locate = functools.partial(lib.plog_locate, v)
    locate.keep = (store, index)  # type: ignore[attr-defined]
    return locate


def find_time(store: Buffer, store_len: int, tindex: Buffer | None, n_tindex: int, ts: int):
    """(status, frame tuple or None) of the first frame with timestamp >= ts."""
    raw, p = _out()
    rc = lib.plog_find_time(store.ptr, store_len, tindex.ptr if tindex is not None else ffi.NULL,
                            n_tindex, ts, p)
    if rc:
        return rc, None
    return OK, _FRAME.unpack(raw)


def resync(store: Buffer, store_len: int, start: int, expected: int, base_offset: int,
           gaps: bool = False, search_end: int | None = None):
    """After a bad frame at ``start`` that should hold ``expected``: ``(status, frame tuple)``
    of the first whole, CRC-valid frame after it with an offset that can follow (see
    ``plog_resync``), or ``(E_NOT_FOUND, None)``: nothing valid follows, a torn tail.
    Frames may start only before ``search_end`` (default ``store_len``): only zeros follow."""
    raw, p = _out()
    rc = lib.plog_resync(store.ptr, store_len, start, store_len if search_end is None else search_end,
                         expected, base_offset, 1 if gaps else 0, p)
    if rc:
        return rc, None
    return OK, _FRAME.unpack(raw)


def scan(store: Buffer, store_len: int, start: int, expected_offset: int | None,
         max_out: int, max_bytes: int, gaps: bool = False):
    """Decode up to ``max_out`` CRC-valid frames from ``start``.

    Returns ``(status, frames, end_position)``: ``frames`` a FRAME_DTYPE array of the good
    frames before any bad one, ``status`` OK or the reason the scan stopped early.
    """
    out = np.empty(max_out, dtype=fmt.FRAME_DTYPE)
    n = ffi.new("size_t *")
    end = ffi.new("uint64_t *")
    rc = lib.plog_scan(store.ptr, store_len, start,
                       0xFFFFFFFFFFFFFFFF if expected_offset is None else expected_offset, gaps,
                       ffi.from_buffer("plog_frame[]", out, require_writable=True), max_out,
                       max_bytes, n, end)
    return rc, out[: n[0]], end[0]


def index_lookup(index: Buffer, n: int, rel: int) -> int:
    """Slot of the largest entry with relative offset <= rel, or -1."""
    slot = ffi.new("size_t *")
    return slot[0] if lib.plog_index_lookup(index.ptr, n, rel, slot) == OK else -1


def index_entry(index: Buffer, slot: int) -> tuple[int, int]:
    """(relative offset, position) of an index's entry ``slot``."""
    return _IDX_ENTRY.unpack(ffi.buffer(index.ptr + slot * 8, 8))


_IDX_ENTRY = struct.Struct("<II")


def timeindex_lookup(tindex: Buffer, n: int, ts: int) -> int:
    """Slot of the last entry with timestamp < ts, or -1."""
    slot = ffi.new("size_t *")
    return slot[0] if lib.plog_timeindex_lookup(tindex.ptr, n, ts, slot) == OK else -1


def index_check(index: Buffer, n: int, store_len: int) -> int:
    """-1 if the offset index is consistent, else the first bad slot."""
    slot = ffi.new("size_t *")
    return -1 if lib.plog_index_check(index.ptr, n, store_len, slot) == OK else slot[0]


def timeindex_check(tindex: Buffer, n: int, store_len: int) -> int:
    """-1 if the time index is consistent, else the first bad slot."""
    slot = ffi.new("size_t *")
    return -1 if lib.plog_timeindex_check(tindex.ptr, n, store_len, slot) == OK else slot[0]


def header_encode(magic: bytes, base_offset: int, flags: int = 0) -> bytes:
    """The 32-byte file header."""
    out = bytearray(fmt.FILE_HEADER_SIZE)
    lib.plog_header_encode(ffi.from_buffer("uint8_t[]", out, require_writable=True), magic, base_offset, flags)
    return bytes(out)


def header_check(data, magic: bytes):
    """(status, base_offset, flags) of a file header."""
    mv = memoryview(data).cast("B")
    base = ffi.new("uint64_t *")
    flags = ffi.new("uint32_t *")
    rc = lib.plog_header_check(ffi.from_buffer("uint8_t[]", mv), len(mv), magic, base, flags)
    return (rc, base[0], flags[0]) if rc == OK else (rc, None, None)


class Appender:
    """Writing state of an active segment: where the next frame goes, the write buffer of
    framed bytes not yet handed to the OS, and the sparse index entries made so far."""

    __slots__ = ("_st", "_wbuf", "_wcap", "_ibuf", "_tbuf", "_frame_one", "_views", "_framer", "__weakref__")

    def __init__(self, base_offset: int, *, next_offset: int, position: int, max_position: int,
                 max_timestamp: int | None, index_interval: int, bytes_since_index: int,
                 index_cap: int, buffer_bytes: int, as_given: bool = False) -> None:
        st = self._st = ffi.new("plog_appender *")
        st.flags = lib.PLOG_AS_GIVEN if as_given else 0
        st.base_offset = base_offset
        st.next_offset = next_offset
        st.position = position
        st.max_position = max_position
        st.max_timestamp = _INT64_MIN if max_timestamp is None else max_timestamp
        st.index_interval = index_interval
        st.bytes_since_index = bytes_since_index
        self._ibuf = self._tbuf = None
        self._set_index_cap(max(index_cap, 1), 0)
        self._wcap = buffer_bytes
        self._wbuf = _raw_alloc("uint8_t[]", buffer_bytes)
        self._frame_one = lib.plog_frame_one
        self._framer = None

    # -- state ------------------------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        return self._st.next_offset

    @next_offset.setter
    def next_offset(self, value: int) -> None:
        """Skip ahead (compacted segments only: the frame after gets this offset)."""
        if value < self._st.next_offset:
            raise ValueError("next_offset cannot go back")
        self._st.next_offset = value

    @property
    def unit_end(self) -> int:
        """Batch framing: a frame whose offset + 1 is below it is marked as not the last of
        its write unit (``ATTR_UNIT_CONTINUES``); 0 (the default): no frame is."""
        return self._st.unit_end

    @unit_end.setter
    def unit_end(self, value: int) -> None:
        self._st.unit_end = value

    @property
    def gaps(self) -> bool:
        return bool(self._st.flags & lib.PLOG_GAPS)

    @gaps.setter
    def gaps(self, value: bool) -> None:
        self._st.flags = (self._st.flags & ~lib.PLOG_GAPS) | (lib.PLOG_GAPS if value else 0)

    @property
    def as_given(self) -> bool:
        """Explicit timestamps below the newest one are kept as given (not refused); the time
        index holds the running maximum either way."""
        return bool(self._st.flags & lib.PLOG_AS_GIVEN)

    @as_given.setter
    def as_given(self, value: bool) -> None:
        self._st.flags = (self._st.flags & ~lib.PLOG_AS_GIVEN) | (lib.PLOG_AS_GIVEN if value else 0)

    @property
    def position(self) -> int:
        """Store position after the last framed record (including the write buffer)."""
        return self._st.position

    @property
    def max_timestamp(self) -> int | None:
        ts = self._st.max_timestamp
        return None if ts == _INT64_MIN else ts

    @max_timestamp.setter
    def max_timestamp(self, value: int | None) -> None:
        """Carry the newest timestamp over from the segment before (a roll)."""
        self._st.max_timestamp = _INT64_MIN if value is None else value

    @property
    def bytes_since_index(self) -> int:
        return self._st.bytes_since_index

    @property
    def max_position(self) -> int:
        return self._st.max_position

    @max_position.setter
    def max_position(self, value: int) -> None:
        self._st.max_position = value

    @property
    def index_count(self) -> int:
        return self._st.index_count

    @property
    def index_cap(self) -> int:
        return self._st.index_cap

    def _set_index_cap(self, cap: int, count: int) -> None:
        st = self._st
        ibuf = _raw_alloc("uint8_t[]", cap * fmt.INDEX_ENTRY_SIZE)
        tbuf = _raw_alloc("uint8_t[]", cap * fmt.TIMEINDEX_ENTRY_SIZE)
        if count:
            ffi.memmove(ibuf, self._ibuf, count * fmt.INDEX_ENTRY_SIZE)
            ffi.memmove(tbuf, self._tbuf, count * fmt.TIMEINDEX_ENTRY_SIZE)
        self._ibuf, self._tbuf = ibuf, tbuf
        self._views = (Buffer.raw(ibuf, cap * fmt.INDEX_ENTRY_SIZE),
                       Buffer.raw(tbuf, cap * fmt.TIMEINDEX_ENTRY_SIZE))
        st.index, st.timeindex = ibuf, tbuf
        st.index_cap = st.timeindex_cap = cap
        st.index_count = st.timeindex_count = count

    def grow_index(self, cap: int) -> None:
        """Make room for ``cap`` index entries (keeps the existing ones)."""
        if cap > self._st.index_cap:
            self._set_index_cap(cap, self._st.index_count)

    def load_index(self, index_bytes: bytes, timeindex_bytes: bytes, max_cap: int | None = None) -> None:
        """Replace the in-memory entries with these (raw entry bytes, no header); room for
        more up to ``max_cap`` entries."""
        n = len(index_bytes) // fmt.INDEX_ENTRY_SIZE
        if len(timeindex_bytes) // fmt.TIMEINDEX_ENTRY_SIZE != n:
            raise ValueError("offset and time index entry counts differ")
        cap = max(n * 2, 64, self._st.index_cap)
        self._set_index_cap(max(n, 1, min(cap, max_cap)) if max_cap is not None else cap, 0)
        ffi.memmove(self._ibuf, index_bytes, len(index_bytes))
        ffi.memmove(self._tbuf, timeindex_bytes, len(timeindex_bytes))
        self._st.index_count = self._st.timeindex_count = n

    def index_bytes(self, start: int, stop: int) -> bytes:
        """Raw offset-index entries of slots [start, stop)."""
        e = fmt.INDEX_ENTRY_SIZE
        return ffi.buffer(self._ibuf + start * e, (stop - start) * e)[:]

    def timeindex_bytes(self, start: int, stop: int) -> bytes:
        """Raw time-index entries of slots [start, stop)."""
        e = fmt.TIMEINDEX_ENTRY_SIZE
        return ffi.buffer(self._tbuf + start * e, (stop - start) * e)[:]

    def index_view(self) -> Buffer:
        """A Buffer over the offset-index entries (read ``index_count`` of them)."""
        return self._views[0]

    def timeindex_view(self) -> Buffer:
        """A Buffer over the time-index entries (read ``index_count`` of them)."""
        return self._views[1]

    # -- write buffer ------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Bytes framed into the write buffer and not yet written out."""
        return self._st.used

    def pending(self):
        """The framed bytes not yet written (a buffer valid until the next frame call)."""
        return ffi.buffer(self._wbuf, self._st.used)

    def drain(self) -> None:
        """Forget the pending bytes (after the caller wrote them)."""
        self._st.used = 0

    def reserve(self, nbytes: int) -> None:
        """Make the (empty) write buffer hold at least ``nbytes``."""
        if self._st.used:
            raise RuntimeError("reserve() needs an empty write buffer")
        if nbytes > self._wcap:
            self._wbuf = _raw_alloc("uint8_t[]", nbytes)
            self._wcap = nbytes
            if self._framer is not None:  # it frames into the new buffer from now on
                self._framer.set_buffer(int(ffi.cast("uintptr_t", self._wbuf)), nbytes, self._wbuf)

    def framer(self, factory):
        """This appender's pylog._speedups Framer (made with ``factory``, the Framer type,
        the first time): ``framer(...).frame_value(value, timestamp)`` is :meth:`frame_value`
        in one C call. It keeps the appender state and the write buffer it frames into
        alive; :meth:`reserve` hands it a new buffer."""
        f = self._framer
        if f is None:
            f = factory(int(ffi.cast("uintptr_t", self._st)), self._st)
            f.set_buffer(int(ffi.cast("uintptr_t", self._wbuf)), self._wcap, self._wbuf)
            self._framer = f
        return f

    @property
    def buffer_capacity(self) -> int:
        return self._wcap

    # -- framing -----------------------------------------------------------------------------
    def frame(self, value, key, metadata, attributes: int, timestamp: int, clamp: bool = False) -> int:
        """Frame one record into the write buffer: its offset, or a negative status. With
        ``clamp``, a timestamp below the newest is raised to it instead of refused."""
        return self._frame_one(
            self._st, self._wbuf, self._wcap,
            _EMPTY if key is None else _ptr(key), 0 if key is None else len(key),
            _EMPTY if metadata is None else _ptr(metadata), 0 if metadata is None else len(metadata),
            _EMPTY if value is None else _ptr(value), 0 if value is None else len(value),
            attributes, timestamp, clamp,
        )

    def frame_value(self, value: bytes, timestamp: int) -> int:
        """``frame`` for the common record: a bytes value, no key, no metadata, a default
        (clamped) timestamp. Its offset, or a negative status."""
        return self._frame_one(self._st, self._wbuf, self._wcap, _EMPTY, 0, _EMPTY, 0,
                               value, len(value), 3, timestamp, 1)

    def frame_batch(self, values, value_lens, keys, key_lens, metas, meta_lens, timestamps,
                    default_timestamp: int) -> tuple[int, int]:
        """Frame a batch into the write buffer: ``(status, records framed)``.

        ``values`` / ``keys`` / ``metas`` are concatenated bytes-likes (or None), the ``*_lens``
        uint32 numpy arrays with NULL_LEN for a null entry, ``timestamps`` an int64 array or
        None. Stops early with E_SPACE / E_SEGMENT_FULL / E_INDEX_FULL; checks timestamps
        and sizes of the whole batch before framing any of it.
        """
        n = len(value_lens)
        n_done = ffi.new("size_t *")
        written = ffi.new("size_t *")
        rc = lib.plog_frame_batch(
            self._st, self._wbuf, self._wcap,
            _ptr(values) if values is not None and len(values) else _EMPTY,
            ffi.from_buffer("uint32_t[]", value_lens),
            _ptr(keys) if keys is not None and len(keys) else (_EMPTY if key_lens is not None else ffi.NULL),
            ffi.from_buffer("uint32_t[]", key_lens) if key_lens is not None else ffi.NULL,
            _ptr(metas) if metas is not None and len(metas) else (_EMPTY if meta_lens is not None else ffi.NULL),
            ffi.from_buffer("uint32_t[]", meta_lens) if meta_lens is not None else ffi.NULL,
            ffi.from_buffer("int64_t[]", timestamps) if timestamps is not None else ffi.NULL,
            default_timestamp, n, n_done, written,
        )
        return rc, n_done[0]

    def frame_in_place(self, buf, value_lens, key_lens, meta_lens, timestamps,
                       default_timestamp: int) -> tuple[int, int, int]:
        """``frame_batch`` for records already laid out as frames in the writable ``buf``
        (each record's key, metadata and value after a ``FRAME_HEADER_SIZE`` gap, which
        this fills in). ``buf`` must be exactly the frames' size and the write buffer
        empty: the caller writes the first ``written`` bytes of ``buf`` at the store
        position the first frame had. Returns ``(status, records framed, written)``.
        """
        n_done = ffi.new("size_t *")
        written = ffi.new("size_t *")
        rc = lib.plog_frame_in_place(
            self._st, ffi.from_buffer("uint8_t[]", buf, require_writable=True), len(buf),
            ffi.from_buffer("uint32_t[]", value_lens),
            ffi.from_buffer("uint32_t[]", key_lens) if key_lens is not None else ffi.NULL,
            ffi.from_buffer("uint32_t[]", meta_lens) if meta_lens is not None else ffi.NULL,
            ffi.from_buffer("int64_t[]", timestamps) if timestamps is not None else ffi.NULL,
            default_timestamp, len(value_lens), n_done, written,
        )
        return rc, n_done[0], written[0]

    def resume_at(self, position: int, next_offset: int) -> None:
        """Continue a walk at ``position``, whose frame holds ``next_offset``, after damage
        was stepped over; that frame gets an index entry, so lookups past the damage find
        it without walking through the bad bytes."""
        if position < self._st.position or next_offset < self._st.next_offset:
            raise ValueError("a walk cannot go back")
        self._st.position = position
        self._st.next_offset = next_offset
        self._st.bytes_since_index = self._st.index_interval

    def recover(self, store: Buffer, store_len: int) -> tuple[int, int]:
        """Walk frames from ``position`` to ``store_len``, validating and indexing them.

        Returns ``(status, frames walked)``; on a bad frame ``position`` is where it starts.
        Grows the index as needed.
        """
        total = 0
        nf = ffi.new("uint64_t *")
        while True:
            rc = lib.plog_recover(store.ptr, store_len, self._st, nf)
            total += nf[0]
            if rc != E_INDEX_FULL:
                return rc, total
            self.grow_index(self._st.index_cap * 2)



def scan_columns(store: Buffer, store_len: int, start: int, expected_offset: int | None,
                 stop_offset: int | None, cols, gaps: bool = False):
    """Append the CRC-valid frames from ``start`` to ``cols`` (a :class:`pylog._columns.Columns`)
    as rows, in one C pass (``plog_scan_columns``).

    Stops when ``cols`` is full, the buffer ends, a frame's offset is >= ``stop_offset``
    (None: no bound), a binary column's data is full (E_SPACE; that column's ``need`` says
    how much it needs) or a frame is bad (its status). ``expected_offset`` and ``gaps`` as
    for :func:`scan`. Returns ``(status, rows appended, end_position)``; the rows before a
    stop are kept.
    """
    c = ffi.new("plog_columns *")
    keep = []

    def ptr(ctype, arr):
        p = ffi.from_buffer(ctype, arr, require_writable=True)
        keep.append(p)
        return p

    c.rows = before = cols.rows
    c.capacity = cols.capacity
    if cols.offsets is not None:
        c.offsets = ptr("int64_t[]", cols.offsets)
    if cols.timestamps is not None:
        c.timestamps = ptr("int64_t[]", cols.timestamps)
    if cols.attributes is not None:
        c.attributes = ptr("uint8_t[]", cols.attributes)
    binary = ((c.key, cols.key), (c.metadata, cols.metadata), (c.value, cols.value))
    for cc, bc in binary:
        if bc is not None:
            cc.offsets = ptr("int32_t[]", bc.offsets)
            cc.data = ptr("uint8_t[]", bc.data)
            cc.data_cap = len(bc.data)
            cc.validity = ptr("uint8_t[]", bc.validity)
            cc.null_count = bc.null_count
    end = ffi.new("uint64_t *")
    rc = lib.plog_scan_columns(store.ptr, store_len, start,
                               0xFFFFFFFFFFFFFFFF if expected_offset is None else expected_offset, gaps,
                               0xFFFFFFFFFFFFFFFF if stop_offset is None else stop_offset, c, end)
    cols.rows = c.rows
    for cc, bc in binary:
        if bc is not None:
            bc.null_count = cc.null_count
            bc.need = cc.need
    return rc, cols.rows - before, end[0]


# ----------------------------------------------------------------------------------------
# Kafka RecordBatch v2 (csrc/kafka.c): the broker's codec (pylog.serve.records)
KAFKA_BATCH_HEADER_SIZE = lib.PLOG_KAFKA_BATCH_HEADER_SIZE


def kafka_headers_check(data) -> bool:
    """True when ``data`` is Kafka's record-header encoding (varint count, then each header)."""
    mv = memoryview(data).cast("B")
    return lib.plog_kafka_headers_check(_ptr(mv), len(mv)) == OK


def kafka_decode(section, count: int):
    """Decode ``count`` records of an uncompressed RecordBatch v2 records section in one C call.

    Returns ``(status, ts_delta, offset_delta, keys, values, headers)``: int64 arrays of the
    deltas, and for keys, values and headers a pair ``(data, lengths)`` (uint8 and uint32
    arrays; ``PLOG_NULL_LEN`` marks a null; a record without headers has null headers).
    """
    mv = memoryview(section).cast("B")
    n = len(mv)
    if count < 0 or count > n:  # a record takes at least 7 bytes: never trust a claimed count
        return E_LENGTH, None, None, None, None, None
    ts = np.empty(count, np.int64)
    od = np.empty(count, np.int64)
    lens = np.empty((3, count), np.uint32)
    bufs = np.empty((3, max(n, 1)), np.uint8)
    used = ffi.new("uint64_t[3]")
    with ffi.from_buffer(mv) as src:
        rc = lib.plog_kafka_decode(
            src, n, count, ffi.from_buffer("int64_t[]", ts, require_writable=True),
            ffi.from_buffer("int64_t[]", od, require_writable=True),
            ffi.from_buffer("uint8_t[]", bufs[0], require_writable=True),
            ffi.from_buffer("uint32_t[]", lens[0], require_writable=True),
            ffi.from_buffer("uint8_t[]", bufs[1], require_writable=True),
            ffi.from_buffer("uint32_t[]", lens[1], require_writable=True),
            ffi.from_buffer("uint8_t[]", bufs[2], require_writable=True),
            ffi.from_buffer("uint32_t[]", lens[2], require_writable=True), used)
    if rc != OK:
        return rc, None, None, None, None, None
    return (rc, ts, od, (bufs[0][: used[0]], lens[0]), (bufs[1][: used[1]], lens[1]),
            (bufs[2][: used[2]], lens[2]))


def kafka_encode(offsets, timestamps, keys, key_lens, values, value_lens, meta=None, meta_lens=None):
    """Build one RecordBatch v2 (header, records, CRC32C) in one C call.

    ``offsets``/``timestamps``: int64 arrays; keys, values, meta: joined bytes-likes with
    uint32 lengths (``PLOG_NULL_LEN``: null; ``meta_lens`` None: no metadata).
    Returns ``(status, batch)``, the batch a read-only buffer (memoryview).
    """
    offsets = np.ascontiguousarray(offsets, np.int64)
    timestamps = np.ascontiguousarray(timestamps, np.int64)
    key_lens = np.ascontiguousarray(key_lens, np.uint32)
    value_lens = np.ascontiguousarray(value_lens, np.uint32)
    n = len(offsets)
    kmv, vmv = memoryview(keys).cast("B"), memoryview(values).cast("B")
    mmv = memoryview(meta if meta is not None else _EMPTY).cast("B")
    cap = KAFKA_BATCH_HEADER_SIZE + n * 64 + len(kmv) + len(vmv) + len(mmv)
    out = _raw_alloc("uint8_t[]", cap)  # not zeroed: C writes every byte it reports
    written = ffi.new("size_t *")
    ml = None if meta_lens is None else np.ascontiguousarray(meta_lens, np.uint32)
    with ffi.from_buffer(kmv) as kp, ffi.from_buffer(vmv) as vp, ffi.from_buffer(mmv) as mp:
        rc = lib.plog_kafka_encode(
            out, cap, n, ffi.from_buffer("int64_t[]", offsets), ffi.from_buffer("int64_t[]", timestamps),
            kp, ffi.from_buffer("uint32_t[]", key_lens), vp, ffi.from_buffer("uint32_t[]", value_lens),
            mp, ffi.NULL if ml is None else ffi.from_buffer("uint32_t[]", ml), written)
    if rc != OK:
        return rc, None
    return rc, memoryview(ffi.buffer(out, written[0]))
