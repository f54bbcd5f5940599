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
import random
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import LogFencedError

from conftest import py_env, scaled, store_files

STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(STRACE is None, reason="strace is not installed")


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
