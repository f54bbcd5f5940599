"""CRC32C: pylog's C core vs its pure-Python twin vs the ``crc32c`` package.

``pylog`` is the dispatcher's choice; ``pylog_clmul`` the x86-64 folding path (VPCLMULQDQ
fused with crc32 instructions), ``pylog_hw`` the crc32 instructions alone.

``Crc``: one call over a buffer of each size (throughput and call overhead). ``CrcBatch``:
CRCs of ``count`` records of 100 B in one buffer: one ``crc32c_batch`` C call vs a Python
loop of single calls (pylog, or the ``crc32c`` package).
"""
from __future__ import annotations

import numpy as np

from pylog import _pure
from pylog._backend import impl

from .common import optional, setup  # noqa: F401

SIZES = [64, 1024, 65536, 1 << 20]
IMPLS = ["pylog", "pylog_clmul", "pylog_hw", "pylog_portable", "pure", "crc32c_pkg"]


def _data(n: int) -> bytes:
    return np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes()


class Crc:
    params = (SIZES, IMPLS)
    param_names = ["size", "impl"]

    def setup(self, size: int, which: str) -> None:
        self.data = _data(size)
        if which == "pylog":
            self.fn = impl.crc32c
        elif which == "pylog_clmul":
            if impl.NAME != "native" or not impl.crc_clmul_available():
                raise NotImplementedError("no carry-less multiply (VPCLMULQDQ) CRC32C path here")
            self.fn = impl.crc32c_clmul
        elif which == "pylog_hw":
            if impl.NAME != "native" or not impl.crc_hw_available():
                raise NotImplementedError("no hardware CRC32C here")
            self.fn = impl.crc32c_hw
        elif which == "pylog_portable":
            self.fn = impl.crc32c_portable
        elif which == "pure":
            if size > 65536:
                raise NotImplementedError("pure Python CRC of 1 MiB takes too long to repeat")
            self.fn = _pure.crc32c
        else:
            self.fn = optional("crc32c").crc32c

    def time_crc32c(self, size: int, which: str) -> None:
        self.fn(self.data)


class CrcBatch:
    params = ([1, 100, 10000], ["pylog_batch", "pylog_loop", "crc32c_pkg_loop"])
    param_names = ["count", "impl"]

    def setup(self, count: int, which: str) -> None:
        self.buf = _data(100 * count)
        self.positions = np.arange(count, dtype=np.uint64) * 100
        self.lengths = np.full(count, 100, dtype=np.uint32)
        self.views = [memoryview(self.buf)[i * 100 : (i + 1) * 100] for i in range(count)]
        if which == "crc32c_pkg_loop":
            self.fn = optional("crc32c").crc32c
        else:
            self.fn = impl.crc32c

    def time_crc32c_batch(self, count: int, which: str) -> None:
        if which == "pylog_batch":
            impl.crc32c_batch(self.buf, self.positions, self.lengths)
        else:
            fn = self.fn
            for v in self.views:
                fn(v)
