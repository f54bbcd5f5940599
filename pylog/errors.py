"""pylog's exceptions.

Every exception pylog raises on purpose derives from :class:`PylogError`. Where an error
refines a builtin, it inherits from it too (``except IndexError`` still catches an
out-of-range read), without shadowing the builtin's name. ``OSError`` from the operating
system stays an ``OSError``, with its errno and filename.
"""
from __future__ import annotations

__all__ = [
    "PylogError",
    "OffsetOutOfRangeError",
    "CorruptRecordError",
    "CorruptIndexError",
    "RecordTooLargeError",
    "OffsetMismatchError",
    "OffsetRemovedError",
    "InvalidTimestampError",
    "LogLockedError",
    "LogClosedError",
    "LogFencedError",
    "ReadOnlyLogError",
    "InvalidNameError",
    "ConfigError",
    "TopicExistsError",
    "UnknownTopicError",
    "UnknownPartitionError",
    "NotAssignedError",
    "MissingExtraError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "UnknownGroupError",
    "GroupActiveError",
    "TransactionError",
]


class PylogError(Exception):
    """Root of every error pylog raises on purpose."""


class OffsetOutOfRangeError(PylogError, IndexError):
    """An offset below ``start_offset`` or at/after ``next_offset`` was asked for.

    Attributes: ``offset``, ``start_offset``, ``next_offset``.
    """

    def __init__(self, offset: int, start_offset: int, next_offset: int, message: str | None = None) -> None:
        self.offset = offset
        self.start_offset = start_offset
        self.next_offset = next_offset
        super().__init__(
            message or f"offset {offset} is out of range: the log holds [{start_offset}, {next_offset})"
        )


class CorruptRecordError(PylogError, ValueError):
    """A frame failed its CRC32C or structural checks; its bytes are never returned.

    Attributes: ``path`` (store file), ``position`` (byte position of the bad frame),
    ``offset`` (the offset that was expected there, or None), ``reason`` (short text).
    """

    def __init__(self, path: str, position: int, offset: int | None, reason: str) -> None:
        self.path = path
        self.position = position
        self.offset = offset
        self.reason = reason
        where = f"offset {offset} " if offset is not None else ""
        super().__init__(f"corrupt record {where}at position {position} of {path}: {reason}")


class CorruptIndexError(PylogError, ValueError):
    """An index file is unusable. pylog rebuilds indexes itself; this is only reported."""


class RecordTooLargeError(PylogError, ValueError):
    """A record is larger than ``max_record_bytes``; nothing was written.

    Attributes: ``size``, ``limit``.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"record of {size} bytes is larger than max_record_bytes={limit}")


class OffsetMismatchError(PylogError, ValueError):
    """``expected_offset`` was not the log's ``next_offset``; nothing was written.

    Attributes: ``expected``, ``actual``.
    """

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"expected_offset={expected} but the log's next_offset is {actual}")


class OffsetRemovedError(PylogError, KeyError):
    """The offset lies inside the log but compaction removed its record (a later record
    with the same key superseded it). ``read_batch``/``scan`` skip such offsets.

    Attribute: ``offset``.
    """

    def __init__(self, offset: int) -> None:
        self.offset = offset
        super().__init__(offset)

    def __str__(self) -> str:
        return f"offset {self.offset} was removed by compaction"


class InvalidTimestampError(PylogError, ValueError):
    """A timestamp is out of range or below the log's latest timestamp."""


class LogLockedError(PylogError):
    """Another writer (in this or another process) holds the partition's lock."""


class LogClosedError(PylogError):
    """The log (or store, or consumer) was closed."""


class LogFencedError(PylogError):
    """A write or fsync failed earlier; the log refuses appends until it is reopened.

    A retried fsync can report success after the data is gone (Rebello et al., ATC'20), so
    pylog never retries: reopen the log, which recovers from what is on disk.
    """


class ReadOnlyLogError(PylogError):
    """A write was attempted on a log opened with ``readonly=True``."""


class InvalidNameError(PylogError, ValueError):
    """A topic or partition name is not allowed (it could escape the data root)."""


class ConfigError(PylogError, ValueError):
    """A configuration value is invalid, or cannot change on an existing log."""


class TopicExistsError(PylogError):
    """``create_topic`` was asked for a topic that already exists."""


class UnknownTopicError(PylogError, KeyError):
    """No topic of that name exists under the root."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown topic"


class UnknownPartitionError(PylogError, IndexError):
    """A topic has no partition of that number."""


class NotAssignedError(PylogError, ValueError):
    """A consumer was asked about a partition it does not own (not assigned to it)."""


class InvalidArgumentError(PylogError, ValueError):
    """An argument is out of its allowed range or conflicts with another (e.g. ``scan(300)``
    on a log holding 100 records, ``append_batch([])``). Also a ValueError, so callers
    that caught ValueError still do."""


class ArgumentTypeError(PylogError, TypeError):
    """An argument has the wrong type (e.g. a str where bytes or an int is needed). Also a
    TypeError, so callers that caught TypeError still do."""


class UnknownGroupError(PylogError, KeyError):
    """No consumer group of that name (on that topic)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown group"


class GroupActiveError(PylogError):
    """A consumer group cannot be reset or deleted while it has live members."""


class MissingExtraError(PylogError, ImportError):
    """An optional part of pylog needs a package that is not installed.

    The message is one line naming the extra that brings it, e.g. ``pip install
    "pylog-commitlog[arrow]"``. Attributes: ``module`` (the missing module), ``extra``.
    """

    def __init__(self, feature: str, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(f"{feature} needs {module}, which is not installed: "
                         f'pip install "pylog-commitlog[{extra}]"', name=module)


class TransactionError(PylogError):
    """A transaction could not be used or committed (it is aborted unless it says otherwise).
    Also ``pylog.transactions.TransactionError``."""


def require(module: str, feature: str, extra: str) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` can be imported."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(feature, module, extra)
