"""The data source's options: the one table both readers follow, parsing and checking.

:data:`OPTIONS` is the contract of a read (the Python source here and the JVM connector
read the same names, types and defaults; docs/spark.md shows it as a table), and of a
write. :data:`KAFKA_OPTIONS` lists what Spark's Kafka source takes that pylog does not:
each is refused at ``load()`` with one line saying why, or accepted and ignored where it
cannot change which rows are read (network tuning). Any other name is refused too, with
the nearest known name as a hint (``startingOffset`` -> ``startingOffsets``).

Spark passes options case-insensitively; :func:`_options_dict` makes them a plain lower-case
dict (picklable, no pyspark type) that the readers and writers take.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pylog.errors import ConfigError, InvalidNameError

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_EARLIEST, _LATEST = -2, -1

#: where an option applies: a batch read, a streaming read, a batch write, a streaming sink
BATCH, STREAM, WRITE, SINK = "batch", "stream", "write", "sink"
_READS = frozenset({BATCH, STREAM})
_WRITES = frozenset({WRITE, SINK})


@dataclass(frozen=True)
class Option:
    """One option of the ``pylog`` format: its name as documented (matched
    case-insensitively), its value's type, its default (None: none), where it applies
    (:data:`BATCH`, :data:`STREAM`, :data:`WRITE`, :data:`SINK`) and what it does."""

    name: str
    type: str
    default: str | None
    where: frozenset[str]
    doc: str


def _o(name: str, type_: str, default: str | None, where: frozenset[str] | set[str], doc: str) -> Option:
    return Option(name, type_, default, frozenset(where), doc)


#: Every option of the format (reads and writes), in the order docs/spark.md shows them.
OPTIONS: tuple[Option, ...] = (
    _o("path", "string", None, _READS | _WRITES, "the data root (a directory of topics); required"),
    _o("topic", "string", None, _READS | _WRITES, "reads: one topic or a comma-separated list (one of topic, topics, "
       "subscribe, subscribePattern, assign is required); writes: the topic written"),
    _o("topics", "string", None, _READS, "a comma-separated list of topics (as topic)"),
    _o("subscribe", "string", None, _READS, "a comma-separated list of topics (Kafka's name; as topic)"),
    _o("subscribePattern", "regex", None, _READS, "the topics whose whole name matches this regular expression; "
       "a stream picks up matching topics created later"),
    _o("assign", "json", None, _READS, "the partitions to read: {\"topic\": [0, 1]}; a stream does not pick up "
       "partitions added later"),
    _o("startingOffsets", "offsets", "earliest (batch), latest (stream)", _READS,
       "earliest, latest (streams only), or JSON {\"topic\": {\"0\": 42}} (-2 earliest, -1 latest: streams only); "
       "partitions not named start at the default"),
    _o("startingOffsetsByTimestamp", "json", None, _READS, "JSON {\"topic\": {\"0\": ms}}: each partition named "
       "starts at its first record with timestamp >= ms; takes precedence over startingOffsets"),
    _o("startingTimestamp", "long", None, _READS, "ms since the epoch: every partition starts at its first record "
       "with timestamp >= this; takes precedence over startingOffsetsByTimestamp and startingOffsets"),
    _o("startingOffsetsByTimestampStrategy", "enum", "latest", _READS, "a partition with no record at or after its "
       "starting timestamp: latest (start at its end) or error (fail, Kafka's default)"),
    _o("endingOffsets", "offsets", "latest", {BATCH}, "latest or JSON {\"topic\": {\"0\": 42}} (-1 latest; "
       "exclusive)"),
    _o("endingOffsetsByTimestamp", "json", None, {BATCH}, "JSON {\"topic\": {\"0\": ms}}: each partition named "
       "ends before its first record with timestamp >= ms (at its end if none); takes precedence over endingOffsets"),
    _o("endingTimestamp", "long", None, {BATCH}, "ms since the epoch: every partition ends before its first record "
       "with timestamp >= this; takes precedence over endingOffsetsByTimestamp and endingOffsets"),
    _o("failOnDataLoss", "boolean", "true", _READS, "records planned but gone (retention, a truncation) fail the "
       "query; false: skip them"),
    _o("minPartitions", "int", None, _READS, "at least this many Spark partitions (the largest slices split)"),
    _o("maxRecordsPerPartition", "long", None, _READS, "at most this many records per Spark partition"),
    _o("includeHeaders", "boolean", "false", _READS, "add the column headers array<struct<key:string,value:binary>> "
       "(the Kafka headers a record's metadata holds)"),
    _o("maxOffsetsPerTrigger", "long", None, {STREAM}, "at most this many records per micro-batch, shared among "
       "partitions by backlog"),
    _o("minOffsetsPerTrigger", "long", None, {STREAM}, "wait for at least this many records before a micro-batch, "
       "at most maxTriggerDelay"),
    _o("maxTriggerDelay", "duration", "15m", {STREAM}, "the longest a micro-batch waits for minOffsetsPerTrigger "
       "(500ms, 30s, 15m, 1h, 1d; a number is ms)"),
    _o("groupId", "string", None, {STREAM}, "a pylog consumer group: each finished micro-batch's end offsets are "
       "committed into it, so pylog group describe and the broker's lag metric show the query's lag"),
    _o("pushFilters", "boolean", "false", {BATCH}, "apply Spark's pushed filters on topic, partition, offset and "
       "timestamp to the plan (needs spark.sql.python.filterPushdown.enabled=true)"),
    _o("createTopic", "boolean", "true", _WRITES, "create a missing topic (at commit time)"),
    _o("partitions", "int", "1", _WRITES, "the partitions of a topic a write creates"),
    _o("lateTimestamps", "enum", "error", _WRITES, "a timestamp below the partition's latest: error or clamp"),
    _o("checkpointLocation", "string", None, {SINK}, "the query's checkpoint (the sink keeps its id there)"),
    _o("sinkId", "string", None, {SINK}, "without checkpointLocation: the name the sink keeps batch ids under"),
)

#: Spark's Kafka-source options pylog does not take: name -> ("refused" or "ignored", why).
#: Every ``kafka.*`` name is refused as ``kafka.*`` is (a ``kafka.`` prefix names a setting
#: of a Kafka consumer; pylog has none).
KAFKA_OPTIONS: dict[str, tuple[str, str]] = {
    "kafka.*": ("refused", "a Kafka consumer setting; pylog reads the data root named by path, not a cluster"),
    "kafka.bootstrap.servers": ("refused", "pylog reads the data root named by option path, not a cluster"),
    "kafka.group.id": ("refused", "the query commits its progress into a pylog consumer group with option groupId"),
    "kafka.isolation.level": ("refused", "pylog readers see committed records only (read_committed), always"),
    "groupIdPrefix": ("ignored", "no Kafka consumer group is made (see groupId)"),
    "kafkaConsumer.pollTimeoutMs": ("ignored", "network tuning: no Kafka consumer polls"),
    "fetchOffset.numRetries": ("ignored", "network tuning: offsets are read from the files"),
    "fetchOffset.retryIntervalMs": ("ignored", "network tuning: offsets are read from the files"),
}

_BY_NAME = {o.name.lower(): o for o in OPTIONS}
_OPTION_NAMES = {**{n: o.name for n, o in _BY_NAME.items()}, **{k.lower(): k for k in KAFKA_OPTIONS},
                 "mode": "mode", "outputmode": "outputMode", "(columns)": "(columns)"}
#: the one of these a read takes names its topics
_SELECTORS = ("topic", "topics", "subscribe", "subscribepattern", "assign")


def check_read_options(options: Mapping[str, str], mode: str | None = None) -> None:
    """Refuse, with one ConfigError line naming it, an option a read does not take: an
    unknown name, a Kafka-source option pylog refuses, an option of writes, and with
    ``mode`` (:data:`BATCH` or :data:`STREAM`) one that does not apply to that kind of
    read (a streaming ``endingOffsets``, a batch ``maxOffsetsPerTrigger``). Spark's names
    are case-insensitive: ``options`` has lower-case keys (:func:`_options_dict`)."""
    for key in options:
        k = str(key).lower()
        opt = _BY_NAME.get(k)
        if opt is None:
            kafka = KAFKA_OPTIONS.get(_OPTION_NAMES.get(k, "")) or (KAFKA_OPTIONS["kafka.*"] if k.startswith("kafka.")
                                                                    else None)
            if kafka is not None:
                if kafka[0] == "ignored":
                    continue
                raise _err(k, f"Kafka's source option is not taken by pylog: {kafka[1]}")
            near = difflib.get_close_matches(k, list(_BY_NAME), n=1, cutoff=0.75)
            hint = f" (did you mean {_BY_NAME[near[0]].name}?)" if near else ""
            raise ConfigError(f"pylog option {key}: unknown option{hint}")
        if not opt.where & _READS:
            raise _err(k, "applies to writes only, not to a read")
        if mode is not None and mode not in opt.where:
            if mode == STREAM and k.startswith("ending"):
                raise _err(k, "is not valid in a streaming query (a stream has no end; as Kafka's source refuses it)")
            if mode == STREAM:
                raise _err(k, "applies to batch reads only (read), not to a streaming read")
            raise _err(k, "applies to streaming reads only (readStream), not to a batch read")
    given = [n for n in _SELECTORS if options.get(n) is not None]
    if len(given) > 1:
        raise _err(given[1], "give only one of topic, topics, subscribe, subscribePattern, assign "
                   f"(got {', '.join(_OPTION_NAMES[n] for n in given)})")
    if mode == BATCH:
        start = options.get("startingoffsets")
        if start is not None and str(start).strip().lower() == "latest":
            raise _err("startingoffsets", "latest is not allowed for a batch read (as Kafka's source refuses it): "
                       "it would read nothing")


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
    """The topics ``topic``, ``topics`` or ``subscribe`` name (comma-separated), sorted."""
    name = next((n for n in ("topic", "topics", "subscribe") if options.get(n) is not None), "topic")
    raw = options.get(name)
    if raw is None or not str(raw).strip():
        raise _err("topic", "required: the topic to read (or topics=a,b,c; subscribe, subscribePattern, assign)")
    names = [t.strip() for t in str(raw).split(",") if t.strip()]
    return sorted(dict.fromkeys(_check_topic_name(t, _OPTION_NAMES[name]) for t in names))


def _pattern_opt(options: Mapping[str, str]) -> re.Pattern[str] | None:
    """The compiled ``subscribePattern`` (matched against a whole topic name), or None."""
    raw = options.get("subscribepattern")
    if raw is None:
        return None
    try:
        return re.compile(str(raw))
    except re.error as e:
        raise _err("subscribepattern", f"not a regular expression: {raw!r} ({e})") from None


def _json(raw: object) -> Any:
    """An option's value parsed as JSON, None when it is not JSON (the caller's error names
    the option and what it expects)."""
    try:
        return json.loads(str(raw))
    except ValueError:
        return None


def _assign_opt(options: Mapping[str, str]) -> dict[str, list[int]] | None:
    """``assign``'s ``{topic: [partition, ...]}`` (sorted), or None."""
    raw = options.get("assign")
    if raw is None:
        return None
    data = _json(raw)
    if not isinstance(data, dict) or not data:
        raise _err("assign", f"expected JSON like {{\"topic\": [0, 1]}}, got {raw!r}")
    out: dict[str, list[int]] = {}
    for t, parts in data.items():
        _check_topic_name(str(t), "assign")
        if not isinstance(parts, list) or not parts or any(
                isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in parts):
            raise _err("assign", f"topic {t!r}: expected a list of partition numbers, got {parts!r}")
        out[str(t)] = sorted(set(parts))
    return out


def _timestamps_spec(options: Mapping[str, str], name: str) -> dict[str, dict[int, int]] | None:
    """A ``*OffsetsByTimestamp`` option: ``{topic: {partition: ms}}``, or None."""
    raw = options.get(name)
    if raw is None:
        return None
    data = _json(raw)
    if not isinstance(data, dict):
        raise _err(name, f"expected JSON like {{\"topic\": {{\"0\": 1732190000000}}}}, got {raw!r}")
    return _partition_map(name, data, "timestamp", 0, "(ms)")


_DURATION = re.compile(r"^\s*([0-9]+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms_opt(options: Mapping[str, str], name: str, default: int) -> int:
    """A duration option (``500ms``, ``30s``, ``15m``, ``1h``, ``1d``; a bare number is ms)."""
    raw = options.get(name)
    if raw is None:
        return default
    m = _DURATION.match(str(raw))
    if m is None:
        raise _err(name, f"expected a duration such as 500ms, 30s, 15m, 1h, got {raw!r}")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _UNIT_MS[unit]


def _choice_opt(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = options.get(name)
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v not in choices:
        raise _err(name, f"expected {' or '.join(choices)}, got {raw!r}")
    return v


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
    out = _partition_map(name, data, "offset", -2)
    for topic, m in out.items():
        for p, off in m.items():
            if off == _LATEST and not allow_latest:
                raise _err(name, f"topic {topic!r} partition {p}: -1 (latest) is not allowed here")
            if off == _EARLIEST and not allow_earliest:
                raise _err(name, f"topic {topic!r} partition {p}: -2 (earliest) is not allowed here")
    return out


def _partition_map(name: str, data: dict[Any, Any], what: str, lo: int, unit: str = "") -> dict[str, dict[int, int]]:
    """``{topic: {partition: int >= lo}}`` from option ``name``'s parsed JSON object ``data``
    (``what``: the values' name in errors)."""
    out: dict[str, dict[int, int]] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise _err(name, f"topic {topic!r}: expected an object of partition: {what}")
        m = out.setdefault(str(topic), {})
        for p, v in parts.items():
            try:
                pi = int(p)
            except ValueError:
                raise _err(name, f"topic {topic!r}: partition {p!r} is not an integer") from None
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise _err(name, f"topic {topic!r} partition {p}: {what} {v!r} is not an integer >= {lo}"
                           + (f" {unit}" if unit else ""))
            m[pi] = v
    return out


def _options_dict(options: Any) -> dict[str, str]:
    """Case-insensitive options as a plain lower-case dict (picklable, no pyspark type)."""
    return {str(k).lower(): v for k, v in dict(options).items()}

