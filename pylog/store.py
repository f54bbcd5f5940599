"""The store file of a segment: a 32-byte header, then record frames back to back.

Written by pwrite at explicit positions (never O_APPEND, so a preallocated file works the
same); read through read-only maps that cover exactly the bytes known to be written, so a
scan can never touch a page past the end of the file.
"""
from __future__ import annotations

import mmap
import os

from pylog import fileutil, vfs
from pylog import format as fmt
from pylog._backend import impl


def create(path: str, base_offset: int, preallocate: int = 0) -> int:
    """Create a store file with its header; returns an O_RDWR fd. Replaces a stale file."""
    fd = vfs.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fileutil.pwrite_all(fd, impl.header_encode(fmt.STORE_MAGIC, base_offset), 0)
        if preallocate > fmt.FILE_HEADER_SIZE and vfs.posix_fallocate is not None:
            vfs.posix_fallocate(fd, 0, preallocate)
    except BaseException:
        vfs.close(fd)
        raise
    return fd


class StoreMap:
    """A read-only map of the first ``length`` bytes of a store file.

    ``mv`` is a memoryview of the map (record views are slices of it), ``buf`` the backend
    Buffer C reads. The map is unmapped when the last reference to it goes, which includes
    every record view handed out: closing never invalidates a view.
    """

    __slots__ = ("length", "mm", "mv", "buf", "addr")

    def __init__(self, fd: int, length: int) -> None:
        self.length = length
        self.mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ) if length else None
        self.mv = memoryview(self.mm) if self.mm is not None else memoryview(b"")
        self.buf = impl.Buffer(self.mm if self.mm is not None else b"")
        #: the map's address, for pylog._speedups (0 under the pure backend: no C reads it)
        self.addr: int = self.buf.addr
