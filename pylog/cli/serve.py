"""``pylog serve``: serve the data root over Kafka's wire protocol."""
from __future__ import annotations

import re
from typing import Any

import click

from pylog.cli._common import _SIZE_UNITS, CONTEXT, _parse_duration, _with_unit


def _size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    n = _with_unit(value, _SIZE_UNITS, "size", f"--{param.name.replace('_', '-')}" if param.name else "")
    if n < 1:
        raise click.BadParameter(f"{value!r} is not a positive size", param=param)
    return n


def _seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    ms = _parse_duration(value, f"--{param.name.replace('_', '-')}" if param.name else "")
    if ms < 1:
        raise click.BadParameter(f"{value!r} is not a positive duration", param=param)
    return ms / 1000


@click.command(context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9092, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("--advertise", default=None, metavar="HOST:PORT",
              help="The address clients are told to connect to (default: where it listens).")
@click.option("--tls-cert", default=None, metavar="PEM", help="TLS certificate chain (PEM); with --tls-key.")
@click.option("--tls-key", default=None, metavar="PEM", help="The TLS certificate's private key (PEM).")
@click.option("--users", default=None, metavar="FILE",
              help="SASL users file (PLAIN over TLS, SCRAM-SHA-256): every client must log in.")
# the bounds (docs/serve.md, "Limits and defaults"), with Kafka's names
@click.option("--max-request-bytes", default="100MiB", show_default=True, callback=_size, metavar="SIZE",
              help="Largest request frame (socket.request.max.bytes).")
@click.option("--queued-max-request-bytes", default="100MiB", show_default=True, callback=_size, metavar="SIZE",
              help="Bytes of large request frames held at once over all connections (queued.max.request.bytes).")
@click.option("--fetch-max-bytes", default="55MiB", show_default=True, callback=_size, metavar="SIZE",
              help="Most record bytes in one Fetch response (fetch.max.bytes).")
@click.option("--max-decompressed-bytes", default="32MiB", show_default=True, callback=_size, metavar="SIZE",
              help="Most bytes one Produce request's compressed batches may decompress to, in all.")
@click.option("--max-connections", default=1000, show_default=True, type=click.IntRange(1),
              help="Connections open at once (max.connections).")
@click.option("--max-connections-per-ip", default=1000, show_default=True, type=click.IntRange(1),
              help="Connections open at once from one IP address (max.connections.per.ip).")
@click.option("--request-timeout", default="30s", show_default=True, callback=_seconds, metavar="DURATION",
              help="Time a started request frame (its size included) may take to arrive.")
@click.option("--idle-timeout", default="10m", show_default=True, callback=_seconds, metavar="DURATION",
              help="Time a connection may stay silent between requests (connections.max.idle.ms).")
@click.option("--fence-backoff", default=5.0, show_default=True, type=click.FloatRange(0), metavar="SECONDS",
              help="After a failed write or fsync fenced a partition, how long until a produce may reopen it.")
@click.option("--data-mode", type=click.Choice(["private", "group"]), default="private", show_default=True,
              help="Files and directories the broker creates: private (0600/0700) or group (0640/0750).")
@click.option("--failed-auth-delay-ms", type=click.IntRange(0, 60000), default=100, show_default=True,
              help="Delay before a failed login is answered (connection.failed.authentication.delay.ms).")
@click.option("--max-failed-logins", type=click.IntRange(0), default=20, show_default=True,
              help="Failed logins per client address per minute; past it logins fail unchecked (0: no limit).")
@click.option("--auto-create-per-request", default=100, show_default=True, type=click.IntRange(0),
              help="Most topics one Metadata request may auto-create (the rest: UNKNOWN_TOPIC_OR_PARTITION).")
@click.option("--auto-create-rate", default=100.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Most topics auto-created per second over all clients.")
@click.option("--max-txn-partitions", default=2000, show_default=True, type=click.IntRange(1),
              help="Partitions (and groups and offsets) open Kafka transactions may hold at once, in all.")
@click.option("--max-txn-partitions-per-client", default=1000, show_default=True, type=click.IntRange(1),
              help="The same, for the transactions begun by one client (a SASL user, or an IP address).")
@click.option("--max-transactional-ids", default=10000, show_default=True, type=click.IntRange(1),
              help="Transactional ids kept; a new one past it replaces the one idle longest.")
@click.option("--transactional-id-expiration", default="7d", show_default=True, callback=_seconds,
              metavar="DURATION", help="How long an idle transactional id is kept (transactional.id.expiration.ms).")
@click.option("--config", "config_file", default=None, metavar="FILE",
              help="Broker configs in Kafka's server.properties form; flags given override them.")
@click.option("--metrics-port", default=None, type=click.IntRange(0, 65535), metavar="PORT",
              help="Serve Prometheus metrics over HTTP at this port (0: any free one), on --metrics-host.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="Address the metrics endpoint listens on; it has no authentication (docs/serve.md, Security).")
@click.pass_context
def serve(ctx: click.Context, /, host: str, port: int, advertise: str | None, tls_cert: str | None,
          tls_key: str | None, users: str | None, data_mode: str, failed_auth_delay_ms: int,
          max_failed_logins: int, config_file: str | None, **limits: Any) -> None:
    """Serve the root over Kafka's wire protocol until SIGTERM (docs/serve.md)."""
    from pylog.serve import brokerconfig
    from pylog.serve import serve as run

    extra: dict[str, Any] = {}
    given: dict[str, str] = {}
    if config_file is not None:
        try:
            loaded = brokerconfig.load(config_file)
        except (brokerconfig.BrokerConfigError, OSError) as e:
            raise click.UsageError(str(e)) from None
        if loaded.unknown:
            click.echo(f"pylog serve: warning: {config_file}: ignoring keys pylog does not know: "
                       f"{', '.join(loaded.unknown)}", err=True)

        def flag(name: str) -> bool:
            return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

        for kw, v in loaded.server.items():
            if kw == "listener":
                if not flag("host"):
                    host = v[0]
                if not flag("port"):
                    port = v[1]
            elif kw == "advertised":
                advertise = advertise if flag("advertise") else f"{v[0]}:{v[1]}"
            elif kw == "failed_auth_delay_ms":
                failed_auth_delay_ms = failed_auth_delay_ms if flag(kw) else v
            elif kw in limits:
                limits[kw] = limits[kw] if flag(kw) else v
            else:
                extra[kw] = v
        extra["topic_defaults"] = loaded.topic_defaults
        given = loaded.given
    effective = {
        "listeners": f"PLAINTEXT://{host}:{port}", "fetch.max.bytes": str(limits["fetch_max_bytes"]),
        "socket.request.max.bytes": str(limits["max_request_bytes"]),
        "queued.max.request.bytes": str(limits["queued_max_request_bytes"]),
        "max.connections": str(limits["max_connections"]),
        "max.connections.per.ip": str(limits["max_connections_per_ip"]),
        "connections.max.idle.ms": str(int(limits["idle_timeout"] * 1000)),
        "transactional.id.expiration.ms": str(int(limits["transactional_id_expiration"] * 1000)),
        "connection.failed.authentication.delay.ms": str(failed_auth_delay_ms)}
    for key, (_, _, _, where) in brokerconfig.BROKER_KEYS.items():  # a flag given: its value, static
        kw = where[7:].split("/")[0] if where.startswith("server:") else ""
        if kw and ctx.get_parameter_source(kw) == click.core.ParameterSource.COMMANDLINE and key in effective:
            given[key] = effective[key]
    extra["broker_configs"] = brokerconfig.describe(given, effective)

    if advertise is not None and not re.fullmatch(r"[^\s:]*:\d{1,5}", advertise):
        raise click.BadParameter(f"{advertise!r} is not HOST:PORT", param_hint="--advertise")
    if limits["queued_max_request_bytes"] < limits["max_request_bytes"]:
        raise click.BadParameter("must be at least --max-request-bytes (or no request of that size is read)",
                                 param_hint="--queued-max-request-bytes")
    run(ctx.obj["root"], host, port, advertise=advertise, tls_cert=tls_cert, tls_key=tls_key, users=users,
        data_mode=data_mode, failed_auth_delay=failed_auth_delay_ms / 1000, max_failed_logins=max_failed_logins,
        ready=_ready, **limits, **extra)


def _ready(s: Any) -> None:
    mhost = f"[{s.metrics_host}]" if ":" in s.metrics_host else s.metrics_host
    metrics = f", metrics on http://{mhost}:{s.metrics_port}/metrics" if s.metrics is not None else ""
    click.echo(f"pylog serve: listening on {s.host}:{s.port}{metrics}")
