"""The file operations pylog changes files with: the one seam for fault injection.

Every open, write, fsync, rename, unlink and truncate pylog makes goes through the names
in this module, looked up at call time (``vfs.pwrite(...)``), so a test can swap them all
for a recording, failing or power-cutting layer with :func:`install` (see
:class:`pylog.testing.CrashFS`), as SQLite's crash VFS and laminarmq's storage trait do.
Reads (``os.pread``, ``mmap``) do not go through here: they cannot change what is durable.
"""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

_NAMES = ("open", "close", "write", "pwrite", "fsync", "fdatasync", "replace", "rename",
          "unlink", "ftruncate", "posix_fallocate", "dup", "rmdir", "mkdir")

open = os.open
close = os.close
write = os.write
pwrite = os.pwrite
fsync = os.fsync
fdatasync = getattr(os, "fdatasync", os.fsync)
replace = os.replace
rename = os.rename
unlink = os.unlink
ftruncate = os.ftruncate
posix_fallocate = getattr(os, "posix_fallocate", None)
dup = os.dup
rmdir = os.rmdir
mkdir = os.mkdir

_DEFAULTS = {name: globals()[name] for name in _NAMES}


def install(fs: Any) -> None:
    """Route every operation named in ``_NAMES`` through ``fs`` (an object with those
    methods). Takes effect for every log in the process."""
    g = globals()
    for name in _NAMES:
        g[name] = getattr(fs, name)


def uninstall() -> None:
    """Back to the operating system's calls."""
    globals().update(_DEFAULTS)


#: The callables :func:`observe_syncs` added, each called as ``observer(seconds)``.
_observers: tuple[Callable[[float], None], ...] = ()
#: The fsync and fdatasync the timed ones wrap (while observed).
_wrapped: dict[str, Any] = {}


#: Told (timed fdatasync, :func:`_notify`) when timing starts over the default fdatasync,
#: (None, None) when it stops or the op timed is not the default: how a C durable append
#: (``pylog.groupcommit``) keeps its own path while timed, reporting its fdatasyncs itself.
_sync_hooks: list[Callable[[Any, Any], None]] = []


def _notify(seconds: float) -> None:
    """Hand ``seconds`` (one fsync's or fdatasync's) to every observer."""
    for observer in _observers:
        observer(seconds)


def _timed_state() -> tuple[Any, Any]:
    op = globals()["fdatasync"]
    if _observers and getattr(op, "__wrapped_op__", None) is _DEFAULTS["fdatasync"]:
        return op, _notify
    return None, None


def _tell_hooks() -> None:
    state = _timed_state()
    for hook in _sync_hooks:
        hook(*state)


def on_timed_syncs(hook: Callable[[Any, Any], None]) -> None:
    """Call ``hook(timed_fdatasync, notify)`` now and whenever :func:`observe_syncs` starts
    or stops timing: while the syncs are timed over the default fdatasync, its timed
    wrapper (which the hook's owner may treat as the default: the op it wraps is) and the
    callable to hand the seconds of each fdatasync it makes itself; else ``(None, None)``."""
    _sync_hooks.append(hook)
    hook(*_timed_state())


def _timed(name: str, op: Any) -> Any:
    perf = time.perf_counter

    def timed(fd: int) -> None:
        t = perf()
        try:
            op(fd)
        finally:
            _notify(perf() - t)
    timed.__name__ = name
    timed.__wrapped_op__ = op  # type: ignore[attr-defined]
    return timed


def observe_syncs(observer: Callable[[float], None]) -> None:
    """Call ``observer(seconds)`` after every :func:`fsync` and :func:`fdatasync` of the
    process (a failed one too) until :func:`unobserve_syncs`: the neutral seam through
    which a layer above (the broker's metrics) times them. While any observer is set the
    two are timed wrappers; the C durable append (``Framer.append_durable``) keeps its C
    path and reports its own fdatasyncs (:func:`on_timed_syncs`)."""
    global _observers
    g = globals()
    first = not _observers
    if first:
        for name in ("fsync", "fdatasync"):
            _wrapped[name] = g[name]
            g[name] = _timed(name, g[name])
    _observers = (*_observers, observer)
    if first:
        _tell_hooks()


def unobserve_syncs(observer: Callable[[float], None]) -> None:
    """Stop calling ``observer`` (added by :func:`observe_syncs`); the last one removed
    puts the unwrapped calls back (unless :func:`install` replaced them since)."""
    global _observers
    if observer not in _observers:
        return
    rest = list(_observers)
    rest.remove(observer)
    _observers = tuple(rest)
    if not _observers:
        g = globals()
        for name, op in _wrapped.items():
            if getattr(g[name], "__wrapped_op__", None) is op:
                g[name] = op
        _wrapped.clear()
        _tell_hooks()


def makedirs(path: str) -> None:
    """os.makedirs(exist_ok=True) through :func:`mkdir`. A file where a directory of the
    path should be raises NotADirectoryError naming that file (not "File exists")."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent and not os.path.isdir(parent):
        makedirs(parent)
    try:
        mkdir(path, 0o755)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory (a file has that name)", path) from None
