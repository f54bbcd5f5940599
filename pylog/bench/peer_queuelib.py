"""The queuelib peer (``FifoDiskQueue``, from the ``bench`` extra)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from pylog.bench.common import System

if TYPE_CHECKING:
    from collections.abc import Sequence


class QueuelibSystem(System):
    """queuelib.FifoDiskQueue: push per record; the scan pops everything (no batch API,
    no random read)."""

    name = "queuelib"
    can_batch = False
    can_read = False

    def available(self) -> str | None:
        try:
            import queuelib  # noqa: F401
        except ImportError:
            return "the queuelib package is not installed"
        return None

    def write_each(self, path: str, values: Sequence[bytes]) -> float:
        from queuelib import FifoDiskQueue

        os.makedirs(os.path.dirname(path), exist_ok=True)
        q = FifoDiskQueue(path)
        push = q.push
        t = time.perf_counter()
        for v in values:
            push(v)
        dt = time.perf_counter() - t
        q.close()
        return dt

    def scan(self, path: str, n: int) -> float:
        from queuelib import FifoDiskQueue

        q = FifoDiskQueue(path)
        pop = q.pop
        t = time.perf_counter()
        c = 0
        while True:
            v = pop()
            if v is None:
                break
            c += len(v)
        dt = time.perf_counter() - t
        q.close()
        return dt
