"""Kafka record headers in a record's metadata (docs/format.md, "Kafka headers").

The broker stores a Kafka record's headers as that record's pylog ``metadata``, in Kafka's
own wire encoding: a zigzag varint count, then per header a varint key length, the UTF-8
key, a varint value length (-1: null) and the value. These helpers let library code read
and write that encoding, so what a Kafka client produced reads the same here, and what the
library appends with ``metadata=encode_headers(...)`` reaches Kafka consumers as headers.
No kio needed.
"""
from __future__ import annotations

from collections.abc import Iterable

from pylog import _backend
from pylog.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["encode_headers", "decode_headers", "is_headers"]

Header = tuple[str, bytes | None]


def _varint(out: bytearray, x: int) -> None:
    v = (x << 1) ^ (x >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def encode_headers(headers: Iterable[Header]) -> bytes | None:
    """The metadata for ``headers`` (``(str key, bytes value or None)`` pairs); None for none."""
    items = list(headers)
    if not items:
        return None
    out = bytearray()
    _varint(out, len(items))
    for k, v in items:
        if not isinstance(k, str):
            raise ArgumentTypeError(f"a header key must be a str, got {type(k).__name__}")
        kb = k.encode()
        _varint(out, len(kb))
        out += kb
        if v is None:
            _varint(out, -1)
        else:
            vb = bytes(v)
            _varint(out, len(vb))
            out += vb
    return bytes(out)


def is_headers(metadata: bytes | memoryview | None) -> bool:
    """True when ``metadata`` is in the header encoding (None: no headers, also true)."""
    return metadata is None or _backend.impl.kafka_headers_check(metadata)


def decode_headers(metadata: bytes | memoryview | None) -> list[Header]:
    """The headers in ``metadata``; [] for None.

    Raises
    ------
    InvalidArgumentError
        ``metadata`` is not in the header encoding (the broker then sends it to Kafka clients
        as one header named ``pylog.metadata``).
    """
    if metadata is None:
        return []
    mv = memoryview(metadata).cast("B")
    if not _backend.impl.kafka_headers_check(mv):
        raise InvalidArgumentError(f"metadata of {len(mv)} bytes is not in Kafka's header encoding")
    pos = 0

    def varint() -> int:
        nonlocal pos
        v = shift = 0
        while True:
            b = mv[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return (v >> 1) ^ -(v & 1)
            shift += 7

    out: list[Header] = []
    for _ in range(varint()):
        n = varint()
        key = bytes(mv[pos : pos + n]).decode("utf-8", "surrogateescape")
        pos += n
        n = varint()
        if n < 0:
            out.append((key, None))
        else:
            out.append((key, bytes(mv[pos : pos + n])))
            pos += n
    return out
