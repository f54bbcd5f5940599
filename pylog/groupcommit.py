"""Group commit under ``fsync="always"``: the durable wait of an append, and its state.

Split out of pylog/appender.py; :class:`pylog.appender.LogAppending` inherits
:class:`LogGroupCommit`. Appenders frame their records into the write buffer and wait in
:meth:`LogGroupCommit._wait_durable`, where one of them at a time is the leader that writes
out and fdatasyncs for the whole group. With pylog._speedups, a group of one (one writer) is
led in C by ``Framer.append_durable`` in the same call that frames the record, reading and
changing the same state (:data:`GroupCommit`, one per log as ``Log._gc``).
"""
from __future__ import annotations

import time
from typing import Any

from pylog import vfs
from pylog._backend import speedups
from pylog.errors import LogFencedError
from pylog.logstate import LogState
from pylog.segment import ActiveSegment

_perf_counter = time.perf_counter
_GROUP_WAIT_MAX = 0.002  # seconds a group commit leader waits at most for its group to form

# Framer.append_durable: "always"'s common record, and the whole durable append of a group of
# one, in one C call (None: a build older than it, whose Framer serves "never" and "interval" only)
append_durable = getattr(getattr(speedups, "Framer", None), "append_durable", None)
if append_durable is not None:
    speedups.set_durable_vfs(vfs, vfs.pwrite, vfs.fdatasync)


class _PyGroupCommit:
    """A log's group commit state under ``fsync="always"`` (see
    :meth:`LogGroupCommit._wait_durable`), read and changed under the log's ``_sync_lock``:
    pylog._speedups.GroupCommit where ``Framer.append_durable`` is there (it reads the state
    from its C struct), else this twin."""

    __slots__ = ("syncing", "waiting", "arrived", "target", "durable_next", "sync_fd", "orphan",
                 "sync_seg", "sync_framer", "wake")

    def __init__(self) -> None:
        self.syncing = False  # a leader writes out and fdatasyncs
        self.waiting = 0  # followers waiting on the log's _sync_cv
        self.arrived = 0  # appenders arrived since the last write-out
        self.target = 1  # the last group's size: the next leader waits for that many
        self.durable_next = 0  # every offset below it is durable
        self.sync_fd = -1  # the leader's dup of sync_seg's store (see _new_sync_fd), -1 when none
        self.orphan = False  # the log closed while a leader used sync_fd: that leader closes it
        self.sync_seg: ActiveSegment | None = None  # the segment sync_fd belongs to
        self.sync_framer: Any = None  # that segment's Framer, if it has one
        self.wake: Any = None  # the log's _sync_cv.notify_all


GroupCommit: Any = speedups.GroupCommit if append_durable is not None else _PyGroupCommit


class LogGroupCommit(LogState):
    """The group commit of a Log under ``fsync="always"`` (mixed into
    :class:`pylog.appender.LogAppending`): the durable wait, its leader's descriptor, and the
    step-down after a failure of the C leader."""

    def _wait_durable(self, offset: int) -> None:
        """Group commit: return once ``offset`` is fsynced, sharing fsyncs among threads.

        Appenders frame their records into the write buffer (under ``_lock``) and wait here.
        One of them at a time is the leader: it writes out everything framed so far with
        one ``pwrite``, notes how far that goes, and fdatasyncs with no lock held, so the
        next group frames its records meanwhile; then it moves ``_gc.durable_next`` and wakes
        the waiters, whose records that fdatasync covered. Before it writes out, a leader
        lets the group form: it waits (at most about one fdatasync's time) until as many
        appenders have arrived since the last write-out as the last group had, so with N
        threads each fdatasync covers about N records instead of alternating between one
        record and N - 1. One writer (a group of one) never waits.
        """
        cv = self._sync_cv
        lk = self._sync_lock  # cv's lock: entered directly where nothing waits or wakes (no Python frames)
        gc = self._gc
        lead = ok = False
        goal = group = 0
        try:
            with lk:
                gc.arrived += 1
                if self._gc_gathering and gc.arrived >= gc.target:
                    self._gc_lead.notify()
                while gc.durable_next <= offset:
                    if self._fenced is not None:
                        raise LogFencedError(f"log {self.path}: fsync failed ({self._fenced}); reopen it")
                    if not gc.syncing:
                        gc.syncing = lead = True
                        break
                    gc.waiting += 1
                    try:
                        cv.wait()
                    finally:
                        gc.waiting -= 1
                else:
                    return
                if gc.arrived < gc.target:  # let the group form
                    self._gc_gathering = True
                    try:
                        self._gc_lead.wait_for(self._gc_formed, self._gc_wait)
                    finally:
                        self._gc_gathering = False
            with self._lock:
                w = self._writable  # the active segment while appends may go to it, else None
                self._write_out(w if w is not None else self._check_writable())  # raises: closed, fenced
                seg = self._active  # after the write-out: it may have rolled (see _flush_locked)
                goal = seg.written_next
                fd = gc.sync_fd if gc.sync_seg is seg else self._new_sync_fd(seg)
                with lk:
                    group, gc.arrived = gc.arrived, 0
            t = _perf_counter() if group > 1 else 0.0
            try:
                vfs.fdatasync(fd)
            except OSError as e:
                self._fence(e)
                raise
            if group > 1:
                # the next leader waits at most about one fdatasync for its group to form
                # (timed for groups only: after a group of one, the next leader waits for none)
                self._gc_wait = min(_perf_counter() - t, _GROUP_WAIT_MAX)
            ok = True
        finally:
            if lead:
                with lk:
                    gc.syncing = False
                    if gc.orphan:  # the log closed during the fdatasync: the leader closes its fd
                        self._drop_sync_fd()
                    if ok:
                        gc.target = group if group > 1 else 1
                        if goal > gc.durable_next:
                            gc.durable_next = goal
                    if gc.waiting:  # one writer: no one to wake
                        cv.notify_all()

    def _durable_failed(self, e: BaseException) -> None:
        """Framer.append_durable's write-out or fdatasync failed while it led a group of one
        (it calls this, then raises ``e``): fence the log and step down, as the leader in
        :meth:`_wait_durable` does on a failure; whoever arrived meanwhile wakes to the fence."""
        try:
            with self._lock:
                if self._fenced is None:
                    self._fence(e)
        finally:
            gc = self._gc
            with self._sync_lock:
                gc.syncing = False
                if gc.orphan:  # the log closed during the fdatasync: the leader closes its fd
                    self._drop_sync_fd()
                if gc.waiting:
                    self._sync_cv.notify_all()

    def _gc_formed(self) -> bool:
        return self._gc.arrived >= self._gc.target or self._fenced is not None

    def _new_sync_fd(self, seg: ActiveSegment) -> int:
        """The group commit leader's own descriptor of ``seg``'s store (a dup, so a roll or
        a close that closes the store's descriptor never leaves the leader's fdatasync with
        a closed or reused number); made once per active segment, used by one leader at a
        time, closed when the next segment's is made or by :meth:`_close_sync_fd`."""
        fd = vfs.dup(seg.store_fd)
        self._drop_sync_fd()
        gc = self._gc
        gc.sync_fd, gc.sync_seg = fd, seg
        # Framer.append_durable leads a group of one only with its own segment's descriptor
        gc.sync_framer = getattr(seg.app, "_framer", None)
        return fd

    def _drop_sync_fd(self) -> None:
        gc = self._gc
        fd = gc.sync_fd
        gc.sync_fd, gc.sync_seg, gc.sync_framer, gc.orphan = -1, None, None, False
        if fd >= 0:
            try:
                vfs.close(fd)
            except OSError:
                pass

    def _close_sync_fd(self) -> None:
        """At close: close the leader's descriptor now, or, while a leader fdatasyncs with
        it, let that leader close it when it is done."""
        with self._sync_cv:
            if self._gc.syncing:
                self._gc.orphan = True
            else:
                self._drop_sync_fd()
