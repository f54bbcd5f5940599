"""Transactions (pylog.transactions, LogStore.transaction()): atomic across topics and
partitions, aborted on an exception, crash-safe, and never visible to any reader in any
process before the commit (each reader stops at the partition's last stable offset)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import py_env, run_py, scaled, strace_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog import transactions
from pylog.log import STABLE_FILE

STRACE = strace_path()


def _store(root, config=None, **topics):
    s = pylog.LogStore(root)
    for name, n in topics.items():
        s.create_topic(name, partitions=n, **(config or {}))
    return s


def _txn_left(root):
    """What is left under the root's ~txn but the visibility token (pylog.loader.VISIBLE_FILE),
    once this process's commits have deleted what they published."""
    transactions.wait_removals()
    d = os.path.join(str(root), "~txn")
    return sorted(n for n in os.listdir(d) if n != "visible") if os.path.isdir(d) else []


def _values(log, start=None):
    return [bytes(r.value) for r in log.scan(start)]


def test_commit_is_atomic_across_topics_and_partitions(tmp_path):
    with _store(tmp_path / "r", orders=3, audit=1) as s:
        with s.transaction() as tx:
            ps = tx.append_batch("orders", [b"o%d" % i for i in range(30)], keys=[b"k%d" % i for i in range(30)])
            tx.append("audit", b"a", metadata=b"m", timestamp=5)
            # nothing is visible before the commit
            assert [len(s.topic("orders").partition(p)) for p in range(3)] == [0, 0, 0]
            assert len(s.topic("audit").partition(0)) == 0
        assert tx.state == "committed"
        for p in range(3):
            want = [b"o%d" % i for i in range(30) if ps[i] == p]
            assert want and _values(s.topic("orders").partition(p)) == want
            assert ps == [s.topic("orders").partition_for(b"k%d" % i) for i in range(30)]
        rec = s.topic("audit").partition(0).read(0)
        assert (bytes(rec.value), bytes(rec.metadata), rec.timestamp) == (b"a", b"m", 5)
        assert tx.offsets[("audit", 0)] == 0
        assert _txn_left(tmp_path / "r") == []
        assert not any(os.path.exists(tmp_path / "r" / "orders" / f"partition-{p}" / STABLE_FILE) for p in range(3))


def test_exception_aborts_and_leaves_nothing(tmp_path):
    with _store(tmp_path / "r", t=2) as s:
        with pytest.raises(KeyError):
            with s.transaction() as tx:
                tx.append("t", b"x", partition=0)
                tx.append("t", b"y", partition=1)
                raise KeyError("boom")
        assert tx.state == "aborted"
        assert [len(s.topic("t").partition(p)) for p in range(2)] == [0, 0]
        assert _txn_left(tmp_path / "r") == []
        with pytest.raises(transactions.TransactionError, match="aborted"):
            tx.append("t", b"z")


def test_bad_input_is_a_typed_error_and_stages_nothing(tmp_path):
    with _store(tmp_path / "r", t=2) as s:
        with s.transaction() as tx:
            with pytest.raises(pylog.UnknownTopicError):
                tx.append("nope", b"x")
            with pytest.raises(pylog.UnknownPartitionError, match="no partition 7"):
                tx.append("t", b"x", partition=7)
            with pytest.raises(TypeError):
                tx.append("t", "a str")
            with pytest.raises(pylog.PylogError, match="at least one value"):
                tx.append_batch("t", [])
            with pytest.raises(pylog.PylogError, match="keys has 1 items, values has 2"):
                tx.append_batch("t", [b"a", b"b"], keys=[b"k"])
            tx.append("t", b"ok", partition=1)
        assert _values(s.topic("t").partition(1)) == [b"ok"]
        assert len(s.topic("t").partition(0)) == 0


def test_plain_appends_proceed_while_a_transaction_is_open(tmp_path):
    with _store(tmp_path / "r", t=1) as s:
        log = s.topic("t").partition(0)
        with s.transaction() as tx:
            tx.append("t", b"tx-1")
            # another thread's plain append is not blocked by the open transaction
            done = []
            th = threading.Thread(target=lambda: done.append(s.topic("t").append(b"plain")))
            th.start()
            th.join(5)
            assert done == [(0, 0)]
            assert _values(log) == [b"plain"]
        assert _values(log) == [b"plain", b"tx-1"]
        assert tx.offsets == {("t", 0): 1}


def test_reader_in_another_process_stops_at_the_stable_offset(tmp_path, monkeypatch):
    """While a commit's apply is in flight, the writer's own reads, a read-only Log in
    another process, and a consumer stop at the apply's start."""
    root = tmp_path / "r"
    s = _store(root, t=1)
    log = s.topic("t").partition(0)
    log.append(b"before")
    reached, go = threading.Event(), threading.Event()
    real = transactions._apply

    def paused(lg, txn_dir, entry, *more):
        lg.append_batch([b"half-1", b"half-2"])  # as a torn apply would leave them
        lg.flush()  # in the file, where other processes could read them
        reached.set()
        go.wait(30)
        lg.truncate(entry["start"])
        real(lg, txn_dir, entry, *more)

    monkeypatch.setattr(transactions, "_apply", paused)
    tx = s.transaction()
    tx.append("t", b"tx-1")
    tx.append("t", b"tx-2")
    th = threading.Thread(target=tx.commit)
    th.start()
    try:
        assert reached.wait(30)
        assert log.next_offset == 3 and log.stable_offset == 1 and log.last_stable_offset == 1
        # no lock is needed for these reads: they must stop at the stable offset
        with pytest.raises(pylog.OffsetOutOfRangeError):
            log.read(1)
        out = run_py(f"""
            import pylog
            log = pylog.Log({str(root / "t" / "partition-0")!r}, readonly=True)
            print(log.stable_offset, log.next_offset, [bytes(r.value) for r in log.read_batch(0)],
                  [bytes(r.value) for r in log.scan()])
            try:
                log.read(1)
                print("read 1")
            except pylog.OffsetOutOfRangeError:
                print("out of range")
            store = pylog.LogStore({str(root)!r})
            c = store.consumer("t")
            print([bytes(r.value) for r in c.poll(timeout_ms=200)])
            latest = store.consumer("t", auto_offset_reset="latest")
            end = store.consumer("t")
            end.seek_to_end()
            print(latest.position(0), end.position(0))
        """)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        # a consumer starting at the end starts at the stable offset, not after the
        # transaction's records (it would skip them once they are committed)
        assert lines == ["1 3 [b'before'] [b'before']", "out of range", "[b'before']", "1 1"]
    finally:
        go.set()
        th.join(30)
    assert _values(log) == [b"before", b"tx-1", b"tx-2"]
    s.close()


# ----------------------------------------------------------------------------------------
# crashes: SIGKILL of the committing process at every rename and fsync of the commit
_CHILD = textwrap.dedent("""
    import sys, pylog
    s = pylog.LogStore(sys.argv[1])
    with s.transaction() as tx:
        tx.append_batch("a", [b"a0-%d" % i for i in range(20)], partition=0)
        tx.append_batch("a", [b"a1-%d" % i for i in range(20)], partition=1)
        tx.append_batch("b", [b"b0-%d" % i for i in range(20)])
    print("committed", flush=True)
""")
_PARTS = [("a", 0), ("a", 1), ("b", 0)]


def _setup(root, config=None):
    s = _store(root, config, a=2, b=1)
    s.topic("a").append(b"old-a", partition=0)
    s.topic("b").append(b"old-b")
    s.close()


def _visible(root):
    """What read-only readers (in this process, no recovery) see, per partition."""
    out = []
    for t, p in _PARTS:
        log = pylog.Log(str(root / t / f"partition-{p}"), readonly=True)
        try:
            out.append([v for v in _values(log) if not v.startswith(b"old")])
        finally:
            log.close()
    return out


def _want(t, p):
    return [b"%s%d-%d" % (t.encode(), p, i) for i in range(20)]


def _check_after_kill(root, committed_ack):
    seen = _visible(root)
    left = [n for n in os.listdir(root / "~txn") if len(n) == 32] if os.path.isdir(root / "~txn") else []
    # decided: the decision is written, or the whole directory is gone (the commit finished)
    decided = not left or any(os.path.exists(root / "~txn" / d / "decision.json") for d in left)
    for (t, p), got in zip(_PARTS, seen):
        assert got in ([], _want(t, p)), (t, p, got)  # never a part of the transaction
        if got:
            assert decided or committed_ack, "records of an undecided transaction are visible"
    # recovery (the next store open) makes it all or nothing, and leaves nothing behind
    with pylog.LogStore(root) as s:
        after = [_values(s.topic(t).partition(p)) for t, p in _PARTS]
    whole = [[b"old-a", *_want("a", 0)], _want("a", 1), [b"old-b", *_want("b", 0)]]
    none = [[b"old-a"], [], [b"old-b"]]
    assert after in (whole, none)
    if (decided and left) or committed_ack or any(seen):
        assert after == whole
    assert _txn_left(root) == []  # nor .new-/.done- ones
    for t, p in _PARTS:
        assert not os.path.exists(root / t / f"partition-{p}" / STABLE_FILE)
    return after == whole


@pytest.mark.skipif(STRACE is None, reason="needs strace")
@pytest.mark.parametrize(("syscalls", "fsync"), [("rename,renameat,renameat2", None), ("fsync,fdatasync", None),
                                                 ("fsync,fdatasync", "always")])
def test_sigkill_at_every_rename_and_fsync_of_the_commit(tmp_path, syscalls, fsync):
    """SIGKILL of the committing process at each rename, or at each fsync: all or nothing
    after recovery, never a part of the transaction visible. Also with the topics under
    fsync="always", whose apply makes every append_batch durable through the group commit
    (the Spark sink commits into such topics the same way)."""
    outcomes = []
    n = 1
    while True:
        root = tmp_path / f"r{n}"
        _setup(root, None if fsync is None else {"fsync": fsync})
        p = subprocess.run([STRACE, "-f", "-o", os.devnull, "-e", f"inject={syscalls}:signal=SIGKILL:when={n}",
                            sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True,
                           env=py_env(), timeout=120)
        acked = "committed" in p.stdout
        outcomes.append(_check_after_kill(root, acked))
        shutil.rmtree(root)
        if acked:
            break  # the n-th call was past the end of the commit: every point was tried
        n += 1
        assert n < 400
    # both outcomes happened: killed before the commit point, and (fsyncs: the apply's) after it
    assert False in outcomes and outcomes[-1] is True, outcomes
    if "fsync" in syscalls:
        assert outcomes.count(True) >= 4, outcomes


def test_sigkill_at_random_points(tmp_path):
    rng = __import__("random").Random(7)
    code = _CHILD.replace("with s.transaction() as tx:", "print('ready', flush=True)\nwith s.transaction() as tx:")
    outcomes = []
    dur = None
    for i in range(scaled(6, 30) + 1):
        root = tmp_path / f"r{i}"
        _setup(root)
        p = subprocess.Popen([sys.executable, "-c", code, str(root)], env=py_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "ready\n"
        t0 = time.monotonic()
        if dur is None:  # the first run is not killed: it times a commit
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            dur = time.monotonic() - t0
        else:
            time.sleep(rng.uniform(0, dur))
            p.send_signal(signal.SIGKILL)
            out, _err = p.communicate(timeout=60)
        outcomes.append(_check_after_kill(root, "committed" in out))
        shutil.rmtree(root)
    assert outcomes[0] is True
    print("random kills, whole after recovery:", outcomes[1:])


def test_a_writer_log_open_rolls_a_decided_apply_forward(tmp_path):
    """A crash after the decision, mid-apply: a plain Log writer opened on the partition
    (not through the store) finishes the apply before anything else is appended."""
    root = tmp_path / "r"
    _setup(root)
    code = _CHILD.replace("import sys, pylog", "import sys, os, pylog\nfrom pylog import transactions as T\n"
                          "real = T._apply\n"
                          "def _apply(log, d, e, *more):\n"
                          "    if e['topic'] == 'a' and e['partition'] == 1:\n"
                          "        log.append_batch([b'torn'] * 3); log.flush(); os._exit(9)\n"
                          "    real(log, d, e, *more)\n"
                          "T._apply = _apply")
    p = run_py(code, str(root))
    assert p.returncode == 9, p.stderr
    assert _visible(root)[1] == []  # the torn part is behind the marker
    log = pylog.Log(str(root / "a" / "partition-1"))
    assert _values(log) == _want("a", 1)
    log.append(b"after")
    assert _values(log, 20) == [b"after"]
    log.close()
    with pylog.LogStore(root) as s:
        assert _values(s.topic("a").partition(0)) == [b"old-a", *_want("a", 0)]
        assert _values(s.topic("b").partition(0)) == [b"old-b", *_want("b", 0)]
    assert _txn_left(root) == []


# ----------------------------------------------------------------------------------------
# a reader process polling while a writer process commits transactions and is killed
_WRITER = textwrap.dedent("""
    import sys, pylog
    s = pylog.LogStore(sys.argv[1])
    PAD = b"x" * 2000
    i = 0
    while True:
        with s.transaction() as tx:
            for t, p in (("a", 0), ("a", 1), ("b", 0)):
                tx.append_batch(t, [b"%d:%d|" % (i, j) + PAD for j in range(5)], partition=p)
        s.topic("b").append(b"plain:%d" % i)
        print(i, flush=True)
        i += 1
""")
_READER = textwrap.dedent("""
    import sys, time, json, pylog
    root = sys.argv[1]
    logs = [pylog.Log(f"{root}/{t}/partition-{p}", readonly=True) for t, p in (("a", 0), ("a", 1), ("b", 0))]
    seen = [[] for _ in logs]
    deadline = time.time() + float(sys.argv[2])
    while time.time() < deadline:
        for i, log in enumerate(logs):
            while True:
                got = log.read_batch(len(seen[i]), max_records=7)
                if not got:
                    break
                seen[i].extend(bytes(r.value[:24]).split(b"|")[0].decode() for r in got)
    print(json.dumps(seen))
""")


def _check_whole(values):
    """Each transaction's 5 records in a partition are all there, in order, or none."""
    tx = [v for v in values if not v.startswith("plain")]
    for k in range(0, len(tx) - len(tx) % 5, 5):
        i = tx[k].split(":")[0]
        assert tx[k:k + 5] == [f"{i}:{j}" for j in range(5)], tx[k:k + 5]
    assert len(tx) % 5 == 0, tx[-5:]


def test_reader_process_never_sees_an_uncommitted_record(tmp_path):
    for run in range(scaled(2, 10)):
        root = tmp_path / f"r{run}"
        _setup(root)
        secs = 3.0
        reader = subprocess.Popen([sys.executable, "-c", _READER, str(root), str(secs)], env=py_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], env=py_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = writer.stdout.readline()  # one transaction committed: now kill it at some point
        time.sleep(secs * (0.2 + 0.1 * (run % 5)))
        writer.send_signal(signal.SIGKILL)
        wout, _ = writer.communicate(timeout=60)
        wout = first + wout
        rout, rerr = reader.communicate(timeout=120)
        assert reader.returncode == 0, rerr
        acked = [int(x) for x in wout.split()]
        assert acked, "the writer committed nothing"
        seen = json.loads(rout)
        for vals in seen:
            _check_whole([v for v in vals if v not in ("old-a", "old-b")])
        with pylog.LogStore(root) as s:
            final = [[bytes(r.value[:24]).split(b"|")[0].decode() for r in s.topic(t).partition(p).scan()]
                     for t, p in _PARTS]
        for vals, fin in zip(seen, final):
            assert fin[:len(vals)] == vals  # nothing a reader saw was rolled back
            _check_whole([v for v in fin if v not in ("old-a", "old-b")])
        for fin in final:  # every acknowledged transaction is there, in every partition
            ids = {v.split(":")[0] for v in fin if not v.startswith(("old", "plain"))}
            assert {str(i) for i in acked} <= ids
        # all or nothing across partitions after recovery
        sets = [{v.split(":")[0] for v in fin if not v.startswith(("old", "plain"))} for fin in final]
        assert sets[0] == sets[1] == sets[2]


# ----------------------------------------------------------------------------------------
# a model: plain appends, transactions (committed or aborted) and reads against lists
_OPS = st.lists(st.one_of(
    st.tuples(st.just("plain"), st.integers(0, 2), st.binary(max_size=8)),
    st.tuples(st.just("tx"), st.lists(st.tuples(st.integers(0, 2), st.binary(max_size=8)), max_size=6),
              st.booleans()),
), max_size=12)


@settings(max_examples=scaled(25, 200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_model(tmp_path_factory, ops):
    root = tmp_path_factory.mktemp("m")
    model = [[], [], []]  # partitions 0, 1 of "a" and 0 of "b" as one flat index
    where = [("a", 0), ("a", 1), ("b", 0)]
    with _store(root, a=2, b=1) as s:
        for op in ops:
            if op[0] == "plain":
                t, p = where[op[1]]
                s.topic(t).append(op[2], partition=p)
                model[op[1]].append(op[2])
            else:
                staged = [[], [], []]
                try:
                    with s.transaction() as tx:
                        for k, v in op[1]:
                            t, p = where[k]
                            tx.append(t, v, partition=p)
                            staged[k].append(v)
                            # an open transaction is invisible
                            assert _values(s.topic(t).partition(p)) == model[k]
                        if not op[2]:
                            raise RuntimeError("abort")
                except RuntimeError:
                    pass
                else:
                    for k in range(3):
                        model[k].extend(staged[k])
            for k, (t, p) in enumerate(where):
                assert _values(s.topic(t).partition(p)) == model[k]
    ro = [pylog.Log(str(root / t / f"partition-{p}"), readonly=True) for t, p in where]
    assert [_values(log) for log in ro] == model
    for log in ro:
        log.close()


def test_a_damaged_stable_marker_is_a_corrupt_record_error(tmp_path):
    """A txn.stable marker damaged from outside is reported as CorruptRecordError naming the
    file (it raised TypeError: the error was built with one argument instead of four)."""
    with _store(tmp_path / "r", t=1) as s:
        s.topic("t").append(b"x")
    part = tmp_path / "r" / "t" / "partition-0"
    (part / STABLE_FILE).write_bytes(b"{not json")
    with pytest.raises(pylog.CorruptRecordError) as ei:
        pylog.Log(part, readonly=True)
    assert ei.value.path == str(part / STABLE_FILE) and "stable-offset marker" in str(ei.value)


def _crash_mid_apply(root):
    """A committer killed in the apply of partition a/1 (after the decision): a/1 holds its
    marker, and the transaction's directory with its decision and staged records stays."""
    _setup(root)
    code = _CHILD.replace("import sys, pylog", "import sys, os, pylog\nfrom pylog import transactions as T\n"
                          "real = T._apply\n"
                          "def _apply(log, d, e, *more):\n"
                          "    if e['topic'] == 'a' and e['partition'] == 1:\n"
                          "        os._exit(9)\n"
                          "    real(log, d, e, *more)\n"
                          "T._apply = _apply")
    p = run_py(code, str(root))
    assert p.returncode == 9, p.stderr
    [txn] = [n for n in os.listdir(root / "~txn") if len(n) == 32]
    return root / "~txn" / txn


@pytest.mark.parametrize("damage", ["staged-missing", "count", "records-lost"])
def test_a_decided_transaction_that_cannot_be_applied_is_a_corrupt_record_error(tmp_path, damage):
    """A decided transaction whose apply finds its staged records gone, a different count of
    them than the decision says, or the partition shorter than the decided start offset:
    opening the partition's writer raises CorruptRecordError naming what is wrong (it raised
    TypeError: the error was built with one argument instead of four)."""
    txn_dir = _crash_mid_apply(tmp_path / "r")
    decision = json.loads((txn_dir / "decision.json").read_text())
    [entry] = [e for e in decision["partitions"] if (e["topic"], e["partition"]) == ("a", 1)]
    [(rel, count)] = entry["staged"]
    if damage == "staged-missing":
        shutil.rmtree(txn_dir / rel)
        path, words = str(txn_dir / rel), "are missing"
    elif damage == "count":
        entry["staged"] = [[rel, count + 1]]
        path, words = str(txn_dir / rel), f"hold {count} records, the decision says {count + 1}"
    else:
        entry["start"] = entry["start"] + 5
        path, words = str(tmp_path / "r" / "a" / "partition-1"), "records before it were lost"
    (txn_dir / "decision.json").write_text(json.dumps(decision))
    with pytest.raises(pylog.CorruptRecordError) as ei:
        pylog.Log(tmp_path / "r" / "a" / "partition-1")
    assert ei.value.path == path and words in str(ei.value)


def test_a_damaged_sinks_file_is_a_corrupt_record_error(tmp_path):
    """The streaming sinks' batch-id file damaged from outside: last_batch_id raises
    CorruptRecordError naming the file (it raised TypeError, as above)."""
    _store(tmp_path / "r", t=1).close()
    os.makedirs(tmp_path / "r" / "~txn", exist_ok=True)
    (tmp_path / "r" / "~txn" / transactions.SINKS_FILE).write_bytes(b"{not json")
    with pytest.raises(pylog.CorruptRecordError) as ei:
        transactions.last_batch_id(str(tmp_path / "r"), "sink")
    assert ei.value.path == str(tmp_path / "r" / "~txn" / transactions.SINKS_FILE)
    assert "unreadable" in str(ei.value)


# ----------------------------------------------------------------------------------------
# the apply: staged records of several contributors, merged by timestamp, in columns
_STAGED = st.lists(st.lists(st.tuples(
    st.one_of(st.none(), st.binary(max_size=6)),  # value (None: a tombstone)
    st.one_of(st.none(), st.binary(max_size=4)),  # key
    st.one_of(st.none(), st.binary(max_size=4)),  # metadata
    st.integers(0, 12),                            # timestamp
), max_size=9), min_size=1, max_size=4)


@settings(max_examples=scaled(40, 300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contributors=_STAGED, before=st.integers(0, 14), chunk=st.integers(1, 7),
       chunk_bytes=st.sampled_from([1, 7, 20, 64 << 20]))
def test_an_apply_merges_the_contributors_as_one_sorted_batch(tmp_path_factory, contributors, before, chunk,
                                                              chunk_bytes):
    """A commit applies what several contributors (Spark tasks) staged for one partition as
    one batch stably sorted by timestamp, each timestamp raised to the partition's latest,
    keys, metadata and tombstones as staged; in chunks of any number of rows and bytes
    (each contributor read in chunks of a share of them, merged as columns taken in runs)."""
    root = tmp_path_factory.mktemp("apply")
    model = []
    for recs in contributors:  # a contributor's timestamps never decrease (its staging Log's)
        model += sorted(recs, key=lambda r: r[3])
    model.sort(key=lambda r: r[3])  # stable: contributors in order, then each in its order
    expected, last = [], before
    for v, k, m, t in model:
        last = max(last, t)
        expected.append((v, k, m, last))
    saved = transactions._APPLY_CHUNK, transactions._APPLY_BYTES
    transactions._APPLY_CHUNK, transactions._APPLY_BYTES = chunk, chunk_bytes
    try:
        with _store(root, a=1) as s:
            s.topic("a").append(b"before", timestamp=before, partition=0)
            txn = transactions.begin_external(str(root))
            parts = []
            for recs in contributors:
                stager = transactions.Stager(str(root), txn)
                for v, k, m, t in sorted(recs, key=lambda r: r[3]):
                    stager.append("a", 0, v, k, m, t)
                parts += stager.prepare()
            tx = transactions.Transaction(s, txn_id=txn)
            tx.add_staged(parts)
            tx.commit()
            got = [(None if r.value is None else bytes(r.value), None if r.key is None else bytes(r.key),
                    None if r.metadata is None else bytes(r.metadata), r.timestamp)
                   for r in s.topic("a").partition(0).scan(1)]
    finally:
        transactions._APPLY_CHUNK, transactions._APPLY_BYTES = saved
    assert got == expected


def _interrupted_apply(monkeypatch, at_chunk):
    """Make the apply raise KeyboardInterrupt (a Ctrl-C) before its chunk ``at_chunk``."""
    monkeypatch.setattr(transactions, "_APPLY_CHUNK", 10)
    orig = transactions._staged_records

    def staged(*a, **k):
        for i, chunk in enumerate(orig(*a, **k)):
            if i == at_chunk:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(transactions, "_staged_records", staged)


def _half_applied(root, monkeypatch):
    """A store whose topic t (fsync="always": each applied chunk is in the file at once)
    holds b"before" and a decided transaction of 50 records interrupted after two chunks
    of 10 of its apply; returns the store (its partition fenced)."""
    s = pylog.LogStore(root)
    s.create_topic("t", fsync="always")
    s.topic("t").append(b"before")
    _interrupted_apply(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        with s.transaction() as tx:
            for i in range(50):
                tx.append("t", b"tx%d" % i, partition=0)
    monkeypatch.undo()
    return s


def test_an_interrupted_apply_fences_its_partition_until_reopened(tmp_path, monkeypatch):
    """Ctrl-C part way through a decided transaction's apply: the partition's next writer
    cuts it back to the transaction's start and applies it again, so no append may be
    acknowledged after the part applied (it would be cut then): the Log refuses appends
    until it is reopened, and the reopen finishes the transaction."""
    root = tmp_path / "r"
    s = _half_applied(root, monkeypatch)
    t = s.topic("t")
    with pytest.raises(pylog.LogFencedError, match="reopened"):
        t.append(b"after", partition=0)
    assert _values(t.partition(0)) == [b"before"]  # reads stop at the stable offset
    s.close()
    with pylog.LogStore(root) as s:
        t = s.topic("t")
        assert t.append(b"after", partition=0) == (0, 51)
        assert _values(t.partition(0)) == [b"before"] + [b"tx%d" % i for i in range(50)] + [b"after"]


def test_a_failure_after_the_commit_point_fences_its_partitions(tmp_path, monkeypatch):
    """The decision is renamed into place, then its directory's fsync fails: the
    transaction is committed but not applied, so its partitions take no append (one would
    be cut when the partition's next writer applies the transaction)."""
    root = tmp_path / "r"
    s = _store(root, a=1, b=2)
    s.topic("a").append(b"a0")
    real = transactions.fileutil.fsync_dir

    def failing(path):
        if os.path.exists(os.path.join(path, transactions.DECISION_FILE)):
            raise OSError(5, "Input/output error (injected)", path)
        real(path)

    monkeypatch.setattr(transactions.fileutil, "fsync_dir", failing)
    with pytest.raises(transactions.TransactionError, match="after its commit point"):
        with s.transaction() as tx:
            tx.append("a", b"ta", partition=0)
            tx.append("b", b"tb", partition=1)
    monkeypatch.undo()
    for name, p in (("a", 0), ("b", 1)):
        with pytest.raises(pylog.LogFencedError):
            s.topic(name).append(b"late", partition=p)
    assert s.topic("b").append(b"b0", partition=0) == (0, 0)  # not in the transaction
    s.close()
    with pylog.LogStore(root) as s:
        assert _values(s.topic("a").partition(0)) == [b"a0", b"ta"]
        assert _values(s.topic("b").partition(1)) == [b"tb"]
        assert s.topic("a").append(b"a2", partition=0) == (0, 2)


def test_a_topic_deleted_and_created_again_elsewhere_gets_none_of_the_staged_records(tmp_path):
    """Records staged for topic t, then another process deletes t and creates a new t: the
    commit is refused and aborted; the new topic holds only its own records."""
    root = tmp_path / "r"
    with _store(root, t=1) as s:
        s.topic("t").append(b"old0")
    s = pylog.LogStore(root, metadata_refresh_ms=0)
    tx = s.transaction()
    tx.append("t", b"staged-for-the-old-t", partition=0)
    p = run_py("""
        import sys, pylog
        with pylog.LogStore(sys.argv[1]) as s:
            s.delete_topic("t"); s.create_topic("t"); s.topic("t").append(b"new0")
    """, str(root))
    assert p.returncode == 0, p.stderr
    with pytest.raises(transactions.TransactionError, match="'t' was deleted"):
        tx.commit()
    assert tx.state == "aborted"
    s.close()
    with pylog.LogStore(root) as s:
        assert _values(s.topic("t").partition(0)) == [b"new0"]
        assert not os.path.exists(os.path.join(root, transactions.TXN_DIR, tx.id))


def test_seek_to_timestamp_and_group_reset_stop_at_the_stable_offset(tmp_path, monkeypatch):
    """While a decided transaction is half applied (its first records are in the file, the
    marker says where it starts), a consumer that seeks past every timestamp and a group
    reset to the latest offset (the CLI, another process) stop at the stable offset: once
    the transaction is finished, the group reads every record of it, none is skipped."""
    root = tmp_path / "r"
    s = _half_applied(root, monkeypatch)
    with pylog.LogStore(root, readonly=True) as ro:
        log = ro.topic("t").reader(0)
        assert log.stable_offset == 1 and log.next_offset == 21
        c = ro.consumer("t")
        c.seek_to_timestamp(2**42)
        assert c.position(0) == 1
    p = subprocess.run([sys.executable, "-m", "pylog", "--root", str(root), "group", "reset", "g", "-t", "t",
                        "--to-latest", "--format", "json"], capture_output=True, text=True, env=py_env())
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["partitions"][0]["new"] == 1
    s.close()
    with pylog.LogStore(root) as s:  # finishes the transaction
        c = s.consumer("t", group="g")
        assert [bytes(r.value) for r in c.poll(max_records=100)] == [b"tx%d" % i for i in range(50)]
        c.close()


def test_a_marker_whose_fsync_fails_does_not_hide_later_appends_from_readers(tmp_path, monkeypatch):
    """The stable-offset marker is renamed into place, then its directory's fsync fails:
    the commit aborts, and the marker goes too, or readers in other processes would stop at
    it, not seeing the appends this writer goes on to make, for as long as it stays open."""
    root = tmp_path / "r"
    s = _store(root, t=1)
    t = s.topic("t")
    t.append(b"a0", partition=0)
    real = transactions.fileutil.fsync_dir

    def failing(path):
        if os.path.exists(os.path.join(path, STABLE_FILE)):
            raise OSError(5, "Input/output error (injected)", path)
        real(path)

    monkeypatch.setattr(transactions.fileutil, "fsync_dir", failing)
    with pytest.raises(OSError, match="injected"):
        with s.transaction() as tx:
            tx.append("t", b"tx", partition=0)
    monkeypatch.undo()
    assert tx.state == "aborted"
    t.append(b"a1", partition=0)
    t.partition(0).flush()
    p = run_py("""
        import sys, pylog
        with pylog.LogStore(sys.argv[1], readonly=True) as ro:
            print([bytes(r.value) for r in ro.topic("t").reader(0).scan()])
    """, str(root))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[b'a0', b'a1']"
    s.close()


def test_a_plain_log_writer_in_a_process_that_never_imported_transactions_rolls_forward(tmp_path, monkeypatch):
    """The roll forward registers itself when pylog.transactions is imported; a process
    that only uses pylog.Log must still finish a decided, half-applied transaction before
    its own appends: else the next store open cuts them back to the transaction's start
    (an acknowledged append lost)."""
    root = tmp_path / "r"
    s = _half_applied(root, monkeypatch)
    s.close()
    p = run_py("""
        import sys, pylog
        assert "pylog.transactions" not in sys.modules
        with pylog.Log(sys.argv[1], fsync="always") as log:
            print(log.append(b"acknowledged"))
    """, str(root / "t" / "partition-0"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "51"
    with pylog.LogStore(root) as s:
        want = [b"before"] + [b"tx%d" % i for i in range(50)] + [b"acknowledged"]
        assert _values(s.topic("t").partition(0)) == want


@pytest.fixture
def sync_thread_eio(monkeypatch):
    """fdatasync fails with EIO on pylog's transaction sync threads (pylog.txnio.Syncs);
    the list of descriptors it failed on."""
    import errno

    from pylog import vfs

    real = vfs.fdatasync
    failed: list[int] = []

    def fdatasync(fd):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("pylog-txn-sync"):
            failed.append(fd)
            raise OSError(errno.EIO, "injected")
        real(fd)

    monkeypatch.setattr(vfs, "fdatasync", fdatasync)
    return failed


def test_an_apply_fdatasync_failing_on_its_sync_thread_fails_the_commit(tmp_path, monkeypatch, sync_thread_eio):
    """A commit applies each partition while the one before is fdatasynced on a worker
    thread. An EIO there (reported once per open file: the log's own fdatasync after it may
    not see it) fails the commit: the transaction is decided, its partitions refuse appends
    until reopened, none of it shows, and the reopen applies it whole."""
    import errno

    root = tmp_path / "r"
    s = _store(root, a=2)
    s.topic("a").append(b"old", partition=0)
    failed = sync_thread_eio
    with pytest.raises(OSError) as ei, s.transaction() as tx:
        tx.append_batch("a", [b"t0"] * 3, partition=0)
        tx.append_batch("a", [b"t1"] * 4, partition=1)
    monkeypatch.undo()
    assert failed and ei.value.errno == errno.EIO and ei.value.filename.endswith(".log")
    with pytest.raises(pylog.PylogError, match="did not finish applying"):
        s.topic("a").partition(0).append(b"late")
    with pylog.Log(str(root / "a" / "partition-1"), readonly=True) as r:
        assert _values(r) == []  # not published: hidden
    s.close()
    with pylog.LogStore(root) as s2:
        assert _values(s2.topic("a").partition(0)) == [b"old"] + [b"t0"] * 3
        assert _values(s2.topic("a").partition(1)) == [b"t1"] * 4
    assert _txn_left(root) == []


def test_a_staging_fdatasync_failing_on_its_sync_thread_fails_the_prepare(tmp_path, monkeypatch, sync_thread_eio):
    """A Spark task's staging syncs each staging Log on a worker thread while it stages
    more (Stager.written). An EIO there fails prepare() (the Log's own fdatasync after it
    may not see it), so the task fails and its job commits nothing."""
    import errno

    root = tmp_path / "r"
    _store(root, a=1).close()
    txn = transactions.begin_external(str(root))
    stager = transactions.Stager(str(root), txn)
    failed = sync_thread_eio
    log = stager.log_for("a", 0)
    log.append_batch([b"x" * 100] * 1000)
    stager.written(log)
    with pytest.raises(OSError) as ei:
        stager.prepare()
    assert failed and ei.value.errno == errno.EIO and ei.value.filename.endswith(".log")
    monkeypatch.undo()
    stager.discard()
    transactions.discard(str(root), txn)
    assert _txn_left(root) == []
