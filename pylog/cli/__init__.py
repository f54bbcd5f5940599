"""The ``pylog`` command: the root group, the verbs registered on it, and ``main`` (one-line errors).

The data root is ``--root``, else ``$PYLOG_ROOT``, else ``./pylog-data``. Every error is one
line on stderr (``pylog: error: ...``) and a non-zero exit status: 1 for a failure, 2 for
a bad command line; never a traceback (``PYLOG_DEBUG=1`` shows one). See docs/cli.md.

One module per verb group: :mod:`pylog.cli.topics` (``topic``), :mod:`pylog.cli.groups`
(``group``), :mod:`pylog.cli.records` (``produce``, ``consume``), :mod:`pylog.cli.maintenance`
(``verify``, ``recover``, ``retention``, ``compact``), :mod:`pylog.cli.dump`,
:mod:`pylog.cli.bench` and :mod:`pylog.cli.serve`; what they share is in :mod:`pylog.cli._common`.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import click

from pylog import __version__
from pylog.cli import bench, dump, groups, maintenance, records, serve, topics
from pylog.cli._common import CONTEXT, DEFAULT_ROOT, CliError, _describe, _Group, _PipeClosed
from pylog.errors import InvalidNameError, PylogError

__all__ = ["CliError", "cli", "main"]


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


for _command in (topics.topic, groups.group, records.produce, records.consume, maintenance.verify,
                 maintenance.recover, maintenance.retention, maintenance.compact, dump.dump, bench.bench,
                 serve.serve):
    cli.add_command(_command)
del _command


def _fail(message: str, code: int) -> int:
    message = " ".join(str(message).split()) or "unknown error"
    try:
        sys.stdout.flush()
    except Exception:
        pass
    sys.stderr.write(f"pylog: error: {message}\n")
    sys.stderr.flush()
    return code


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
