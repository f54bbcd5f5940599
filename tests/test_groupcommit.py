"""The group commit of ``fsync="always"`` (pylog.groupcommit, csrc/speedups_groupcommit.c).

* the C GroupCommit and its Python twin (the pure backend's) give the same answers and
  states for any sequence of calls that does not wait on another thread (a property test);
* 16 threads appending under ``fsync="always"``: every append returns only once its record
  is durable (``durable_next`` past it), the records are all there, and the fdatasyncs are
  shared (fewer than one per record), on both backends;
* a failed fdatasync (strace EIO) while 8 threads append in a child process: every thread
  ends (none hangs in a wait), every acknowledged record survives a reopen;
* Ctrl-C reaches a main thread that waits as a follower in C (while another thread's
  fdatasync is held up by strace), and the log goes on working;
* 8 threads of a child process appending under ``fsync="always"``, killed with SIGKILL: every
  record acknowledged to any thread is there after a reopen, with its value;
* a signal handler raising at any point of a durable append, a failed fdatasync with a signal,
  a truncate during a leader's fdatasync: no leader left behind, a fenced log, nothing
  acknowledged that was not written out.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import py_env, strace_path
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog import groupcommit
from pylog._backend import speedups

STRACE = strace_path()
C_GC = getattr(speedups, "GroupCommit", None)
FIELDS = ("syncing", "waiting", "arrived", "target", "fenced", "durable_next", "syncs", "wait_ns", "epoch",
          "sync_fd", "orphan")


def _state(gc):
    return {f: int(getattr(gc, f)) for f in FIELDS}


ops = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 40)),
    st.tuples(st.just("take_group")),
    st.tuples(st.just("gather")),
    st.tuples(st.just("abandon")),
    st.tuples(st.just("step_down"), st.booleans(), st.integers(0, 40), st.integers(0, 20),
              st.floats(0, 0.0004)),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("lower"), st.integers(0, 40)),
    st.tuples(st.just("fence")),
    st.tuples(st.just("close_fd")),
), max_size=40)


@pytest.mark.skipif(C_GC is None, reason="pylog._speedups' GroupCommit is not built")
@settings(deadline=None, max_examples=150)
@given(ops)
def test_the_c_group_commit_and_its_python_twin_agree(seq):
    """Both objects, driven by the same calls (those a single thread can make: an arrive that
    would wait for another thread's leader is left out, and only the leader gathers or steps
    down), return the same and end in the same state. A gather waits for a group no other
    thread completes, at most a step_down's elapsed time (under half a millisecond here)."""
    c, p = C_GC(), groupcommit._PyGroupCommit()
    for op in seq:
        name, args = op[0], op[1:]
        if name == "arrive":
            off = args[0]
            if c.syncing and not c.fenced and c.durable_next <= off:
                continue  # would wait for a leader no thread is
        if name in ("step_down", "gather") and not c.syncing:
            continue  # only a leader steps down or gathers
        rc, rp = getattr(c, name)(*args), getattr(p, name)(*args)
        assert rc == rp, (op, rc, rp)
        assert _state(c) == _state(p), op


@pytest.mark.parametrize("threads, per", [(16, 60)])
def test_threads_return_only_once_durable_and_share_fdatasyncs(tmp_path, threads, per):
    """Each append under fsync="always" returns with its record durable (the group commit's
    durable_next past it, read at once in the appending thread); all records are there in
    the end; and the leaders' fdatasyncs number fewer than the records (groups formed)."""
    log = pylog.Log(str(tmp_path / "log"), fsync="always", segment_bytes=1 << 20)
    bad: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    got: list[int] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        try:
            for i in range(per):
                off = log.append(b"t%02d-%03d" % (k, i))
                dn = log._gc.durable_next
                if dn <= off:
                    bad.append((off, dn))
                with lock:
                    got.append(off)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "an appender hangs"
    assert not errors, errors[0]
    assert not bad, bad[:5]
    n = threads * per
    assert sorted(got) == list(range(n))
    syncs = log._gc.syncs
    log.close()
    assert 0 < syncs <= n * 3 // 4, (syncs, n)
    with pylog.Log(str(tmp_path / "log")) as r:
        values = sorted(bytes(rec.value) for rec in r.scan())
    assert values == sorted(b"t%02d-%03d" % (k, i) for k in range(threads) for i in range(per))


THREADS_CHILD = """
import json, os, sys, threading
import pylog
from pylog.errors import LogFencedError
log = pylog.Log(sys.argv[1], fsync="always")
out = {"acked": [], "ends": []}
lock = threading.Lock()
def worker(k):
    try:
        for i in range(300):
            v = b"t%d-%d" % (k, i)
            off = log.append(v)
            with lock:
                out["acked"].append([off, v.decode()])
        end = "done"
    except LogFencedError:
        end = "fenced"
    except OSError as e:
        end = "errno %d" % e.errno
    with lock:
        out["ends"].append(end)
ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
@pytest.mark.parametrize("when", [3, 20, 60])
def test_a_failed_fdatasync_under_threads_ends_every_thread_and_keeps_acked_records(tmp_path, when):
    """strace fails the ``when``-th fdatasync of a process whose 8 threads append under
    fsync="always": every thread ends (an OSError for the leader, LogFencedError for the
    followers, none left waiting), and a reopen finds every acknowledged record, whole."""
    path = str(tmp_path / "log")
    r = subprocess.run([STRACE, "-f", "-qq", "-o", str(tmp_path / "trace"), "-e", "trace=fdatasync",
                        "-e", f"inject=fdatasync:error=EIO:when={when}", sys.executable, "-c", THREADS_CHILD,
                        path], capture_output=True, text=True, timeout=180, env=py_env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["ends"]) == 8, out["ends"]
    assert "errno 5" in out["ends"], out["ends"]  # the leader whose fdatasync failed
    assert all(e in ("fenced", "errno 5") for e in out["ends"]), out["ends"]
    with pylog.Log(path) as log:
        have = {rec.offset: bytes(rec.value).decode() for rec in log.scan()}
        assert log.verify() == []
    for off, v in out["acked"]:
        assert have.get(off) == v, (off, v)


SIGINT_CHILD = """
import os, sys, threading, time
import pylog
log = pylog.Log(sys.argv[1], fsync="always")
log.append(b"first")  # (held up 5 s: strace counts each thread's fdatasyncs) the leader's fd made
led = threading.Event()
def leader():
    led.set()
    log.append(b"led")  # its fdatasync (its thread's first) is held up by strace for 5 s
t = threading.Thread(target=leader)
t.start()
led.wait()
time.sleep(0.3)  # the leader is in its fdatasync
print("waiting", flush=True)
t0 = time.monotonic()
try:
    log.append(b"follower")  # the main thread waits as a follower, in C
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print("interrupted after %.2f" % (time.monotonic() - t0), flush=True)
t.join()
log.append(b"after")
print("next", log.next_offset, flush=True)
os._exit(0)
"""


@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
def test_ctrl_c_reaches_a_main_thread_waiting_as_a_follower(tmp_path):
    """The main thread waits as a follower while another thread's fdatasync is held up (5 s,
    by strace): SIGINT raises KeyboardInterrupt there at once, as in threading's waits, and
    the log goes on working (the leader finishes, the next append succeeds)."""
    path = str(tmp_path / "log")
    p = subprocess.Popen([STRACE, "-f", "-qq", "-o", str(tmp_path / "trace"), "-e", "trace=fdatasync",
                          "-e", "inject=fdatasync:delay_enter=5000000:when=1", sys.executable, "-c",
                          SIGINT_CHILD, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=py_env())
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.strip() == "waiting", (line, p.stderr.read() if p.poll() is not None else "")
        time.sleep(0.2)
        # the child's pid: strace's only child
        child = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()[0])
        os.kill(child, signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    lines = rest.strip().splitlines()
    assert lines and lines[0].startswith("interrupted after"), (rest, err[-2000:])
    # at once, not when the leader's 5 s end (the margin: the SIGINT is sent 0.2 s after "waiting",
    # through a pgrep, and the test runs inside loaded full runs)
    assert float(lines[0].split()[-1]) < 3.0, lines
    assert lines[-1].startswith("next "), (rest, err[-2000:])


# the children below: a signal handler that raises Boom
RAISING_HANDLER = """
import json, os, signal, sys, threading, time
import pylog
from pylog.errors import LogFencedError
class Boom(Exception):
    pass
def handler(*a):
    raise Boom()
"""

SIGNAL_AS_ARRIVE_RETURNS = RAISING_HANDLER + """
log = pylog.Log(sys.argv[1], fsync="always")
signal.signal(signal.SIGALRM, handler)
n = 0
t_end = time.monotonic() + 4
while time.monotonic() < t_end:
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.0001 + (n % 50) * 0.000005)
        while True:
            log.append(b"v", key=b"k")  # the general path: _append, _wait_durable, arrive
    except Boom:
        pass
    n += 1
    if log._gc.syncing:  # this is the only thread: a leader left over
        print("stuck after", n, flush=True)
        break
signal.setitimer(signal.ITIMER_REAL, 0)
t = threading.Thread(target=lambda: log.append(b"next"), daemon=True)
t.start()
t.join(5)
print("interrupts", n, "next append blocked" if t.is_alive() else "next append done", flush=True)
os._exit(0)
"""


@pytest.mark.skipif(C_GC is None, reason="the pure backend's group commit is Python: a signal handler can "
                    "raise at any call in it (even as its step_down begins), which no Python code can rule out")
def test_a_signal_as_arrive_returns_the_lead_never_leaves_the_log_without_a_leader(tmp_path):
    """A signal handler raising at any point of a durable append (thousands of SIGALRMs, one
    thread appending on the general path) never leaves the group commit with a leader that
    is gone: arrive() may have made the caller the leader just as the handler raised, before
    the caller could know it (abandon() then steps it down), and the step-down is the first
    call of the leader's ``finally``. The next append goes through."""
    r = subprocess.run([sys.executable, "-c", SIGNAL_AS_ARRIVE_RETURNS, str(tmp_path / "log")],
                       capture_output=True, text=True, timeout=60, env=py_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stuck" not in r.stdout, r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.endswith("next append done") and int(last.split()[1]) > 100, last


EIO_AND_SIGNAL = RAISING_HANDLER + """
log = pylog.Log(sys.argv[1], fsync="always")
signal.signal(signal.SIGUSR1, handler)
acked, raised = 0, None
try:
    for i in range(60):
        log.append(b"r%03d" % i)  # one thread: the C leader of a group of one
        acked += 1
except BaseException as e:
    raised = type(e).__name__
res = {}
def nxt():
    try:
        log.append(b"next")
        res["next"] = "appended"
    except LogFencedError:
        res["next"] = "fenced"
    except BaseException as e:
        res["next"] = type(e).__name__
t = threading.Thread(target=nxt, daemon=True)
t.start()
t.join(5)
print(json.dumps({"acked": acked, "raised": raised, "next": res.get("next", "blocked"),
                  "syncing": int(log._gc.syncing)}), flush=True)
os._exit(0)
"""


@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
@pytest.mark.skipif(getattr(getattr(speedups, "Framer", None), "append_durable", None) is None,
                    reason="the C leader (Framer.append_durable) is not in use")
def test_an_fdatasync_failure_with_a_signal_still_fences(tmp_path):
    """strace fails the 20th fdatasync of a one-writer process (the C leader's) with EIO and
    delivers a SIGUSR1 (whose handler raises) as it returns: the append raises, and the log
    is fenced all the same (the C leader fences and steps down before any Python runs): the
    next append raises LogFencedError, it neither hangs nor succeeds (after a failed
    fdatasync, Linux may let the next one succeed), and no leader is left."""
    path = str(tmp_path / "log")
    r = subprocess.run([STRACE, "-qq", "-o", str(tmp_path / "trace"), "-e", "trace=fdatasync",
                        "-e", "inject=fdatasync:error=EIO:signal=SIGUSR1:when=20", sys.executable, "-c",
                        EIO_AND_SIGNAL, path], capture_output=True, text=True, timeout=120, env=py_env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["raised"] in ("Boom", "OSError"), out
    assert out["next"] == "fenced" and out["syncing"] == 0, out
    with pylog.Log(path) as log:
        assert [bytes(rec.value) for rec in log.scan()][:out["acked"]] == [b"r%03d" % i for i in range(out["acked"])]


def test_a_truncate_during_a_leaders_fdatasync_acknowledges_nothing_unwritten(tmp_path, monkeypatch):
    """A leader fdatasyncs (slowly) up to offset 11; meanwhile the log is truncated to 5 and
    another thread appends offset 5 and waits. When the leader steps down, its goal (11) is
    from before the truncate and must not make offset 5 durable: the append returns only once
    its own record is written out and fdatasynced."""
    from pylog import vfs

    log = pylog.Log(str(tmp_path / "log"), fsync="always")
    for i in range(10):
        log.append(b"x%d" % i)
    real = vfs.fdatasync
    slow_on, in_sync = threading.Event(), threading.Event()

    def slow(fd: int) -> None:
        if slow_on.is_set():
            in_sync.set()
            time.sleep(0.3)
        real(fd)

    monkeypatch.setattr(vfs, "fdatasync", slow)
    slow_on.set()
    leader = threading.Thread(target=lambda: log.append(b"leader"))
    leader.start()
    assert in_sync.wait(10)
    slow_on.clear()
    log.truncate(5)  # while the leader fdatasyncs (its goal: 11)
    res: dict[str, int] = {}

    def follower() -> None:
        off = log.append(b"after-truncate")
        res["off"], res["written_next"] = off, log._active.written_next

    a = threading.Thread(target=follower)
    a.start()
    leader.join(10)
    a.join(10)
    assert res["off"] == 5
    assert res["written_next"] > res["off"], res  # written out (and fdatasynced) before acknowledged
    log.close()
    with pylog.Log(str(tmp_path / "log")) as r:
        assert [bytes(rec.value) for rec in r.scan()] == [b"x%d" % i for i in range(5)] + [b"after-truncate"]


THREADS_KILLED = """
import os, sys, threading
import pylog
log = pylog.Log(sys.argv[1], fsync="always", segment_bytes=64 << 10)
def worker(k):
    i = 0
    while True:
        v = b"t%d-%06d" % (k, i)
        off = log.append(v)
        os.write(1, b"%d %s\\n" % (off, v))  # one write a line: whole lines only
        i += 1
ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(8)]
for t in ts:
    t.start()
for t in ts:
    t.join()
"""


def test_acknowledged_appends_of_many_threads_survive_sigkill(tmp_path):
    """8 threads of a child process append under fsync="always" (with the extension, each a
    follower or a leader of the group commit in C; without it, the Python twin), printing each
    offset once its append returned; the child is killed with SIGKILL mid-stream. A reopen in
    this process finds every acknowledged record at its offset with its value, across rolls
    (64 KiB segments), and nothing torn. (A process kill keeps what was written out, synced or
    not: this holds the acknowledgement to the write-out; the fdatasync before it is held by
    tests/test_durable_writeout.py's strace traces and tests/test_crash_powercut.py.)"""
    path = str(tmp_path / "log")
    p = subprocess.Popen([sys.executable, "-c", THREADS_KILLED, path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=py_env())
    assert p.stdout is not None
    acked: list[tuple[int, bytes]] = []
    try:
        for line in p.stdout:
            off, v = line.split()
            acked.append((int(off), v))
            if len(acked) >= 3000:
                p.send_signal(signal.SIGKILL)
                break
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(30)
    for line in p.stdout.read().splitlines():  # acknowledged before the kill landed
        f = line.split()
        if len(f) == 2:
            acked.append((int(f[0]), f[1]))
    assert len(acked) >= 3000, (len(acked), p.stderr.read()[-2000:] if p.stderr else "")
    with pylog.Log(path) as log:
        assert log.verify() == []
        assert len(log.segments()) > 2  # it rolled
        for off, v in acked:
            assert bytes(log.read(off).value) == v, off
