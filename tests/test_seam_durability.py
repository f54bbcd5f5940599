"""The write path's rolls, truncate and retention under faults (issue 14, cases 10-12).

DESIGN.md §5: a crash at any point of truncate, retention or a roll leaves dense offsets and
a log that reads every record it still claims; a failed operation fences the log but never
breaks reads of what was written before the failure.

Faults come from outside the code under test: SIGKILL of real processes, and strace's
syscall fault injection (``-e inject=SYSCALL:signal=SIGKILL:when=N`` /
``:error=EIO:when=N``), iterated over every call of an operation.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import py_env, scaled, store_files, strace_path
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import LogFencedError

STRACE = strace_path()
needs_strace = pytest.mark.skipif(STRACE is None, reason="strace is not installed, or runs under qemu-user")


def value_for(offset: int, size: int, salt: int = 0) -> bytes:
    """The value the tests write at ``offset``: its own digest repeated to ``size`` bytes."""
    d = hashlib.blake2b(f"{salt}:{offset}".encode(), digest_size=16).digest()
    return (d * (size // 16 + 1))[:size]


# ---------------------------------------------------------------------------------------
# case 10: flushes and rolls
POLICIES = [
    dict(fsync="always"),
    dict(fsync="interval", flush_messages=1, flush_ms=None),
    dict(fsync="interval", flush_messages=3, flush_ms=None),
    dict(fsync="interval", flush_messages=10, flush_ms=None),
    dict(fsync="interval", flush_messages=None, flush_ms=1),
    dict(fsync="interval", flush_messages=7, flush_ms=1),
    dict(fsync="never"),
]


def test_flush_messages_with_rolls_does_not_raise(make_log):
    """The issue's reproduction: append #19 raised ValueError (a sync of the segment the
    write-out had just sealed and closed)."""
    log = make_log(fsync="interval", segment_bytes=4096, flush_messages=10, flush_ms=None)
    offs = [log.append(value_for(i, 300)) for i in range(40)]
    assert offs == list(range(40))
    assert len(log.segments()) > 3
    log.append(b"after")  # not fenced
    log.close()
    with pylog.Log(log.path) as again:
        assert [bytes(r.value) for r in again.scan(0, 40)] == [value_for(i, 300) for i in range(40)]


def test_timer_flush_after_a_roll_in_the_write_out(make_log):
    """The flush_ms timer (pylog.flusher calls Log._timer_flush, dropping exceptions) took the
    same path: the queue it wrote out rolled the segment it then synced."""
    log = make_log(fsync="interval", segment_bytes=4096, flush_messages=None, flush_ms=60_000)
    for i in range(20):  # 20 x 336 B queued: the write-out rolls
        log.append(value_for(i, 300))
    log._timer_flush(pylog.log._now_ms() + 10 ** 9)  # as the flusher thread calls it
    assert len(log.segments()) >= 2
    log.append(b"after")  # a failure in the timer would have fenced the log
    assert log.next_offset == 21


@settings(max_examples=scaled(40, 400))
@given(policy=st.sampled_from(POLICIES),
       segment_bytes=st.sampled_from([4096, 5000, 8192]),
       write_buffer=st.sampled_from([0, 1024, 256 << 10]),
       ops=st.lists(st.tuples(st.sampled_from(["one", "key", "batch", "flush"]),
                              st.integers(0, 1500), st.integers(1, 12)), min_size=1, max_size=60))
def test_policies_with_tiny_segments_and_many_rolls(tmp_path_factory, policy, segment_bytes, write_buffer, ops):
    """Property: under every fsync policy, with segments of a few records and any write
    buffer, appends never raise, every returned offset reads back its own value at once and
    after close + reopen, and offsets are dense."""
    path = str(tmp_path_factory.mktemp("p") / "log")
    log = pylog.Log(path, segment_bytes=segment_bytes, write_buffer_bytes=write_buffer, **policy)
    want: dict[int, bytes] = {}
    for kind, size, n in ops:
        nxt = log.next_offset
        if kind == "one":
            off = log.append(value_for(nxt, size))
            want[off] = value_for(nxt, size)
        elif kind == "key":
            off = log.append(value_for(nxt, size), key=b"k")
            want[off] = value_for(nxt, size)
        elif kind == "batch":
            vals = [value_for(nxt + j, size) for j in range(n)]
            first = log.append_batch(vals)
            want.update({first + j: v for j, v in enumerate(vals)})
        else:
            log.flush()
    assert sorted(want) == list(range(len(want)))
    for off in sorted({0, len(want) // 2, len(want) - 1}) if want else ():
        assert bytes(log.read(off).value) == want[off]
    log.close()
    with pylog.Log(path) as again:
        assert again.next_offset == len(want)
        assert {r.offset: bytes(r.value) for r in again.scan()} == want
        assert again.verify() == []


KILL_WRITER = """
import os, signal, sys, random
sys.path.insert(0, os.environ["TESTS_DIR"])
import pylog
from test_seam_durability import value_for, POLICIES
path, seed = sys.argv[1], int(sys.argv[2])
rnd = random.Random(seed)
policy = POLICIES[seed % len(POLICIES)]
log = pylog.Log(path, segment_bytes=rnd.choice([4096, 6000]), **policy)
# with flush_ms too, a timed flush restarts the count: only flush_messages alone is modelled
n_flush = policy.get("flush_messages") if policy.get("flush_ms", 1) is None else None
since = 0
out = sys.stdout
stop = rnd.randrange(20, 400)
for i in range(stop):
    nxt = log.next_offset
    size = rnd.randrange(0, 900)
    if rnd.random() < 0.2:
        vals = [value_for(nxt + j, size, seed) for j in range(rnd.randrange(1, 8))]
        first = log.append_batch(vals)
        last, count = first + len(vals) - 1, len(vals)
    else:
        last, count = log.append(value_for(nxt, size, seed)), 1
    acked = policy["fsync"] == "always"
    since += count
    if n_flush is not None and since >= n_flush:
        acked, since = True, 0  # the policy fsynced everything up to here
    if rnd.random() < 0.05:
        log.flush()
        acked, since = True, 0
    if acked:
        out.write(f"A {last}\\n")
    out.write(f"S {last} {size}\\n")
    out.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("seed", range(scaled(14, 140)))
def test_acknowledged_appends_survive_sigkill_across_rolls(tmp_path, seed):
    """A writer under each policy, tiny segments, kills itself at a random append: every
    acknowledged offset reads back its own value after reopen, offsets are dense, and every
    record present is one that was appended (never torn)."""
    path = str(tmp_path / "log")
    env = dict(py_env(), TESTS_DIR=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", KILL_WRITER, path, str(seed)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == -signal.SIGKILL, r.stderr
    acked = -1
    returned = -1
    for line in r.stdout.splitlines():
        f = line.split()
        if f[0] == "A":
            acked = int(f[1])
        else:
            returned = int(f[1])
    assert returned >= 19
    with pylog.Log(path) as log:
        assert log.start_offset == 0
        assert log.next_offset > acked
        recs = list(log.scan())
        assert [r.offset for r in recs] == list(range(log.next_offset))
        for rec in recs:  # present means genuine: the value is the one written at that offset
            v = bytes(rec.value)
            assert v == value_for(rec.offset, len(v), seed)
        assert log.verify() == []


# ---------------------------------------------------------------------------------------
# cases 11 and 12: truncate and retention, killed or failing at every system call
#: the system calls a truncate or a retention changes files with
FILE_CALLS = ["rename", "unlink", "fsync", "fdatasync", "ftruncate", "copy_file_range", "pwrite64"]
#: kills also at every write (the atomic files' contents) in the long run; not failed with
#: EIO, which would also hit the child's own report on stdout
KILL_CALLS = FILE_CALLS + (["write"] if os.environ.get("PYLOG_LONG") == "1" else [])
BOUNDS = (0, 17, 34, 45)  # segments [0,17) [17,34) [34,45), as in the issue
CUT = 5                   # truncate(5)
VSIZE = 40


def make_three_segments(path: str) -> None:
    with pylog.Log(path, fsync="never") as log:
        for o in range(BOUNDS[-1]):
            log.append(value_for(o, VSIZE))
            if o + 1 in BOUNDS[1:-1]:
                log.roll()
        assert [s["base_offset"] for s in log.segments()] == list(BOUNDS[:-1])


OP_CHILD = """
import json, os, sys
import pylog
from pylog.errors import LogFencedError
sys.path.insert(0, os.environ["TESTS_DIR"])
from test_seam_durability import value_for, VSIZE, CUT
path, op = sys.argv[1], sys.argv[2]
try:
    log = pylog.Log(path)
except OSError as e:  # the fault hit the open, before the operation
    print(json.dumps({"phase": "open", "error": repr(e)}))
    sys.stdout.flush()
    os._exit(0)
failed = None
try:
    if op == "truncate":
        log.truncate(CUT)
    else:
        log.remove_expired(0)
except OSError as e:
    failed = repr(e)
# what the log shows now (a fenced one after a failure) must read back, all of it
start, nxt = log.start_offset, log.next_offset
bad = [o for o in range(start, nxt) if bytes(log.read(o).value) != value_for(o, VSIZE)]
scanned = [r.offset for r in log.scan()]
batch = [r.offset for r in log.read_batch(start, max_records=1000)] if nxt > start else []
verified = [str(e) for e in log.verify()]
try:
    log.append(b"more")
    appended = True
except LogFencedError:
    appended = False
stores = sorted(int(n[:-4]) for n in os.listdir(path) if n.endswith(".log"))
print(json.dumps({"phase": "op", "failed": failed, "start": start, "next": nxt, "bad": bad,
                  "dense": scanned == list(range(start, nxt)) and batch == scanned,
                  "verify": verified, "appended": appended, "stores": stores}))
sys.stdout.flush()
os._exit(0)
"""


def run_under_strace(path: str, op: str, call: str, fault: str, n: int, trace: str):
    """Run OP_CHILD on ``path`` with strace making the ``n``-th ``call`` fail with
    ``fault`` (``signal=SIGKILL`` or ``error=EIO``). Returns (process, injected)."""
    env = dict(py_env(), TESTS_DIR=os.path.dirname(os.path.abspath(__file__)))
    # no -f: the operation runs in the main thread, and strace counts calls per process
    # (importing pylog starts helper processes of its own)
    # pwrite64: the kernel copy is refused (ENOSYS), so truncate copies with pread/pwrite
    # (strace tampers only with the calls it traces)
    traced, refuse = call, []
    if call == "pwrite64":
        traced, refuse = "pwrite64,copy_file_range", ["-e", "inject=copy_file_range:error=ENOSYS"]
    r = subprocess.run([STRACE, "-qq", "-o", trace, "-e", f"trace={traced}", *refuse,
                        "-e", f"inject={call}:{fault}:when={n}", sys.executable, "-c", OP_CHILD, path, op],
                       capture_output=True, text=True, timeout=120, env=env)
    with open(trace) as f:
        injected = any(line.startswith(call + "(") and "INJECTED" in line for line in f)
    return r, injected


def check_reopened(path: str, op: str) -> tuple[int, int]:
    """Reopen after the fault: offsets dense from start to next, every record genuine,
    nothing bad; (start, next)."""
    with pylog.Log(path) as log:
        start, nxt = log.start_offset, log.next_offset
        recs = list(log.scan())
        assert [r.offset for r in recs] == list(range(start, nxt))
        assert all(bytes(r.value) == value_for(r.offset, VSIZE) for r in recs)
        assert log.verify() == [] and log.recovery_report == []
        if op == "truncate":
            assert start == 0
            assert nxt in (CUT, BOUNDS[-1])  # not begun, or finished (by the open if need be)
        else:
            assert nxt == BOUNDS[-1] and start in BOUNDS[:-1]
        assert log.append(b"after") == nxt  # appends resume
        assert not os.path.exists(os.path.join(path, "truncate-point"))
    return start, nxt


def sweep(tmp_path, op: str, call: str, fault: str) -> list[dict]:
    """Fault the 1st, 2nd, ... ``call`` of opening the log and running ``op`` until a run
    gets through without a fault; check the log after each. Returns the runs' reports."""
    template = str(tmp_path / "template")
    make_three_segments(template)
    reports = []
    for n in range(1, 200):
        path = str(tmp_path / f"run{n}")
        shutil.copytree(template, path)
        r, injected = run_under_strace(path, op, call, fault, n, str(tmp_path / f"trace{n}"))
        killed = r.returncode == -signal.SIGKILL
        assert killed or r.returncode == 0, r.stderr[-2000:]
        rep = {"n": n, "killed": killed, "injected": injected}
        if not killed:
            rep.update(__import__("json").loads(r.stdout.strip().splitlines()[-1]))
        rep["reopened"] = check_reopened(path, op)
        reports.append(rep)
        shutil.rmtree(path)
        if not killed and not injected:
            break
    else:
        pytest.fail(f"{op} still reached a {call} after 200 runs")
    return reports


@needs_strace
@pytest.mark.parametrize("op", ["truncate", "retention"])
@pytest.mark.parametrize("call", KILL_CALLS)
def test_crash_at_every_call_of_truncate_and_retention(tmp_path, op, call):
    """Case 11: SIGKILL at every ``call`` of a truncate(5) of [0,17) [17,34) [34,45) (and of
    a retention that deletes both sealed segments). After each, the reopened log has dense
    offsets and reads every record it claims; a truncate is either not begun or finished
    (the open finishes one whose truncate point was durable), never a hole; once a run
    finished it, every later crash point does too; retention only ever moves the start
    forward, to a segment's base."""
    reports = sweep(tmp_path, op, call, "signal=SIGKILL")
    final = reports[-1]
    assert not final["killed"] and final["failed"] is None
    if op == "truncate":
        assert final["next"] == CUT and final["reopened"] == (0, CUT)
        nexts = [r["reopened"][1] for r in reports]
        assert nexts == sorted(nexts, reverse=True), nexts  # 45 ... 45, 5 ... 5
    else:
        assert final["start"] == BOUNDS[2]
        starts = [r["reopened"][0] for r in reports]
        assert starts == sorted(starts), starts


@needs_strace
@pytest.mark.parametrize("op", ["truncate", "retention"])
@pytest.mark.parametrize("call,error", [(c, "EIO") for c in FILE_CALLS]
                         + [(c, "ENOSPC") for c in ("copy_file_range", "pwrite64", "fsync", "rename")])
def test_failure_at_every_call_of_truncate_and_retention(tmp_path, op, call, error):
    """Case 12: EIO (ENOSPC where a full disk shows) from every ``call`` of a truncate or
    a retention. The operation raises,
    the log is fenced (appends raise LogFencedError), and what it shows matches the files:
    every offset in [start_offset, next_offset) reads back (read, read_batch, scan) with no
    hole and verify() finds nothing; a failed retention starts at the oldest store still
    there. After a reopen the same holds, and an interrupted truncate is finished."""
    reports = sweep(tmp_path, op, call, f"error={error}")
    failures = [r for r in reports if r.get("phase") == "op" and r["failed"]]
    if call in ("rename", "unlink", "fsync") or (call in ("copy_file_range", "pwrite64") and op == "truncate"):
        assert failures, "the sweep never failed the operation itself"
    for r in failures:
        assert r["bad"] == [] and r["dense"] and r["verify"] == [], r
        assert r["appended"] is False, r
        assert r["start"] == r["stores"][0], r  # start_offset never past a store still there
        if op == "truncate":
            # whole segments gone newest first, or the kept part already in place
            assert r["start"] == 0 and r["next"] in (CUT, *BOUNDS[1:]), r
        else:
            assert r["next"] == BOUNDS[-1], r
    final = reports[-1]
    assert not final["injected"] and final["failed"] is None and final["appended"]


def test_open_sets_aside_the_segments_after_a_hole(tmp_path):
    """Case 11's backstop: the state an interrupted truncate of an older pylog left ([0,17)
    and [34,45), the middle segment gone, unclean). Opening used to claim [0, 45) with
    17..33 unreadable for good; now the log ends before the hole, the segments after it are
    kept as ``*.gap`` (byte for byte), the hole is reported, and appends continue."""
    path = str(tmp_path / "log")
    make_three_segments(path)
    stores = store_files(path)
    with open(stores[2], "rb") as f:
        after = f.read()
    for name in os.listdir(path):
        if name.startswith("00000000000000000017.") or name == "clean-shutdown":
            os.unlink(os.path.join(path, name))
    with pylog.Log(path) as log:
        assert (log.start_offset, log.next_offset) == (0, 17)
        assert [r.offset for r in log.scan()] == list(range(17))
        assert all(bytes(log.read(o).value) == value_for(o, VSIZE) for o in range(17))
        [err] = log.recovery_report
        assert err.offset == 17 and "[17, 34)" in err.reason and err.path.endswith(".log.gap")
        assert len(log.recovery_actions) == 1 and "set aside" in log.recovery_actions[0]
        assert log.append(b"next") == 17
    with open(stores[2] + ".gap", "rb") as f:
        assert f.read() == after
    assert not os.path.exists(stores[2])
    with pylog.Log(path) as log:  # reopened: the set-aside files stay, nothing more to report
        assert log.next_offset == 18 and log.recovery_report == []
    assert os.path.exists(stores[2] + ".gap")


def test_open_finishes_an_interrupted_truncate(tmp_path):
    """A truncate point left by a crash (written before a truncate changes any file) is
    finished by the next writer's open, and said so in ``recovery_actions``; a reader's
    open changes nothing."""
    from pylog import checkpoint

    path = str(tmp_path / "log")
    make_three_segments(path)
    checkpoint.write_truncate_point(path, CUT)
    with pylog.Log(path, readonly=True) as ro:
        assert ro.next_offset == BOUNDS[-1]
    with pylog.Log(path) as log:
        assert (log.start_offset, log.next_offset) == (0, CUT)
        assert log.recovery_actions == [f"finished an interrupted truncate: offsets [{CUT}, 45) dropped"]
        assert [bytes(r.value) for r in log.scan()] == [value_for(o, VSIZE) for o in range(CUT)]
    assert not os.path.exists(os.path.join(path, "truncate-point"))
    with pylog.Log(path) as log:
        assert log.next_offset == CUT and log.recovery_actions == []


def test_an_unfinishable_truncate_opens_fenced_and_readable(tmp_path, monkeypatch):
    """If finishing an interrupted truncate fails at open (a full disk), the log still
    opens: fenced, every record it shows readable; the next open finishes the truncate."""
    import errno

    from pylog import checkpoint, fileutil

    path = str(tmp_path / "log")
    make_three_segments(path)
    checkpoint.write_truncate_point(path, CUT)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileutil, "copy_range", full)
    log = pylog.Log(path)
    assert "could not finish an interrupted truncate to offset 5" in log.recovery_actions[0]
    start, nxt = log.start_offset, log.next_offset
    assert start == 0 and CUT <= nxt <= BOUNDS[-1]
    assert [r.offset for r in log.scan()] == list(range(nxt))
    assert all(bytes(log.read(o).value) == value_for(o, VSIZE) for o in range(nxt))
    with pytest.raises(LogFencedError):
        log.append(b"x")
    log.close()
    monkeypatch.undo()
    with pylog.Log(path) as log:
        assert log.next_offset == CUT
        assert log.recovery_actions == [f"finished an interrupted truncate: offsets [{CUT}, {nxt}) dropped"]


def test_next_offset_is_consistent_while_another_thread_drains(tmp_path):
    """next_offset read while another thread (the flush_ms flusher, a flush) drains the append
    queue: the drain empties the queue before it frames it, so an unlocked read saw neither
    the queued records nor the framed ones (found on aarch64 under emulation, where a writer
    that wrote value_for(next_offset) stored one offset's value at another)."""
    import threading

    log = pylog.Log(str(tmp_path / "log"), fsync="interval", flush_messages=None, flush_ms=None)
    with log._lock:  # the queue: the path without pylog._speedups (whose Framer frames at once)
        log._set_framer(None)
        log._queueing = True
    for _ in range(5):
        log.append(b"x")
    assert log._q and log.next_offset == 5
    orig = log._frame_locked
    entered, release = threading.Event(), threading.Event()

    def slow(*a, **k):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        return orig(*a, **k)

    log._frame_locked = slow  # type: ignore[method-assign]
    flusher = threading.Thread(target=log.flush)
    flusher.start()
    assert entered.wait(10)
    seen: list[int] = []
    reader = threading.Thread(target=lambda: seen.append(log.next_offset))
    reader.start()
    reader.join(0.3)
    release.set()
    flusher.join(10)
    reader.join(10)
    assert seen == [5]
    assert log.append(b"y") == 5
    log.close()
