"""The ``pylog`` command: topics, producing, consuming, checking and inspecting a data root.

The data root is ``--root``, else ``$PYLOG_ROOT``, else ``./pylog-data``. Every error is one
line on stderr (``pylog: error: ...``) and a non-zero exit status: 1 for a failure, 2 for
a bad command line; never a traceback (``PYLOG_DEBUG=1`` shows one). See docs/cli.md.
"""
from __future__ import annotations

import base64
import json
import operator
import os
import re
import sys
import time
from typing import Any, BinaryIO, Iterator

import click

from pylog import __version__
from pylog.errors import InvalidNameError, PylogError, UnknownTopicError

DEFAULT_ROOT = "pylog-data"
CHUNK = 4 << 20
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class CliError(Exception):
    """An error already worded for the user (exit status ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------------------
# helpers
def _store(ctx: click.Context, *, create: bool = False, readonly: bool = False, **options: Any) -> Any:
    """The LogStore of the data root; ``create`` makes the root if it is missing; ``readonly``
    for the verbs that only read (they work on a root the user cannot write, and write
    nothing)."""
    from pylog.topics import LogStore

    root = ctx.obj["root"]
    if not create and not os.path.isdir(root):
        raise CliError(f"data root {root!r} does not exist (create a topic first, or pass --root)")
    if os.path.exists(root) and not os.path.isdir(root):
        raise CliError(f"data root {root!r} is not a directory")
    if os.path.isdir(root) and not os.access(root, os.R_OK | os.X_OK):
        raise CliError(f"data root {root!r} is not readable")
    if not readonly and os.path.isdir(root) and not os.access(root, os.W_OK):
        raise CliError(f"data root {root!r} is not writable (this command writes; the reading commands "
                       f"work without write access, and consume does without --group)")
    store = LogStore(root, readonly=readonly, **options)
    ctx.call_on_close(store.close)
    return store


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null", ""):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text.replace("_", ""))
    except ValueError:
        return text


_SIZE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
               "kb": 1000, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_TIME_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000,
               "w": 7 * 86_400_000}


def _with_unit(text: str, units: dict[str, int], what: str, hint: str) -> int:
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text.replace("_", ""))
    if m is None or m.group(2).lower() not in units and m.group(2):
        raise click.BadParameter(f"{text!r} is not a {what} (e.g. {'64MiB, 1GB, 4096' if what == 'size' else '7d, 12h, 30s, 500ms'})",
                                 param_hint=hint)
    value = float(m.group(1)) * units[m.group(2).lower() or ("b" if what == "size" else "ms")]
    if value != int(value):
        raise click.BadParameter(f"{text!r} is not a whole number of {'bytes' if what == 'size' else 'ms'}",
                                 param_hint=hint)
    return int(value)


def _parse_duration(text: str, hint: str) -> int:
    """Milliseconds of a duration: ``500ms``, ``30s``, ``5m``, ``12h``, ``7d``, ``2w``, or a number of ms."""
    return _with_unit(text, _TIME_UNITS, "duration", hint)


def _parse_configs(items: tuple[str, ...], base: Any = None) -> dict[str, Any]:
    """``-c NAME=VALUE`` options as LogConfig changes, checked (a bad one is a usage error).
    Sizes (``*_bytes``) take units (``64MiB``, ``1GB``), durations (``*_ms``) too (``7d``)."""
    from pylog.config import LogConfig
    from pylog.errors import ConfigError

    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--config")
        key = name.strip().replace("-", "_").replace(".", "_")
        v = _parse_value(value)
        if isinstance(v, str) and key.endswith("_bytes"):
            v = _with_unit(v, _SIZE_UNITS, "size", f"--config {key}")
        elif isinstance(v, str) and key.endswith("_ms"):
            v = _with_unit(v, _TIME_UNITS, "duration", f"--config {key}")
        out[key] = v
    try:
        (base or LogConfig()).replace(**out)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--config") from None
    return out


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _topics_arg(store: Any, topic: str | None) -> list[str]:
    if topic is None:
        return store.topics()
    store.topic(topic)  # raises InvalidNameError / UnknownTopicError
    return [topic]


# ----------------------------------------------------------------------------------------
def _set_root(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.find_root().ensure_object(dict)["root"] = value


class _Group(click.Group):
    """A command group whose commands also take ``--root`` after the verb
    (``pylog topic list --root DIR`` as well as ``pylog --root DIR topic list``)."""

    group_class = type  # subgroups (pylog topic, pylog group) are _Groups too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Add ``cmd``, giving it (unless it is a group) a ``--root`` option."""
        if not isinstance(cmd, click.Group) and not any(p.name == "root_after_verb" for p in cmd.params):
            cmd.params.append(click.Option(["--root", "root_after_verb"], metavar="DIR", expose_value=False,
                                           callback=_set_root, help="Data root (also before the verb)."))
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a closed stdout (``pylog consume | head``) becomes _PipeClosed,
        which click does not turn into exit status 1 as it does a BrokenPipeError."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _PipeClosed() from None


class _PipeClosed(Exception):
    """The reader of stdout went away: not an error (exit 0)."""


@click.group(cls=_Group, context_settings=CONTEXT)
@click.option("--root", envvar="PYLOG_ROOT", default=DEFAULT_ROOT, show_default=True, metavar="DIR",
              help="Data root (also $PYLOG_ROOT).")
@click.version_option(version=__version__, prog_name="pylog")
@click.pass_context
def cli(ctx: click.Context, root: str) -> None:
    """pylog: a segmented, append-only commit log (topics, partitions, consumer groups).

    \b
    Examples:
      pylog topic create orders --partitions 3
      seq 10 | pylog produce orders
      pylog consume orders --from-beginning
    """
    ctx.ensure_object(dict)
    ctx.obj["root"] = root


# -- topics --------------------------------------------------------------------------------
@cli.group(context_settings=CONTEXT)
def topic() -> None:
    """Create, list, describe, alter and delete topics."""


@topic.command("create", context_settings=CONTEXT)
@click.argument("name")
@click.option("-p", "--partitions", type=click.IntRange(1, 1 << 16), default=1, show_default=True,
              help="Number of partitions.")
@click.option("-c", "--config", "configs", multiple=True, metavar="NAME=VALUE",
              help="A LogConfig setting, e.g. retention_ms=86400000 or cleanup_policy=compact (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="Succeed quietly if the topic exists.")
@click.pass_context
def topic_create(ctx: click.Context, name: str, partitions: int, configs: tuple[str, ...],
                 if_not_exists: bool) -> None:
    """Create topic NAME."""
    from pylog.errors import TopicExistsError
    from pylog.topics import check_name

    check_name(name)
    options = _parse_configs(configs)
    store = _store(ctx, create=True)
    try:
        store.create_topic(name, partitions, **options)
    except TopicExistsError:
        if not if_not_exists:
            raise
        return
    click.echo(f"created topic {name} with {partitions} partition{'s' if partitions != 1 else ''}")


@topic.command("list", context_settings=CONTEXT)
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def topic_list(ctx: click.Context, fmt_: str) -> None:
    """List the topics, one per line (json: one array)."""
    root = ctx.obj["root"]
    names: list[str] = []
    if not os.path.isdir(root):
        if os.path.exists(root):
            raise CliError(f"data root {root!r} is not a directory")
    else:
        names = _store(ctx, readonly=True).topics()
    if fmt_ == "json":
        click.echo(json.dumps(names))
        return
    for name in names:
        click.echo(name)


@topic.command("describe", context_settings=CONTEXT)
@click.argument("name", required=False)
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--segments", is_flag=True, help="List every segment too.")
@click.pass_context
def topic_describe(ctx: click.Context, name: str | None, fmt_: str, segments: bool) -> None:
    """Partitions, offsets, segments and sizes of topic NAME (default: every topic)."""
    store = _store(ctx, readonly=True)
    infos = [store.topic(n).describe() for n in _topics_arg(store, name)]
    if fmt_ == "json":
        click.echo(json.dumps(infos if name is None else infos[0], indent=1))
        return
    for info in infos:
        cfg = info["config"]
        changed = {k: v for k, v in cfg.items() if v != _defaults().get(k)}
        click.echo(f"Topic: {info['name']}\tPartitions: {info['partitions']}\t"
                   f"Config: {', '.join(f'{k}={v}' for k, v in sorted(changed.items())) or '(defaults)'}\t"
                   f"Groups: {', '.join(info['groups']) or '(none)'}")
        for p in info["partition_info"]:
            click.echo(f"\tPartition: {p['partition']}\tStartOffset: {p['start_offset']}\t"
                       f"NextOffset: {p['next_offset']}\tRecords: {p['records']}\t"
                       f"Segments: {p['segments']}\tSize: {_human(p['size_bytes'])}")
            if segments:
                for s in p["segment_list"]:
                    click.echo(f"\t\tSegment: {s['base_offset']:020d}\tOffsets: [{s['base_offset']}, "
                               f"{s['next_offset']})\tSize: {s['size_bytes']}\t"
                               f"{'sealed' if s['sealed'] else 'active'}")


def _defaults() -> dict[str, Any]:
    from pylog.config import LogConfig

    return LogConfig().to_dict()


@topic.command("alter", context_settings=CONTEXT)
@click.argument("name")
@click.option("-p", "--partitions", type=click.IntRange(1, 1 << 16), default=None,
              help="New (larger) number of partitions.")
@click.option("-c", "--config", "configs", multiple=True, metavar="NAME=VALUE",
              help="A LogConfig setting to change (repeatable).")
@click.pass_context
def topic_alter(ctx: click.Context, name: str, partitions: int | None, configs: tuple[str, ...]) -> None:
    """Add partitions to topic NAME or change its config."""
    options = _parse_configs(configs)
    if partitions is None and not options:
        raise click.UsageError("nothing to change: give --partitions or --config")
    store = _store(ctx)
    t = store.topic(name)
    if options:
        store.alter_topic(name, **options)
    if partitions is not None:
        if partitions < t.partitions:
            raise CliError(f"topic {name} has {t.partitions} partitions; partitions can only be added")
        if partitions > t.partitions:
            store.add_partitions(name, partitions - t.partitions)
    click.echo(f"altered topic {name}")


@topic.command("delete", context_settings=CONTEXT)
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="Succeed quietly if there is no such topic.")
@click.pass_context
def topic_delete(ctx: click.Context, name: str, if_exists: bool) -> None:
    """Delete topic NAME, its data and its consumer groups' offsets."""
    from pylog.topics import check_name

    check_name(name)
    if if_exists and not os.path.isdir(ctx.obj["root"]):
        return
    store = _store(ctx)
    try:
        store.delete_topic(name)
    except UnknownTopicError:
        if not if_exists:
            raise
        return
    click.echo(f"deleted topic {name}")


# -- consumer groups ---------------------------------------------------------------------------
@cli.group(context_settings=CONTEXT)
def group() -> None:
    """List, describe, reset and delete consumer groups (like kafka-consumer-groups)."""


def _dash(v: Any) -> str:
    return "-" if v is None else str(v)


@group.command("list", context_settings=CONTEXT)
@click.option("-t", "--topic", "topic_name", default=None, help="Only the groups of this topic.")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def group_list(ctx: click.Context, topic_name: str | None, fmt_: str) -> None:
    """List the consumer groups, one per line."""
    root = ctx.obj["root"]
    names = _store(ctx).groups(topic_name) if os.path.isdir(root) or topic_name else []
    if fmt_ == "json":
        click.echo(json.dumps(names))
        return
    for name in names:
        click.echo(name)


@group.command("describe", context_settings=CONTEXT)
@click.argument("group_name", metavar="GROUP")
@click.option("-t", "--topic", "topic_name", default=None, help="Only this topic (default: every topic it consumes).")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def group_describe(ctx: click.Context, group_name: str, topic_name: str | None, fmt_: str) -> None:
    """Per partition: committed offset, log end, lag and the live consumer that owns it."""
    info = _store(ctx).describe_group(group_name, topic_name)
    if fmt_ == "json":
        click.echo(json.dumps(info, indent=1))
        return
    rows = [("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "OWNER")]
    for r in info["partitions"]:
        owner = r["owner"] or "-"
        if r["damaged"]:
            owner += " (committed-offset file damaged: ignored)"
        rows.append((group_name, r["topic"], str(r["partition"]), _dash(r["committed"]), str(r["log_end"]),
                     _dash(r["lag"]), owner))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    members = info["members"]
    click.echo(f"\n{len(members)} live member{'s' if len(members) != 1 else ''}"
               f"{': ' + '; '.join(members) if members else ''}")


@group.command("reset", context_settings=CONTEXT)
@click.argument("group_name", metavar="GROUP")
@click.option("-t", "--topic", "topic_name", required=True, help="The topic whose offsets are reset.")
@click.option("--to-earliest", is_flag=True, help="Each partition's start offset.")
@click.option("--to-latest", is_flag=True, help="Each partition's log end.")
@click.option("--to-offset", type=click.IntRange(0), default=None, metavar="N", help="Offset N (clamped into the log).")
@click.option("--to-datetime", default=None, metavar="ISO",
              help="The first record at or after this time (ISO 8601; UTC unless a zone is given).")
@click.option("--shift-by", type=int, default=None, metavar="N", help="The committed offset plus N (may be negative).")
@click.option("-p", "--partition", "partitions", type=click.IntRange(0), multiple=True,
              help="Only this partition (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Show the new offsets, write nothing.")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def group_reset(ctx: click.Context, group_name: str, topic_name: str, to_earliest: bool, to_latest: bool,
                to_offset: int | None, to_datetime: str | None, shift_by: int | None, partitions: tuple[int, ...],
                dry_run: bool, fmt_: str) -> None:
    """Reset GROUP's committed offsets on a topic (refused while the group has live members)."""
    chosen = [n for n, v in (("--to-earliest", to_earliest), ("--to-latest", to_latest),
                             ("--to-offset", to_offset), ("--to-datetime", to_datetime),
                             ("--shift-by", shift_by)) if v is not None and v is not False]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
                               f"--shift-by (got {', '.join(chosen) or 'none'})")
    if to_datetime is not None:
        from pylog.groups import parse_datetime

        try:
            parse_datetime(to_datetime)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--to-datetime") from None
    plan = _store(ctx).reset_group(group_name, topic_name, to_earliest=to_earliest, to_latest=to_latest,
                                   to_offset=to_offset, to_datetime=to_datetime, shift_by=shift_by,
                                   partitions=partitions or None, dry_run=dry_run)
    if fmt_ == "json":
        click.echo(json.dumps({"dry_run": dry_run, "partitions": plan}, indent=1))
        return
    rows = [("GROUP", "TOPIC", "PARTITION", "OLD-OFFSET", "NEW-OFFSET")]
    rows += [(group_name, r["topic"], str(r["partition"]), _dash(r["old"]), str(r["new"])) for r in plan]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if dry_run:
        click.echo("(dry run: nothing written)")


@group.command("delete", context_settings=CONTEXT)
@click.argument("group_name", metavar="GROUP")
@click.option("-t", "--topic", "topic_name", default=None, help="Only from this topic (default: every topic).")
@click.pass_context
def group_delete(ctx: click.Context, group_name: str, topic_name: str | None) -> None:
    """Delete GROUP's committed offsets (refused while it has live members)."""
    topics = _store(ctx).delete_group(group_name, topic_name)
    click.echo(f"deleted group {group_name} from topic{'s' if len(topics) != 1 else ''} {', '.join(topics)}")


# -- produce -------------------------------------------------------------------------------
def _lines(streams: list[tuple[str, BinaryIO]]) -> Iterator[tuple[str, int, list[bytes]]]:
    """``(source name, number of the first line, lines)``, a few MiB of lines at a time,
    without their newline (``\\n`` or ``\\r\\n``)."""
    for name, f in streams:
        rest = b""
        first = 1
        while True:
            data = f.read(CHUNK)
            if not data:
                break
            if rest:
                data = rest + data
            lines = data.split(b"\n")
            rest = lines.pop()
            if lines:
                if b"\r" in data:
                    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
                yield name, first, lines
                first += len(lines)
        if rest:
            yield name, first, [rest[:-1] if rest.endswith(b"\r") else rest]


class _BadLine(Exception):
    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index = index
        self.why = why


def _json_bytes(obj: dict[str, Any], name: str) -> bytes | None:
    """Field ``name`` of a JSON-lines record (``name``: text, or ``name_base64``), as bytes."""
    if name + "_base64" in obj:
        b64 = obj[name + "_base64"]
        if not isinstance(b64, str):
            raise ValueError(f"{name}_base64 must be a string")
        try:
            return base64.b64decode(b64, validate=True)
        except ValueError:
            raise ValueError(f"{name}_base64 is not valid base64") from None
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return json.dumps(v, separators=(",", ":")).encode()  # a JSON value that is not a string


def _parse_json_line(line: bytes) -> tuple[bytes | None, bytes | None, bytes | None, int | None, int | None]:
    """(key, value, metadata, timestamp, partition) of one JSON-lines record."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not valid JSON ({e.args[0].split(':')[0]})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    ts = obj.get("timestamp")
    part = obj.get("partition")
    for name, v in (("timestamp", ts), ("partition", part)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    return _json_bytes(obj, "key"), _json_bytes(obj, "value"), _json_bytes(obj, "metadata"), ts, part


def _parse_ts(text: str) -> int:
    """A --timestamp: milliseconds since the epoch, or an ISO 8601 date/time."""
    try:
        return int(text)
    except ValueError:
        from pylog.groups import parse_datetime

        try:
            return parse_datetime(text)
        except ValueError as e:
            raise click.BadParameter(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 "
                                     f"date/time", param_hint="--timestamp") from e


@cli.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="TOPIC")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-k", "--key-separator", default=None, metavar="SEP",
              help="Split each line at the first SEP into key and value.")
@click.option("-p", "--partition", type=click.IntRange(0), default=None,
              help="Write every record to this partition (default: by key hash, or spread).")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: one value per line; json: one object per line, as consume --format json prints "
                   "them (key, value, metadata, *_base64, timestamp, partition; \"value\": null is a tombstone).")
@click.option("--null-marker", default=None, metavar="TEXT",
              help="text format: a value equal to TEXT is a tombstone (a record whose value is None).")
@click.option("-H", "--metadata", default=None, metavar="TEXT", help="text format: metadata of every record.")
@click.option("--timestamp", "timestamp_", default=None, metavar="MS|ISO",
              help="text format: timestamp of every record (ms since the epoch, or ISO 8601; default: now).")
@click.option("--lock-timeout", type=click.FloatRange(0, 1e9), default=10.0, show_default=True,
              metavar="SECONDS",
              help="Wait this long for a partition another producer writes (0: fail at once).")
@click.pass_context
def produce(ctx: click.Context, topic_name: str, files: tuple[str, ...], key_separator: str | None,
            partition: int | None, fmt_: str, null_marker: str | None, metadata: str | None,
            timestamp_: str | None, lock_timeout: float) -> None:
    """Append one record per line of FILES (default: stdin) to TOPIC.

    A line's trailing newline (\\n or \\r\\n) is not part of the record. With --key-separator,
    the text before the first separator is the key. Records with a key go to the partition
    Kafka's partitioner would choose; records without one are spread over the partitions.
    A bad line stops the command (exit 1) naming its line number; the records before it are
    kept, those after it are not written.

    The partitions written (--partition, else all of them) are locked before any input is
    read; a partition another producer holds is waited for up to --lock-timeout seconds.
    """
    from pylog.errors import LogLockedError

    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    if key_separator is not None:
        key_separator = key_separator.replace("\\t", "\t")  # -k '\t' as typed in a shell
    if fmt_ == "json":
        for flag, v in (("--key-separator", key_separator), ("--null-marker", null_marker),
                        ("--metadata", metadata), ("--timestamp", timestamp_)):
            if v is not None:
                raise click.UsageError(f"{flag} is for the text format (a JSON line carries its own fields)")
    ts = _parse_ts(timestamp_) if timestamp_ is not None else None
    store = _store(ctx, lock_timeout=lock_timeout)
    t = store.topic(topic_name)
    if partition is not None:
        t._check_partition(partition)
    try:  # every lock before the first byte of input: two producers never interleave by chance
        for p in [partition] if partition is not None else range(t.partitions):
            t.partition(p)
    except LogLockedError as e:
        raise CliError(f"{e}; another producer is writing it (see --lock-timeout)") from None
    limit = t.config.max_record_bytes
    streams: list[tuple[str, BinaryIO]] = []
    try:
        for name in files or ("-",):
            if name == "-":
                streams.append(("stdin", sys.stdin.buffer))
            else:
                try:
                    streams.append((name, open(name, "rb")))
                except OSError as e:
                    raise CliError(f"cannot read {name}: {e.strerror}") from None
        sep = key_separator.encode() if key_separator is not None else None
        null = null_marker.encode() if null_marker is not None else None
        meta = metadata.encode() if metadata is not None else None
        count = 0
        for source, first, lines in _lines(streams):
            try:
                count += _produce_lines(t, lines, fmt_, sep, key_separator, null, meta, ts, partition, limit)
            except _BadLine as e:
                count += e.index
                where = f"line {first + e.index}" + (f" of {source}" if len(streams) > 1 else "")
                raise CliError(f"{where} {e.why} ({count} record{'s' if count != 1 else ''} before it "
                               f"{'were' if count != 1 else 'was'} produced and kept)") from None
        ctx.obj["produced"] = count
    finally:
        for _name, f in streams:
            if f is not sys.stdin.buffer:
                f.close()


def _produce_lines(t: Any, lines: list[bytes], fmt_: str, sep: bytes | None, sep_text: str | None,
                   null: bytes | None, meta: bytes | None, ts: int | None, partition: int | None,
                   limit: int) -> int:
    """Append the records of ``lines``; at a bad line, append the records before it and raise
    _BadLine. Returns how many records were appended."""
    if fmt_ == "text" and ts is None:
        keys: list[Any] | None = None
        values: list[Any] = lines
        if sep is not None:
            keys, values = [], []
            for i, line in enumerate(lines):
                k, found, v = line.partition(sep)
                if not found:
                    if i:
                        t.append_batch(values, keys=keys, partition=partition,
                                       metadata=None if meta is None else [meta] * i)
                    raise _BadLine(i, f"has no key separator {sep_text!r}")
                keys.append(k)
                values.append(v)
        if null is not None:
            values = [None if v == null else v for v in values]
        extra = 0 if meta is None else len(meta)
        big = next((i for i, v in enumerate(values) if v is not None and len(v) + extra
                    + (len(keys[i]) if keys is not None else 0) > limit), None)  # type: ignore[index]
        if big is not None:
            if big:
                t.append_batch(values[:big], keys=None if keys is None else keys[:big], partition=partition,
                               metadata=None if meta is None else [meta] * big)
            size = len(values[big]) + extra + (len(keys[big]) if keys is not None else 0)  # type: ignore[arg-type]
            raise _BadLine(big, f"is a record of {size} bytes, larger than max_record_bytes={limit}")
        if values:
            t.append_batch(values, keys=keys, partition=partition,
                           metadata=None if meta is None else [meta] * len(values))
        return len(values)
    # JSON lines, or explicit timestamps: one record at a time, so a record refused by the
    # log (a timestamp below the partition's latest one, ...) stops exactly there
    for i, line in enumerate(lines):
        if fmt_ == "json":
            if not line.strip():
                raise _BadLine(i, "is empty (expected a JSON object)")
            try:
                key, value, m, when, part = _parse_json_line(line)
            except ValueError as e:
                raise _BadLine(i, f"is not a record: {e}") from None
            if partition is not None:
                part = partition
        else:
            key, value, m, when, part = None, line, meta, ts, partition
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    raise _BadLine(i, f"has no key separator {sep_text!r}")
            if null is not None and value == null:
                value = None
        try:
            t.append(value, key=key, partition=part, metadata=m, timestamp=when)
        except PylogError as e:
            raise _BadLine(i, f"was refused: {e}") from None
    return len(lines)


# -- consume -------------------------------------------------------------------------------
_VALUE = operator.itemgetter(3)


def _json_field(out: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        out[name] = None
        return
    b = bytes(value)
    try:
        out[name] = b.decode("utf-8")
    except UnicodeDecodeError:
        out[name] = None
        out[name + "_base64"] = base64.b64encode(b).decode("ascii")


@cli.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="TOPIC")
@click.option("--from-beginning", is_flag=True,
              help="Start at the earliest offset (with --group: when the group has committed nothing).")
@click.option("--offset", default=None, metavar="N|earliest|latest",
              help="Start at this offset of --partition.")
@click.option("-p", "--partition", type=click.IntRange(0), default=None, help="Read only this partition.")
@click.option("-g", "--group", default=None, help="Consumer group: start at its committed offsets and commit.")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new records (Ctrl-C to stop).")
@click.option("-n", "--max-records", type=click.IntRange(1), default=None, help="Stop after this many records.")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: each value as it is, one per line; json: one object per record.")
@click.option("--print-key", is_flag=True, help="text format: print KEY<separator>VALUE.")
@click.option("--key-separator", default="\t", show_default=repr("\t"), metavar="SEP",
              help="Separator for --print-key.")
@click.option("-F", "--template", default=None, metavar="FMT",
              help="Print each record by this template, as kcat -f: %t topic, %p partition, %o offset, "
                   "%T timestamp, %k key, %s value, %h metadata, %K key size, %S value size, %% a %; "
                   "\\n \\t escapes. Example: '%p:%o %k=%s\\n'.")
@click.option("--idle-timeout", default=None, metavar="DURATION",
              help="Wait for new records (as --follow), and stop after this long without one (e.g. 5s, 500ms).")
@click.pass_context
def consume(ctx: click.Context, topic_name: str, from_beginning: bool, offset: str | None,
            partition: int | None, group: str | None, follow: bool, max_records: int | None, fmt_: str,
            print_key: bool, key_separator: str, template: str | None, idle_timeout: str | None) -> None:
    """Print the records of TOPIC.

    Without --group and --from-beginning, only records appended from now on are printed
    (as Kafka's console consumer does). Without --follow, stops at the end of the log.
    Ctrl-C ends --follow quietly (exit 0).
    """
    _check_consume_options(ctx, offset, from_beginning, fmt_, print_key, template)
    idle = _parse_duration(idle_timeout, "--idle-timeout") if idle_timeout is not None else None
    render = _compile_template(template, topic_name) if template is not None else None
    try:
        _consume(ctx, topic_name, from_beginning, offset, partition, group, follow or idle is not None,
                 max_records, fmt_, print_key, key_separator, render, idle)
    except KeyboardInterrupt:
        if not (follow or idle is not None):
            raise
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            pass


def _check_consume_options(ctx: click.Context, offset: str | None, from_beginning: bool, fmt_: str,
                           print_key: bool, template: str | None) -> None:
    """Refuse options that contradict each other."""
    from click.core import ParameterSource

    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning contradict each other (--offset earliest is "
                               "the beginning of one partition)")
    if template is not None and ctx.get_parameter_source("fmt_") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--template and --format contradict each other (the template is the format)")
    if print_key and (fmt_ == "json" or template is not None):
        raise click.UsageError("--print-key is for the text format (json shows the key; a template uses %k)")


def _compile_template(template: str, topic_name: str) -> Any:
    """A function record, partition -> bytes for a kcat-like ``-f`` template."""
    fields = {"t": None, "p": None, "o": None, "T": None, "k": None, "s": None, "h": None, "K": None, "S": None}
    parts: list[Any] = []
    lit = []
    i = 0
    text = template
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "ntr\\":
            lit.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[text[i + 1]])
            i += 2
            continue
        if c == "%":
            if i + 1 >= len(text):
                raise click.BadParameter("ends with a lone %", param_hint="--template")
            f = text[i + 1]
            if f == "%":
                lit.append("%")
            elif f in fields:
                if lit:
                    parts.append("".join(lit).encode())
                    lit = []
                parts.append(f)
            else:
                raise click.BadParameter(f"unknown field %{f} (known: %t %p %o %T %k %s %h %K %S %%)",
                                         param_hint="--template")
            i += 2
            continue
        lit.append(c)
        i += 1
    if lit:
        parts.append("".join(lit).encode())
    topic_b = topic_name.encode()

    def render(r: Any, p: int) -> bytes:
        out = []
        for part in parts:
            if type(part) is bytes:
                out.append(part)
            elif part == "s":
                out.append(b"null" if r[3] is None else r[3])
            elif part == "k":
                out.append(b"null" if r[2] is None else r[2])
            elif part == "h":
                out.append(b"null" if r[4] is None else r[4])
            elif part == "o":
                out.append(b"%d" % r[0])
            elif part == "p":
                out.append(b"%d" % p)
            elif part == "T":
                out.append(b"%d" % r[1])
            elif part == "t":
                out.append(topic_b)
            elif part == "K":
                out.append(b"-1" if r[2] is None else b"%d" % len(r[2]))
            else:  # S
                out.append(b"-1" if r[3] is None else b"%d" % len(r[3]))
        return b"".join(out)

    return render


def _consume(ctx: click.Context, topic_name: str, from_beginning: bool, offset: str | None,
             partition: int | None, group: str | None, follow: bool, max_records: int | None, fmt_: str,
             print_key: bool, key_separator: str, render: Any, idle: int | None) -> None:
    start: int | str | None = None
    if offset is not None:
        if partition is None:
            raise click.UsageError("--offset needs --partition")
        if offset in ("earliest", "latest"):
            start = offset
        else:
            try:
                start = int(offset)
            except ValueError:
                raise click.BadParameter(f"{offset!r} is not an offset, 'earliest' or 'latest'",
                                         param_hint="--offset") from None
            if start < 0:
                raise click.BadParameter(f"{offset!r} is negative", param_hint="--offset")
    if group is not None:
        from pylog.topics import check_name

        check_name(group, "group")
    store = _store(ctx, readonly=group is None)
    t = store.topic(topic_name)
    if partition is not None:
        t._check_partition(partition)
    reset = "earliest" if (from_beginning or start is not None) else "latest"
    consumer = store.consumer(topic_name, group=group, auto_offset_reset=reset,
                              partitions=None if partition is None else [partition])
    if start is not None:
        assert partition is not None
        if start == "earliest":
            consumer.seek_to_beginning()
        elif start == "latest":
            consumer.seek_to_end()
        else:
            log = t.reader(partition)
            if log.readonly:
                log.refresh()
            if not log.start_offset <= start <= log.next_offset:  # type: ignore[operator]
                raise CliError(f"offset {start} is out of range: partition {partition} of {topic_name} "
                               f"holds [{log.start_offset}, {log.next_offset})")
            consumer.seek(partition, start)  # type: ignore[arg-type]
    elif group is None and from_beginning:
        consumer.seek_to_beginning()
    elif group is None:
        consumer.seek_to_end()
    out = _Output()
    # What the group commits: per partition, the offset after the last record the reader of
    # stdout has taken (a new group's resolved start position until then)
    done: dict[int, int] = {p: consumer.position(p) for p in consumer.assignment()} if group else {}
    try:
        _consume_loop(consumer, out, done, topic_name, follow, max_records, fmt_, print_key,
                      key_separator.replace("\\t", "\t").encode(), group is not None, render, idle)
    except BrokenPipeError:
        pass  # the reader went away (pylog consume | head): not an error; commit what it took
    finally:
        if group is not None and not consumer.closed:
            out.drain()
            out.settle(done)
            mine = set(consumer.assignment())
            for p in mine - set(done):  # taken over, nothing read from it: its resolved start
                done[p] = consumer.position(p)
            consumer.commit({p: off for p, off in done.items() if p in mine})
    if out.broken:
        raise BrokenPipeError


class _Output:
    """stdout for ``pylog consume``: written with ``os.write`` (every byte handed to the OS is
    counted) and, for a pipe, asked (FIONREAD) how much its reader has not taken yet, so a
    group commits only records its reader really took. Marks remember, per record written,
    where its bytes end."""

    def __init__(self) -> None:
        import collections
        import stat

        self.written = 0
        self.broken = False
        self.marks: Any = collections.deque()  # (partition, offsets, ends): one per chunk
        try:
            sys.stdout.flush()
            self.fd = sys.stdout.fileno()
            self.fifo = stat.S_ISFIFO(os.fstat(self.fd).st_mode)
        except (AttributeError, OSError, ValueError):
            self.fd, self.fifo = -1, False

    def write(self, data: bytes, p: int, offsets: list[int], lengths: list[int]) -> None:
        """Write ``data``, the records ``offsets`` of partition ``p`` whose output takes
        ``lengths`` bytes each. BrokenPipeError when the reader went away."""
        import numpy as np

        ends = np.cumsum(np.asarray(lengths, dtype=np.int64)) + self.written
        self.marks.append((p, offsets, ends))
        mv = memoryview(data)
        try:
            if self.fd < 0:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
                self.written += len(data)
                return
            while mv:
                n = os.write(self.fd, mv)
                self.written += n
                mv = mv[n:]
        except BrokenPipeError:
            self.broken = True
            raise

    def unread(self) -> int:
        """Bytes written to a pipe that its reader has not taken (0 for anything else)."""
        if not self.fifo:
            return 0
        import array
        import fcntl
        import termios

        buf = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        except OSError:
            return 0
        return buf[0]

    def drain(self, timeout: float = 2.0) -> None:
        """Give a pipe's reader up to ``timeout`` seconds to take what is still in the pipe
        (at exit: records it takes in time are committed, the rest are delivered again to
        the group's next consumer)."""
        if not self.fifo or self.broken:
            return
        import select

        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        deadline = time.monotonic() + timeout
        while self.unread() and time.monotonic() < deadline:
            if any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0)):
                return  # the reader is gone: what it did not take stays uncommitted
            time.sleep(0.005)

    def settle(self, done: dict[int, int]) -> None:
        """Move ``done`` past every record whose bytes the reader has taken."""
        import numpy as np

        taken = self.written - self.unread()
        while self.marks:
            p, offsets, ends = self.marks[0]
            k = int(np.searchsorted(ends, taken, side="right"))
            if k:
                done[p] = offsets[k - 1] + 1
            if k < len(offsets):
                break
            self.marks.popleft()


def _consume_loop(consumer: Any, out: _Output, done: dict[int, int], topic_name: str, follow: bool,
                  max_records: int | None, fmt_: str, print_key: bool, ksep: bytes, grouped: bool,
                  render: Any, idle: int | None) -> None:
    left = max_records if max_records is not None else 1 << 62
    text = fmt_ == "text"
    idle_until = None if idle is None else time.monotonic() + idle / 1000
    while left > 0:
        wait = 1000 if idle_until is None else max(0, min(1000, int((idle_until - time.monotonic()) * 1000)))
        batch = consumer.poll_partitions(min(left, 20000), timeout_ms=wait if follow else 0)
        if batch and idle is not None:
            idle_until = time.monotonic() + idle / 1000
        for p, recs in batch.items():
            if len(recs) > left:
                recs = recs[:left]
            done.setdefault(p, recs[0][0])
            offsets = [r[0] for r in recs]
            if render is not None:
                rendered = [render(r, p) for r in recs]
                lengths = [len(x) for x in rendered]
                data = b"".join(rendered)
            elif text and not print_key:
                vals = list(map(_VALUE, recs))
                if None in vals:
                    vals = [b"null" if v is None else v for v in vals]
                lengths = [len(v) + 1 for v in vals]
                vals.append(b"")
                data = b"\n".join(vals)
            elif text:
                parts = []
                lengths = []
                for r in recs:
                    k = b"null" if r[2] is None else r[2]
                    v = b"null" if r[3] is None else r[3]
                    parts += (k, ksep, v, b"\n")
                    lengths.append(len(k) + len(ksep) + len(v) + 1)
                data = b"".join(parts)
            else:
                lines = []
                for r in recs:
                    obj: dict[str, Any] = {"topic": topic_name, "partition": p, "offset": r[0], "timestamp": r[1]}
                    _json_field(obj, "key", r[2])
                    _json_field(obj, "value", r[3])
                    _json_field(obj, "metadata", r[4])
                    lines.append(json.dumps(obj).encode() + b"\n")
                lengths = [len(x) for x in lines]
                data = b"".join(lines)
            out.write(data, p, offsets, lengths)
            left -= len(recs)
            if len(recs) < len(batch[p]):
                consumer.seek(p, recs[-1][0] + 1)
            if left <= 0:
                break
        if grouped:
            out.settle(done)
            mine = set(consumer.assignment())
            consumer.commit({p: off for p, off in done.items() if p in mine})
        if not batch:
            if idle_until is not None and time.monotonic() >= idle_until:
                break
            if not follow:
                break


# -- checking ------------------------------------------------------------------------------
def _progress(total: int, label: str) -> Any:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    prog = Progress(TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    transient=True, console=_err_console(), disable=not sys.stderr.isatty())
    return prog


def _err_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@cli.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="[TOPIC]", required=False)
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def verify(ctx: click.Context, topic_name: str | None, fmt_: str) -> None:
    """CRC-check every record of TOPIC (default: every topic). Exit status 1, and one
    line per bad record, when anything is corrupt. Changes nothing (it opens the root
    read-only: a root the user cannot write can be checked)."""
    store = _store(ctx, readonly=True)
    logs = []
    for name in _topics_arg(store, topic_name):
        t = store.topic(name)
        for p in range(t.partitions):
            log = t.reader(p)
            if log.readonly:
                log.refresh()
            logs.append((name, p, log))
    total = sum(log.size_bytes for _n, _p, log in logs)
    bad = []
    records = 0
    with _progress(total, "verifying") as prog:
        task = prog.add_task("verify", total=total)
        for name, p, log in logs:
            for err in log.verify(progress=lambda n: prog.advance(task, n)):
                bad.append((name, p, err))
            records += log.next_offset - log.start_offset
    if fmt_ == "json":
        click.echo(json.dumps({"ok": not bad, "partitions": len(logs), "bytes": total, "records": records,
                               "corrupt": [{"topic": n, "partition": p, "offset": e.offset, "position": e.position,
                                            "path": e.path, "reason": e.reason} for n, p, e in bad]}))
    else:
        for name, p, err in bad:
            click.echo(f"{name}/partition-{p}: {err}")
    if bad:
        raise CliError(f"{len(bad)} corrupt record{'s' if len(bad) != 1 else ''} found", code=1)
    if fmt_ == "text":
        click.echo(f"ok: {len(logs)} partition{'s' if len(logs) != 1 else ''}, {_human(total)} checked")


@cli.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="[TOPIC]", required=False)
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--truncate-at-damage", is_flag=True,
              help="Cut each partition at its first damaged record, after saving everything "
                   "cut to a cut-at-<offset> directory in the partition directory.")
@click.option("--clear-report", is_flag=True,
              help="Forget what recovery cut or found at earlier opens (the recovery report).")
@click.pass_context
def recover(ctx: click.Context, topic_name: str | None, fmt_: str, truncate_at_damage: bool,
            clear_report: bool) -> None:
    """Open every partition of TOPIC (default: every topic) for writing, which recovers
    it after a crash (torn tails cut, interior damage kept and reported, indexes rebuilt),
    then CRC-check it and report what was done and what is damaged (exit status 1)."""
    store = _store(ctx)
    problems = 0
    for name in _topics_arg(store, topic_name):
        t = store.topic(name)
        for p in range(t.partitions):
            log = t.partition(p)
            what = []
            cut = None
            if log.truncated_bytes:
                what.append(f"cut {log.truncated_bytes} torn bytes")
            if truncate_at_damage:
                cut = log.truncate_at_damage()
                if cut is not None:
                    what.append(f"truncated at damaged offset {cut[0]}, what was cut saved to {cut[1]}")
            if clear_report:
                n = log.clear_recovery_report()
                if n:
                    what.append(f"cleared {n} recovery report entr{'y' if n == 1 else 'ies'}")
            bad = log.verify()
            for err in bad:
                what.append(f"corrupt: {err}")
                problems += 1
            if fmt_ == "json":
                click.echo(json.dumps({"topic": name, "partition": p, "start_offset": log.start_offset,
                                       "next_offset": log.next_offset, "truncated_bytes": log.truncated_bytes,
                                       "truncated_at_damage": cut[0] if truncate_at_damage and cut else None,
                                       "saved_to": cut[1] if truncate_at_damage and cut else None,
                                       "corrupt": [str(e) for e in bad]}))
                continue
            click.echo(f"{name}/partition-{p}: [{log.start_offset}, {log.next_offset}) "
                       f"{'; '.join(what) if what else 'ok'}")
    if problems:
        raise CliError(f"{problems} corrupt record{'s' if problems != 1 else ''} or recovery report "
                       f"entr{'ies' if problems != 1 else 'y'} (kept; 'pylog recover --truncate-at-damage' "
                       f"cuts at the damage, '--clear-report' forgets what was reported)")


@cli.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="[TOPIC]", required=False)
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def retention(ctx: click.Context, topic_name: str | None, fmt_: str) -> None:
    """Apply retention_ms / retention_bytes to TOPIC (default: every topic whose
    cleanup_policy is delete): delete whole old segments."""
    store = _store(ctx)
    names = _topics_arg(store, topic_name)
    total = 0
    rows = []
    for name in names:
        for (_n, p), k in store.enforce_retention(name).items():
            total += k
            rows.append({"topic": name, "partition": p, "segments_deleted": k})
            if k and fmt_ == "text":
                click.echo(f"{name}/partition-{p}: deleted {k} segment{'s' if k != 1 else ''}")
    if fmt_ == "json":
        click.echo(json.dumps({"segments_deleted": total, "partitions": rows}))
        return
    click.echo(f"retention: {total} segment{'s' if total != 1 else ''} deleted")


@cli.command(context_settings=CONTEXT)
@click.argument("topic_name", metavar="[TOPIC]", required=False)
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def compact(ctx: click.Context, topic_name: str | None, fmt_: str) -> None:
    """Compact TOPIC (default: every topic whose cleanup_policy is compact): keep the
    latest record of each key in sealed segments."""
    store = _store(ctx)
    if topic_name is not None and store.topic(topic_name).config.cleanup_policy != "compact":
        raise CliError(f"topic {topic_name} has cleanup_policy=delete; "
                       f"set it with: pylog topic alter {topic_name} -c cleanup_policy=compact")
    removed = 0
    rows = []
    for name in _topics_arg(store, topic_name):
        for (_n, p), rep in store.compact(name).items():
            removed += rep.records_removed
            rows.append({"topic": name, "partition": p, "segments_cleaned": rep.segments_cleaned,
                         "records_removed": rep.records_removed, "bytes_before": rep.bytes_before,
                         "bytes_after": rep.bytes_after})
            if rep and fmt_ == "text":
                click.echo(f"{name}/partition-{p}: {rep.segments_cleaned} segments cleaned, "
                           f"{rep.records_removed} records removed, "
                           f"{_human(rep.bytes_before)} -> {_human(rep.bytes_after)}")
    if fmt_ == "json":
        click.echo(json.dumps({"records_removed": removed, "partitions": rows}))
        return
    click.echo(f"compaction: {removed} record{'s' if removed != 1 else ''} removed")


# -- dump ----------------------------------------------------------------------------------
def _is_sealed(path: str, base: int) -> bool:
    """Whether the store file ``path`` has a later segment beside it (so it is sealed)."""
    from pylog import format as fmt

    d = os.path.dirname(os.path.abspath(path))
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return any((b := fmt.parse_segment_name(n, fmt.STORE_SUFFIX)) is not None and b > base for n in names)


def _show_bytes(b: Any, limit: int) -> str:
    if b is None:
        return "null"
    raw = bytes(b[:limit])
    s = raw.decode("utf-8", "backslashreplace")
    return json.dumps(s, ensure_ascii=False) + ("..." if len(b) > limit else "")


@cli.command(context_settings=CONTEXT)
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--print-data", "-d", is_flag=True, help="Print keys, values and metadata too.")
@click.option("--max-bytes", type=click.IntRange(0), default=100, show_default=True,
              help="With --print-data: show at most this many bytes of each field.")
@click.option("--max-records", type=click.IntRange(1), default=None, help="Stop after this many records.")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object per line (the file, then each record or index entry).")
def dump(path: str, print_data: bool, max_bytes: int, max_records: int | None, fmt_: str) -> None:
    """Decode a segment file (.log), an offset index (.index), a time index (.timeindex) or
    a committed-offset file (.offset), like kafka-dump-log. Exit 1 at a bad frame."""
    import mmap
    import struct

    from pylog import format as fmt
    from pylog._backend import impl

    try:
        f = open(path, "rb")
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if path.endswith(".offset"):
            from pylog.consumer import decode_offset

            off = decode_offset(f.read(1024))
            if off is None:
                raise CliError(f"{path}: not a valid committed-offset file")
            if fmt_ == "json":
                click.echo(json.dumps({"file": path, "kind": "offset", "committed_offset": off}))
            else:
                click.echo(f"Dumping {path}\ncommitted offset: {off}")
            return
        kinds = {fmt.STORE_SUFFIX: fmt.STORE_MAGIC, fmt.INDEX_SUFFIX: fmt.INDEX_MAGIC,
                 fmt.TIMEINDEX_SUFFIX: fmt.TIMEINDEX_MAGIC}
        suffix = next((s for s in kinds if path.endswith(s)), None)
        if suffix is None:
            raise CliError(f"{path}: unknown file kind (expected .log, .index, .timeindex or .offset)")
        head = f.read(fmt.FILE_HEADER_SIZE)
        rc, base, flags = impl.header_check(head, kinds[suffix])
        if rc != impl.OK:
            raise CliError(f"{path}: bad file header (not a pylog {suffix} file, or damaged)")
        version = struct.unpack_from("<H", head, 8)[0]
        out = sys.stdout.buffer
        js = fmt_ == "json"
        if js:
            out.write((json.dumps({"file": path, "kind": suffix.lstrip("."), "base_offset": base, "version": version,
                                   "flags": flags, "compacted": bool(flags & fmt.HEADER_COMPACTED),
                                   "size": size}) + "\n").encode())
        else:
            out.write(f"Dumping {path}\nbase offset: {base} version: {version} flags: {flags}"
                      f"{' (compacted)' if flags & fmt.HEADER_COMPACTED else ''} size: {size}\n".encode())
        if suffix != fmt.STORE_SUFFIX:
            esize = fmt.INDEX_ENTRY_SIZE if suffix == fmt.INDEX_SUFFIX else fmt.TIMEINDEX_ENTRY_SIZE
            body = f.read()
            if len(body) % esize:
                raise CliError(f"{path}: {len(body)} bytes of entries is not a multiple of {esize}")
            lines = []
            for i in range(len(body) // esize):
                if suffix == fmt.INDEX_SUFFIX:
                    rel, pos = struct.unpack_from("<II", body, i * esize)
                    lines.append(json.dumps({"offset": base + rel, "position": pos}) if js
                                 else f"offset: {base + rel} position: {pos}")
                else:
                    ts, rel, pos = struct.unpack_from("<qII", body, i * esize)
                    lines.append(json.dumps({"timestamp": ts, "offset": base + rel, "position": pos}) if js
                                 else f"timestamp: {ts} offset: {base + rel} position: {pos}")
                if max_records is not None and len(lines) >= max_records:
                    break
            if lines:
                out.write(("\n".join(lines) + "\n").encode())
            return
        if size <= fmt.FILE_HEADER_SIZE:
            return
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        buf = impl.Buffer(mm)
        mv = memoryview(mm)
        pos = fmt.FILE_HEADER_SIZE
        shown = 0
        gaps = bool(flags & fmt.HEADER_COMPACTED)
        expected = base
        try:
            while pos < size:
                rc, frames, end = impl.scan(buf, size, pos, expected, 4096, (1 << 64) - 1, gaps)
                lines = []
                for fr in frames.tolist():
                    fpos, off, ts, fsize, attrs, klen, mlen, vlen, crc = fr
                    if js:
                        obj: dict[str, Any] = {
                            "offset": off, "position": fpos, "timestamp": ts, "size": fsize, "crc": crc,
                            "keysize": -1 if attrs & 1 else klen, "metadatasize": -1 if attrs & 2 else mlen,
                            "valuesize": -1 if attrs & 4 else vlen}
                        if print_data:
                            p = fpos + fmt.FRAME_HEADER_SIZE
                            for name, absent, lo, n in (("key", attrs & 1, p, klen), ("metadata", attrs & 2, p + klen, mlen),
                                                        ("value", attrs & 4, p + klen + mlen, vlen)):
                                _json_field(obj, name, None if absent else mv[lo : lo + min(n, max_bytes)])
                        lines.append(json.dumps(obj))
                        shown += 1
                        if max_records is not None and shown >= max_records:
                            break
                        continue
                    line = (f"offset: {off} position: {fpos} timestamp: {ts} size: {fsize} crc: {crc} "
                            f"isvalid: true keysize: {-1 if attrs & 1 else klen} "
                            f"metadatasize: {-1 if attrs & 2 else mlen} valuesize: {-1 if attrs & 4 else vlen}")
                    if print_data:
                        p = fpos + fmt.FRAME_HEADER_SIZE
                        key = None if attrs & 1 else mv[p : p + klen]
                        meta = None if attrs & 2 else mv[p + klen : p + klen + mlen]
                        val = None if attrs & 4 else mv[p + klen + mlen : p + klen + mlen + vlen]
                        line += (f" key: {_show_bytes(key, max_bytes)} metadata: {_show_bytes(meta, max_bytes)}"
                                 f" payload: {_show_bytes(val, max_bytes)}")
                        del key, meta, val
                    lines.append(line)
                    shown += 1
                    if max_records is not None and shown >= max_records:
                        break
                if lines:
                    out.write(("\n".join(lines) + "\n").encode())
                if max_records is not None and shown >= max_records:
                    return
                if len(frames):
                    expected = int(frames[-1]["offset"]) + 1
                    pos = int(end)
                if rc != impl.OK:
                    from pylog.fileutil import data_end
                    from pylog.segment import reason

                    if not _is_sealed(path, base) and data_end(f.fileno(), int(end), size) == int(end):
                        # nothing but zeros after the last frame of the active segment: space
                        # preallocated (preallocate=True) or a tail a crash left unwritten,
                        # which recovery cuts. (In a sealed segment they would be lost records.)
                        after = "the last record" if shown else "the file header"
                        out.write((json.dumps({"zeros": size - int(end), "after": after}) + "\n").encode() if js
                                  else f"zeros: {size - int(end)} bytes after {after} "
                                       f"(preallocated, or never written)\n".encode())
                        return
                    out.flush()
                    raise CliError(f"{path}: bad frame at position {int(end)} (expected offset {expected}): "
                                   f"{reason(rc)}")
                if not len(frames):
                    break
        finally:
            del mv
            del buf
            try:
                mm.close()
            except BufferError:
                pass


# -- bench ---------------------------------------------------------------------------------
@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "help_option_names": []})
@click.option("-h", "--help", "help_", is_flag=True, help="Show this message (with --compare: the comparison's).")
@click.option("-n", "--records", type=click.IntRange(1), default=200_000, show_default=True)
@click.option("-s", "--size", "value_size", type=click.IntRange(0), default=100, show_default=True,
              help="Value size in bytes.")
@click.option("-p", "--partitions", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option("--keys", type=click.IntRange(0), default=0, show_default=True,
              help="Number of distinct keys (0: records without keys).")
@click.option("--compare", is_flag=True,
              help="Run the comparison with other stores (pylog.bench; its peers come with the bench "
                   "extra, and a peer not installed is skipped). Arguments after it go to the comparison "
                   "(--quick, --peers, --json FILE, ...; see pylog bench --compare --help).")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object (with --compare: use its --json FILE).")
@click.argument("compare_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def bench(ctx: click.Context, help_: bool, records: int, value_size: int, partitions: int, keys: int,
          fmt_: str, compare: bool, compare_args: tuple[str, ...]) -> None:
    """A quick produce/consume benchmark in a temporary directory (records/s, MB/s)."""
    if compare:
        from click.core import ParameterSource

        from pylog.bench.compare import main as compare_main

        given = {n for n in ("records", "value_size", "partitions", "keys")
                 if ctx.get_parameter_source(n) is ParameterSource.COMMANDLINE}
        if given & {"partitions", "keys"}:
            raise click.UsageError("--partitions and --keys are not options of --compare")
        args = list(compare_args) + (["--help"] if help_ else [])
        if "records" in given:
            args += ["--records", str(records)]
        if "value_size" in given:
            args += ["--value-size", str(value_size)]
        sys.exit(compare_main(args, prog="pylog bench --compare"))
    if help_:
        click.echo(ctx.get_help())
        return
    if compare_args:
        raise click.UsageError(f"unexpected arguments: {' '.join(compare_args)}")
    import tempfile

    from pylog.topics import LogStore

    value = os.urandom(value_size)
    batch = 10_000
    with tempfile.TemporaryDirectory(prefix="pylog-bench-") as root:
        with LogStore(root) as store:
            t = store.create_topic("bench", partitions, segment_bytes=64 << 20)
            key_list = [b"key-%d" % (i % keys) for i in range(batch)] if keys else None
            t0 = time.perf_counter()
            done = 0
            while done < records:
                n = min(batch, records - done)
                t.append_batch([value] * n, keys=None if key_list is None else key_list[:n])
                done += n
            store.flush()
            t1 = time.perf_counter()
            c = store.consumer("bench", group=None, auto_offset_reset="earliest")
            got = 0
            while got < records:
                r = c.poll(10_000)
                if not r:
                    break
                got += len(r)
            t2 = time.perf_counter()
        mb = records * value_size / 1e6
        if fmt_ == "json":
            click.echo(json.dumps({"records": records, "value_size": value_size, "partitions": partitions,
                                   "produce_s": t1 - t0, "produce_records_s": records / (t1 - t0),
                                   "consume_s": t2 - t1, "consumed": got, "consume_records_s": got / (t2 - t1)}))
            return
        click.echo(f"produce: {records} records of {value_size} B in {t1 - t0:.3f} s: "
                   f"{records / (t1 - t0):,.0f} records/s, {mb / (t1 - t0):,.1f} MB/s")
        click.echo(f"consume: {got} records in {t2 - t1:.3f} s: "
                   f"{got / (t2 - t1):,.0f} records/s, {mb / (t2 - t1):,.1f} MB/s")


# ----------------------------------------------------------------------------------------
def _fail(message: str, code: int) -> int:
    message = " ".join(str(message).split()) or "unknown error"
    try:
        sys.stdout.flush()
    except Exception:
        pass
    sys.stderr.write(f"pylog: error: {message}\n")
    sys.stderr.flush()
    return code


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror}{where}"
    if isinstance(e, KeyError) and not isinstance(e, PylogError):
        return f"missing {e}"
    return str(e) or type(e).__name__


@cli.command(context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9092, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="The address clients are told to connect to (default: where it listens).")
@click.option("--tls-cert", default=None, metavar="PEM", help="TLS certificate chain (PEM); with --tls-key.")
@click.option("--tls-key", default=None, metavar="PEM", help="The TLS certificate's private key (PEM).")
@click.option("--users", default=None, metavar="FILE",
              help="SASL users file (PLAIN over TLS, SCRAM-SHA-256): every client must log in.")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, advertise: str | None, tls_cert: str | None,
          tls_key: str | None, users: str | None) -> None:
    """Serve the root over Kafka's wire protocol until SIGTERM (docs/serve.md)."""
    from pylog.serve import serve as run

    if advertise is not None and not re.fullmatch(r"[^\s:]*:\d{1,5}", advertise):
        raise click.BadParameter(f"{advertise!r} is not HOST:PORT", param_hint="--advertise")
    run(ctx.obj["root"], host, port, advertise=advertise, tls_cert=tls_cert, tls_key=tls_key, users=users, ready=lambda s: click.echo(f"pylog serve: listening on {s.host}:{s.port}"))


_NO_ARGS: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


def _one_line_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                      line: str | None = None) -> None:
    """Warnings (a damaged committed-offset file, ...) as one line: ``pylog: warning: ...``."""
    sys.stderr.write(f"pylog: warning: {' '.join(str(message).split())}\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pylog`` console script; returns (and exits with) the status."""
    import warnings

    warnings.showwarning = _one_line_warning
    try:
        rv = cli.main(args=argv, prog_name="pylog", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except _NO_ARGS as e:  # bare "pylog" or "pylog topic": the help, on stdout
        click.echo(e.ctx.get_help() if e.ctx is not None else cli.get_help(click.Context(cli)))
        code = 0
    except click.exceptions.Abort:
        code = _fail("interrupted", 130)
    except click.ClickException as e:
        code = _fail(e.format_message(), e.exit_code if e.exit_code else 2)
    except CliError as e:
        code = _fail(str(e), e.code)
    except InvalidNameError as e:  # a topic or group name typed on the command line
        code = _fail(str(e), 2)
    except (BrokenPipeError, _PipeClosed):
        # the reader went away (pylog consume | head): not an error
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        code = 0
    except KeyboardInterrupt:
        code = _fail("interrupted", 130)
    except (PylogError, OSError, ValueError, TypeError, KeyError, IndexError) as e:
        if os.environ.get("PYLOG_DEBUG"):
            raise
        code = _fail(_describe(e), 1)
    except Exception as e:  # never a traceback
        if os.environ.get("PYLOG_DEBUG"):
            raise
        code = _fail(f"internal error: {type(e).__name__}: {e}", 1)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
