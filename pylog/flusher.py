"""One background thread that serves every open log's ``flush_ms`` timer, and an
``atexit`` hook that hands buffered appends to the OS when the interpreter exits.

A process forked from one with open logs (``os.fork``, ``multiprocessing``'s "fork") starts
its own thread when it opens a log, and fences the logs it inherited: their lock, write
buffer and files belong to the parent, so a child that appended through them would
overwrite the parent's records (appends "acknowledged" in neither process)."""
from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Protocol


class _Flushable(Protocol):
    def _timer_flush(self, now_ms: int) -> None: ...
    def write_out(self) -> None: ...
    def _forked(self) -> None: ...


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


def _after_fork_in_child() -> None:
    """In a forked child: no flusher thread runs here (threads do not survive a fork), a
    parent thread may have held the lock, and the parent's logs are not this process's to
    write or flush: each is fenced (``Log._forked``) and forgotten."""
    global _lock, _thread
    _lock = threading.Lock()
    _thread = None
    inherited = list(_logs)
    _logs.clear()
    for log in inherited:
        try:
            log._forked()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
