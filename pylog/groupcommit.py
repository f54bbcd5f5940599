"""Group commit under ``fsync="always"``: the durable wait of an append, and its state.

Split out of pylog/appender.py; :class:`pylog.appender.LogAppending` inherits
:class:`LogGroupCommit`. Appenders frame their records into the write buffer and wait in
:meth:`LogGroupCommit._wait_durable`, where one of them at a time is the leader that writes
out and fdatasyncs for the whole group. With pylog._speedups the group commit is C
(:data:`GroupCommit`, one per log as ``Log._gc``), and the common record's whole durable
append, follower or leader, is ``Framer.append_durable``, in the same call that frames it.
"""
from __future__ import annotations

import errno
import threading
import time
from typing import Any

from pylog import vfs
from pylog._backend import speedups
from pylog.errors import LogFencedError
from pylog.logstate import LogState
from pylog.segment import ActiveSegment

_perf_counter = time.perf_counter
_GROUP_WAIT_MAX = 0.002  # seconds a leader waits at most for its group to form
# what GroupCommit.arrive says (csrc/groupcommit.h's GC_*): the record is durable; the
# caller leads; the log is fenced
GC_DURABLE, GC_LEAD, GC_FENCED = 0, 1, 2

# Framer.append_durable: "always"'s common record, framed, waited for or led, in one C call
# (None: a build older than it, whose Framer serves "never" and "interval" only)
append_durable = getattr(getattr(speedups, "Framer", None), "append_durable", None)
if append_durable is not None:
    speedups.set_durable_vfs(vfs, vfs.pwrite, vfs.fdatasync)
    # timed syncs (the broker's fsync metric): the C path stays, and reports its fdatasyncs
    if hasattr(speedups, "set_sync_observer"):
        vfs.on_timed_syncs(speedups.set_sync_observer)


class _PyGroupCommit:
    """A log's group commit under ``fsync="always"``, its state and its waits, in Python:
    pylog._speedups.GroupCommit (csrc/speedups_groupcommit.c, whose followers wait with the
    GIL released and which ``Framer.append_durable`` drives from C) where the extension is
    there, else this twin, method for method. :meth:`LogGroupCommit._wait_durable` says how
    they are used."""

    __slots__ = ("syncing", "waiting", "arrived", "target", "fenced", "gathering", "durable_next",
                 "wait_ns", "wait_max", "syncs", "epoch", "lead_epoch", "leader", "sync_fd", "orphan",
                 "sync_seg", "sync_framer", "_lock", "_done", "_formed")

    def __init__(self) -> None:
        self.syncing = False  # a leader writes out and fdatasyncs
        self.waiting = 0  # followers waiting on _done
        self.arrived = 0  # appenders arrived since the last write-out (the forming group)
        self.target = 1  # the last group's size: the size at which a group has formed
        self.fenced = False  # the log is fenced: every wait ends
        self.durable_next = 0  # every offset below it is durable
        self.syncs = 0  # the fdatasyncs its leaders made (each covers a group)
        self.epoch = 0  # truncates (lower()) so far
        self.lead_epoch = 0  # the epoch when the leader wrote out (take_group)
        self.leader = 0  # the leading thread's ident, when syncing
        self.gathering = False  # the leader waits on _formed for its group
        self.wait_ns = 0  # how long a leader waits for its group (about one fdatasync)
        self.wait_max = _GROUP_WAIT_MAX  # the cap of wait_ns, seconds
        self.sync_fd = -1  # the leader's dup of sync_seg's store (see _new_sync_fd), -1 when none
        self.orphan = False  # the log closed while a leader used sync_fd: that leader closes it
        self.sync_seg: ActiveSegment | None = None  # the segment sync_fd belongs to
        self.sync_framer: Any = None  # that segment's Framer, if it has one
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)  # followers
        self._formed = threading.Condition(self._lock)  # the gathering leader

    def arrive(self, offset: int) -> int:
        """An appender whose record at ``offset`` is framed arrives, and waits while a leader
        writes out and fdatasyncs: GC_DURABLE (the record is durable), GC_LEAD (no leader:
        the caller leads now, then calls :meth:`gather`) or GC_FENCED."""
        with self._lock:
            self.arrived += 1
            if self.gathering and self.arrived >= self.target:
                self._formed.notify()
            while self.durable_next <= offset:
                if self.fenced:
                    return GC_FENCED
                if not self.syncing:
                    self.leader = threading.get_ident()  # first: abandon() knows it leads
                    self.syncing = True
                    return GC_LEAD
                self.waiting += 1
                try:
                    self._done.wait()
                finally:
                    self.waiting -= 1
            return GC_DURABLE

    def gather(self) -> None:
        """The leader lets its group form: it waits until as many appenders have arrived
        since the last write-out as the last group had (or a fence), at most ``wait_ns``."""
        with self._lock:
            if self.arrived >= self.target or self.wait_ns <= 0 or self.fenced:
                return
            self.gathering = True
            try:
                self._formed.wait_for(lambda: self.arrived >= self.target or self.fenced, self.wait_ns / 1e9)
            finally:
                self.gathering = False

    def take_group(self) -> int:
        """The leader, written out: the appenders arrived since the last write-out."""
        with self._lock:
            n, self.arrived = self.arrived, 0
            self.lead_epoch = self.epoch
            return n

    def step_down(self, ok: bool, goal: int, group: int, elapsed: float) -> int:
        """The leader steps down and wakes the followers; when ``ok``, every offset below
        ``goal`` is durable and ``group``/``elapsed`` set the next leader's wait. Returns the
        leader's descriptor if the log closed meanwhile (the caller closes it), else -1."""
        with self._lock:
            self.syncing = False
            fd = -1
            if self.orphan:
                fd = self.sync_fd
                self.sync_fd, self.sync_seg, self.sync_framer, self.orphan = -1, None, None, False
            if ok:
                self.syncs += 1
                self.target = group if group > 1 else 1
                # (not if a truncate came between the write-out and now: goal is from before it)
                if goal > self.durable_next and self.lead_epoch == self.epoch:
                    self.durable_next = goal
                if group > 1:  # the next leader waits at most this fdatasync's time for its group
                    self.wait_ns = int(max(0.0, min(elapsed, self.wait_max)) * 1e9)
            if self.waiting:
                self._done.notify_all()
            return fd

    def fence(self) -> None:
        """The log is fenced: every follower stops waiting."""
        with self._lock:
            self.fenced = True
            self._done.notify_all()
            self._formed.notify_all()

    def advance(self, n: int) -> None:
        """Every offset below ``n`` is durable (a flush, a roll, an open)."""
        with self._lock:
            if n > self.durable_next:
                self.durable_next = n
            if self.waiting:
                self._done.notify_all()

    def lower(self, n: int) -> None:
        """A truncate cut the log to ``n`` records."""
        with self._lock:
            if n < self.durable_next:
                self.durable_next = n
            self.epoch += 1  # a leader's goal from before it no longer counts

    def abandon(self) -> None:
        """The calling thread gave up leading before it wrote out (a signal handler's
        exception as :meth:`arrive` returned GC_LEAD): if it leads, it steps down."""
        with self._lock:
            mine = self.syncing and self.leader == threading.get_ident()
        if mine:
            fd = self.step_down(False, 0, 0, 0.0)
            if fd >= 0:
                LogGroupCommit._close_fd(fd)

    def close_fd(self) -> int:
        """At close: the leader's descriptor, forgotten, for the caller to close; -1 when
        there is none or while a leader fdatasyncs with it (its step_down hands it over)."""
        with self._lock:
            if self.syncing:
                self.orphan = True
                return -1
            fd = self.sync_fd
            self.sync_fd, self.sync_seg, self.sync_framer, self.orphan = -1, None, None, False
            return fd


GroupCommit: Any = speedups.GroupCommit if append_durable is not None else _PyGroupCommit


class LogGroupCommit(LogState):
    """The group commit of a Log under ``fsync="always"`` (mixed into
    :class:`pylog.appender.LogAppending`): the durable wait, its leader's descriptor, and the
    step-down after a failure of the C leader."""

    def _wait_durable(self, offset: int) -> None:
        """Group commit: return once ``offset`` is fsynced, sharing fsyncs among threads.

        Appenders frame their records into the write buffer (under ``_lock``) and arrive at
        the group commit (``_gc``), where they wait. One of them at a time is the leader: it
        writes out everything framed so far with one ``pwrite``, notes how far that goes,
        and fdatasyncs with no lock held, so the next group frames its records meanwhile;
        then it moves ``_gc.durable_next`` and wakes the waiters, whose records that
        fdatasync covered. Before it writes out, a leader lets the group form: it waits (at
        most about one fdatasync's time) until as many appenders have arrived since the last
        write-out as the last group had, so with N threads each fdatasync covers about N
        records instead of alternating between one record and N - 1. One writer (a group of
        one) never waits. ``Framer.append_durable`` does the
        same for the common record in C; this is the path of every other append, and of the
        pure backend.
        """
        gc = self._gc
        try:
            r = gc.arrive(offset)  # waits while a leader syncs (with the extension: the GIL released)
        except BaseException:
            # a signal handler's exception as arrive returned GC_LEAD would leave no one
            # leading, and every appender waiting for ever
            gc.abandon()
            raise
        if r == GC_DURABLE:
            return
        if r == GC_FENCED:
            if self._fenced is None:
                # the C leader fenced the group commit, and a signal handler's exception kept
                # _durable_failed from fencing the log's own state: fence it now
                with self._lock:
                    if self._fenced is None:
                        self._fence(OSError(errno.EIO, "a write or fdatasync of the group commit failed"))
            raise LogFencedError(f"log {self.path}: fsync failed ({self._fenced}); reopen it")
        ok = False
        goal = group = 0
        elapsed = 0.0
        try:
            gc.gather()  # let the group form
            with self._lock:
                w = self._writable  # the active segment while appends may go to it, else None
                self._write_out(w if w is not None else self._check_writable())  # raises: closed, fenced
                seg = self._active  # after the write-out: it may have rolled (see _flush_locked)
                goal = seg.written_next
                fd = gc.sync_fd if gc.sync_seg is seg else self._new_sync_fd(seg)
                group = gc.take_group()
            t = _perf_counter()
            try:
                vfs.fdatasync(fd)
            except OSError as e:
                gc.fence()  # first, in one call: no later leader acknowledges anything
                with self._lock:
                    if self._fenced is None:
                        self._fence(e)
                raise
            elapsed = _perf_counter() - t
            ok = True
        finally:
            # step_down is the first call here: a signal handler cannot come before it
            self._close_fd(gc.step_down(ok, goal, group, elapsed))

    def _durable_failed(self, e: BaseException) -> None:
        """Framer.append_durable's write-out or fdatasync failed while it led (it has fenced
        the group commit and stepped down already, in C; it calls this, then raises ``e``):
        fence the log's own state, as the leader in :meth:`_wait_durable` does."""
        with self._lock:
            if self._fenced is None:
                self._fence(e)

    def _new_sync_fd(self, seg: ActiveSegment) -> int:
        """The group commit leader's own descriptor of ``seg``'s store (a dup, so a roll or
        a close that closes the store's descriptor never leaves the leader's fdatasync with
        a closed or reused number); made once per active segment by the leader (no other
        thread touches it meanwhile), used by one leader at a time, closed when the next
        segment's is made or by :meth:`_close_sync_fd`."""
        fd = vfs.dup(seg.store_fd)
        gc = self._gc
        old = gc.sync_fd
        gc.sync_fd, gc.sync_seg = fd, seg
        # Framer.append_durable leads only with its own segment's descriptor
        gc.sync_framer = getattr(seg.app, "_framer", None)
        self._close_fd(old)
        return fd

    @staticmethod
    def _close_fd(fd: int) -> None:
        if fd >= 0:
            try:
                vfs.close(fd)
            except OSError:
                pass

    def _close_sync_fd(self) -> None:
        """At close: close the leader's descriptor now, or, while a leader fdatasyncs with
        it, let that leader close it when it is done."""
        self._close_fd(self._gc.close_fd())
