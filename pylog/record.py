"""The Record type: one entry of a log."""
from __future__ import annotations

from typing import NamedTuple

Bytes = bytes | memoryview


class Record(NamedTuple):
    """One record: ``(offset, timestamp, key, value, metadata)``.

    ``timestamp`` is milliseconds since the Unix epoch. ``key``, ``value`` and ``metadata``
    are ``memoryview``s over the segment's map when read from a sealed segment (zero copy;
    they stay valid after the log is closed or the segment deleted), or ``bytes``/views
    otherwise; ``None`` where the record has none (a ``None`` value is a tombstone).
    """

    offset: int
    timestamp: int
    key: Bytes | None
    value: Bytes | None
    metadata: Bytes | None

    def __repr__(self) -> str:
        """``Record(offset=7, timestamp=..., key=b'k', value=b'first 24 bytes'... (100 B), ...)``:
        each field's first bytes, and its size when it is longer."""
        return (f"Record(offset={self.offset!r}, timestamp={self.timestamp!r}, key={_preview(self.key)}, "
                f"value={_preview(self.value)}, metadata={_preview(self.metadata)})")


PREVIEW_BYTES = 24


def _preview(b: Bytes | None) -> str:
    if b is None:
        return "None"
    try:
        n = len(b) if not isinstance(b, memoryview) else b.nbytes
        head = bytes(b[:PREVIEW_BYTES])
    except ValueError:  # a released view
        return "<released>"
    return f"{head!r}" + (f"... ({n} B)" if n > PREVIEW_BYTES else "")


#: Builds a Record from a 5-tuple without Python-level __new__ (used on the hot paths).
new_record = tuple.__new__
