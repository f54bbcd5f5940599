"""Processes forked from one with open logs (``os.fork``, multiprocessing's "fork" start
method): a child never writes through a log it inherited (its lock, write buffer and files
are the parent's), and a log the child opens itself gets its ``flush_ms`` timer."""
from __future__ import annotations

import os
import select
import time
import traceback

import pytest

import pylog

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _child(fn):
    """Run ``fn`` in a forked child; its exit status (0: fn returned, 1: it raised)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_forked_child_cannot_append_through_an_inherited_log(tmp_path):
    """Two children appending through the parent's topic handle used to 'succeed', each
    overwriting the parent's file at the same positions: 200 appends acknowledged and lost,
    and a damaged region in the store. Now they get LogFencedError, and the parent goes on."""
    root = tmp_path / "r"
    s = pylog.LogStore(root)
    s.create_topic("t")
    t = s.topic("t")
    t.append(b"parent-0")
    log = t.partition(0)
    log.flush()  # written: another process (the child) sees it

    def child():
        with pytest.raises(pylog.LogFencedError, match="forked"):
            t.append(b"child")
        with pytest.raises(pylog.LogFencedError):
            log.append_batch([b"child"] * 3)
        assert bytes(log.read(0).value) == b"parent-0"  # reads still work
        log.close()  # closes only the child's descriptors

    assert _child(child) == 0
    assert _child(child) == 0
    for i in range(1, 11):
        t.append(b"parent-%d" % i)
    s.close()
    with pylog.LogStore(root) as s:
        log = s.topic("t").partition(0)
        assert log.verify() == [] and log.recovery_report == []
        assert [bytes(r.value) for r in log.scan()] == [b"parent-%d" % i for i in range(11)]


def test_the_parents_lock_goes_when_the_parent_closes_even_while_a_child_lives(tmp_path):
    path = str(tmp_path / "log")
    log = pylog.Log(path)
    log.append(b"x")
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: lives until the parent writes
        os.write(ready_w, b"1")  # fork() has returned here: the at-fork handlers have run
        os.read(r, 1)
        os._exit(0)
    try:
        # the child closes its copy of the lock's descriptor in its at-fork handler, before
        # fork() returns in it; until then (under emulation, a long while) it still holds the lock
        assert os.read(ready_r, 1) == b"1"
        log.close()
        with pylog.Log(path) as again:  # the child's inherited descriptor holds no lock
            assert again.next_offset == 1
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)


@pytest.mark.skipif(bool(os.environ.get("QEMU_CPU")), reason=(
    "qemu-user (the ARM suite) aborts a forked child of a threaded process when the child "
    "starts a thread: 'qemu_plugin_vcpu_init_hook: assertion failed', seen on armhf -cpu max"))
def test_a_forked_child_runs_the_flush_timer_of_the_logs_it_opens(tmp_path):
    """The flusher thread does not survive a fork; a child that opened a log of its own
    never had its flush_ms timer run (records stayed in its write buffer until close)."""
    parent_log = pylog.Log(str(tmp_path / "parent"), fsync="interval", flush_ms=50)
    parent_log.append(b"p")  # the parent's flusher thread runs
    path = str(tmp_path / "child")
    r, w = os.pipe()

    def child():
        log = pylog.Log(path, fsync="interval", flush_ms=50, flush_messages=None)
        log.append(b"from the child")
        os.write(w, b"1")
        time.sleep(5)  # not closed: only the timer can write it out meanwhile
        log.close()

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: says "1", or why it failed
        try:
            child()
        except BaseException:
            os.write(w, traceback.format_exc().encode()[-3000:])
        finally:
            os._exit(0)
    os.close(w)  # a child that dies before it writes gives an end of file, not a hang
    try:
        waiting = select.poll()  # not select(): the suite's descriptors pass FD_SETSIZE
        waiting.register(r, select.POLLIN)
        assert waiting.poll(120_000), "the forked child said nothing in 120 s"
        said = os.read(r, 4096)
        assert said == b"1", f"the forked child failed: {said.decode(errors='replace') or 'it died'}"
        deadline = time.monotonic() + 3
        seen = 0
        while time.monotonic() < deadline and not seen:
            time.sleep(0.05)
            try:
                with pylog.Log(path, readonly=True) as reader:
                    seen = reader.next_offset
            except FileNotFoundError:
                pass
        assert seen == 1, "the child's append was not written out by its flush timer"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        parent_log.close()
