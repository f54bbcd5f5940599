"""The Redis Streams peer: a private ``redis-server`` (when the binary is on the PATH) and the
``redis`` client (from the ``bench`` extra)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING, Any

from pylog.bench.common import System, free_port, latencies

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np


class RedisSystem(System):
    """Redis Streams on a private ``redis-server`` (127.0.0.1, free port, temp dir, no
    persistence): XADD per record (one round trip each), pipelined XADD per 1,000, XRANGE
    scan in pages of 10,000, XRANGE of one id per random read. Held in RAM: its bytes per
    record is ``used_memory`` growth."""

    name = "redis streams"
    batch_name = "pipelined XADD/1000"
    disk_note = "RAM"

    def __init__(self, quick: bool) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: str | None = None
        self.client: Any = None  # a redis.Redis while started
        self.each_cap = 2_000 if quick else 20_000
        self.batch_cap = 10_000 if quick else 200_000
        self.read_cap = 500 if quick else 5_000
        self.ids: dict[str, list[Any]] = {}
        self.mem: dict[str, float] = {}
        self.counter = 0

    def available(self) -> str | None:
        if shutil.which("redis-server") is None:
            return "no redis-server binary"
        try:
            import redis  # noqa: F401
        except ImportError:
            return "the redis client is not installed (pip install redis)"
        return None

    def start(self) -> None:
        import redis

        self.tmp = tempfile.mkdtemp(prefix="pylog-redis-")
        port = free_port()
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port", str(port),
             "--dir", self.tmp, "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _stream(self, path: str) -> str:
        return "s:" + path

    def _used(self) -> float:
        return float(self.client.info("memory")["used_memory"])

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        r, s = self.client, self._stream(path)
        r.delete(s)
        xadd = r.xadd
        t = time.perf_counter()
        for v in values:
            xadd(s, {"v": v})
        return time.perf_counter() - t

    def write_batches(self, path: str, batches: Sequence[Sequence[bytes]]) -> float:
        r, s = self.client, self._stream(path)
        r.delete(s)
        before = self._used()
        ids: list[Any] = []
        t = time.perf_counter()
        for b in batches:
            p = r.pipeline(transaction=False)
            for v in b:
                p.xadd(s, {"v": v})
            ids.extend(p.execute())
        dt = time.perf_counter() - t
        self.ids[path] = ids
        self.mem[path] = self._used() - before
        return dt

    def scan(self, path: str, n: int) -> float:
        r, s = self.client, self._stream(path)
        t = time.perf_counter()
        c = 0
        start = "-"
        while True:
            page = r.xrange(s, min=start, max="+", count=10_000)
            if not page:
                break
            for _id, fields in page:
                c += len(fields[b"v"])
            start = b"(" + page[-1][0]
        return time.perf_counter() - t

    def read_latencies(self, path: str, idx: Sequence[int], overhead: float) -> np.ndarray:
        r, s = self.client, self._stream(path)
        ids = self.ids[path]
        ks = [ids[i] for i in idx if i < len(ids)]

        def get(k: Any) -> Any:
            return r.xrange(s, min=k, max=k)

        for k in ks[:200]:
            get(k)
        return latencies(get, ks, overhead)

    def disk(self, path: str) -> float:
        return self.mem.get(path, float("nan"))
