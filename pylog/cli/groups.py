"""``pylog group``: list, describe, reset and delete consumer groups."""
from __future__ import annotations

import json
from typing import Any

import click

from pylog.cli._common import CONTEXT, _Group, _store


@click.group(cls=_Group, context_settings=CONTEXT)
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
    names = _store(ctx, readonly=True).groups(topic_name)
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
    info = _store(ctx, readonly=True).describe_group(group_name, topic_name)
    if fmt_ == "json":
        click.echo(json.dumps(info, indent=1))
        return
    rows = [("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "OWNER")]
    for r in info["partitions"]:
        owner = r["owner"] or "-"
        if r["damaged"]:
            owner += " (committed-offset file damaged: ignored)"
        lag = _dash(r["lag"]) + ("*" if r["out_of_range"] else "")
        rows.append((group_name, r["topic"], str(r["partition"]), _dash(r["committed"]), str(r["log_end"]),
                     lag, owner))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    if any(r["out_of_range"] for r in info["partitions"]):
        click.echo("* the committed offset is outside the log: the next consumer starts per its "
                   "auto_offset_reset; the lag counts from the log start (earliest, the default)")
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
