"""One background thread that serves every open log's ``flush_ms`` timer, and an
``atexit`` hook that hands buffered appends to the OS when the interpreter exits."""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Protocol


class _Flushable(Protocol):
    def _timer_flush(self, now_ms: int) -> None: ...
    def write_out(self) -> None: ...


_logs: weakref.WeakSet[_Flushable] = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None
_TICK = 0.05


def _run() -> None:
    while True:
        time.sleep(_TICK)
        now = time.time_ns() // 1_000_000
        for log in _snapshot():
            try:
                log._timer_flush(now)
            except Exception:  # a failed flush fences that log; the thread goes on
                pass


def _snapshot() -> list[_Flushable]:
    """The registered logs, copied under the lock: a WeakSet raises if another thread
    registers or unregisters a log while it is iterated (that killed this thread, and with
    it every log's ``flush_ms`` timer)."""
    with _lock:
        return list(_logs)


def register(log: _Flushable) -> None:
    global _thread
    with _lock:
        _logs.add(log)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="pylog-flusher", daemon=True)
            _thread.start()


def unregister(log: _Flushable) -> None:
    with _lock:
        _logs.discard(log)


@atexit.register
def _at_exit() -> None:
    for log in _snapshot():
        try:
            log.write_out()
        except Exception:
            pass
