"""Small durable-file helpers: atomic writes, directory fsync, safe truncation.

The rules (ALICE, OSDI'14): write a temp file, fsync it, rename it over the target, then
fsync the directory; a created or renamed file is durable only once its directory is.
"""
from __future__ import annotations

import errno
import fcntl
import os
from typing import TYPE_CHECKING

from pylog import format as fmt
from pylog import vfs

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


def fsync_dir(path: str) -> None:
    """fsync a directory, so entries created, renamed or deleted in it are durable."""
    fd = vfs.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        vfs.fsync(fd)
    finally:
        vfs.close(fd)


def write_all(fd: int, data: ReadableBuffer) -> None:
    """os.write until every byte is written (a short write is not an error)."""
    mv = memoryview(data).cast("B")
    while mv:
        n = vfs.write(fd, mv)
        mv = mv[n:]


def pwrite_all(fd: int, data: ReadableBuffer, position: int) -> None:
    mv = memoryview(data).cast("B")
    while mv:
        n = vfs.pwrite(fd, mv, position)
        mv = mv[n:]
        position += n


def data_end(fd: int, start: int, end: int, limit: int = 16 << 20) -> int:
    """Where the last non-zero byte of ``fd`` in ``[start, end)`` ends (``start`` if none).

    Holes, and the unwritten extents of preallocated space, are skipped with SEEK_DATA /
    SEEK_HOLE where the file system has them; then the zeros before the end of the last
    data extent are read back, at most ``limit`` bytes of them (past that, the end of that
    extent is returned, or ``end`` where SEEK_DATA is missing: too much to read to tell)."""
    last = end
    try:
        pos = last = start
        while pos < end:
            d = os.lseek(fd, pos, os.SEEK_DATA)
            if d >= end:
                break
            last = pos = min(os.lseek(fd, d, os.SEEK_HOLE), end)
    except OSError as e:  # ENXIO: no data after pos; anything else: no SEEK_DATA here
        if e.errno != errno.ENXIO:
            last = end
    hi, read = last, 0
    while hi > start:
        lo = max(start, hi - (1 << 20))
        n = len(os.pread(fd, hi - lo, lo).rstrip(b"\0"))
        if n:
            return lo + n
        read += hi - lo
        if read >= limit:
            return last
        hi = lo
    return start


def read_if_exists(path: str) -> bytes | None:
    """The whole of the small file at ``path`` (a marker or a JSON record), or None when
    there is none."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def atomic_write(path: str, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    tmp = path + fmt.TEMP_SUFFIX
    fd = vfs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if sync:
            vfs.fsync(fd)
    finally:
        vfs.close(fd)
    vfs.replace(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def copy_range(src: int, dst: int, size: int, name: str) -> None:
    """Copy the first ``size`` bytes of ``src`` to the same place in ``dst``: in the kernel
    with ``copy_file_range`` where the file system allows it, else through ``pread`` and
    :func:`vfs.pwrite` (always, while a fault-injection layer is installed: it must see
    every write)."""
    done = 0
    kernel = hasattr(os, "copy_file_range") and vfs.pwrite is os.pwrite
    while done < size:
        if kernel:
            try:
                n = os.copy_file_range(src, dst, min(64 << 20, size - done), done, done)
            except OSError as e:
                # not across file systems, not by this kernel or file system, or blocked
                # (a container's seccomp filter answers EPERM)
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                    raise
                n = 0
            if not n:  # refused, or nothing copied: the plain path decides (and says why)
                kernel = False
                continue
        else:
            chunk = os.pread(src, min(4 << 20, size - done), done)
            if chunk:
                pwrite_all(dst, chunk, done)
            n = len(chunk)
        if not n:
            raise OSError(errno.EIO, f"{name} is shorter than {size} bytes")
        done += n


def shrink_file(path: str, size: int, *, copy: bool) -> None:
    """Cut ``path`` to ``size`` bytes, durably.

    With ``copy`` (a map of the file may be alive, here or in another process), the kept
    prefix is written to a new file renamed over the old one: the old inode, and every map
    of it, stays whole, so no live view can fault (a map past a shrunk file's end raises
    SIGBUS). This needs free space for the kept part; a failed copy removes its temp
    file. Without ``copy`` the file is cut in place: only for a file no process can have
    mapped past ``size``.
    """
    if not copy:
        fd = vfs.open(path, os.O_RDWR)
        try:
            vfs.ftruncate(fd, size)
            vfs.fsync(fd)
        finally:
            vfs.close(fd)
        return
    tmp = path + fmt.TEMP_SUFFIX
    src = vfs.open(path, os.O_RDONLY)
    try:
        dst = vfs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            copy_range(src, dst, size, path)
            vfs.fsync(dst)
        except BaseException:
            try:  # a full disk must not stay fuller by a partial copy
                vfs.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            vfs.close(dst)
    finally:
        vfs.close(src)
    vfs.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def flock_held(lock_path: str) -> bool | None:
    """Whether another open file description holds an flock on ``lock_path``: True if one
    does, False if none does, None if the file does not exist. The probe takes the lock
    (non-blocking) on a descriptor of its own and lets it go at once."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


#: a topic directory's metadata file and a data root's lock (pylog.topicmeta.TOPIC_FILE and
#: pylog.topics.STORE_LOCK: named here, below the topic layer, for :func:`dir_kind`)
TOPIC_FILE = "topic.json"
STORE_LOCK = ".store.lock"


def dir_kind(path: str) -> str | None:
    """What directory ``path`` is: ``"log"`` (a Log's segment files), ``"topic"`` (a topic.json),
    ``"store"`` (a LogStore's data root: its lock, or a topic directory in it), or None
    (nothing of pylog's; missing; not a directory). Lets Log and LogStore refuse to write
    their files into a directory of another kind."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return None
    if TOPIC_FILE in names:
        return "topic"
    if any(fmt.parse_segment_name(n, fmt.STORE_SUFFIX) is not None for n in names):
        return "log"
    if STORE_LOCK in names or any(os.path.isfile(os.path.join(path, n, TOPIC_FILE)) for n in names):
        return "store"
    return None
