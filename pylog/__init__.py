"""pylog: a segmented, append-only commit log with a small C core.

>>> import pylog, tempfile
>>> with pylog.Log(tempfile.mkdtemp()) as log:
...     log.append(b"hello")
...     bytes(log.read(0).value)
0
b'hello'
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pylog import _backend
from pylog.config import LogConfig
from pylog.consumer import Consumer
from pylog.errors import (
    ArgumentTypeError,
    ConfigError,
    CorruptIndexError,
    CorruptRecordError,
    GroupActiveError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidTimestampError,
    LogClosedError,
    LogFencedError,
    LogLockedError,
    MissingExtraError,
    NotAssignedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    OffsetRemovedError,
    PylogError,
    ReadOnlyLogError,
    RecordTooLargeError,
    TopicExistsError,
    TransactionError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.log import Log
from pylog.record import Record
from pylog.topics import LogStore, Topic

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__version__ = "0.1.0"

#: Which implementation of the C core's functions is in use: "native" or "pure".
backend: str = _backend.NAME

#: What the backend offers (tests assert this per backend).
backend_features: frozenset[str] = frozenset(
    {"crc32c", "frame", "scan", "index-search"}
    | ({"crc32c-" + _backend.impl.crc_impl(), "zero-copy-c"} if backend == "native" else {"crc32c-portable"})
    | ({"speedups"} if _backend.speedups is not None else set())
)


def crc32c(data: ReadableBuffer, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``value`` (0 to start)."""
    return _backend.impl.crc32c(data, value)


__all__ = [
    "Log", "LogConfig", "Record", "crc32c", "backend", "backend_features", "__version__",
    "PylogError", "OffsetOutOfRangeError", "CorruptRecordError", "CorruptIndexError",
    "RecordTooLargeError", "OffsetMismatchError", "OffsetRemovedError", "InvalidTimestampError", "LogLockedError",
    "LogClosedError", "LogFencedError", "ReadOnlyLogError", "InvalidNameError", "ConfigError",
    "TopicExistsError", "UnknownTopicError", "UnknownPartitionError", "NotAssignedError",
    "MissingExtraError", "InvalidArgumentError", "ArgumentTypeError", "UnknownGroupError", "GroupActiveError",
    "TransactionError", "LogStore", "Topic", "Consumer",
]
