"""Kafka's wire protocol: request framing, headers, schemas and the response builder.

The message schemas are not written here: they come from ``kio``, which is generated from
Kafka's own JSON schemas (``clients/src/main/resources/common/message``). This module
only picks the schema of an (API key, version), decodes a request frame, and turns a
handler's plain dict into the version's response entity, so that one handler serves
every version it is listed for (fields a version lacks are dropped, fields a version has
and the handler did not give take a neutral default).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

from kio.index import load_request_schema as _load_request_schema
from kio.index import load_response_schema as _load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import DecodeError

#: API keys and the versions served (Kafka 4.0's minimums, KIP-896, up to what kio knows and
#: the handlers fill): key -> (name, lowest, highest).
SERVED: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 13),
    1: ("Fetch", 4, 18),
    2: ("ListOffsets", 1, 7),
    3: ("Metadata", 0, 13),
    18: ("ApiVersions", 0, 3),
    19: ("CreateTopics", 2, 7),
    20: ("DeleteTopics", 1, 5),
    32: ("DescribeConfigs", 1, 4),
    37: ("CreatePartitions", 0, 3),
    44: ("IncrementalAlterConfigs", 0, 1),  # IncrementalAlterConfigs (:mod:`.admin_configs`)
    33: ("AlterConfigs", 0, 2),  # AlterConfigs (:mod:`.admin_configs`)
    # consumer groups (:mod:`.coordinator`)
    8: ("OffsetCommit", 2, 9), 9: ("OffsetFetch", 1, 9), 10: ("FindCoordinator", 0, 4),
    11: ("JoinGroup", 0, 9), 12: ("Heartbeat", 0, 4), 13: ("LeaveGroup", 0, 5),
    14: ("SyncGroup", 0, 5), 15: ("DescribeGroups", 0, 5), 16: ("ListGroups", 0, 5),
    42: ("DeleteGroups", 0, 2),
    47: ("OffsetDelete", 0, 0),  # OffsetDelete (:mod:`.group_admin`)
    # idempotent producers (:mod:`.producers`)
    22: ("InitProducerId", 0, 5),
    # SASL (:mod:`.security`); without a users file the handshake offers no mechanism
    17: ("SaslHandshake", 1, 1), 36: ("SaslAuthenticate", 0, 2),
    21: ("DeleteRecords", 0, 2),  # DeleteRecords (:mod:`.admin_records`)
    23: ("OffsetForLeaderEpoch", 2, 4),  # OffsetForLeaderEpoch (:mod:`.admin_records`)
    61: ("DescribeProducers", 0, 0),  # DescribeProducers (:mod:`.admin_records`)
    60: ("DescribeCluster", 0, 2),  # DescribeCluster (:mod:`.admin_cluster`)
    35: ("DescribeLogDirs", 1, 4),  # DescribeLogDirs (:mod:`.admin_cluster`)
    # transactions (:mod:`.txn_coordinator`); v4+ of AddPartitionsToTxn are broker to broker,
    # EndTxn v5 and TxnOffsetCommit v4+ transaction version 2 (KIP-890 part 2): not served
    24: ("AddPartitionsToTxn", 0, 3), 25: ("AddOffsetsToTxn", 0, 3), 26: ("EndTxn", 0, 4),
    28: ("TxnOffsetCommit", 0, 3), 65: ("DescribeTransactions", 0, 0), 66: ("ListTransactions", 0, 1),
    50: ("DescribeUserScramCredentials", 0, 0), 51: ("AlterUserScramCredentials", 0, 0),  # :mod:`.scram_admin`
    29: ("DescribeAcls", 1, 3), 30: ("CreateAcls", 1, 3), 31: ("DeleteAcls", 1, 3),  # :mod:`.acl_admin`
}

#: API keys of a next step (none now). They are not
#: advertised by ApiVersions; a client that sends one anyway gets every error code of the
#: response set to UNSUPPORTED_VERSION, the code Kafka gives for an API it does not serve.
NOT_YET: dict[int, tuple[str, int, int]] = {}

# kio resolves a schema by importing its module on every call: once per (key, version) here
load_request_schema = functools.lru_cache(maxsize=None)(_load_request_schema)
load_response_schema = functools.lru_cache(maxsize=None)(_load_response_schema)
# typed as plain callables: lru_cache asks for hashable arguments, and mypy does not count an
# entity class (a dataclass, whose instances are unhashable) as one
_reader: Callable[[Any], Any] = functools.lru_cache(maxsize=None)(entity_reader)
_writer: Callable[[Any], Any] = functools.lru_cache(maxsize=None)(entity_writer)

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hhi")


class RequestError(Exception):
    """A request the broker cannot answer: the connection is closed (as Kafka does)."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One decoded request: its header fields and the kio payload entity."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    response_cls: type


def _schema_ok(key: int, version: int) -> bool:
    return any(key in table and table[key][1] <= version <= table[key][2] for table in (SERVED, NOT_YET))


def decode_request(frame: bytes | memoryview) -> Request:
    """Decode one request frame (the bytes after its 4-byte size).

    Raises
    ------
    RequestError
        The frame is truncated or malformed, or names an API key or version not served.
        ApiVersions at an unknown version is not an error: Kafka answers it at v0 with
        UNSUPPORTED_VERSION, so the caller does that (``body`` is None).
    """
    if len(frame) < 8:
        raise RequestError(f"a request frame of {len(frame)} bytes is shorter than its header")
    key, version, correlation = _KEY_VERSION.unpack_from(frame, 0)
    if key == 18 and not _schema_ok(key, version):
        return Request(key, version, correlation, None, None, load_response_schema(18, 0))
    if not _schema_ok(key, version):
        raise RequestError(f"API key {key} version {version} is not served")
    req_cls = load_request_schema(key, version)
    try:
        header, used = _reader(req_cls.__header_schema__)(frame, 0)
        body, n = _reader(req_cls)(frame, used)
    except (DecodeError, ValueError, TypeError, OverflowError, UnicodeDecodeError, IndexError, KeyError) as e:
        # KeyError: kio names an unknown tagged-field tag that way
        raise RequestError(f"malformed {req_cls.__name__} v{version}: {e}") from e
    # bytes after the payload are ignored, as Kafka's own request parser does (librdkafka
    # sends tagged fields that kio's schema of some versions does not list)
    return Request(key, version, correlation, getattr(header, "client_id", None), body,
                   load_response_schema(key, version))


#: Writes of at least this many bytes (a Fetch's records) are kept as the caller's buffer.
BIG_WRITE = 1 << 16


class _Frame:
    """A response frame being written by kio: small writes gathered in a bytearray, large
    ones (record batches) kept as they are, not copied (a copy of 16 MiB, with its page
    faults, cost as much as building the batch)."""

    __slots__ = ("parts", "small", "size")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.small = bytearray(4)  # the size, filled in at the end
        self.size = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n >= BIG_WRITE:
            self.parts.append(self.small)
            self.parts.append(data)
            self.small = bytearray()
        else:
            self.small += data
        self.size += n
        return n


def encode_response(req: Request, payload: Any) -> bytes | list[Any]:
    """The response frame (size, header, payload) of ``payload`` (a kio entity): bytes, or
    for a payload holding large byte fields (a Fetch's records) or a large frame of small
    ones, the frame's buffers in order (not copied again), for the caller to write one
    after another."""
    cls = type(payload)
    header_cls = cls.__header_schema__
    buf = _Frame()
    _writer(header_cls)(buf, header_cls(correlation_id=req.correlation_id))
    _writer(cls)(buf, payload)
    first = buf.parts[0] if buf.parts else buf.small
    _SIZE.pack_into(first, 0, buf.size)
    if not buf.parts:
        # a large frame of small fields (a Fetch of many partitions, each under BIG_WRITE):
        # its one buffer as is, not copied again, written in slices as the others
        return bytes(buf.small) if buf.size < BIG_WRITE else [buf.small]
    return [*buf.parts, buf.small] if buf.small else buf.parts


# ----------------------------------------------------------------------------------------
# The response builder: plain dicts -> the entity of one version
def _entity_of(tp: Any) -> tuple[Any, bool]:
    """(entity class, is a tuple of them) for a field type, or (None, False)."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return (inner, True) if dataclasses.is_dataclass(inner) else (None, True)
    if origin in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            if a is not type(None):
                return _entity_of(a)
    if dataclasses.is_dataclass(tp):
        return tp, False
    return None, False


def _default(f: dataclasses.Field[Any], error: int) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    cls, many = _entity_of(f.type)
    if many:
        return ()
    if cls is not None:
        return build(cls, {}, error)
    kt = f.metadata.get("kafka_type", "")
    if kt == "error_code":
        return ErrorCode(error)
    if kt in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kt == "string":
        return None if type(None) in typing.get_args(f.type) else ""
    if kt == "bool":
        return False
    if kt == "uuid":
        return None if type(None) in typing.get_args(f.type) else uuid.UUID(int=0)
    if kt in ("records", "bytes"):
        return None if type(None) in typing.get_args(f.type) else b""
    if kt == "float64":
        return 0.0
    return 0


def build(cls: type, data: dict[str, Any], error: int = 0) -> Any:
    """The ``cls`` entity from ``data``: keys ``cls`` lacks are dropped, missing fields take a
    neutral default (an unset ``error_code`` is ``error``), nested dicts become entities."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            v = data[f.name]
            sub, many = _entity_of(f.type)
            if sub is not None and many and v is not None:
                v = tuple(x if dataclasses.is_dataclass(x) else build(sub, x, error) for x in v)
            elif sub is not None and isinstance(v, dict):
                v = build(sub, v, error)
            elif many and isinstance(v, list):
                v = tuple(v)
            elif f.metadata.get("kafka_type") == "error_code":
                v = ErrorCode(v)
            elif f.metadata.get("kafka_type") in ("timedelta_i32", "timedelta_i64") and isinstance(v, int):
                v = datetime.timedelta(milliseconds=v)
            kw[f.name] = v
        elif f.default is dataclasses.MISSING:
            kw[f.name] = _default(f, error)
    return cls(**kw)
