"""Appending: per record and in batches, by value size and fsync policy.

Each ``time_*`` call appends ``RECORDS_PER_CALL[value_size]`` records (1,000; 100 at 64 KiB),
so divide by that for the time per record. ``fsync="always"`` waits for the disk on every
call, so it has its own small classes.
"""
from __future__ import annotations

import threading

import pylog

from .common import RECORDS_PER_CALL, BaseIO, make_values, setup  # noqa: F401

SIZES = [16, 100, 1024, 65536]
BUFFERED = ["never", "interval"]


class AppendRecord(BaseIO):
    """``Log.append`` one record at a time."""

    params = (SIZES, BUFFERED)
    param_names = ["value_size", "fsync"]

    def setup(self, value_size: int, fsync: str) -> None:
        self.values = make_values(RECORDS_PER_CALL[value_size], value_size)
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync=fsync, segment_bytes=256 << 20))

    def time_append(self, value_size: int, fsync: str) -> None:
        append = self.log.append
        for v in self.values:
            append(v)


class AppendRecordPath(BaseIO):
    """``Log.append`` of 1,000 records of 100 B by the two ways it takes the common record:
    ``framer``, framed at once into the write buffer by pylog._speedups' ``Framer`` (one C
    call takes the lock, frames, releases it: the native backend's path since issue 16), or
    ``queue``, queued and framed in one C call per write buffer (the path without the
    extension, and the pure backend's)."""

    params = (["framer", "queue"], ["never", "interval"])
    param_names = ["path", "fsync"]

    def setup(self, path: str, fsync: str) -> None:
        self.values = make_values(1000, 100)
        log = self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync=fsync, segment_bytes=256 << 20))
        if path == "framer":
            if getattr(log, "_framer", None) is None:
                raise NotImplementedError("no pylog._speedups Framer in this build or commit")
        else:
            if hasattr(log, "_set_framer"):
                with log._lock:
                    log._set_framer(None)
                    log._queueing = True

    def time_append(self, path: str, fsync: str) -> None:
        append = self.log.append
        for v in self.values:
            append(v)


class AppendRecordKeyed(BaseIO):
    """``Log.append`` with a key and an explicit timestamp (what a producer passes)."""

    params = [100]
    param_names = ["value_size"]

    def setup(self, value_size: int) -> None:
        self.values = make_values(1000, value_size)
        self.keys = [b"key-%d" % (i % 97) for i in range(1000)]
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="never", segment_bytes=256 << 20))

    def time_append_keyed(self, value_size: int) -> None:
        append = self.log.append
        ts = 1_700_000_000_000
        for k, v in zip(self.keys, self.values):
            append(v, key=k, timestamp=ts)


class AppendBatch(BaseIO):
    """``Log.append_batch`` of ``RECORDS_PER_CALL`` records in one call."""

    params = (SIZES, BUFFERED)
    param_names = ["value_size", "fsync"]

    def setup(self, value_size: int, fsync: str) -> None:
        self.values = make_values(RECORDS_PER_CALL[value_size], value_size)
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync=fsync, segment_bytes=256 << 20))

    def time_append_batch(self, value_size: int, fsync: str) -> None:
        self.log.append_batch(self.values)


class AppendBatchPath(BaseIO):
    """``append_batch`` of 1,000 records by the path it takes: gathered (framed a chunk at
    a time in pylog._speedups' scratch and written with pwritev, large values from where
    they lie: what big batches of bytes values do with the extension), framed in place (laid
    out by one join, then written from there: big batches otherwise) or copied into the
    write buffer (what smaller ones do)."""

    params = ([100, 1024, 32768], ["gathered", "in_place", "copied"])
    param_names = ["value_size", "path"]

    def setup(self, value_size: int, path: str) -> None:
        import pylog.log

        if not hasattr(pylog.log, "IN_PLACE_MIN_BYTES"):
            raise NotImplementedError("no in-place batch framing in this commit")
        if path == "gathered" and getattr(pylog.log, "_c_bytes_only", None) is None:
            raise NotImplementedError("no gathered batch writes in this commit (or no pylog._speedups)")
        self.saved = pylog.log.IN_PLACE_MIN_BYTES, getattr(pylog.log, "_c_bytes_only", None)
        pylog.log.IN_PLACE_MIN_BYTES = 1 << 62 if path == "copied" else 0
        if path != "gathered":
            pylog.log._c_bytes_only = None
        self.values = make_values(1000 if value_size < 32768 else 100, value_size)
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="never", segment_bytes=256 << 20))

    def teardown(self, value_size: int, path: str) -> None:
        import pylog.log

        pylog.log.IN_PLACE_MIN_BYTES, pylog.log._c_bytes_only = self.saved
        super().teardown(value_size, path)

    def time_append_batch(self, value_size: int, path: str) -> None:
        self.log.append_batch(self.values)


class AppendBatchSizes(BaseIO):
    """``append_batch`` of 100 B records, by batch length (records per call)."""

    params = [1, 10, 100, 1000, 10000]
    param_names = ["batch"]

    def setup(self, batch: int) -> None:
        self.values = make_values(batch, 100)
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="never", segment_bytes=256 << 20))

    def time_append_batch(self, batch: int) -> None:
        self.log.append_batch(self.values)


class AppendDurable(BaseIO):
    """``fsync="always"``: 20 records per call, each durable before ``append`` returns."""

    params = [100, 1024]
    param_names = ["value_size"]
    number = 1
    repeat = (3, 10, 10.0)

    def setup(self, value_size: int) -> None:
        self.values = make_values(20, value_size)
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="always"))

    def time_append_always(self, value_size: int) -> None:
        append = self.log.append
        for v in self.values:
            append(v)

    def time_append_batch_always(self, value_size: int) -> None:
        self.log.append_batch(self.values)


class AppendDurablePath(BaseIO):
    """What a durable append costs besides the disk: ``fsync="always"``, 1,000 records of
    100 B, one writer, with ``pylog.vfs.fdatasync`` made a no-op for the call (the group
    commit leader's write-out, lock hand-offs and bookkeeping, and the ``pwrite``; since
    issue 16 the write-out is one C call, ``Framer.write_out``; a replaced fdatasync turns
    ``Framer.append_durable``'s C leader off, so this times the Python leader: see
    ``AppendDurableOneWriter``). The ``plain`` peer is the
    comparison benchmark's loop without its fdatasync (``os.write`` per record)."""

    params = ["pylog", "plain"]
    param_names = ["writer"]

    def setup(self, writer: str) -> None:
        import os

        self.values = make_values(1000, 100)
        if writer == "pylog":
            self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="always", segment_bytes=256 << 20))
        else:
            self.fd = os.open(os.path.join(self.tmpdir(), "plain"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def time_append_no_disk_wait(self, writer: str) -> None:
        import os

        from pylog import vfs

        if writer == "plain":
            write, fd = os.write, self.fd
            for v in self.values:
                write(fd, v)
            return
        real = vfs.fdatasync
        vfs.fdatasync = lambda fd: None
        try:
            append = self.log.append
            for v in self.values:
                append(v)
        finally:
            vfs.fdatasync = real

    def teardown(self, writer: str) -> None:
        import os

        if writer == "plain":
            os.close(self.fd)
        super().teardown(writer)


class AppendDurableOneWriter(BaseIO):
    """One durable writer with the real fdatasync: ``fsync="always"``, 200 records of 100 B.
    ``c``: the default, where ``Framer.append_durable`` leads each group of one in one C call
    (frame, write-out, fdatasync, durable_next moved; issue 16); ``python``: the same with
    ``pylog.vfs.fdatasync`` replaced by a wrapper of ``os.fdatasync``, which turns the C
    leader off (the group commit leader in ``_wait_durable``); ``plain``: the comparison
    benchmark's ``os.write`` + ``os.fdatasync`` loop. The disk's fdatasync is most of each
    figure: compare them within one run."""

    params = ["c", "python", "plain"]
    param_names = ["path"]
    number = 1
    repeat = (3, 10, 10.0)

    def setup(self, path: str) -> None:
        import os

        self.values = make_values(200, 100)
        if path == "plain":
            self.fd = os.open(os.path.join(self.tmpdir(), "plain"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        else:
            self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="always", segment_bytes=256 << 20))

    def time_append_durable(self, path: str) -> None:
        import os

        from pylog import vfs

        if path == "plain":
            write, sync, fd = os.write, os.fdatasync, self.fd
            for v in self.values:
                write(fd, v)
                sync(fd)
            return
        real = vfs.fdatasync
        if path == "python":
            vfs.fdatasync = lambda fd: real(fd)
        try:
            append = self.log.append
            for v in self.values:
                append(v)
        finally:
            vfs.fdatasync = real

    def teardown(self, path: str) -> None:
        import os

        if path == "plain":
            os.close(self.fd)
        super().teardown(path)


class AppendGroupCommit(BaseIO):
    """``fsync="always"`` with several threads appending at once: they share fsyncs
    (group commit). Each call: ``threads`` x 10 records."""

    params = [1, 4, 16]
    param_names = ["threads"]
    number = 1
    repeat = (3, 10, 10.0)

    def setup(self, threads: int) -> None:
        self.value = make_values(1, 100)[0]
        self.log = self.keep_log(pylog.Log(self.tmpdir(), fsync="always"))

    def time_group_commit(self, threads: int) -> None:
        self._run(self.log, threads, 10)

    @staticmethod
    def _run(log: pylog.Log, threads: int, per: int) -> None:
        value = make_values(1, 100)[0]

        def work() -> None:
            for _ in range(per):
                log.append(value)

        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def track_records_per_fdatasync(self, threads: int) -> float:
        """Records each fdatasync of the store covered, ``threads`` x 20 appends (the
        ceiling is ``threads``: one record per waiting thread)."""
        from pylog import vfs

        log = pylog.Log(self.tmpdir(), fsync="always", segment_bytes=256 << 20)
        real = vfs.fdatasync
        count = [0]

        def counted(fd: int) -> None:
            count[0] += 1
            real(fd)

        vfs.fdatasync = counted
        try:
            self._run(log, threads, 20)
        finally:
            vfs.fdatasync = real
            log.close()
        return threads * 20 / max(count[0], 1)

    track_records_per_fdatasync.unit = "records"  # type: ignore[attr-defined]

    def track_records_per_sync(self, threads: int) -> float:
        """The same with the group commit as it runs by default (pylog.vfs untouched: with
        pylog._speedups, ``Framer.append_durable`` and the group commit in C), counted by
        the group commit itself (``GroupCommit.syncs``)."""
        log = pylog.Log(self.tmpdir(), fsync="always", segment_bytes=256 << 20)
        try:
            self._run(log, threads, 20)
            return threads * 20 / max(log._gc.syncs, 1)
        finally:
            log.close()

    track_records_per_sync.unit = "records"  # type: ignore[attr-defined]


class AppendPeakMemory(BaseIO):
    """Peak memory of writing 100,000 records of 100 B in batches of 1,000."""

    def setup(self) -> None:
        self.values = make_values(1000, 100)

    def peakmem_append_batch_100k(self) -> None:
        log = pylog.Log(self.tmpdir(), fsync="never")
        for _ in range(100):
            log.append_batch(self.values)
        log.close()
