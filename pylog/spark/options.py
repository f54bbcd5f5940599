"""Parsing and checking the data source's options: one ConfigError line naming the bad option.

Spark passes options case-insensitively; :func:`_options_dict` makes them a plain lower-case
dict (picklable, no pyspark type) that the readers and writers take.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from pylog.errors import ConfigError, InvalidNameError

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_EARLIEST, _LATEST = -2, -1

_OPTION_NAMES = {n.lower(): n for n in (
    "path", "topic", "topics", "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "failOnDataLoss", "minPartitions", "maxOffsetsPerTrigger", "createTopic", "partitions", "lateTimestamps",
    "sinkId", "pushFilters")}


def _err(option: str, msg: str) -> ConfigError:
    """The error for a bad option value: one line that names the option."""
    return ConfigError(f"pylog option {_OPTION_NAMES.get(option.lower(), option)}: {msg}")


def _bool_opt(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise _err(name, f"expected true or false, got {raw!r}")


def _int_opt(options: Mapping[str, str], name: str, default: int | None, lo: int = 0) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise _err(name, f"expected an integer, got {raw!r}") from None
    if v < lo:
        raise _err(name, f"must be >= {lo}, got {v}")
    return v


def _root_opt(options: Mapping[str, str], *, must_exist: bool = True) -> str:
    root = options.get("path")
    if not root:
        raise _err("path", "required: the pylog data root (a directory of topics)")
    root = os.path.abspath(str(root))
    if must_exist and not os.path.isdir(root):
        raise _err("path", f"no such directory: {root}")
    return root


def _check_topic_name(name: str, option: str) -> str:
    if not _TOPIC_RE.match(name) or name in (".", ".."):
        raise InvalidNameError(f"pylog option {option}: invalid topic name {name!r} "
                               "(allowed: [A-Za-z0-9._-]{1,249}, not . or ..)")
    return name


def _topics_opt(options: Mapping[str, str]) -> list[str]:
    raw = options.get("topic") if options.get("topic") is not None else options.get("topics")
    if raw is None:
        raw = options.get("subscribe")
    if raw is None or not str(raw).strip():
        raise _err("topic", "required: the topic to read (or topics=a,b,c)")
    names = [t.strip() for t in str(raw).split(",") if t.strip()]
    return sorted(dict.fromkeys(_check_topic_name(t, "topic") for t in names))


def _offsets_spec(options: Mapping[str, str], name: str, default: str, *,
                  allow_latest: bool = True, allow_earliest: bool = True) -> Any:
    """"earliest" | "latest" | {topic: {partition: offset (-2 earliest, -1 latest)}}."""
    raw = options.get(name)
    if raw is None:
        return default
    s = str(raw).strip()
    if s.lower() in ("earliest", "latest"):
        s = s.lower()
        if (s == "latest" and not allow_latest) or (s == "earliest" and not allow_earliest):
            raise _err(name, f"{s!r} is not allowed here")
        return s
    try:
        data = json.loads(s)
    except ValueError:
        raise _err(name, f"expected earliest, latest or JSON like {{\"topic\": {{\"0\": 42}}}}, got {s!r}") from None
    if not isinstance(data, dict):
        raise _err(name, f"expected a JSON object of topics, got {s!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise _err(name, f"topic {topic!r}: expected an object of partition: offset")
        m = out.setdefault(str(topic), {})
        for p, off in parts.items():
            try:
                pi = int(p)
            except ValueError:
                raise _err(name, f"topic {topic!r}: partition {p!r} is not an integer") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < -2:
                raise _err(name, f"topic {topic!r} partition {p}: offset {off!r} is not an integer >= -2")
            if off == _LATEST and not allow_latest:
                raise _err(name, f"topic {topic!r} partition {p}: -1 (latest) is not allowed here")
            if off == _EARLIEST and not allow_earliest:
                raise _err(name, f"topic {topic!r} partition {p}: -2 (earliest) is not allowed here")
            m[pi] = off
    return out


def _options_dict(options: Any) -> dict[str, str]:
    """Case-insensitive options as a plain lower-case dict (picklable, no pyspark type)."""
    return {str(k).lower(): v for k, v in dict(options).items()}

