"""Frame encode and scan in the C core (and its pure-Python twin), below the Log.

* ``FrameEncode``: frame 1,000 records into a write buffer, one ``frame_batch`` C call or
  1,000 ``frame`` calls (what ``append`` does per record). ``FrameInPlace``: the same in
  a buffer the records were laid out in (``frame_in_place``: what a big ``append_batch``
  does).
* ``FrameScan``: decode and CRC-check 1,000 frames (``scan``: what ``read_batch`` and
  ``scan`` do), and walk + validate + index them (``recover``: what reopen after a crash and
  ``verify()`` do).
"""
from __future__ import annotations

import numpy as np

from pylog import _pure
from pylog import format as fmt
from pylog._backend import impl

from .common import make_values, setup  # noqa: F401

N = 1000
TS = 1_700_000_000_000


def _backend(name: str):
    if name == "native":
        if impl.NAME != "native":
            raise NotImplementedError("the C core is not built")
        return impl
    return _pure


def _appender(mod, buffer_bytes: int, position: int = fmt.FILE_HEADER_SIZE, interval: int = 1 << 31):
    return mod.Appender(0, next_offset=0, position=position, max_position=(1 << 63), max_timestamp=None,
                        index_interval=interval, bytes_since_index=0, index_cap=1 << 16,
                        buffer_bytes=buffer_bytes)


def _framed(mod, values: list[bytes]) -> bytes:
    app = _appender(mod, sum(map(len, values)) + fmt.FRAME_HEADER_SIZE * len(values))
    lens = np.array([len(v) for v in values], dtype=np.uint32)
    rc, k = app.frame_batch(b"".join(values), lens, None, None, None, None, None, TS)
    assert rc == mod.OK and k == len(values), (rc, k)
    return mod.header_encode(fmt.STORE_MAGIC, 0) + bytes(app.pending())


class FrameEncode:
    params = ([16, 100, 1024], ["native", "pure"])
    param_names = ["value_size", "backend"]

    def setup(self, value_size: int, backend: str) -> None:
        mod = self.mod = _backend(backend)
        self.values = make_values(N, value_size)
        self.joined = b"".join(self.values)
        self.lens = np.full(N, value_size, dtype=np.uint32)
        self.app = _appender(mod, N * (value_size + fmt.FRAME_HEADER_SIZE))

    def time_frame_batch(self, value_size: int, backend: str) -> None:
        app = self.app
        app.frame_batch(self.joined, self.lens, None, None, None, None, None, TS)
        app.drain()

    def time_frame_one_by_one(self, value_size: int, backend: str) -> None:
        app = self.app
        frame = app.frame
        for v in self.values:
            frame(v, None, None, 3, TS)
        app.drain()


class FrameInPlace:
    """``frame_in_place``: the 1,000 records already laid out as frames (a header-sized gap
    before each), their headers and CRCs filled in where they lie."""

    params = FrameEncode.params
    param_names = FrameEncode.param_names

    def setup(self, value_size: int, backend: str) -> None:
        mod = _backend(backend)
        if not hasattr(mod.Appender, "frame_in_place"):
            raise NotImplementedError("no in-place framing in this commit")
        values = make_values(N, value_size)
        gap = bytes(fmt.FRAME_HEADER_SIZE)
        self.laid = bytearray(b"".join(gap + v for v in values))
        self.lens = np.full(N, value_size, dtype=np.uint32)
        self.app = _appender(mod, 0)
        rc, k, _ = self.app.frame_in_place(self.laid, self.lens, None, None, None, TS)
        assert rc == mod.OK and k == N, f"frame_in_place returned {rc} after {k} records"

    def time_frame_in_place(self, value_size: int, backend: str) -> None:
        self.app.frame_in_place(self.laid, self.lens, None, None, None, TS)


class FrameScan:
    params = ([16, 100, 1024], ["native", "pure"])
    param_names = ["value_size", "backend"]

    def setup(self, value_size: int, backend: str) -> None:
        mod = self.mod = _backend(backend)
        self.data = _framed(mod, make_values(N, value_size))
        self.buf = mod.Buffer(self.data)

    def time_scan(self, value_size: int, backend: str) -> None:
        rc, frames, _end = self.mod.scan(self.buf, len(self.data), fmt.FILE_HEADER_SIZE, 0, N, 1 << 62)

    def time_recover(self, value_size: int, backend: str) -> None:
        app = _appender(self.mod, 0, interval=4096)
        app.recover(self.buf, len(self.data))


class VerifyThroughput:
    """C walk + CRC check of a 16 MiB buffer of 1 KiB frames (bytes/s = 16 MiB / time)."""

    def setup(self) -> None:
        if impl.NAME != "native":
            raise NotImplementedError("the C core is not built")
        self.data = _framed(impl, make_values(16 * 1024 * 1024 // 1060, 1024))
        self.buf = impl.Buffer(self.data)

    def time_recover_16mib(self) -> None:
        app = _appender(impl, 0, interval=4096)
        app.recover(self.buf, len(self.data))

    def track_recover_gb_per_s(self) -> float:
        import time

        best = float("inf")
        for _ in range(5):
            app = _appender(impl, 0, interval=4096)
            t = time.perf_counter()
            app.recover(self.buf, len(self.data))
            best = min(best, time.perf_counter() - t)
        return len(self.data) / best / 1e9

    track_recover_gb_per_s.unit = "GB/s"
