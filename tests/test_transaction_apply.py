"""The apply of a decided transaction (pylog.transactions._apply over pylog.columnar): staged
Logs of several segments, values larger than an apply's chunk, damaged staging, and memory
that stays bounded however much several contributors staged for one partition."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from conftest import py_env, strace_path

import pylog
from pylog import transactions

STRACE = strace_path()


def _b(x):
    return None if x is None else bytes(x)


@pytest.fixture
def small_segments(monkeypatch):
    """Staging Logs roll every 4 KiB (Stager._log opens them with the defaults)."""
    real = transactions.Log

    def log(path, *a, **kw):
        if not kw.get("readonly"):
            kw["segment_bytes"] = 4096
        return real(path, *a, **kw)

    monkeypatch.setattr(transactions, "Log", log)


def _commit(root, contributors, before=()):
    """Stage ``contributors`` (lists of (value, key, metadata, timestamp), each in
    timestamp order) for partition 0 of topic "a" (holding ``before``), commit; return what
    the transaction appended and the segments of each staging Log."""
    with pylog.LogStore(root) as s:
        s.create_topic("a", partitions=1)
        for v, k, m, t in before:
            s.topic("a").append(v, key=k, metadata=m, timestamp=t, partition=0)
        txn = transactions.begin_external(str(root))
        parts, segments = [], []
        for recs in contributors:
            stager = transactions.Stager(str(root), txn)
            for v, k, m, t in recs:
                stager.append("a", 0, v, k, m, t)
            segments += [len(log.segments()) for log in stager._logs.values()]
            parts += stager.prepare()
        tx = transactions.Transaction(s, txn_id=txn)
        tx.add_staged(parts)
        tx.commit()
        got = [(_b(r.value), _b(r.key), _b(r.metadata), r.timestamp)
               for r in s.topic("a").partition(0).scan(len(before))]
    return got, segments


def _model(contributors, before=()):
    """One stable sort by timestamp of the contributors' records (in their order), each
    timestamp raised to the partition's latest."""
    recs = sorted((r for c in contributors for r in c), key=lambda r: r[3])
    last = max((t for *_x, t in before), default=-1)
    out = []
    for v, k, m, t in recs:
        last = max(last, t)
        out.append((v, k, m, last))
    return out


def _records(rng, n, tmax, big=0):
    """``n`` records in timestamp order: tombstones, empty values beside nulls, null and
    empty keys and metadata; with ``big``, some values of up to that many bytes."""
    out = []
    for t in sorted(rng.integers(0, tmax + 1, n).tolist()):
        c = rng.random()
        if c < 0.2:
            v = None
        elif c < 0.4:
            v = b""
        elif big and c > 0.8:
            v = rng.bytes(int(rng.integers(big // 2, big + 1)))
        else:
            v = rng.bytes(int(rng.integers(1, 60)))
        k = [None, b"", b"k%d" % t][int(rng.integers(0, 3))]
        m = [None, b"", b"m"][int(rng.integers(0, 3))]
        out.append((v, k, m, t))
    return out


@pytest.mark.parametrize("contributors", [1, 3])
@pytest.mark.parametrize(("chunk", "chunk_bytes"), [(1 << 16, 64 << 20), (37, 1000)])
def test_staged_logs_of_several_segments_apply_whole(tmp_path, small_segments, contributors, chunk, chunk_bytes,
                                                     monkeypatch):
    rng = np.random.default_rng(contributors * 1000 + chunk)
    monkeypatch.setattr(transactions, "_APPLY_CHUNK", chunk)
    monkeypatch.setattr(transactions, "_APPLY_BYTES", chunk_bytes)
    staged = [_records(rng, 700, 40) for _ in range(contributors)]
    before = [(b"x", b"", None, 20)]  # some staged timestamps are below it: raised
    got, segments = _commit(tmp_path / "r", staged, before)
    assert min(segments) >= 5
    assert got == _model(staged, before)


@pytest.mark.parametrize("contributors", [2, 3])
@pytest.mark.parametrize("chunk", [1 << 16, 300])
def test_contributors_whose_batches_interleave_in_long_runs_apply_in_timestamp_order(
        tmp_path, small_segments, contributors, chunk, monkeypatch):
    """Spark tasks stage batches stamped when each was staged: the contributors' rows
    interleave in long runs (equal timestamps across contributors too). The apply gives
    those runs as they lie, with no copy (columnar._runs), in the order one stable sort by
    timestamp gives, as the copying merge does for rows that interleave finely."""
    from pylog import columnar

    rng = np.random.default_rng(contributors * 7 + chunk)
    monkeypatch.setattr(transactions, "_APPLY_CHUNK", chunk)
    taken = []
    real = columnar._runs

    def runs(spans):  # type: ignore[no-untyped-def]
        out = real(spans)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(columnar, "_runs", runs)
    staged = []
    for c in range(contributors):
        recs, t = [], 0
        for _batch in range(12):
            t += int(rng.integers(0, 3))  # a batch's stamp: often the same as another contributor's
            recs += [(b"c%d-%d" % (c, len(recs)), None if len(recs) % 3 else b"k", None, t)
                     for _ in range(int(rng.integers(300, 700)))]
        staged.append(recs)
    got, _segments = _commit(tmp_path / "r", staged)
    assert got == _model(staged)
    assert taken and all(taken), taken  # every round went by runs


def test_both_merges_give_one_order(tmp_path, monkeypatch):
    """columnar.merged_by_timestamp by runs (however short) and by one sort agree with a
    stable sort, on spans whose rows interleave finely and coarsely, with
    ties across spans."""
    from pylog import columnar

    rng = np.random.default_rng(5)

    def scanned(i, vals, ts):  # type: ignore[no-untyped-def]
        path = str(tmp_path / f"l{i}")
        shutil.rmtree(path, ignore_errors=True)
        with pylog.Log(path, timestamps="as-given") as log:
            if vals:
                log.append_batch(vals, timestamps=ts)
        with pylog.Log(path, readonly=True) as log:
            out = [c for part in columnar.parts(log, log.start_offset, log.stable_offset, 1)
                   for c in columnar.scan_part(part, columnar.RECORD_COLUMNS, 1 << 20, columnar.same)]
        return [(c, 0, c.rows) for c in out]

    def rows_of(out):  # type: ignore[no-untyped-def]
        got = []
        for value, _key, _meta, ts in out:
            lens = value.lengths.astype(np.int64)
            offs = np.concatenate([[0], np.cumsum(lens)])
            data = bytes(value.data)
            got += [(data[offs[i]:offs[i + 1]], int(ts[i])) for i in range(len(ts))]
        return got

    for trial in range(40):
        spans, want = [], []
        for i in range(int(rng.integers(1, 5))):
            n = int(rng.integers(1, 400))
            step = int(rng.choice([1, 50, 400]))
            ts = np.sort(rng.integers(0, n // step + 2, n)).astype(np.int64)
            vals = [b"%d-%d" % (i, j) for j in range(n)]
            spans += scanned(i, vals, ts)
            want += list(zip(vals, ts.tolist()))
        want.sort(key=lambda r: r[1])
        with monkeypatch.context() as m:
            m.setattr(columnar, "MIN_RUN_ROWS", 1)  # runs, however short
            by_runs = rows_of(columnar.merged_by_timestamp(spans, 64))
            m.setattr(columnar, "MIN_RUN_ROWS", 1 << 30)  # one sort (unless no rows interleave)
            by_sort = rows_of(columnar.merged_by_timestamp(spans, 64))
        assert by_runs == want == by_sort, trial


@pytest.mark.parametrize("contributors", [1, 2])
def test_values_larger_than_an_apply_chunk(tmp_path, monkeypatch, contributors):
    """Values of MiB, some larger than the bytes of an apply's chunk (each goes alone)."""
    rng = np.random.default_rng(contributors)
    monkeypatch.setattr(transactions, "_APPLY_BYTES", 1 << 20)
    staged = [_records(rng, 16, 6, big=3 << 19) for _ in range(contributors)]
    assert max(len(v or b"") for c in staged for v, *_x in c) > 1 << 20
    got, _segments = _commit(tmp_path / "r", staged)
    assert got == _model(staged)


@pytest.mark.parametrize("contributors", [1, 3])
@pytest.mark.parametrize("where", ["middle", "last"])
def test_a_flipped_byte_in_a_staged_store_appends_nothing(tmp_path, small_segments, contributors, where):
    """A staging store damaged after prepare: the commit raises CorruptRecordError, no
    reader sees a record of the transaction, and every reopen raises it again (the
    transaction stays decided) rather than append a byte of it."""
    root = tmp_path / "r"
    s = pylog.LogStore(root)
    s.create_topic("a", partitions=1)
    s.topic("a").append(b"before", partition=0)
    txn = transactions.begin_external(str(root))
    parts = []
    for c in range(contributors):
        stager = transactions.Stager(str(root), txn)
        stager.append_batch("a", 0, [b"<%d:%05d>" % (c, i) * 4 for i in range(300)])
        parts += stager.prepare()
    stores = sorted(glob.glob(str(root / "~txn" / txn / "*" / "a" / "0" / "*.log")))
    assert len(stores) >= 5 * contributors
    path = stores[len(stores) // 2] if where == "middle" else stores[-1]
    with open(path, "r+b") as f:
        data = f.read()
        at = data.rfind(b"<")
        f.seek(at + 3)
        f.write(bytes([data[at + 3] ^ 1]))
    tx = transactions.Transaction(s, txn_id=txn)
    tx.add_staged(parts)
    with pytest.raises(pylog.CorruptRecordError):
        tx.commit()
    assert [bytes(r.value) for r in s.topic("a").partition(0).scan()] == [b"before"]
    s.close()
    for _ in range(2):
        with pytest.raises(pylog.CorruptRecordError):
            pylog.LogStore(root)
    reader = pylog.Log(str(root / "a" / "partition-0"), readonly=True)
    assert [bytes(x.value) for x in reader.scan()] == [b"before"]
    reader.close()


def _apply_peak(root, contributors, n):
    """Peak bytes traced (Python and numpy) while ``contributors`` staging Logs of ``n``
    records each, in interleaved timestamps, are applied to one partition."""
    with pylog.LogStore(root) as s:
        s.create_topic("a", partitions=1)
        txn = transactions.begin_external(str(root))
        parts = []
        for c in range(contributors):
            stager = transactions.Stager(str(root), txn)
            stager.append_batch("a", 0, [b"v%07d" % i for i in range(n)],
                                timestamps=[contributors * i + c for i in range(n)])
            parts += stager.prepare()
        tx = transactions.Transaction(s, txn_id=txn)
        tx.add_staged(parts)
        tracemalloc.start()
        try:
            tx.commit()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        got = [bytes(r.value) for r in s.topic("a").partition(0).scan()]
        assert got == [b"v%07d" % i for i in range(n) for _c in range(contributors)]
    return peak


@pytest.mark.parametrize("contributors", [2, 4])
def test_a_merge_holds_a_bounded_share_of_the_staged_records(tmp_path, monkeypatch, contributors):
    """Several contributors for one partition: the apply reads them in chunks, so its
    memory does not grow with what they staged (4x the records: not 4x the memory)."""
    monkeypatch.setattr(transactions, "_APPLY_CHUNK", 400)
    monkeypatch.setattr(transactions, "_APPLY_BYTES", 16 << 10)
    small = _apply_peak(tmp_path / "small", contributors, 2_000)
    large = _apply_peak(tmp_path / "large", contributors, 8_000)
    assert large < 1.5 * small, (small, large)


# ----------------------------------------------------------------------------------------
# a SIGKILL during a merge's apply: the next open rolls it forward, every record once
_COMMIT_CHILD = """
import json, sys, pylog
from pylog import transactions
transactions._APPLY_CHUNK = 40
root, txn, parts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = pylog.LogStore(root)
tx = transactions.Transaction(s, txn_id=txn)
tx.add_staged([tuple(p) for p in parts])
tx.commit()
print("committed", flush=True)
"""


@pytest.mark.skipif(STRACE is None, reason="needs strace")
def test_sigkill_during_a_merge_apply_leaves_every_record_once(tmp_path):
    """Three contributors staged interleaved timestamps for one partition (which rolls
    segments while the merge is applied); the committing process is killed at every n-th
    write, rename, fsync or truncate: after the next open the partition holds its record
    from before and either none of the transaction or all of it, in merged order, once."""
    template = tmp_path / "template"
    staged = [[(b"<%d:%04d>" % (c, i) + b"." * 3000, None if i % 3 else b"k", None, 3 * i + c) for i in range(120)]
              for c in range(3)]
    with pylog.LogStore(template) as s:
        s.create_topic("a", partitions=1, segment_bytes=64 << 10)
        s.topic("a").append(b"before", timestamp=0, partition=0)
        txn = transactions.begin_external(str(template))
        parts = []
        for recs in staged:
            stager = transactions.Stager(str(template), txn)
            for v, k, m, t in recs:
                stager.append("a", 0, v, k, m, t)
            parts += stager.prepare()
    whole = [(b"before", None, None, 0), *_model(staged)]
    outcomes = []
    n = 1
    while True:
        root = tmp_path / f"r{n}"
        shutil.copytree(template, root)
        p = subprocess.run([STRACE, "-f", "-o", os.devnull, "-e",
                            f"inject=pwrite64,pwritev,write,rename,renameat,renameat2,fsync,fdatasync,ftruncate:"
                            f"signal=SIGKILL:when={n}",
                            sys.executable, "-c", _COMMIT_CHILD, str(root), txn, json.dumps(parts)],
                           capture_output=True, text=True, env=py_env(), timeout=120)
        acked = "committed" in p.stdout
        decided = os.path.exists(root / "~txn" / txn / transactions.DECISION_FILE) or not os.path.isdir(
            root / "~txn" / txn)
        with pylog.LogStore(root) as s:
            got = [(_b(r.value), _b(r.key), _b(r.metadata), r.timestamp) for r in s.topic("a").partition(0).scan()]
        assert got == (whole if decided or acked else whole[:1]), (n, len(got))
        outcomes.append(decided)
        shutil.rmtree(root)
        if acked:
            break
        n += 3
        assert n < 600
    # killed before the decision, and after it, part way through the apply (several times)
    assert False in outcomes and outcomes.count(True) >= 4, outcomes


def test_a_staged_log_whose_timestamps_decrease_is_a_corrupt_record_error(tmp_path, small_segments):
    """A merge relies on each staging Log's timestamps never decreasing (a Log refuses
    that): a staged Log made to hold 10 then 5 (a segment swapped in from another, every
    frame CRC-valid) stops the commit with CorruptRecordError, nothing appended."""
    root = tmp_path / "r"
    s = pylog.LogStore(root)
    s.create_topic("a", partitions=1)
    txn = transactions.begin_external(str(root))
    parts, dirs = [], []
    for c, ts in enumerate(([5, 5], [10, 10], [7])):
        stager = transactions.Stager(str(root), txn)
        for t in ts:
            stager.append("a", 0, b"%d" % c * 3000, None, None, t)  # a segment per record
        dirs.append(stager._logs["a", 0].path)
        parts += stager.prepare()
    first = "0" * 20
    for ext in (".log", ".index", ".timeindex"):  # contributor 0: offset 0 at 10, offset 1 at 5
        if os.path.exists(os.path.join(dirs[1], first + ext)):
            shutil.copyfile(os.path.join(dirs[1], first + ext), os.path.join(dirs[0], first + ext))
    tx = transactions.Transaction(s, txn_id=txn)
    tx.add_staged(parts)
    with pytest.raises(pylog.CorruptRecordError, match="timestamp 5 is below"):
        tx.commit()
    assert len(s.topic("a").partition(0)) == 0
    s.close()
