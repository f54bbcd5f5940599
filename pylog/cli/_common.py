"""What every ``pylog`` verb shares: the data root, option parsing, errors worded for the user.

The click group class that gives every verb ``--root`` after it, ``CliError`` (one line and an
exit status), opening the data root's LogStore, and parsing ``-c NAME=VALUE``, sizes and durations.
"""
from __future__ import annotations

import base64
import os
import re
from typing import Any

import click

from pylog.errors import PylogError

DEFAULT_ROOT = "pylog-data"
CHUNK = 4 << 20
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _describe(e: BaseException) -> str:
    """One line for an error the CLI reports: an OSError's text and file, else the message."""
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror}{where}"
    if isinstance(e, KeyError) and not isinstance(e, PylogError):
        return f"missing {e}"
    return str(e) or type(e).__name__


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
    if os.path.exists(root) and not os.path.isdir(root):
        raise CliError(f"data root {root!r} is not a directory")
    if not create and not os.path.isdir(root):
        raise CliError(f"data root {root!r} does not exist (create a topic first, or pass --root)")
    above = os.path.dirname(os.path.abspath(root))
    while not os.path.lexists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):  # e.g. --root FILE/sub: not "File exists"
        raise CliError(f"data root {root!r} cannot be a directory: {above!r} is a file")
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
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text.replace("_", ""))
    if m is None or m.group(2).lower() not in units and m.group(2):
        examples = "64MiB, 1GB, 4096" if what == "size" else "7d, 12h, 30s, 500ms"
        raise click.BadParameter(f"{text!r} is not a {what} (e.g. {examples})",
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
        names: list[str] = store.topics()
        return names
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
