"""``pylog topic``: create, list, describe, alter and delete topics."""
from __future__ import annotations

import json
import os
from typing import Any

import click

from pylog.cli._common import CONTEXT, CliError, _Group, _human, _parse_configs, _store, _topics_arg
from pylog.errors import UnknownTopicError


@click.group(cls=_Group, context_settings=CONTEXT)
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
    names = _store(ctx, readonly=True).topics()  # a root that does not exist is an error (a typo)
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
    if partitions is not None and partitions < t.partitions:  # checked before anything changes
        raise CliError(f"topic {name} has {t.partitions} partitions; partitions can only be added")
    if partitions == t.partitions and not options:  # as Kafka: a count that is not an increase
        raise CliError(f"topic {name} has {partitions} partitions already; nothing changed")
    if options:
        store.alter_topic(name, **options)
    if partitions is not None and partitions > t.partitions:
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
