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
