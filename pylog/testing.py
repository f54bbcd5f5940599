"""Test tools shipped with pylog, for pylog's own suite and for downstream users.

* :class:`CrashFS`: a fault-injecting storage layer installed through :mod:`pylog.vfs`.
  It records what each fsync made durable (file contents) and what each directory fsync
  made durable (directory entries), can fail any operation (ENOSPC, EIO...), and on a
  simulated power cut builds the directory as a machine would find it after reboot: every
  file as of its last fsync, every directory as of its last fsync, unsynced appends torn
  at a random point (sometimes with a zeroed sector: size persisted before data).
* :func:`simulate_crash`: abandon a Log as a SIGKILL would (no flush, no clean marker).
* :class:`LogMachine`: a hypothesis ``RuleBasedStateMachine`` running a Log against a
  plain list model.
"""
from __future__ import annotations

import errno as _errno
import os
import random
import stat
from typing import Any, Callable

from pylog import vfs

__all__ = ["CrashFS", "PowerCut", "simulate_crash"]


class PowerCut(BaseException):
    """Raised by CrashFS at the simulated power cut. A BaseException so that no
    ``except Exception`` in the code under test can swallow it."""


_FileId = int


class CrashFS:
    """Fault-injecting file layer over a directory tree ``root``.

    Parameters
    ----------
    root
        Only files below it are tracked (everything there at install time counts as
        durable). Operations elsewhere pass straight through.
    cut_after
        Raise :class:`PowerCut` instead of performing the ``cut_after``-th mutating
        operation (1-based); after that every operation raises PowerCut.
    fail
        ``fail(op, path) -> errno | None``: when it returns an errno, the operation raises
        that OSError instead (a write first writes a random part of its bytes, as a short
        write before ENOSPC would).
    seed
        Seeds the tearing of unsynced data in :meth:`materialize`.
    """

    MUTATING = ("open", "write", "pwrite", "fsync", "fdatasync", "replace", "rename",
                "unlink", "ftruncate", "posix_fallocate", "mkdir")

    def __init__(self, root: str, *, cut_after: int | None = None,
                 fail: Callable[[str, str], int | None] | None = None, seed: int = 0) -> None:
        self.root = os.path.realpath(root)
        self.cut_after = cut_after
        self.fail = fail
        self.rng = random.Random(seed)
        self.ops = 0
        self.dead = False
        self.log: list[tuple[str, str]] = []
        self._next_id = 0
        self.fds: dict[int, tuple[str, Any]] = {}          # fd -> ("file", id) | ("dir", path)
        self.current: dict[str, dict[str, _FileId]] = {}   # dir -> name -> id
        self.durable_dirs: dict[str, dict[str, _FileId]] = {}
        self.durable: dict[_FileId, bytes] = {}            # id -> content at its last fsync
        self.path_of: dict[_FileId, str] = {}
        for d, _dirs, files in os.walk(self.root):
            d = os.path.realpath(d)
            self.current[d] = {}
            for name in files:
                p = os.path.join(d, name)
                fid = self._new_id(p)
                self.current[d][name] = fid
                with open(p, "rb") as f:
                    self.durable[fid] = f.read()
            self.durable_dirs[d] = dict(self.current[d])

    # -- bookkeeping ---------------------------------------------------------------------
    def _new_id(self, path: str) -> _FileId:
        self._next_id += 1
        self.path_of[self._next_id] = path
        return self._next_id

    def _abs(self, path: str) -> str:
        path = os.fspath(path)
        return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))

    def _tracked(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _step(self, op: str, path: str) -> None:
        if self.dead:
            raise PowerCut(f"after the power cut: {op} {path}")
        if not self._tracked(path):
            return
        self.ops += 1
        self.log.append((op, path))
        if self.cut_after is not None and self.ops >= self.cut_after:
            self.dead = True
            raise PowerCut(f"power cut before op {self.ops}: {op} {path}")
        if self.fail is not None:
            e = self.fail(op, path)
            if e:
                raise OSError(e, os.strerror(e), path)

    def _fd_path(self, fd: int) -> str:
        kind, v = self.fds.get(fd, ("", None))
        if kind == "file":
            return self.path_of[v]
        if kind == "dir":
            return v
        return ""

    # -- the vfs operations --------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        p = self._abs(path)
        existed = os.path.exists(p)
        if flags & (os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_RDWR):
            self._step("open", p)
        elif self.dead:
            raise PowerCut("after the power cut")
        fd = os.open(path, flags, mode)
        if self._tracked(p):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.fds[fd] = ("dir", p)
            else:
                d, name = os.path.split(p)
                cur = self.current.setdefault(d, {})
                if not existed or name not in cur:
                    cur[name] = self._new_id(p)
                self.fds[fd] = ("file", cur[name])
        return fd

    def close(self, fd: int) -> None:
        self.fds.pop(fd, None)
        os.close(fd)

    def dup(self, fd: int) -> int:
        new = os.dup(fd)
        if fd in self.fds:
            self.fds[new] = self.fds[fd]
        return new

    def _write_fault(self, op: str, fd: int, data: Any, position: int | None) -> int:
        p = self._fd_path(fd)
        try:
            self._step(op, p)
        except OSError as e:
            # a short write lands part of the bytes before the error
            mv = memoryview(data).cast("B")
            k = self.rng.randrange(len(mv) + 1) if len(mv) else 0
            if k:
                if position is None:
                    os.write(fd, mv[:k])
                else:
                    os.pwrite(fd, mv[:k], position)
            raise e
        return 0

    def write(self, fd: int, data: Any) -> int:
        self._write_fault("write", fd, data, None)
        return os.write(fd, data)

    def pwrite(self, fd: int, data: Any, position: int) -> int:
        self._write_fault("pwrite", fd, data, position)
        return os.pwrite(fd, data, position)

    def _sync(self, op: str, fd: int) -> None:
        self._step(op, self._fd_path(fd))
        (os.fsync if op == "fsync" else os.fdatasync)(fd)
        kind, v = self.fds.get(fd, ("", None))
        if kind == "file":
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                self.durable[v] = f.read()
        elif kind == "dir":
            self.durable_dirs[v] = dict(self.current.get(v, {}))

    def fsync(self, fd: int) -> None:
        self._sync("fsync", fd)

    def fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd)

    def replace(self, src: str, dst: str) -> None:
        s, d = self._abs(src), self._abs(dst)
        self._step("replace", d)
        os.replace(src, dst)
        self._move(s, d)

    def rename(self, src: str, dst: str) -> None:
        s, d = self._abs(src), self._abs(dst)
        self._step("rename", d)
        os.rename(src, dst)
        self._move(s, d)

    def _move(self, s: str, d: str) -> None:
        sd, sn = os.path.split(s)
        dd, dn = os.path.split(d)
        fid = self.current.get(sd, {}).pop(sn, None)
        if fid is not None and self._tracked(d):
            self.current.setdefault(dd, {})[dn] = fid
            self.path_of[fid] = d

    def unlink(self, path: str) -> None:
        p = self._abs(path)
        self._step("unlink", p)
        os.unlink(path)
        d, n = os.path.split(p)
        self.current.get(d, {}).pop(n, None)

    def ftruncate(self, fd: int, size: int) -> None:
        self._step("ftruncate", self._fd_path(fd))
        os.ftruncate(fd, size)

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        self._step("posix_fallocate", self._fd_path(fd))
        os.posix_fallocate(fd, offset, length)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        p = self._abs(path)
        self._step("mkdir", p)
        os.mkdir(path, mode)
        # Directories themselves are treated as durable once made (documented limit).
        self.current.setdefault(p, {})
        self.durable_dirs.setdefault(p, {})

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    # -- install / materialize -------------------------------------------------------------
    def __enter__(self) -> "CrashFS":
        vfs.install(self)
        return self

    def __exit__(self, *exc: object) -> None:
        vfs.uninstall()

    def _current_bytes(self, fid: _FileId) -> bytes | None:
        for fd, (kind, v) in self.fds.items():
            if kind == "file" and v == fid:
                try:
                    with open(f"/proc/self/fd/{fd}", "rb") as f:
                        return f.read()
                except OSError:
                    pass
        p = self.path_of.get(fid)
        if p is not None:
            d, n = os.path.split(p)
            if self.current.get(d, {}).get(n) == fid:
                try:
                    with open(p, "rb") as f:
                        return f.read()
                except OSError:
                    return None
        return None

    def materialize(self, dest: str, *, tear: bool = True) -> str:
        """Write the post-power-cut image of ``root`` into ``dest``; returns ``dest``.

        Each directory holds the entries of its last fsync; each file the bytes of its last
        fsync, plus (with ``tear``) a random prefix of the bytes appended since, whose last
        sector may read as zeros. Bytes rewritten in place since the fsync are lost.
        """
        for d, entries in self.durable_dirs.items():
            out_dir = os.path.join(dest, os.path.relpath(d, self.root))
            os.makedirs(out_dir, exist_ok=True)
            for name, fid in entries.items():
                data = self.durable.get(fid, b"")
                if tear:
                    cur = self._current_bytes(fid)
                    if cur is not None and len(cur) > len(data) and cur[: len(data)] == data:
                        extra = cur[len(data):]
                        k = self.rng.randrange(len(extra) + 1)
                        torn = bytearray(extra[:k])
                        if k and self.rng.random() < 0.3:
                            z = min(512, k)
                            torn[k - z:] = bytes(z)
                        data = data + bytes(torn)
                with open(os.path.join(out_dir, name), "wb") as f:
                    f.write(data)
        return dest


def simulate_crash(log: Any) -> None:
    """Abandon ``log`` as a SIGKILL would: buffered appends are lost, nothing is flushed,
    no clean-shutdown marker is written; its files and lock are released."""
    from pylog import flusher

    with log._lock:
        flusher.unregister(log)
        active = log._active
        app = getattr(active, "app", None)
        if app is not None and not log.readonly:
            app.drain()
        log._closed = True
        active.close_files()
        log._cache.clear()
        log._release_lock()


def enospc(after: int, ops: tuple[str, ...] = ("pwrite", "write")) -> Callable[[str, str], int | None]:
    """A CrashFS ``fail`` hook: ENOSPC on the named operations from the ``after``-th on."""
    count = [0]

    def fail(op: str, path: str) -> int | None:
        if op in ops:
            count[0] += 1
            if count[0] >= after:
                return _errno.ENOSPC
        return None

    return fail
