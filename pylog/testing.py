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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pylog import vfs

if TYPE_CHECKING:
    from pylog.log import Log
    from pylog.record import Record

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
            path: str = v
            return path
        return ""

    # -- the vfs operations --------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        """Open a file; a created file's directory entry is durable only after a directory fsync."""
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
        """Close ``fd`` and forget it."""
        self.fds.pop(fd, None)
        os.close(fd)

    def dup(self, fd: int) -> int:
        """Duplicate ``fd``; the copy refers to the same file."""
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
        """Write at the file position (not durable until an fsync; may fail or tear)."""
        self._write_fault("write", fd, data, None)
        return os.write(fd, data)

    def pwrite(self, fd: int, data: Any, position: int) -> int:
        """Write at a position (not durable until an fsync; may fail or tear)."""
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
        """fsync ``fd``: its file's bytes become durable (a directory fd: its entries)."""
        self._sync("fsync", fd)

    def fdatasync(self, fd: int) -> None:
        """fdatasync ``fd``: its file's bytes become durable (a directory fd: its entries)."""
        self._sync("fdatasync", fd)

    def replace(self, src: str, dst: str) -> None:
        """Rename over ``dst`` (durable only after the directory's fsync)."""
        s, d = self._abs(src), self._abs(dst)
        self._step("replace", d)
        os.replace(src, dst)
        self._move(s, d)

    def rename(self, src: str, dst: str) -> None:
        """Rename (durable only after the directory's fsync)."""
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
        """Remove a name (durable only after the directory's fsync)."""
        p = self._abs(path)
        self._step("unlink", p)
        os.unlink(path)
        d, n = os.path.split(p)
        self.current.get(d, {}).pop(n, None)

    def ftruncate(self, fd: int, size: int) -> None:
        """Truncate through ``fd`` (not durable until an fsync)."""
        self._step("ftruncate", self._fd_path(fd))
        os.ftruncate(fd, size)

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        """Reserve space through ``fd`` (not durable until an fsync)."""
        self._step("posix_fallocate", self._fd_path(fd))
        os.posix_fallocate(fd, offset, length)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        """Make a directory (treated as durable at once: a documented simplification)."""
        p = self._abs(path)
        self._step("mkdir", p)
        os.mkdir(path, mode)
        # Directories themselves are treated as durable once made (documented limit).
        self.current.setdefault(p, {})
        self.durable_dirs.setdefault(p, {})

    def rmdir(self, path: str) -> None:
        """Remove an empty directory."""
        os.rmdir(path)

    # -- install / materialize -------------------------------------------------------------
    def __enter__(self) -> CrashFS:
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
        fsync and, with ``tear``, what a power cut may have persisted of the writes since
        (:meth:`tear`): any subset of their 512-byte sectors, later ones without earlier
        ones, the file's size maybe persisted without the data (zeros). Without ``tear``,
        nothing written since the last fsync survives.
        """
        for d, entries in self.durable_dirs.items():
            out_dir = os.path.join(dest, os.path.relpath(d, self.root))
            os.makedirs(out_dir, exist_ok=True)
            for name, fid in entries.items():
                data = self.durable.get(fid, b"")
                if tear:
                    cur = self._current_bytes(fid)
                    if cur is not None and cur != data:
                        data = self.tear(data, cur)
                with open(os.path.join(out_dir, name), "wb") as f:
                    f.write(data)
        return dest

    SECTOR = 512
    #: how :meth:`tear` picks the sectors that persist: a prefix of the new bytes (whose
    #: last sector may read as zeros), each changed sector at random, all, or none
    TEAR_MODES = ("prefix", "sectors", "sectors", "sectors", "all", "none")

    def tear(self, old: bytes, new: bytes) -> bytes:
        """What a power cut leaves of a file whose last fsync saw ``old`` and that holds
        ``new`` now. A sector (512 bytes, aligned in the file) is written atomically, so it
        holds its old bytes or its new ones; any subset of the changed sectors persists,
        later ones without earlier ones included. A file grown since ends anywhere between
        its old and new size (a sector boundary, or the new end), and bytes past the old
        end whose sector did not persist read as zeros (the size was persisted first). A
        file shrunk since keeps its old bytes (a truncate not yet synced is lost)."""
        if len(new) < len(old):
            return old
        mode = self.rng.choice(self.TEAR_MODES)
        sec = self.SECTOR
        if mode == "prefix":  # the old model: a random prefix of the new bytes
            k = self.rng.randrange(len(old), len(new) + 1)
            out = bytearray(old + new[len(old) : k]) if new[: len(old)] == old else bytearray(old)
            if k > len(old) and len(out) == k and self.rng.random() < 0.3:
                z = min(sec, k - len(old))
                out[k - z : k] = bytes(z)
            return bytes(out)
        end = len(new)
        if mode == "sectors" and len(new) > len(old):
            ends = [b for b in range(len(old) - len(old) % sec + sec, len(new), sec)] + [len(new)]
            end = self.rng.choice([len(old), *ends])
        out = bytearray(old[:end]) + bytes(max(0, end - len(old)))
        for a in range(0, end, sec):
            b = min(a + sec, end)
            if new[a:b] == bytes(out[a:b]):
                continue
            if mode == "all" or (mode == "sectors" and self.rng.random() < 0.5):
                out[a:b] = new[a:b]
        return bytes(out)


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
            log._q = []  # queued appends die with the process too
            log._q_ts = []
        log._closed = True
        log._writable = None
        log._set_framer(None)
        log._queueing = False
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


try:  # the state machine needs hypothesis (the "test" extra)
    from hypothesis import note
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
except ImportError:  # pragma: no cover
    pass
else:
    __all__.append("LogMachine")

    _values = st.binary(max_size=300)

    def _value(rec: Record) -> bytes:
        """A record's value as bytes (the machine appends no tombstones)."""
        assert rec.value is not None
        return bytes(rec.value)
    _keys = st.none() | st.binary(max_size=20)

    class LogMachine(RuleBasedStateMachine):
        """A Log against a list model: ``model[i]`` is ``(key, value)`` of offset
        ``start + i``. Rules append (one, batch, streaming), read, fetch, scan, roll,
        truncate, reopen (sometimes with new config), apply retention, and crash (losing
        what was not flushed, then tearing or zeroing the unflushed tail). After a crash
        the log must hold a prefix of the model with every flushed record, ending with a
        whole batch, and report nothing."""

        def __init__(self) -> None:
            super().__init__()
            import tempfile

            import pylog

            self.pylog = pylog
            self.dir = tempfile.mkdtemp(prefix="pylog-machine-")
            self.config: dict[str, Any] = {}
            self.log: Log | None = None
            self.model: list[tuple[bytes | None, bytes]] = []
            self.start = 0
            self.durable = 0  # offsets below this are flushed

        def teardown(self) -> None:
            import shutil

            if self.log is not None:
                self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

        @property
        def opened(self) -> Log:
            """The open log (the rules that use it run only while one is open: their
            preconditions say so)."""
            assert self.log is not None
            return self.log

        @property
        def next(self) -> int:
            """The model's next_offset."""
            return self.start + len(self.model)

        @rule(segment_bytes=st.sampled_from([4096, 8192, 1 << 20]),
              interval=st.sampled_from([0, 64, 4096]),
              cached=st.sampled_from([0, 1, 2, None]),
              buffer=st.sampled_from([0, 512, 1 << 16]),
              initial=st.sampled_from([0, 1000]))
        @precondition(lambda self: self.log is None)
        def open(self, segment_bytes: int, interval: int, cached: Any, buffer: int, initial: int) -> None:
            self.config = dict(segment_bytes=segment_bytes, index_interval_bytes=interval,
                               cached_segments=cached, write_buffer_bytes=buffer, fsync="never",
                               flush_ms=None, initial_offset=initial)
            note(f"open {self.config}")
            self.log = self.pylog.Log(self.dir, **self.config)
            self.start = self.durable = initial

        @rule(value=_values, key=_keys)
        @precondition(lambda self: self.log is not None)
        def append(self, value: bytes, key: bytes | None) -> None:
            off = self.opened.append(value, key=key)
            note(f"append {len(value)} B key={key!r} -> {off}")
            assert off == self.next
            self.model.append((key, value))

        @rule(values=st.lists(_values, min_size=1, max_size=40), with_keys=st.booleans(),
              in_place=st.booleans())
        @precondition(lambda self: self.log is not None)
        def append_batch(self, values: list[bytes], with_keys: bool, in_place: bool) -> None:
            import pylog.log as log_mod

            keys: list[bytes | None] | None = [b"k%d" % i for i in range(len(values))] if with_keys else None
            # in_place: frame the batch where it lies whatever its size (else only big ones)
            saved = log_mod.IN_PLACE_MIN_BYTES
            log_mod.IN_PLACE_MIN_BYTES = 0 if in_place else saved
            try:
                first = self.opened.append_batch(values, keys=keys)
            finally:
                log_mod.IN_PLACE_MIN_BYTES = saved
            note(f"append_batch {len(values)} in_place={in_place} -> {first}")
            assert first == self.next
            self.model.extend(zip(keys or [None] * len(values), values))

        @rule(chunks=st.lists(st.binary(max_size=100), max_size=5), fail_at=st.none() | st.integers(0, 4))
        @precondition(lambda self: self.log is not None)
        def streaming_append(self, chunks: list[bytes], fail_at: int | None) -> None:
            def gen() -> Iterator[bytes]:
                for i, c in enumerate(chunks):
                    if fail_at is not None and i == fail_at:
                        raise KeyError("source failed")
                    yield c

            failing = fail_at is not None and fail_at < len(chunks)
            note(f"streaming append {len(chunks)} chunks fail_at={fail_at}")
            if failing:
                try:
                    self.opened.append(gen())
                except KeyError:
                    pass
                else:
                    raise AssertionError("the iterator's error was swallowed")
            else:
                assert self.opened.append(gen()) == self.next
                self.model.append((None, b"".join(chunks)))

        @rule(data=st.data())
        @precondition(lambda self: self.log is not None and self.model)
        def read(self, data: Any) -> None:
            i = data.draw(st.integers(0, len(self.model) - 1))
            rec = self.opened.read(self.start + i)
            key, value = self.model[i]
            assert rec.offset == self.start + i
            assert _value(rec) == value
            assert (None if rec.key is None else bytes(rec.key)) == key

        @rule(data=st.data(), max_bytes=st.integers(0, 5000), max_records=st.none() | st.integers(1, 50))
        @precondition(lambda self: self.log is not None and self.model)
        def read_batch(self, data: Any, max_bytes: int, max_records: int | None) -> None:
            i = data.draw(st.integers(0, len(self.model) - 1))
            recs = self.opened.read_batch(self.start + i, max_bytes=max_bytes, max_records=max_records)
            assert recs, "a fetch below next_offset returns at least one record"
            if max_records is not None:
                assert len(recs) <= max_records
            for j, rec in enumerate(recs):
                assert rec.offset == self.start + i + j
                assert _value(rec) == self.model[i + j][1]

        @rule(data=st.data())
        @precondition(lambda self: self.log is not None)
        def scan(self, data: Any) -> None:
            a = data.draw(st.integers(self.start, self.next))
            b = data.draw(st.integers(a, self.next))
            got = [(r.offset, _value(r)) for r in self.opened.scan(a, b)]
            assert got == [(a + j, self.model[a - self.start + j][1]) for j in range(b - a)]

        @rule()
        @precondition(lambda self: self.log is not None)
        def roll(self) -> None:
            self.opened.roll()
            self.durable = self.next if self.model else self.durable

        @rule()
        @precondition(lambda self: self.log is not None)
        def flush(self) -> None:
            self.opened.flush()
            self.durable = self.next

        @rule(data=st.data())
        @precondition(lambda self: self.log is not None)
        def truncate(self, data: Any) -> None:
            off = data.draw(st.integers(self.start, self.next))
            note(f"truncate {off}")
            self.opened.truncate(off)
            del self.model[off - self.start:]
            self.durable = min(self.durable, off)

        @rule(segment_bytes=st.none() | st.sampled_from([4096, 16384]))
        @precondition(lambda self: self.log is not None)
        def reopen(self, segment_bytes: int | None) -> None:
            self.opened.close()
            kw: dict[str, Any] = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
            note(f"reopen {kw}")
            self.log = self.pylog.Log(self.dir, **kw)
            self.durable = self.next

        @rule(keep=st.integers(0, 20000))
        @precondition(lambda self: self.log is not None)
        def retention(self, keep: int) -> None:
            self.opened.close()
            self.log = self.pylog.Log(self.dir, retention_bytes=keep)
            self.log.enforce_retention()
            new_start = self.log.start_offset
            note(f"retention_bytes={keep}: start {self.start} -> {new_start}")
            assert self.start <= new_start <= self.next
            del self.model[: new_start - self.start]
            self.start = new_start
            self.durable = self.next
            assert self.log.size_bytes >= 0

        @rule(mode=st.sampled_from(["cut", "zero", "garbage"]), data=st.data())
        @precondition(lambda self: self.log is not None)
        def crash(self, mode: str, data: Any) -> None:
            log = self.opened
            active = log._active
            active.write_pending()  # what reached the OS may survive; the buffer may not
            written = active.written
            dpos = written
            if self.durable < active.next_offset:
                if self.durable <= active.base_offset:
                    dpos = 32
                else:
                    dpos = active.find(self.durable)[1][0]
            simulate_crash(log)
            self.log = None
            path = active.store_path
            size = os.path.getsize(path)
            if mode == "cut" and size > dpos:
                cut = data.draw(st.integers(dpos, size))
                os.truncate(path, cut)
            elif mode == "zero" and size > dpos:
                a = data.draw(st.integers(dpos, size))
                with open(path, "r+b") as f:
                    f.seek(a)
                    f.write(bytes(min(512, size - a)))
            elif mode == "garbage":
                with open(path, "ab") as f:
                    f.write(data.draw(st.binary(min_size=1, max_size=64)))
            note(f"crash {mode}: durable={self.durable} dpos={dpos} size={size}")
            self.log = self.pylog.Log(self.dir)
            # A power cut loses unsynced pages in any order: a zeroed block past every
            # flushed record, even with whole frames after it, is a torn write, cut silently
            assert self.log.recovery_report == [], self.log.recovery_report
            assert self.log.verify() == []
            n = self.log.next_offset
            assert self.durable <= n <= self.next, (self.durable, n, self.next)
            del self.model[n - self.start:]
            self.durable = n

        @invariant()
        def offsets_agree(self) -> None:
            if self.log is not None:
                assert self.log.next_offset == self.next
                assert self.log.start_offset == self.start
                assert len(self.log) == len(self.model)
