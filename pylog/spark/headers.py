"""The ``headers`` column of a read with ``includeHeaders=true``, as Spark's Kafka source
gives it: ``array<struct<key:string,value:binary>>``, null for a record without headers.

A record's Kafka headers are its pylog ``metadata`` in Kafka's header encoding (what
``pylog serve`` stores for a produced record, :mod:`pylog.serve.headers`). Metadata in any
other encoding reads as one header named ``pylog.metadata`` holding it, as the broker sends
it to Kafka consumers; so a read through the source and a Kafka consumer of the broker see
the same headers.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from pylog.serve.headers import decode_headers, is_headers

__all__ = ["HEADERS_DDL", "HEADERS_TYPE", "METADATA_HEADER", "headers_array"]

#: The column's Spark type, as Spark's Kafka source declares it.
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"
#: Its Arrow type (what Spark converts the declared type to).
HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))
#: The header name metadata that is not in Kafka's header encoding reads under.
METADATA_HEADER = "pylog.metadata"


def _headers(meta: bytes | None) -> list[dict[str, Any]] | None:
    if meta is None:
        return None
    if not is_headers(meta):
        return [{"key": METADATA_HEADER, "value": meta}]
    found = decode_headers(meta)
    return [{"key": k, "value": v} for k, v in found] or None


def headers_array(metadata: pa.Array) -> pa.Array:
    """The headers column of a batch from its ``metadata`` column (a binary array)."""
    if metadata.null_count == len(metadata):
        return pa.nulls(len(metadata), HEADERS_TYPE)
    return pa.array([_headers(m) for m in metadata.to_pylist()], type=HEADERS_TYPE)
