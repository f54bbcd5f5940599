"""The one ladder from an exception to Kafka's error code, for the admin APIs' answers.

An admin request (CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs) answers each of its resources on its own: a
failure of one is that resource's error code and message, the others go on. The
handlers catch :data:`ADMIN_ERRORS` around each resource and answer it with
:func:`answer`, which maps the exception by :data:`LADDER` (the first class it is an
instance of), with the handler's own codes for a rung where Kafka's API differs (a bad
name is INVALID_TOPIC_EXCEPTION to CreateTopics, UNKNOWN_TOPIC_OR_PARTITION elsewhere).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog.errors import (
    ConfigError,
    InvalidNameError,
    PylogError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)

__all__ = ["ADMIN_ERRORS", "LADDER", "code_of", "answer"]

#: What the admin handlers catch around each resource (anything else is a bug: the
#: server logs it and closes the connection).
ADMIN_ERRORS = (PylogError, OSError)

#: (exception class, Kafka error code), the first match wins: the subclasses come first.
LADDER: tuple[tuple[type[BaseException], int], ...] = (
    (TopicExistsError, E.topic_already_exists),
    (UnknownTopicError, E.unknown_topic_or_partition),
    (UnknownPartitionError, E.unknown_topic_or_partition),
    (InvalidNameError, E.unknown_topic_or_partition),  # no topic can have that name: none is there
    (ConfigError, E.invalid_config),
    (PylogError, E.invalid_request),
    (OSError, E.kafka_storage_error),  # a full or failing disk, EMFILE, EACCES: that resource only
)


def code_of(e: BaseException, overrides: Mapping[type[BaseException], int] | None = None) -> int:
    """Kafka's error code for ``e`` by :data:`LADDER`; ``overrides`` replaces the code of
    a rung (keyed by the rung's class, e.g. ``{InvalidNameError: E.invalid_topic_exception}``).
    An exception on no rung is UNKNOWN_SERVER_ERROR."""
    for cls, code in LADDER:
        if isinstance(e, cls):
            return overrides.get(cls, code) if overrides else code
    return int(E.unknown_server_error)


def answer(r: dict[str, Any], e: BaseException, overrides: Mapping[type[BaseException], int] | None = None) -> None:
    """Set a resource's ``error_code`` (:func:`code_of`) and ``error_message`` (``str(e)``)."""
    r["error_code"], r["error_message"] = code_of(e, overrides), str(e)
