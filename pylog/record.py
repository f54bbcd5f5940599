"""The Record type: one entry of a log."""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

Bytes = Union[bytes, memoryview]


class Record(NamedTuple):
    """One record: ``(offset, timestamp, key, value, metadata)``.

    ``timestamp`` is milliseconds since the Unix epoch. ``key``, ``value`` and ``metadata``
    are ``memoryview``s over the segment's map when read from a sealed segment (zero copy;
    they stay valid after the log is closed or the segment deleted), or ``bytes``/views
    otherwise; ``None`` where the record has none (a ``None`` value is a tombstone).
    """

    offset: int
    timestamp: int
    key: Optional[Bytes]
    value: Optional[Bytes]
    metadata: Optional[Bytes]


#: Builds a Record from a 5-tuple without Python-level __new__ (used on the hot paths).
new_record = tuple.__new__
