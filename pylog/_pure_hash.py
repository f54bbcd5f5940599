"""CRC32C and Kafka's murmur2 in pure Python: the twins of csrc/crc32c.c and csrc/hash.c,
the oracle the C core is tested against. :mod:`pylog._pure` exports them as the pure backend's
names; written for clarity, not speed.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_POLY = 0x82F63B78
_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)
del _n, _c



def crc_impl() -> str:
    return "portable"


def crc_hw_available() -> bool:
    return False


def crc_clmul_available() -> bool:
    return False


def crc32c(data: ReadableBuffer, value: int = 0) -> int:
    """CRC32C (Castagnoli), bit-reflected, one table lookup per byte."""
    c = value ^ 0xFFFFFFFF
    t = _TABLE
    for b in memoryview(data).cast("B").tobytes():
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


crc32c_portable = crc32c
crc32c_hw = crc32c
crc32c_clmul = crc32c


def crc32c_3(a: ReadableBuffer, b: ReadableBuffer, c: ReadableBuffer) -> tuple[int, int, int]:
    """The CRC32C of three bytes-likes (the C core computes them interleaved)."""
    return crc32c(a), crc32c(b), crc32c(c)


def crc32c_batch(buf: ReadableBuffer, positions: Any, lengths: Any) -> np.ndarray:
    mv = memoryview(buf).cast("B")
    pos = list(positions)
    lens = list(lengths)
    if len(pos) != len(lens):
        raise ValueError("positions and lengths differ in length")
    out = np.empty(len(pos), dtype=np.uint32)
    for i, (p, n) in enumerate(zip(pos, lens)):
        if p > len(mv) or n > len(mv) - p:
            raise ValueError("a (position, length) pair lies outside the buffer")
        out[i] = crc32c(mv[p : p + n])
    return out


_M = 0x5BD1E995
_U32 = struct.Struct("<I")


def murmur2(data: ReadableBuffer) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit MurmurHash2 of ``data`` with seed
    ``0x9747b28c``, as a signed 32-bit int (what Java returns)."""
    data = bytes(data)
    length = len(data)
    h = 0x9747B28C ^ length
    n4 = length & ~3
    if n4:
        for (k,) in _U32.iter_unpack(data[:n4]):
            k = (k * _M) & 0xFFFFFFFF
            k ^= k >> 24
            k = (k * _M) & 0xFFFFFFFF
            h = ((h * _M) & 0xFFFFFFFF) ^ k
    rem = length & 3
    if rem:
        if rem == 3:
            h ^= data[n4 + 2] << 16
        if rem >= 2:
            h ^= data[n4 + 1] << 8
        h ^= data[n4]
        h = (h * _M) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _M) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h
