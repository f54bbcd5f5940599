"""Index files: the sparse offset index (``.index``) and the time index (``.timeindex``).

Both are a 32-byte header followed by fixed-size little-endian entries (see
docs/format.md). An index is a hint: pylog rebuilds it from the store whenever it is
missing, short, torn or inconsistent, so nothing here raises on bad content; it reports.
Sealed index files have exactly ``32 + n * entry_size`` bytes.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from pylog import fileutil, vfs
from pylog import format as fmt
from pylog._backend import impl

KINDS = {
    fmt.INDEX_SUFFIX: (fmt.INDEX_MAGIC, fmt.INDEX_ENTRY_SIZE, fmt.INDEX_DTYPE),
    fmt.TIMEINDEX_SUFFIX: (fmt.TIMEINDEX_MAGIC, fmt.TIMEINDEX_ENTRY_SIZE, fmt.TIMEINDEX_DTYPE),
}


def create(path: str, suffix: str, base_offset: int) -> int:
    """Create an empty index file (header only); returns an O_RDWR fd."""
    magic = KINDS[suffix][0]
    fd = vfs.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fileutil.pwrite_all(fd, impl.header_encode(magic, base_offset), 0)
    except BaseException:
        vfs.close(fd)
        raise
    return fd


def write(path: str, suffix: str, base_offset: int, entries: bytes) -> None:
    """Replace an index file atomically with these raw entries."""
    magic = KINDS[suffix][0]
    fileutil.atomic_write(path, impl.header_encode(magic, base_offset) + entries)


def in_memory(suffix: str, base_offset: int, entries: bytes) -> MappedIndex:
    """An index held in anonymous memory, never written to a file (a read-only log's
    rebuilt index: a reader changes nothing on disk)."""
    magic, esize, dtype = KINDS[suffix]
    n = len(entries) // esize
    if not n:
        return MappedIndex(None, 0, dtype)
    data = impl.header_encode(magic, base_offset) + bytes(entries)
    mm = mmap.mmap(-1, len(data))
    mm.write(data)
    return MappedIndex(mm, n, dtype)


def read_entries(path: str, suffix: str, base_offset: int) -> bytes | None:
    """The raw entries of an index file, or None when the file is missing or its header or
    size is wrong (the caller rebuilds)."""
    magic, esize, _ = KINDS[suffix]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    rc, base, _flags = impl.header_check(data[: fmt.FILE_HEADER_SIZE], magic)
    if rc != impl.OK or base != base_offset:
        return None
    body = data[fmt.FILE_HEADER_SIZE :]
    if len(body) % esize:
        return None
    return body


def check(suffix: str, entries_buf: impl.Buffer, n: int, store_len: int) -> bool:
    """Whether n entries are strictly increasing and point inside the store."""
    fn = impl.index_check if suffix == fmt.INDEX_SUFFIX else impl.timeindex_check
    return fn(entries_buf, n, store_len) < 0


class MappedIndex:
    """A sealed index file, mapped read-only: ``buf`` for C, ``array`` a numpy view."""

    __slots__ = ("n", "mm", "buf", "array")

    def __init__(self, mm: mmap.mmap | None, n: int, dtype: np.dtype) -> None:
        self.n = n
        self.mm = mm
        if mm is None:
            self.buf = impl.Buffer(b"")
            self.array = np.empty(0, dtype=dtype)
        else:
            self.buf = impl.Buffer(mm, skip=fmt.FILE_HEADER_SIZE, size=n * dtype.itemsize)
            self.array = np.frombuffer(mm, dtype=dtype, count=n, offset=fmt.FILE_HEADER_SIZE)


def open_mapped(path: str, suffix: str, base_offset: int, store_len: int) -> MappedIndex | None:
    """Map a sealed index file and check it; None when it must be rebuilt."""
    magic, esize, dtype = KINDS[suffix]
    try:
        fd = vfs.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < fmt.FILE_HEADER_SIZE or (size - fmt.FILE_HEADER_SIZE) % esize:
            return None
        head = os.pread(fd, fmt.FILE_HEADER_SIZE, 0)
        rc, base, _flags = impl.header_check(head, magic)
        if rc != impl.OK or base != base_offset:
            return None
        n = (size - fmt.FILE_HEADER_SIZE) // esize
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if n else None
    finally:
        vfs.close(fd)
    idx = MappedIndex(mm, n, dtype)
    if n and not check(suffix, idx.buf, n, store_len):
        return None
    return idx


def agree(index_entries: np.ndarray, timeindex_entries: np.ndarray, count: int) -> bool:
    """Whether an offset index and a time index (numpy views of their entries) fit each other
    and a segment of ``count`` offsets: pylog writes both together, so the relative offset
    and position of every slot are the same in both, and the last relative offset lies
    inside the segment. Costs no read of the store."""
    n = len(index_entries)
    if n != len(timeindex_entries):
        return False
    if n == 0:
        return True
    if int(index_entries["relative_offset"][-1]) >= count:
        return False
    return bool((index_entries["relative_offset"] == timeindex_entries["relative_offset"]).all()
                and (index_entries["position"] == timeindex_entries["position"]).all())
