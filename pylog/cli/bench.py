"""``pylog bench``: produce and consume N records in a scratch root (``--compare``: the comparison with other logs)."""
from __future__ import annotations

import json
import os
import sys
import time

import click

from pylog.cli._common import CONTEXT


@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "help_option_names": []})
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
