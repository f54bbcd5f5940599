"""Readers never see part of a transaction (issue 30, items 5 and 6): a read-only reader in
another process that refreshes while an apply finishes keeps none or all of the
transaction's records in a partition, and a transaction shows in all of its partitions at
one moment. Real writer and reader processes; the races are hit every time by hooks that
pause the apply (``pylog.transactions.apply_hook``) and the reader between its walk of the
files and its look at the marker (``pylog.loader.refresh_hook``). Both backends."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import LONG, py_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog

BACKENDS = ["native", "pure"]

#: What writer and reader children share: files in a sync directory as signals.
SYNC = """
import json, os, sys, time
import pylog
from pylog import loader, transactions

def wait_for(sync, name, timeout=60):
    p = os.path.join(sync, name)
    deadline = time.monotonic() + timeout
    while not os.path.exists(p):
        if time.monotonic() > deadline:
            sys.exit("timed out waiting for " + name)
        time.sleep(0.002)

def touch(sync, name):
    open(os.path.join(sync, name), "w").close()
"""

#: Commits one transaction of ``n`` records into each of a/0 and a/1, its apply paused
#: after the first chunk of partition ``pause`` (flushed into the file, where readers see
#: it) until the reader says "go".
WRITER = SYNC + """
root, sync, n, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if sys.argv[5:] == ["ready"]:  # the reader opens first (else its open may see the apply's first chunk)
    wait_for(sync, "reader-open")
transactions._APPLY_CHUNK = 50
paused = []

def hook(log, entry, done):
    if not paused and entry["partition"] == pause:
        paused.append(done)
        log.flush()
        touch(sync, "applying")
        wait_for(sync, "go")

transactions.apply_hook = hook
with pylog.LogStore(root) as s:
    with s.transaction() as tx:
        for p in (0, 1):
            tx.append_batch("a", [b"T-%d-%d" % (p, i) for i in range(n)], partition=p)
touch(sync, "committed")
"""


def _child(code, *args, backend):
    env = dict(py_env(), PYLOG_BACKEND="pure" if backend == "pure" else "")
    if backend != "pure":
        env.pop("PYLOG_BACKEND")
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return out


def _store(root, before=10):
    with pylog.LogStore(root) as s:
        s.create_topic("a", partitions=2)
        for p in (0, 1):
            s.topic("a").append_batch([b"old-%d-%d" % (p, i) for i in range(before)], partition=p)


def _run(tmp_path, reader, backend, n=300, pause=0, ready=False):
    root, sync = tmp_path / "r", tmp_path / "sync"
    sync.mkdir()
    _store(root)
    r = _child(reader, root, sync, backend=backend)
    w = _child(WRITER, root, sync, n, pause, *(["ready"] if ready else []), backend=backend)
    out = _done(r)
    _done(w)
    return json.loads(out)


#: A read-only Log of a/0, opened before the commit ("refresh") or while the apply is
#: paused ("open"); its refresh (or open) lets the apply finish between its walk and its
#: look at the marker: the walk holds part of the transaction, the marker is gone after.
REFRESH_READER = SYNC + """
root, sync, how = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(root, "a", "partition-0")
log = pylog.Log(path, readonly=True) if how == "refresh" else None
touch(sync, "reader-open")
wait_for(sync, "applying")
hooked = []

def hook(lg):
    if not hooked:
        hooked.append(lg.next_offset)  # what the walk found
        touch(sync, "go")
        wait_for(sync, "committed")

loader.refresh_hook = hook
if how == "refresh":
    log.refresh()
else:
    log = pylog.Log(path, readonly=True)
stable = log.stable_offset  # before any read (a read past it would refresh again)
print(json.dumps({"walked": hooked[0], "stable": stable,
                  "values": [bytes(log.read(i).value).decode() for i in range(stable)]}))
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["refresh", "open"])
def test_a_refresh_racing_the_end_of_an_apply_keeps_none_or_all_of_it(tmp_path, backend, how):
    """Item 5, the reproduction: the reader's walk sees the first 50 of 300 records of the
    transaction, the apply then finishes (the marker is removed) before the reader looks
    at the marker. It used to keep offsets 0..59 (a partial end); now it looks again (the
    store's visibility token changed) and has all 310."""
    n = 300
    got = _run(tmp_path, REFRESH_READER.replace('sys.argv[3]', repr(how)), backend, n, ready=True)
    assert got["walked"] == 10 + 50  # the race was hit: the walk held part of the transaction
    assert got["stable"] == 10 + n
    assert got["values"] == [f"old-0-{i}" for i in range(10)] + [f"T-0-{i}" for i in range(n)]


#: While the apply is paused in a/1 (a/0 is applied), a read-only store's consumer of
#: both partitions and read-only Logs of each; then, with the apply let go and finished,
#: Spark's planning snapshot (pylog.spark.reading._bounds) whose look at a/1 races the
#: publish.
ACROSS_READER = SYNC + """
root, sync = sys.argv[1], sys.argv[2]
wait_for(sync, "applying")
out = {}
with pylog.LogStore(root, readonly=True) as ro:
    c = ro.consumer("a")
    c.seek_to_beginning()
    got = c.poll_partitions(max_records=10000)
    out["poll"] = {str(p): len(v) for p, v in got.items()}
logs = [pylog.Log(os.path.join(root, "a", f"partition-{p}"), readonly=True) for p in (0, 1)]
out["stable"] = [lg.stable_offset for lg in logs]
seen = []

def hook(lg):
    seen.append(os.path.basename(lg.path))
    if lg.path.endswith("partition-1") and not os.path.exists(os.path.join(sync, "go")):
        touch(sync, "go")  # a/0 was looked at before: now the transaction is published
        wait_for(sync, "committed")

loader.refresh_hook = hook
from pylog.spark.reading import _bounds
out["bounds"] = {str(p): list(v) for p, v in _bounds(root, ["a"])["a"].items()}
out["looks"] = seen
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_transaction_shows_in_all_its_partitions_at_once(tmp_path, backend):
    """Item 6: a/0 is applied and a/1 is being applied. Markers used to be removed one
    partition at a time, so a consumer of both (and read-only Logs of each) got the
    transaction's records from a/0 and none from a/1; now both stop at the markers until
    the transaction is published. Spark's planning snapshot, whose look at a/1 lets the
    publish happen after a/0 was looked at, looks again and has it in both."""
    pytest.importorskip("pyspark.sql.datasource")  # the reader child plans as Spark does
    n = 300
    got = _run(tmp_path, ACROSS_READER, backend, n, pause=1)
    assert got["poll"] == {"0": 10, "1": 10}
    assert got["stable"] == [10, 10]
    assert got["bounds"] == {"0": [0, 10 + n], "1": [0, 10 + n]}
    # the race was hit: a/1 was looked at while the transaction was still unpublished
    assert got["looks"].count("partition-1") >= 2, got["looks"]


#: Commits the planned transactions (``[[records per partition] per transaction]``) into
#: a/0, a/1 and b/0, the apply slowed; then "committed".
SOAK_WRITER = SYNC + """
root, sync, plan, delay = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
transactions._APPLY_CHUNK = 7

def hook(log, entry, done):
    time.sleep(delay)

transactions.apply_hook = hook
parts = [("a", 0), ("a", 1), ("b", 0)]
touch(sync, "started")
with pylog.LogStore(root) as s:
    for t, counts in enumerate(plan):
        with s.transaction() as tx:
            for (topic, p), k in zip(parts, counts):
                if k:
                    tx.append_batch(topic, [b"%d/%d/%d" % (t, i, k) for i in range(k)], partition=p)
touch(sync, "committed")
"""

#: Refreshes the three partitions over and over while the writer runs. Checks (1) each
#: partition holds each transaction whole or not at all; (2) a transaction seen in any
#: partition is whole in every one of its partitions looked at afterwards; (3) a
#: transactions.consistent snapshot holds each transaction in all its partitions or none.
SOAK_READER = SYNC + """
root, sync, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
parts = [("a", 0), ("a", 1), ("b", 0)]
wait_for(sync, "started")
while True:
    try:
        logs = [pylog.Log(os.path.join(root, t, f"partition-{p}"), readonly=True) for t, p in parts]
        break
    except FileNotFoundError:
        time.sleep(0.001)
read_to = [0, 0, 0]
have = [dict() for _ in parts]  # per partition: {txn: records seen}
shown = set()
looks = snapshots = 0

def look(j):
    global looks
    lg = logs[j]
    lg.refresh()
    stable = lg.stable_offset
    while read_to[j] < stable:  # every record below the stable offset this look found
        batch = lg.read_batch(read_to[j], 1 << 30, stable - read_to[j])
        assert batch, (parts[j], read_to[j], stable)
        for r in batch:
            if r.offset >= stable:
                break
            t, i, k = map(int, bytes(r.value).split(b"/"))
            assert i == have[j].get(t, 0), (parts[j], t, i, have[j])
            have[j][t] = i + 1
            read_to[j] = r.offset + 1
    for t, m in have[j].items():  # (1) whole or not at all
        assert m == plan[t][j], f"{parts[j]}: transaction {t} has {m} of {plan[t][j]} records"
    for t in shown:  # (2) shown elsewhere before this look: whole here too
        assert plan[t][j] == 0 or t in have[j], f"transaction {t} shown elsewhere, not in {parts[j]}"
    looks += 1

while True:
    last = os.path.exists(os.path.join(sync, "committed"))
    for j in range(3):
        look(j)
        shown.update(have[j])
    ends = transactions.consistent(root, lambda: [lg.refresh() or lg.stable_offset for lg in logs])
    snapshots += 1
    starts = [0, 0, 0]
    for t, counts in enumerate(plan):  # (3): the snapshot cuts between transactions
        inside = [starts[j] + counts[j] <= ends[j] for j in range(3) if counts[j]]
        assert all(inside) or not any(inside), (t, ends, plan)
        starts = [starts[j] + counts[j] for j in range(3)]
    if last:
        break
assert all(len(have[j]) == sum(1 for c in plan if c[j]) for j in range(3))
print(json.dumps({"looks": looks, "snapshots": snapshots}))
"""


@settings(max_examples=25 if LONG else 3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=st.lists(st.lists(st.integers(0, 40), min_size=3, max_size=3).filter(any), min_size=1, max_size=6),
       delay=st.sampled_from([0.0, 0.0005, 0.003]), backend=st.sampled_from(BACKENDS))
def test_readers_never_see_part_of_a_transaction(tmp_path_factory, plan, delay, backend):
    """A writer process commits the planned transactions into three partitions of two
    topics (its apply slowed), two reader processes refresh them over and over meanwhile:
    each partition holds every transaction whole or not at all; a transaction a reader
    has seen in one partition is whole in each of its partitions the reader looks at
    afterwards; a ``transactions.consistent`` snapshot holds it in all or none."""
    tmp = tmp_path_factory.mktemp("soak")
    root, sync = tmp / "r", tmp / "sync"
    sync.mkdir()
    with pylog.LogStore(root) as s:
        s.create_topic("a", partitions=2)
        s.create_topic("b")
        for t, p in (("a", 0), ("a", 1), ("b", 0)):
            s.topic(t).partition(p)  # its first segment: readers can open it
    arg = json.dumps(plan)
    readers = [_child(SOAK_READER, root, sync, arg, backend=backend) for _ in range(2)]
    w = _child(SOAK_WRITER, root, sync, arg, delay, backend=backend)
    _done(w)
    for r in readers:
        got = json.loads(_done(r))
        assert got["looks"] >= 3 and got["snapshots"] >= 1


#: Commits one transaction of ``n`` records into a/0 and a/1 and dies (exit 9) as the
#: apply of a/1 begins: a/0 holds its records, both partitions their markers.
DIES_IN_APPLY = """
import os, sys, pylog
from pylog import transactions
root, n = sys.argv[1], int(sys.argv[2])
real = transactions._apply

def apply(log, d, entry, *more):
    if entry["partition"] == 1:
        os._exit(9)
    real(log, d, entry, *more)

transactions._apply = apply
with pylog.LogStore(root) as s:
    with s.transaction() as tx:
        for p in (0, 1):
            tx.append_batch("a", [b"T-%d-%d" % (p, i) for i in range(n)], partition=p)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_partition_rolled_forward_alone_stays_hidden_until_all_are(tmp_path, backend):
    """A committer died applying a/1 (a/0 applied). A plain Log writer of a/0 rolls it
    forward and appends after it: readers elsewhere still see neither partition's part
    (the roll forward used to remove a/0's marker, showing the transaction there alone);
    reopening a/0 never cuts that append (its marker says applied); the roll forward of
    a/1 publishes the transaction, which then shows in both, with the append."""
    root, n = tmp_path / "r", 40
    _store(root)
    p = _child(DIES_IN_APPLY, root, n, backend=backend)
    p.communicate(timeout=120)
    assert p.returncode == 9
    d0, d1 = (str(root / "a" / f"partition-{i}") for i in (0, 1))
    readers = [pylog.Log(d, readonly=True) for d in (d0, d1)]
    assert [r.stable_offset for r in readers] == [10, 10]
    with pylog.Log(d0) as w:
        assert w.stable_offset == 10 + n  # this writer goes on after the transaction
        assert w.append(b"after") == 10 + n
    for r in readers:
        r.refresh()
    assert [r.stable_offset for r in readers] == [10, 10]
    with pylog.Log(d0) as w:  # the marker says applied: nothing is cut, nothing applied again
        assert w.next_offset == 10 + n + 1
    with pylog.Log(d1) as w:  # the last partition: the transaction is published
        assert w.next_offset == 10 + n
    for r in readers:
        r.refresh()
    assert [r.stable_offset for r in readers] == [10 + n + 1, 10 + n]
    want0 = [f"old-0-{i}" for i in range(10)] + [f"T-0-{i}" for i in range(n)] + ["after"]
    assert [bytes(x.value).decode() for x in readers[0].scan()] == want0
    assert [bytes(x.value).decode() for x in readers[1].scan()][10:] == [f"T-1-{i}" for i in range(n)]
    for r in readers:
        r.close()
    with pylog.LogStore(root) as s:  # nothing left behind: no directory, no marker
        assert len(s.topic("a").partition(0)) == 10 + n + 1
        assert sorted(os.listdir(root / "~txn")) == ["visible"]
    assert not any(os.path.exists(os.path.join(d, "txn.stable")) for d in (d0, d1))


def test_a_look_between_the_token_and_the_publish_is_not_kept_after_it(tmp_path, monkeypatch):
    """Found under emulation (armhf): the committer wrote the store's new visibility token
    and was descheduled before the rename that publishes; a reader's refresh of each
    partition ran in that window, found the transaction unpublished and recorded the new
    token with that cap. After the publish the token was the same, the files unchanged,
    so its refreshes kept the stale cap: ``consistent()`` returned a snapshot showing the
    transaction in a partition looked at before the window and not in the others (and a
    plain refresh never showed it until something else changed). Here the window is
    entered every time, by looks from inside the publish, just before its rename."""
    from pylog import transactions, vfs

    root = tmp_path / "r"
    with pylog.LogStore(root) as s:
        s.create_topic("a", partitions=3)
        for p in range(3):
            s.topic("a").partition(p)
        readers = [pylog.Log(root / "a" / f"partition-{p}", readonly=True) for p in range(3)]
        in_window = []
        real = vfs.rename

        def rename(src, dst, *args, **kw):
            if os.path.basename(dst).startswith(".done-"):
                # the publish: its token is written, the directory not yet renamed
                for r in readers[1:]:
                    r.refresh()
                in_window.append([r.stable_offset for r in readers])
            return real(src, dst, *args, **kw)

        monkeypatch.setattr(vfs, "rename", rename)
        with s.transaction() as tx:
            for p in range(3):
                tx.append_batch("a", [b"x-%d" % i for i in range(4 + p)], partition=p)
        assert in_window and in_window[0][1:] == [0, 0]  # the window was entered, unpublished
        ends = transactions.consistent(root, lambda: [r.refresh() or r.stable_offset for r in readers])
        assert ends == [4, 5, 6]
        for r in readers:
            r.refresh()
        assert [r.stable_offset for r in readers] == [4, 5, 6]
        for r in readers:
            r.close()


def test_publishes_are_one_at_a_time(tmp_path, monkeypatch):
    """Two transactions of disjoint partitions commit in two threads. While the first is
    inside its publish (its id written, its directory not yet renamed), the second's
    publish waits: otherwise a reader could read the second's id before and after the
    first's rename and miss it. Without the lock both renames were under way at once."""
    import threading

    from pylog import vfs

    root = tmp_path / "r"
    events = []
    paused, release = threading.Event(), threading.Event()
    real = vfs.rename

    def rename(src, dst, *args, **kw):
        if os.path.basename(dst).startswith(".done-"):
            events.append(("rename", threading.current_thread().name))
            if threading.current_thread().name == "first":
                paused.set()
                release.wait(30)
        return real(src, dst, *args, **kw)

    with pylog.LogStore(root) as s:
        s.create_topic("a", partitions=2)

        def commit(p):
            with s.transaction() as tx:
                tx.append_batch("a", [b"v-%d" % p] * 3, partition=p)
            events.append(("done", threading.current_thread().name))

        monkeypatch.setattr(vfs, "rename", rename)
        first = threading.Thread(target=commit, args=(0,), name="first")
        first.start()
        assert paused.wait(30)
        second = threading.Thread(target=commit, args=(1,), name="second")
        second.start()
        second.join(0.5)  # long enough for its publish to reach the rename, were it free to
        assert ("rename", "second") not in events
        release.set()
        first.join(30)
        second.join(30)
    assert [e for e in events if e[0] == "rename"] == [("rename", "first"), ("rename", "second")]
    for p in (0, 1):
        with pylog.Log(root / "a" / f"partition-{p}", readonly=True) as lg:
            assert lg.stable_offset == 3 and bytes(lg.read(2).value) == b"v-%d" % p
