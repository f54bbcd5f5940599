"""Consumers: positions, commits (durable across SIGKILL), groups splitting partitions."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.consumer import OFFSET_FILE_SIZE, decode_offset, encode_offset


@pytest.fixture
def store(tmp_path):
    s = pylog.LogStore(tmp_path / "root")
    yield s
    s.close()


def fill(topic, n_per_partition):
    for p in range(topic.partitions):
        topic.append_batch([b"p%d-%d" % (p, i) for i in range(n_per_partition)], partition=p)


def drain(consumer, max_records=500):
    out = []
    while True:
        got = consumer.poll_partitions(max_records)
        if not got:
            return out
        for p, recs in got.items():
            out.extend((p, r.offset, bytes(r.value)) for r in recs)


def test_poll_reads_everything_once_in_order(store):
    t = store.create_topic("t", 3)
    fill(t, 40)
    c = store.consumer("t", group="g")
    assert c.assignment() == [0, 1, 2]
    got = drain(c, max_records=7)
    assert len(got) == 120
    for p in range(3):
        mine = [(off, v) for q, off, v in got if q == p]
        assert mine == [(i, b"p%d-%d" % (p, i)) for i in range(40)]
    assert c.poll() == []
    assert [c.position(p) for p in range(3)] == [40, 40, 40]


def test_poll_returns_records_and_last_poll(store):
    t = store.create_topic("t", 2)
    fill(t, 5)
    c = store.consumer("t", group="g")
    recs = c.poll(max_records=100)
    assert len(recs) == 10
    assert sum(len(v) for v in c.last_poll.values()) == 10
    assert {p: [r.offset for r in v] for p, v in c.last_poll.items()} == {0: list(range(5)), 1: list(range(5))}
    assert all(isinstance(r, pylog.Record) for r in recs)


def test_max_records_is_respected(store):
    t = store.create_topic("t", 1)
    fill(t, 50)
    c = store.consumer("t")
    assert len(c.poll(max_records=13)) == 13
    assert c.position(0) == 13
    with pytest.raises(ValueError):
        c.poll(max_records=0)
    with pytest.raises(ValueError):
        c.poll(timeout_ms=-1)


def test_commit_and_resume(tmp_path):
    root = tmp_path / "r"
    with pylog.LogStore(root) as s:
        t = s.create_topic("t", 2)
        fill(t, 10)
        c = s.consumer("t", group="billing")
        assert c.committed() == {0: None, 1: None}
        c.poll(max_records=4)
        c.commit()
        committed = c.committed()
        assert sum(v for v in committed.values()) == 4
        c.poll(max_records=100)  # read but not committed
    with pylog.LogStore(root) as s:
        c = s.consumer("t", group="billing")
        assert {p: c.position(p) for p in (0, 1)} == committed
        assert len(drain(c)) == 16
        other = s.consumer("t", group="other")  # groups are independent
        assert len(drain(other)) == 20


def test_auto_offset_reset_latest_and_none(store):
    t = store.create_topic("t", 1)
    fill(t, 5)
    c = store.consumer("t", group="late", auto_offset_reset="latest")
    assert c.poll() == []
    t.append(b"new")
    assert [bytes(r.value) for r in c.poll()] == [b"new"]
    with pytest.raises(ValueError):
        store.consumer("t", group="x", auto_offset_reset="middle")


def test_seek_family(store):
    t = store.create_topic("t", 2)
    for i in range(10):
        t.append(b"%d" % i, partition=0, timestamp=1000 + i * 10)
    c = store.consumer("t", group="g")
    c.seek(0, 7)
    assert [r.offset for r in c.poll()] == [7, 8, 9]
    c.seek_to_beginning([0])
    assert c.position(0) == 0
    c.seek_to_end()
    assert c.position(0) == 10 and c.position(1) == 0
    c.seek_to_timestamp(1035)
    assert c.position(0) == 4
    assert c.offsets_for_time(5000) == {0: None, 1: None}
    c.seek_to_timestamp(5000)
    assert c.position(0) == 10
    with pytest.raises(pylog.UnknownPartitionError):
        c.seek(5, 0)
    with pytest.raises(TypeError):
        c.seek(0, "1")
    with pytest.raises(pylog.OffsetOutOfRangeError):
        c.seek(0, -1)
    c.seek(0, 1000)  # out of range: reset at the next poll (earliest)
    assert len(c.poll()) == 10


def test_position_below_start_resets_after_retention(store):
    t = store.create_topic("t", 1, segment_bytes=4096)
    c = store.consumer("t", group="g")
    for i in range(300):
        t.append(b"x" * 50, timestamp=1)
    c.seek(0, 0)
    c.commit({0: 0})
    t.partition(0).remove_expired(0)
    start = t.partition(0).start_offset
    assert start > 0
    recs = c.poll()
    assert recs[0].offset == start


def test_two_consumers_split_partitions(store):
    t = store.create_topic("t", 5)
    fill(t, 10)
    a = store.consumer("t", group="g", rebalance_ms=0)
    b = store.consumer("t", group="g", rebalance_ms=0)
    for _ in range(3):
        a.poll(1)
        b.poll(1)
    assert set(a.assignment()).isdisjoint(b.assignment())
    assert sorted(a.assignment() + b.assignment()) == [0, 1, 2, 3, 4]
    b.close()
    a.poll(1)
    assert a.assignment() == [0, 1, 2, 3, 4]


def test_manual_assignment_conflicts(store):
    store.create_topic("t", 3)
    a = store.consumer("t", group="g", partitions=[1])
    assert a.assignment() == [1]
    with pytest.raises(pylog.LogLockedError):
        store.consumer("t", group="g", partitions=[1, 2])
    b = store.consumer("t", group="g", partitions=[2])
    with pytest.raises(pylog.NotAssignedError):
        b.position(1)
    with pytest.raises(pylog.NotAssignedError):
        b.commit({1: 0})
    a.close()
    c = store.consumer("t", group="g", partitions=[1])
    assert c.assignment() == [1]


def test_no_group_cannot_commit(store):
    store.create_topic("t", 1)
    c = store.consumer("t")
    with pytest.raises(pylog.NotAssignedError):
        c.commit()
    with pytest.raises(pylog.InvalidNameError):
        store.consumer("t", group="../evil")
    c.close()
    with pytest.raises(pylog.LogClosedError):
        c.poll()


def test_poll_timeout_waits_for_new_records(store):
    t = store.create_topic("t", 1)
    c = store.consumer("t", group="g")
    t0 = time.monotonic()
    assert c.poll(timeout_ms=150) == []
    assert time.monotonic() - t0 >= 0.14
    import threading

    threading.Timer(0.05, lambda: t.append(b"late")).start()
    recs = c.poll(timeout_ms=5000)
    assert [bytes(r.value) for r in recs] == [b"late"]


def test_offset_file_format_and_damage(tmp_path):
    data = encode_offset(1234, 99)
    assert len(data) == OFFSET_FILE_SIZE and decode_offset(data) == 1234
    for bad in (b"", data[:-1], data[:10] + bytes([data[10] ^ 1]) + data[11:], b"x" * OFFSET_FILE_SIZE):
        assert decode_offset(bad) is None
    root = tmp_path / "r"
    with pylog.LogStore(root) as s:
        t = s.create_topic("t", 1)
        fill(t, 10)
        c = s.consumer("t", group="g")
        c.seek(0, 6)
        c.commit()
        path = os.path.join(t.path, "~consumers", "g", "partition-0.offset")
        assert os.path.getsize(path) == OFFSET_FILE_SIZE
    with open(path, "r+b") as f:
        f.seek(16)
        f.write(b"\xff")
    with pylog.LogStore(root) as s:
        with pytest.warns(RuntimeWarning, match="damaged"):
            c = s.consumer("t", group="g")
            assert c.position(0) == 0  # earliest, never a wrong offset


def test_reader_in_other_store_follows_writer(tmp_path):
    root = tmp_path / "r"
    with pylog.LogStore(root) as w, pylog.LogStore(root) as r:
        t = w.create_topic("t", 1, fsync="always")
        c = r.consumer("t", group="g")
        assert c.poll() == []
        t.append(b"one")
        assert [bytes(x.value) for x in c.poll(timeout_ms=2000)] == [b"one"]


CHILD = textwrap.dedent("""
    import os, sys, pylog
    root, n = sys.argv[1], int(sys.argv[2])
    s = pylog.LogStore(root)
    c = s.consumer("t", group="g")
    done = 0
    while done < n:
        recs = c.poll(max_records=7)
        if not recs:
            break
        done += len(recs)
        c.commit()
        print(sum(c.committed().values()), flush=True)
    sys.stdout.write("waiting\\n"); sys.stdout.flush()
    import time
    time.sleep(60)
""")


@pytest.mark.crash
def test_commit_survives_sigkill(tmp_path):
    root = tmp_path / "r"
    with pylog.LogStore(root) as s:
        t = s.create_topic("t", 3)
        fill(t, 20)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root), "30"], stdout=subprocess.PIPE, text=True)
    last = None
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip() == "waiting":
                break
            last = int(line)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert last is not None and last >= 30
    with pylog.LogStore(root) as s:
        c = s.consumer("t", group="g")  # the killed member's locks are gone
        assert c.assignment() == [0, 1, 2]
        assert sum(c.committed().values()) == last
        rest = drain(c)
        assert len(rest) == 60 - last


@settings(max_examples=20)
@given(st.lists(st.tuples(st.sampled_from(["poll", "commit", "reopen", "append"]), st.integers(1, 20)),
                max_size=25))
def test_consumer_against_model(tmp_path_factory, ops):
    """Positions and commits follow a model: every record is seen once between commits,
    and a reopened consumer restarts at the last commit."""
    root = tmp_path_factory.mktemp("c")
    s = pylog.LogStore(root)
    try:
        t = s.create_topic("t", 2)
        sizes = [0, 0]
        pos = [0, 0]
        committed = [0, 0]
        c = s.consumer("t", group="g")
        for op, n in ops:
            if op == "append":
                for i in range(n):
                    p, off = t.append(b"x", key=b"%d" % i)
                    assert off == sizes[p]
                    sizes[p] += 1
            elif op == "poll":
                got = c.poll_partitions(n)
                assert sum(len(v) for v in got.values()) == min(n, sum(sizes) - sum(pos))
                for p, recs in got.items():
                    assert [r.offset for r in recs] == list(range(pos[p], pos[p] + len(recs)))
                    pos[p] += len(recs)
            elif op == "commit":
                c.commit()
                committed = list(pos)
            else:
                c.close()
                c = s.consumer("t", group="g")
                pos = list(committed)
            assert [c.position(p) for p in (0, 1)] == pos
    finally:
        s.close()


def test_iterating_commits_only_what_the_loop_took(store):
    """``for rec in consumer: ... break`` then commit(): the group resumes right after the
    last record the loop took, not after the rest of the poll's batch (it used to commit
    the whole batch: records never handed out were skipped by the group)."""
    t = store.create_topic("t", partitions=2)
    fill(t, 10)
    c = store.consumer("t", group="g")
    took = []
    for rec in c:
        took.append(bytes(rec.value))
        if len(took) == 3:
            break
    c.commit()
    c.close()
    part = int(took[0][1:2])
    assert took == [b"p%d-%d" % (part, i) for i in range(3)]
    c = store.consumer("t", group="g")
    assert c.committed() == {part: 3, 1 - part: 0}
    rest = c.poll(max_records=100)
    assert sorted(bytes(r.value) for r in rest) == sorted(
        [b"p%d-%d" % (part, i) for i in range(3, 10)] + [b"p%d-%d" % (1 - part, i) for i in range(10)])
    c.close()


def test_seek_inside_the_iteration_is_obeyed(store):
    t = store.create_topic("t")
    fill(t, 6)
    c = store.consumer("t", group="g")
    took = []
    for rec in c:
        took.append(rec.offset)
        if rec.offset == 3 and len(took) == 4:
            c.seek(0, 1)  # the rest of this batch (4, 5) is not handed out
        if len(took) == 9:
            break
    assert took == [0, 1, 2, 3, 1, 2, 3, 4, 5]
    c.close()
