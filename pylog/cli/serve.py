"""``pylog serve``: serve the data root over Kafka's wire protocol."""
from __future__ import annotations

import re

import click

from pylog.cli._common import CONTEXT


@click.command(context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9092, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="The address clients are told to connect to (default: where it listens).")
@click.option("--tls-cert", default=None, metavar="PEM", help="TLS certificate chain (PEM); with --tls-key.")
@click.option("--tls-key", default=None, metavar="PEM", help="The TLS certificate's private key (PEM).")
@click.option("--users", default=None, metavar="FILE",
              help="SASL users file (PLAIN over TLS, SCRAM-SHA-256): every client must log in.")
@click.option("--auto-create-per-request", default=100, show_default=True, type=click.IntRange(0),
              help="Most topics one Metadata request may auto-create (the rest: UNKNOWN_TOPIC_OR_PARTITION).")
@click.option("--auto-create-rate", default=100.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Most topics auto-created per second over all clients.")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, advertise: str | None, tls_cert: str | None,
          tls_key: str | None, users: str | None, auto_create_per_request: int, auto_create_rate: float) -> None:
    """Serve the root over Kafka's wire protocol until SIGTERM (docs/serve.md)."""
    from pylog.serve import serve as run

    if advertise is not None and not re.fullmatch(r"[^\s:]*:\d{1,5}", advertise):
        raise click.BadParameter(f"{advertise!r} is not HOST:PORT", param_hint="--advertise")
    run(ctx.obj["root"], host, port, advertise=advertise, tls_cert=tls_cert, tls_key=tls_key, users=users,
        auto_create_per_request=auto_create_per_request, auto_create_rate=auto_create_rate,
        ready=lambda s: click.echo(f"pylog serve: listening on {s.host}:{s.port}"))
