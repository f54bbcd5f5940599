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


@pytest.mark.skipif(STRACE is None, reason="strace with fault injection is not available")
@pytest.mark.parametrize("when", [4, 5, 12, 57])  # (the first 3 write the new files' headers)
def test_a_failed_c_write_out_fences_and_keeps_every_acknowledged_record(tmp_path, when):
    """strace fails the ``when``-th pwrite64 of a durable writer process with EIO: the
    append that hit it raises, the log refuses appends (fenced), and a reopen finds every
    acknowledged record, whole, and at most the one whose append failed after them (when
    the failed pwrite was an index write, after its frame's: unacknowledged, it may survive
    whole)."""
    import errno

    path = str(tmp_path / "log")
    trace = str(tmp_path / "trace")
    r = subprocess.run([STRACE, "-qq", "-o", trace, "-e", "trace=pwrite64",
                        "-e", f"inject=pwrite64:error=EIO:when={when}", sys.executable, "-c", CHILD, path],
                       capture_output=True, text=True, timeout=120, env=py_env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    with open(trace) as f:
        assert any("INJECTED" in line for line in f)
    assert out["errno"] == errno.EIO and out["fenced"], out
    assert 0 <= out["acked"] < 200
    with pylog.Log(path, fsync="always") as log:
        n = log.next_offset
        assert out["acked"] <= n <= out["acked"] + 1
        assert [bytes(rec.value) for rec in log.scan()] == [b"r%05d" % i * 10 for i in range(n)]
        assert log.verify() == []
