"""The durable append's write-out in C (pylog._speedups' ``Framer.write_out``).

Under ``fsync="always"`` the group commit leader hands the write buffer to the OS before its
fdatasync. With the extension that is one C call (pwrite of the pending frames at the
position the first of them has, retried after EINTR and short writes, then the buffer
forgotten), which the Python path (``fileutil.pwrite_all`` + ``Appender.drain``) did in
several. Checked here: it writes exactly the bytes the Python path writes, and a failing
pwrite (injected with strace into a real process) fences the log with nothing partial
visible and every acknowledged record kept.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import py_env, store_files, strace_path

import pylog
from pylog import fileutil, vfs
from pylog._backend import speedups

STRACE = strace_path()
needs_writeout = pytest.mark.skipif(
    speedups is None, reason="pylog._speedups is not in use (the pure backend, or no extension)")


def _workload(log: pylog.Log) -> None:
    """The same records every time (explicit timestamps): single appends of the fast path,
    appends with keys and metadata, and batches."""
    for i in range(40):
        log.append(b"v%04d" % i * (i % 7 + 1), timestamp=1_700_000_000_000 + i)
    for i in range(10):
        log.append(b"k%d" % i, key=b"key", metadata=b"m" * i, timestamp=1_700_000_001_000 + i)
    log.append_batch([b"b%03d" % i * 30 for i in range(50)], timestamps=[1_700_000_002_000] * 50)
    for i in range(20):
        log.append(bytes(i * 13), timestamp=1_700_000_003_000 + i)


@needs_writeout
def test_c_write_out_writes_what_the_python_path_writes(tmp_path, monkeypatch):
    written: list[str] = []  # the files pwrite_all wrote to
    real_all = fileutil.pwrite_all

    def noted(fd: int, data, position: int) -> None:
        written.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_all(fd, data, position)

    monkeypatch.setattr(fileutil, "pwrite_all", noted)
    a = str(tmp_path / "c")
    with pylog.Log(a, fsync="always", segment_bytes=4096) as log:  # rolls several times
        _workload(log)
    # the stores' frames went out through the C call (only headers and indexes through
    # pwrite_all: each store once, for its header, when it was created)
    stores = [w for w in written if w.endswith(".log")]
    assert len(stores) == len(set(stores)) == len(store_files(a)), stores
    assert any(w.endswith(".index") for w in written)
    # the Python path: a replaced vfs.pwrite (as a fault injector's) turns the C call off
    monkeypatch.setattr(fileutil, "pwrite_all", real_all)
    monkeypatch.setattr(vfs, "pwrite", lambda fd, data, pos: os.pwrite(fd, data, pos))
    b = str(tmp_path / "py")
    with pylog.Log(b, fsync="always", segment_bytes=4096) as log:
        _workload(log)
    sa, sb = store_files(a), store_files(b)
    assert [os.path.basename(p) for p in sa] == [os.path.basename(p) for p in sb] and len(sa) > 3
    for x, y in zip(sa, sb):
        assert open(x, "rb").read() == open(y, "rb").read(), x
    with pylog.Log(a) as log:
        assert log.verify() == [] and log.next_offset == 120


CHILD = """
import json, os, sys
import pylog
from pylog.errors import LogFencedError
log = pylog.Log(sys.argv[1], fsync="always")
acked, error = 0, None
try:
    for i in range(200):
        log.append(b"r%05d" % i * 10)
        acked += 1
except OSError as e:
    error = e.errno
try:
    log.append(b"more")
    fenced = False
except LogFencedError:
    fenced = True
print(json.dumps({"acked": acked, "errno": error, "fenced": fenced}))
sys.stdout.flush()
os._exit(0)
"""


def _run_with_eio(tmp_path, syscall: str, when: int, child: str, path: str) -> dict:
    """Run ``child`` (a writer printing a JSON summary last) under strace, failing the
    ``when``-th ``syscall`` with EIO; checks the fault was injected and the writer saw an
    EIO and a fenced log, and returns its summary."""
    import errno

    trace = str(tmp_path / "trace")
    r = subprocess.run([STRACE, "-qq", "-o", trace, "-e", f"trace={syscall}",
                        "-e", f"inject={syscall}:error=EIO:when={when}", sys.executable, "-c", child, path],
                       capture_output=True, text=True, timeout=120, env=py_env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    with open(trace) as f:
        assert any("INJECTED" in line for line in f)
    assert out["errno"] == errno.EIO and out["fenced"], out
    assert 0 <= out["acked"] < 200
    return out


@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
@pytest.mark.parametrize("when", [4, 5, 12, 57])  # (the first 3 write the new files' headers)
def test_a_failed_c_write_out_fences_and_keeps_every_acknowledged_record(tmp_path, when):
    """strace fails the ``when``-th pwrite64 of a durable writer process with EIO: the
    append that hit it raises, the log refuses appends (fenced), and a reopen finds every
    acknowledged record, whole, and at most the one whose append failed after them (when
    the failed pwrite was an index write, after its frame's: unacknowledged, it may survive
    whole)."""

    path = str(tmp_path / "log")
    out = _run_with_eio(tmp_path, "pwrite64", when, CHILD, path)
    with pylog.Log(path, fsync="always") as log:
        n = log.next_offset
        assert out["acked"] <= n <= out["acked"] + 1
        assert [bytes(rec.value) for rec in log.scan()] == [b"r%05d" % i * 10 for i in range(n)]
        assert log.verify() == []


# ---- the durable append of a group of one in C (Framer.append_durable) -------------------

needs_durable_c = pytest.mark.skipif(
    speedups is None or not hasattr(getattr(speedups, "Framer", None), "append_durable"),
    reason="pylog._speedups' Framer.append_durable is not in use (the pure backend, or no extension)")


@needs_durable_c
def test_one_durable_writer_is_led_in_c_and_writes_what_the_python_path_writes(tmp_path, monkeypatch):
    """One writer under fsync="always": after the first append (whose Python leader makes the
    leader's descriptor), every common append is written out and fdatasynced by
    Framer.append_durable (no _wait_durable), each durable when append returns (the group
    commit's durable_next past it), the index written as the Python path writes it."""
    from pylog.appender import LogAppending

    waits: list[int] = []
    real_wait = LogAppending._wait_durable

    def counted(self, offset):
        waits.append(offset)
        return real_wait(self, offset)

    monkeypatch.setattr(LogAppending, "_wait_durable", counted)
    import pylog.appender

    # one clock for the C framing and the Python paths (a roll's append), so both logs match
    monkeypatch.setattr(pylog.appender, "_now_ms", lambda: 1_700_000_000_000)
    speedups.set_test_clock(lambda: 1_700_000_000_000)
    try:
        a = str(tmp_path / "c")
        with pylog.Log(a, fsync="always", segment_bytes=8192, index_interval_bytes=512) as log:
            for i in range(300):  # several rolls, an index entry every few records
                off = log.append(b"r%05d" % i * (i % 9 + 1))
                assert off == i and log._gc.durable_next == i + 1
            led_in_c = 300 - len(waits)
        # the same appends with a replaced vfs.fdatasync: the C path is off, the Python leader syncs
        monkeypatch.setattr(vfs, "fdatasync", lambda fd: os.fdatasync(fd))
        del waits[:]
        b = str(tmp_path / "py")
        with pylog.Log(b, fsync="always", segment_bytes=8192, index_interval_bytes=512) as log:
            for i in range(300):
                assert log.append(b"r%05d" % i * (i % 9 + 1)) == i
        assert len(waits) == 300
    finally:
        speedups.set_test_clock(None)
    # each segment's first append goes through the Python leader (it makes the descriptor)
    assert led_in_c >= 300 - len(store_files(a)) - 1, led_in_c
    for ext in (".log", ".index", ".timeindex"):
        fa = sorted(n for n in os.listdir(a) if n.endswith(ext))
        fb = sorted(n for n in os.listdir(b) if n.endswith(ext))
        assert fa == fb and len(fa) >= 3, (ext, fa, fb)
        for n in fa:
            assert open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read(), n
    with pylog.Log(a) as log:
        assert log.verify() == [] and log.next_offset == 300
        assert [r.offset for r in log.scan(start=123, stop=126)] == [123, 124, 125]


FSYNC_CHILD = """
import json, os, sys
import pylog
from pylog.appender import LogAppending
from pylog.errors import LogFencedError
waits = []
real_wait = LogAppending._wait_durable
def counted(self, offset):
    waits.append(offset)
    return real_wait(self, offset)
LogAppending._wait_durable = counted
log = pylog.Log(sys.argv[1], fsync="always")
acked, error, failed_waits = 0, None, None
try:
    for i in range(200):
        n = len(waits)
        try:
            log.append(b"r%05d" % i * 10)
        except OSError:
            failed_waits = len(waits) - n  # _wait_durable calls of the append that failed
            raise
        acked += 1
        os.write(1, b"ack %d %d\\n" % (i, len(waits)))  # and the _wait_durable calls so far
except OSError as e:
    error = e.errno
try:
    log.append(b"more")
    fenced = False
except LogFencedError:
    fenced = True
print(json.dumps({"acked": acked, "errno": error, "fenced": fenced, "failed_waits": failed_waits,
                  "waits": len(waits)}))
sys.stdout.flush()
os._exit(0)
"""


@needs_durable_c
@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
@pytest.mark.parametrize("when", [2, 3, 40, 150])  # (the first fdatasyncs: the new log's files)
def test_a_failed_fdatasync_of_the_c_leader_fails_the_append_and_fences(tmp_path, when):
    """strace fails the ``when``-th fdatasync of a one-writer process with EIO. Where the
    C leader (Framer.append_durable) made that fdatasync, the append raises the EIO, the log
    is fenced (the next append raises LogFencedError), and a reopen finds every acknowledged
    record and at most the one whose append failed."""

    path = str(tmp_path / "log")
    out = _run_with_eio(tmp_path, "fdatasync", when, FSYNC_CHILD, path)
    if out["acked"] >= 2:  # past the first appends (the Python leader makes the descriptor)
        assert out["failed_waits"] == 0, out  # the C leader's fdatasync failed, not _wait_durable's
        assert out["waits"] <= 2, out
    with pylog.Log(path, fsync="always") as log:
        n = log.next_offset
        assert out["acked"] <= n <= out["acked"] + 1
        assert [bytes(rec.value) for rec in log.scan()] == [b"r%05d" % i * 10 for i in range(n)]
        assert log.verify() == []


@needs_durable_c
@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
@pytest.mark.parametrize("when", [5, 77])
def test_the_c_leader_acknowledges_only_after_its_fdatasync_and_acked_records_survive_kill9(tmp_path, when):
    """A one-writer process is killed (SIGKILL) on entering its ``when``-th fdatasync. The
    trace shows every acknowledgement (the child's write of "ack i") after an fdatasync of the
    store that returned 0 following the pwrite of record i's frame; a reopen finds every
    acknowledged record, whole."""
    path = str(tmp_path / "log")
    trace = str(tmp_path / "trace")
    r = subprocess.run([STRACE, "-qq", "-y", "-o", trace, "-e", "trace=pwrite64,fdatasync,write",
                        "-e", f"inject=fdatasync:signal=SIGKILL:when={when}", sys.executable, "-c",
                        FSYNC_CHILD, path], capture_output=True, text=True, timeout=120, env=py_env())
    assert r.returncode != 0  # killed
    lines = [line.split() for line in r.stdout.splitlines() if line.startswith("ack ")]
    acked = [int(x[1]) for x in lines]
    assert acked == list(range(len(acked))) and len(acked) >= when - 4, (acked, r.stdout[-500:])
    assert int(lines[-1][2]) <= 2, lines[-1]  # the C leader synced them (the Python one the first)
    # the order of events: a record's frame pwritten to the store, then a successful fdatasync
    # of the store, then its acknowledgement
    pending_write = synced_upto = 0  # frames written to the store so far; of them, fdatasynced
    acks = 0
    with open(trace) as f:
        for line in f:
            if line.startswith("pwrite64(") and ".log>" in line.split(",")[0] and ", 0) = " not in line:
                pending_write += 1  # (one frame a pwrite: one writer, a group of one; not the header)
            elif line.startswith("fdatasync(") and ".log>" in line and line.rstrip().endswith("= 0"):
                synced_upto = pending_write
            elif line.startswith("write(1") and "ack " in line:
                acks += 1
                assert acks <= synced_upto, (acks, synced_upto, line)
    assert acks == len(acked)
    with pylog.Log(path) as log:
        vals = [bytes(rec.value) for rec in log.scan()]
        assert vals[:len(acked)] == [b"r%05d" % i * 10 for i in acked]
        assert len(vals) <= len(acked) + 1
        assert log.verify() == []
