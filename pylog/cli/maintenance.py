"""Checking and tidying a data root: ``pylog verify``, ``recover``, ``retention`` and ``compact``."""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from pylog.cli._common import CONTEXT, CliError, _human, _store, _topics_arg


def _progress(total: int, label: str) -> Any:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    prog = Progress(TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    transient=True, console=_err_console(), disable=not sys.stderr.isatty())
    return prog


def _err_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@click.command(context_settings=CONTEXT)
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


@click.command(context_settings=CONTEXT)
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


@click.command(context_settings=CONTEXT)
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


@click.command(context_settings=CONTEXT)
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
