"""A transaction's I/O on worker threads: fdatasyncs that run while more records are
framed (a commit's applies, a Spark task's staging), and the deletion of a published
transaction's directory after the commit returns (pylog.transactions)."""
from __future__ import annotations

import os
import shutil
import threading
from typing import TYPE_CHECKING, Any

from pylog import vfs

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["Syncs", "remove_later", "wait_removals"]


class Syncs:
    """fdatasyncs of logs being filled (a commit's applies, a Spark task's staging) on
    worker threads (the GIL is let go in the call), so the disk writes their records while
    more are framed: at most one at a time per log, each covering what the log had written
    out when it began. :meth:`wait` waits for them all and raises the first failure: an
    error an fdatasync reports is reported once per open file, and the descriptor synced
    here shares its open file with the log's, so the log's own later fdatasync may not see
    it. The caller then fails as a failed flush would."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._futures: list[Any] = []
        self._last: dict[int, Any] = {}  # id(log) -> its latest sync

    def __enter__(self) -> Syncs:
        return self

    def kick(self, log: Log) -> None:
        """Begin syncing what ``log`` holds now, unless a sync of it is under way."""
        f = self._last.get(id(log))
        if f is None or f.done():
            self.start(log)

    def start(self, log: Log) -> None:
        """Write out ``log``'s buffered records and begin syncing what it holds now."""
        from concurrent.futures import ThreadPoolExecutor

        log.write_out()
        active = log._active
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pylog-txn-sync")
        fd = os.dup(active.store_fd)
        try:
            f = self._last[id(log)] = self._pool.submit(_sync_and_close, fd, active.store_path)
        except BaseException:
            os.close(fd)
            raise
        self._futures.append(f)

    def wait(self, check: bool = True) -> None:
        """Wait for every sync begun; with ``check``, raise the first failure."""
        if self._pool is None:
            return
        self._pool.shutdown(wait=True)
        self._pool = None
        futures, self._futures, self._last = self._futures, [], {}
        if check:
            for f in futures:
                f.result()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.wait(check=exc_type is None)  # (else the block's own failure is the one raised)


def remove_later(path: str) -> None:
    """Delete a published transaction's renamed directory (its staged records: freeing a
    large file's blocks takes the file system a while) on a thread, so the commit returns
    once its records show. Not a daemon thread: the interpreter waits for it at exit. What
    a killed process leaves is hidden (``.done-`` names) and deleted by the store's next
    recovery (pylog.txnrecovery)."""
    t = threading.Thread(target=shutil.rmtree, args=(path,), kwargs={"ignore_errors": True},
                         name="pylog-txn-cleanup")
    with _removals_lock:
        _removals[:] = [x for x in _removals if x.is_alive()] + [t]
        t.start()


_removals: list[Any] = []  # the threads of remove_later
_removals_lock = threading.Lock()


def wait_removals() -> None:
    """Wait until this process's committed transactions' directories are deleted (a
    commit returns before; see :func:`remove_later`)."""
    with _removals_lock:
        pending = list(_removals)
    for t in pending:
        t.join()


def _sync_and_close(fd: int, path: str) -> None:
    try:
        vfs.fdatasync(fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        os.close(fd)
