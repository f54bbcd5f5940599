"""The JVM connector (jvm/, pylog.spark.jar_path()) held to the Python source's answers.

Runs on the session's SparkSession (conftest.py's ``spark``, which has the jar on
``spark.jars``); the ``jvm`` fixture points ``format("pylog")`` at the connector for a test
(``spark.pylog.reader=jvm``) and the Python source stays reachable as ``pylog-python``.
Skipped when the jar could not be built (no javac). Few hypothesis examples unless
PYLOG_LONG=1.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import pylog  # noqa: E402
from pylog import spark as pylog_spark  # noqa: E402

pytestmark = pytest.mark.spark
LONG = os.environ.get("PYLOG_LONG") == "1"
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture
def jvm(spark):
    """``format("pylog")`` answered by the JVM connector for this test."""
    if pylog_spark.jar_path() is None or spark.conf.get("spark.pylog.reader", None) is None:
        pytest.skip("the JVM connector's jar is not built (no javac)")
    spark.conf.set("spark.pylog.reader", "jvm")
    try:
        yield spark
    finally:
        spark.conf.set("spark.pylog.reader", "python")


def load(spark, fmt, root, topic, **options):
    r = spark.read.format(fmt).option("path", str(root)).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def rows(df):
    out = []
    for r in df.collect():
        d = r.asDict()
        out.append(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in d.values()))
    return sorted(out, key=lambda t: tuple(str(x) for x in t))


def both(spark, root, topic, **options):
    """(the JVM connector's rows, the Python source's rows) of one read."""
    return rows(load(spark, "pylog", root, topic, **options)), rows(load(spark, "pylog-python", root, topic, **options))


def outcome(fn):
    """('ok', value) or ('error', None): whether a read raised, and what it returned."""
    try:
        return "ok", fn()
    except Exception:  # noqa: BLE001 (Py4J and Spark wrap the JVM's errors)
        return "error", None


def plan_of(df):
    return df._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001


def library_rows(root, topic):
    """(partition, offset, key, value, metadata) of every readable record, through pylog."""
    out = []
    with pylog.LogStore(str(root), readonly=True) as store:
        t = store.topic(topic)
        for p in range(t.partitions):
            log = t.reader(p)
            out += [(p, r.offset, r.key, r.value, r.metadata) for r in log.scan(stop=log.stable_offset)]
    return sorted(out, key=lambda x: (x[0], x[1]))


def make_topic(root, name="ev", partitions=2, records=60, segment_bytes=4096):
    with pylog.LogStore(str(root)) as store:
        t = store.create_topic(name, partitions=partitions, config=pylog.LogConfig(segment_bytes=segment_bytes))
        for p in range(partitions):
            log = t.partition(p)
            for i in range(records):
                log.append(b"v%d-%d" % (p, i), key=None if i % 3 else b"k%d" % i,
                           metadata=None if i % 4 else b"m", timestamp=1_700_000_000_000 + i)


def test_jar_path_and_dispatch(jvm, tmp_path):
    """jar_path() names the built jar; format("pylog") is the JVM connector when it is on the
    classpath (the scan names the root and topics), and writes through it land in the store."""
    jar = pylog_spark.jar_path()
    assert jar is not None and jar.endswith(".jar") and os.path.isfile(jar)
    make_topic(tmp_path, records=5)
    df = load(jvm, "pylog", tmp_path, "ev")
    assert f"pylog {tmp_path} ev" in plan_of(df)
    assert "pylog-python" not in plan_of(df)
    jvm.createDataFrame([(b"k", b"w")], "key binary, value binary").write.format("pylog") \
        .mode("append").option("path", str(tmp_path)).option("topic", "ev").save()
    got, want = both(jvm, tmp_path, "ev")
    assert got == want and len(got) == 11


def test_rows_options_and_errors_match(jvm, tmp_path):
    make_topic(tmp_path)
    for opts in ({}, {"startingOffsets": json.dumps({"ev": {"0": 7}}), "endingOffsets": json.dumps({"ev": {"1": 20}})},
                 {"startingTimestamp": "1700000000030"}):
        got, want = both(jvm, tmp_path, "ev", **opts)
        assert got == want and got, opts
    # topics instead of topic; both at once are refused by both readers, naming the second
    r = jvm.read.format("pylog").option("path", str(tmp_path)).option("topics", "ev").load()
    assert rows(r) == rows(load(jvm, "pylog-python", tmp_path, "ev"))
    for fmt in ("pylog", "pylog-python"):
        with pytest.raises(Exception, match="topics: give only one of topic"):
            load(jvm, fmt, tmp_path, "ev", topics="ev").collect()
    for bad in ({"startingOffsets": "{nope"}, {"endingOffsets": json.dumps({"ev": {"0": 999}})},
                {"endingOffsets": json.dumps({"zz": {"0": 1}})}, {"failOnDataLoss": "maybe"},
                {"startingOffset": "earliest"}):
        with pytest.raises(Exception, match=list(bad)[0]):
            load(jvm, "pylog", tmp_path, "ev", **bad).collect()
    with pytest.raises(Exception, match="no topic 'nope'"):
        load(jvm, "pylog", tmp_path, "nope").collect()


def test_options_the_connector_does_not_read_go_to_the_python_source(jvm, tmp_path):
    """A read naming an option of the contract the connector does not read (here
    ``includeHeaders`` and ``assign``) is handed to the Python source, which reads it (it
    used to be refused by the default reader); a name that is no option is refused by the
    Python source's one line, naming it."""
    make_topic(tmp_path, records=6)
    df = load(jvm, "pylog", tmp_path, "ev", includeHeaders="true")
    assert df.columns[-1] == "headers" and df.count() == 12
    r = jvm.read.format("pylog").option("path", str(tmp_path)).option("assign", json.dumps({"ev": [1]})).load()
    assert {x["partition"] for x in r.collect()} == {1}
    with pytest.raises(Exception, match="startingOffset"):
        load(jvm, "pylog", tmp_path, "ev", startingOffset="earliest").collect()


@pytest.mark.parametrize("where", [
    "offset >= 10 and offset < 25", "partition = 1", "topic = 'ev' and offset in (3, 5, 40)",
    "timestamp >= timestamp_millis(1700000000050)", "timestamp < timestamp_micros(1700000000010500)",
    "offset > 5 and timestamp <= timestamp_millis(1700000000020) and partition in (0)",
])
def test_filters_are_pushed_and_exact(jvm, tmp_path, where):
    make_topic(tmp_path)
    df = load(jvm, "pylog", tmp_path, "ev").where(where)
    want = rows(load(jvm, "pylog-python", tmp_path, "ev").where(where))
    assert rows(df) == want and want
    plan = plan_of(df)
    assert "Filter (" not in plan, plan  # applied exactly by the scan
    c = load(jvm, "pylog", tmp_path, "ev").where(where)
    assert c.count() == len(want)
    assert c.select("offset").count() == len(want)


def test_statistics_and_pruning(jvm, tmp_path):
    make_topic(tmp_path)
    df = load(jvm, "pylog", tmp_path, "ev").select("offset")
    assert df.count() == 120
    leaf = df._jdf.queryExecution().optimizedPlan().collectLeaves().head()  # noqa: SLF001
    stats = leaf.stats()
    # the scan's own estimate (the bytes of its slices), not Spark's default of 8 EiB
    assert 0 < int(str(stats.sizeInBytes())) < 1 << 20, stats.toString()
    assert "offset" in plan_of(df) and "value" not in plan_of(df).split("BatchScan")[1].split("]")[0]


def test_vectors_read_by_the_jvm(jvm, tmp_path):
    """docs/format.md's vectors (written by an independent encoder) read through the connector."""
    with open(os.path.join(DATA, "vectors.json")) as f:
        exp = json.load(f)
    shutil.copytree(os.path.join(DATA, "vectors"), tmp_path / "vec" / "partition-0")
    got = load(jvm, "pylog", tmp_path, "vec").orderBy("offset").collect()
    hx = lambda b: None if b is None else bytes(b).hex()  # noqa: E731
    assert [{"offset": r["offset"], "timestamp": int(r["timestamp"].timestamp() * 1000 + 0.5) if False else None,
             "key": hx(r["key"]), "metadata": hx(r["metadata"]), "value": hx(r["value"])} for r in got] == \
        [{**r, "timestamp": None} for r in exp["records"]]
    ts = load(jvm, "pylog", tmp_path, "vec").selectExpr("offset", "unix_micros(timestamp) AS us").orderBy("offset")
    assert [r["us"] for r in ts.collect()] == [r["timestamp"] * 1000 for r in exp["records"]]


def _txn_in_progress(root, topic, p, start):
    """A transaction being applied to partition p: its marker caps reads at ``start``."""
    tid = uuid.uuid4().hex
    os.makedirs(os.path.join(root, "~txn", tid), exist_ok=True)
    with open(os.path.join(root, topic, f"partition-{p}", "txn.stable"), "w") as f:
        json.dump({"txn": tid, "start": start}, f)
    return tid


@st.composite
def stores(draw):
    ops = draw(st.lists(st.tuples(
        st.sampled_from(["one", "batch", "txn"]), st.integers(0, 1),
        st.lists(st.tuples(st.sampled_from([None, b"a", b"b", b"c"]), st.one_of(st.none(), st.binary(max_size=40)),
                           st.sampled_from([None, b"md"])), min_size=1, max_size=12)),
        min_size=1, max_size=10))
    return {"ops": ops, "compact": draw(st.booleans()), "open_txn": draw(st.sampled_from([None, 0, 1])),
            "flip": draw(st.one_of(st.none(), st.floats(0, 1)))}


def _build(root, spec):
    cfg = pylog.LogConfig(segment_bytes=4096, cleanup_policy="compact" if spec["compact"] else "delete",
                          index_interval_bytes=256)
    with pylog.LogStore(str(root)) as store:
        t = store.create_topic("g", partitions=2, config=cfg)
        for kind, p, recs in spec["ops"]:
            keys = [k for k, _v, _m in recs]
            values = [v if v is not None or k is not None else b"" for k, v, _m in recs]
            mds = [m for _k, _v, m in recs]
            if kind == "one":
                for k, v, m in zip(keys, values, mds):
                    t.partition(p).append(v, key=k, metadata=m)
            elif kind == "batch":
                t.partition(p).append_batch(values, keys=keys, metadata=mds)
            else:
                with store.transaction() as tx:
                    tx.append_batch("g", values, keys=keys, partition=p, metadata=mds)
                    tx.commit()
        for p in range(2):  # roll, so that compaction has sealed segments to clean
            t.partition(p).append(b"tail", key=b"z")
        if spec["compact"]:
            store.compact("g")
    if spec["open_txn"] is not None:
        p = spec["open_txn"]
        with pylog.Log(os.path.join(root, "g", f"partition-{p}"), readonly=True) as log:
            nxt = log.next_offset
        _txn_in_progress(root, "g", p, max(0, nxt - 3))
    if spec["flip"] is not None:
        d = os.path.join(root, "g", "partition-0")
        logs = sorted(n for n in os.listdir(d) if n.endswith(".log"))
        path = os.path.join(d, logs[0])
        size = os.path.getsize(path)
        if size > 32 + 36:
            at = 32 + int(spec["flip"] * (size - 33))
            with open(path, "r+b") as f:
                f.seek(at)
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ 0x5A]))


@settings(max_examples=40 if LONG else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=stores())
def test_conformance_generated_stores(jvm, tmp_path_factory, spec):
    """Generated stores (tombstones, null keys and metadata, batches, transactions committed
    and in progress, compaction gaps, several segments, a flipped byte): the JVM connector,
    the Python source and the library give the same rows, or both readers fail."""
    root = tmp_path_factory.mktemp("gen")
    _build(root, spec)
    j = outcome(lambda: rows(load(jvm, "pylog", root, "g")))
    p = outcome(lambda: rows(load(jvm, "pylog-python", root, "g")))
    assert j[0] == p[0], (j, p)
    assert j == p
    # the aggregates the connector answers itself (in the driver: a small read) agree too
    q = ("count(*)", "min(offset)", "max(offset)", "min(timestamp)", "max(timestamp)", "max(partition)")
    a = outcome(lambda: tuple(load(jvm, "pylog", root, "g").selectExpr(*q).collect()[0]))
    assert a[0] == j[0], (a, j[0])
    if a[0] == "ok":
        assert a[1] == tuple(load(jvm, "pylog-python", root, "g").selectExpr(*q).collect()[0])
    if j[0] == "ok" and spec["flip"] is None:
        lib = library_rows(root, "g")
        assert [(r[3], r[4], r[0], r[1], r[7]) for r in sorted(j[1], key=lambda r: (r[3], r[4]))] == \
            [(r[0], r[1], r[2], r[3], r[4]) for r in lib]


def test_transaction_in_progress_is_hidden(jvm, tmp_path):
    """A partition whose txn.stable names a transaction still there reads up to its start;
    once the transaction's directory is gone, everything shows."""
    make_topic(tmp_path, records=20)
    tid = _txn_in_progress(tmp_path, "ev", 1, 12)
    got, want = both(jvm, tmp_path, "ev")
    assert got == want and len(got) == 20 + 12
    os.rmdir(tmp_path / "~txn" / tid)
    assert len(both(jvm, tmp_path, "ev")[0]) == 40


def test_a_truncate_under_way_is_hidden(jvm, tmp_path):
    """While a partition's truncate-point is there (a truncate under way: its files may be
    half changed), both readers stop at its offset, counts included; once it is gone,
    everything shows."""
    from pylog import checkpoint

    make_topic(tmp_path, records=20)
    d = str(tmp_path / "ev" / "partition-1")
    checkpoint.write_truncate_point(d, 12)
    got, want = both(jvm, tmp_path, "ev")
    assert got == want and len(got) == 20 + 12
    assert load(jvm, "pylog", tmp_path, "ev").count() == 32
    checkpoint.clear_truncate_point(d)
    assert len(both(jvm, tmp_path, "ev")[0]) == 40


def test_corrupt_frame_fails_both(jvm, tmp_path):
    make_topic(tmp_path, partitions=1, records=200)  # several segments: the first is sealed
    path = tmp_path / "ev" / "partition-0" / ("0" * 20 + ".log")
    data = bytearray(path.read_bytes())
    data[32 + 36 + 2] ^= 0xFF  # in the first record's value
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="CRC32C"):
        load(jvm, "pylog", tmp_path, "ev").collect()
    with pytest.raises(Exception, match="CRC32C"):  # a count in the driver checks every frame too
        load(jvm, "pylog", tmp_path, "ev").count()
    with pytest.raises(Exception, match="(?i)crc|corrupt"):
        load(jvm, "pylog-python", tmp_path, "ev").collect()


def test_stream_available_now(jvm, tmp_path):
    """A micro-batch read with maxOffsetsPerTrigger and availableNow: every record once, and
    offsets in the Python source's JSON layout."""
    make_topic(tmp_path)
    ck = tmp_path / "ck"
    q = (load_stream(jvm, tmp_path, maxOffsetsPerTrigger="50").writeStream.format("memory")
         .queryName("jvm_stream").option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination(120)
    got = rows(jvm.sql("SELECT * FROM jvm_stream"))
    assert got == rows(load(jvm, "pylog-python", tmp_path, "ev"))
    assert len(q.recentProgress) >= 3  # 120 records, 50 a trigger
    last = max((n for n in os.listdir(ck / "offsets") if n.isdigit()), key=int)
    body = (ck / "offsets" / last).read_text().splitlines()[-1]
    assert json.loads(body) == {"ev": {"0": 60, "1": 60}}


def load_stream(spark, root, **options):
    r = spark.readStream.format("pylog").option("path", str(root)).option("topic", "ev") \
        .option("startingOffsets", "earliest")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture()
def driver_bytes(jvm, request):
    """``spark.pylog.driverAggregateBytes`` set for one test (and put back after it)."""
    jvm.conf.set("spark.pylog.driverAggregateBytes", request.param)
    yield request.param
    jvm.conf.unset("spark.pylog.driverAggregateBytes")


@pytest.mark.parametrize("driver_bytes", ["0", "1", "268435456"], indirect=True)
@pytest.mark.parametrize("where", [None, "offset >= 10 and partition = 1",
                                   "timestamp > timestamp_millis(1700000000030)", "offset > 1000"])
def test_aggregates_are_pushed(jvm, tmp_path, where, driver_bytes):
    """COUNT(*), MIN/MAX(offset), MIN/MAX(timestamp) come from the scan, with the same answers
    as the Python source (none match: 0, nulls): whole in the driver with no job (a local
    relation) when the read is small, else one row of partial aggregates per slice."""
    make_topic(tmp_path)
    q = ("count(*) AS n", "count(offset) AS c", "min(offset) AS a", "max(offset) AS b",
         "min(timestamp) AS t0", "max(timestamp) AS t1", "max(partition) AS p")

    def agg(fmt):
        df = load(jvm, fmt, tmp_path, "ev")
        return df if where is None else df.where(where)

    j = agg("pylog").selectExpr(*q)
    assert j.collect() == agg("pylog-python").selectExpr(*q).collect()
    plan = plan_of(j)
    # 1 byte: planned for the driver, too big (unless nothing matches), that plan is the scan's
    if driver_bytes == "0" or (driver_bytes == "1" and where != "offset > 1000"):
        assert "agg0" in plan and "LocalTableScan" not in plan, plan  # the scan's partial aggregates
    else:
        assert "LocalTableScan" in plan and "BatchScan" not in plan, plan  # answered in the driver
    assert load(jvm, "pylog", tmp_path, "ev").where("offset < 0").count() == 0
    assert load(jvm, "pylog", tmp_path, "ev").count() == 120


def test_driver_aggregate_setting_is_checked(jvm, tmp_path):
    make_topic(tmp_path)
    jvm.conf.set("spark.pylog.driverAggregateBytes", "lots")
    try:
        with pytest.raises(Exception, match="driverAggregateBytes must be a number of bytes >= 0, got 'lots'"):
            load(jvm, "pylog", tmp_path, "ev").count()
    finally:
        jvm.conf.unset("spark.pylog.driverAggregateBytes")


def test_build_without_javac_builds_nothing(tmp_path, monkeypatch, capsys):
    """No javac (pip install without a JDK): no jar, one line saying why, no failure."""
    from pylog.spark import jvm_build

    monkeypatch.setenv("PATH", str(tmp_path))
    assert jvm_build.build(tmp_path / "x.jar") is None
    assert "no javac" in capsys.readouterr().err
    assert not (tmp_path / "x.jar").exists()
    assert jvm_build.stale(tmp_path / "x.jar")


WRITER = r"""
import os, sys, time, pylog
root, stop = sys.argv[1], sys.argv[2]
n = 0
with pylog.LogStore(root) as store:
    t = store.topic("w")
    while True:  # 200 rounds at most (then it waits), one more after the stop file
        # it stops no sooner than 400 records a partition: ~11 KB of frames, so 4 KiB segments roll
        last = os.path.exists(stop) and n >= 400
        if n >= 1000 and not last:
            time.sleep(0.01)
            continue
        for p in range(2):
            log = t.partition(p)
            log.append_batch([b"w%d-%d" % (p, n + j) for j in range(5)])
            log.flush()
        n += 5
        if last:
            break
        time.sleep(0.01)
print(n, flush=True)
"""


def _prefix_ok(got):
    """Each partition's rows are offsets 0..k-1 with the writer's values, none missing."""
    by = {}
    for r in got:
        by.setdefault(r[3], []).append((r[4], r[1]))
    for p, recs in by.items():
        recs.sort()
        assert [o for o, _v in recs] == list(range(len(recs))), p
        assert all(v == b"w%d-%d" % (p, o) for o, v in recs), p
    return sum(len(v) for v in by.values())


def test_writer_in_another_process_appends_and_rolls(jvm, tmp_path):
    """A writer in another process appends (and rolls 4 KiB segments) while both readers
    read again and again: every read is each partition's consecutive prefix with the
    writer's values (never a torn or CRC-failing frame), and once the writer is done the
    JVM connector, the Python source and the library agree."""
    import subprocess
    import sys

    with pylog.LogStore(str(tmp_path / "root")) as store:
        store.create_topic("w", partitions=2, config=pylog.LogConfig(segment_bytes=4096))
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "root"), str(stop)], stdout=subprocess.PIPE)
    seen = {"pylog": [], "pylog-python": []}
    try:
        for _ in range(2):
            for fmt in seen:
                seen[fmt].append(_prefix_ok(rows(load(jvm, fmt, tmp_path / "root", "w"))))
    finally:
        stop.touch()
        out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0
    n = int(out)
    assert all(0 <= c < 2 * n for v in seen.values() for c in v), (seen, n)
    got, want = both(jvm, tmp_path / "root", "w")
    assert got == want and _prefix_ok(got) == 2 * n
    segs = [x for x in os.listdir(tmp_path / "root" / "w" / "partition-0") if x.endswith(".log")]
    assert len(segs) >= 2, segs  # 400 records at least: it rolled
    lib = library_rows(tmp_path / "root", "w")
    assert [(r[3], r[4], r[1]) for r in sorted(got, key=lambda r: (r[3], r[4]))] == \
        [(p, o, v) for p, o, _k, v, _m in lib]


def _planned(df):
    """The JVM RDD of ``df``'s executed plan: the scan has planned its slices (their end
    offsets fixed); counting it runs the tasks."""
    return df._jdf.queryExecution().toRdd()  # noqa: SLF001


@pytest.mark.parametrize("fmt", ["pylog", "pylog-python"])
def test_retention_after_planning(jvm, tmp_path, fmt):
    """Retention deletes the sealed segments after the read planned them: failOnDataLoss=true
    (the default) fails naming the option, false skips the deleted records and reads the
    rest; the JVM connector and the Python source alike."""
    make_topic(tmp_path, partitions=1, records=200)
    strict = _planned(load(jvm, fmt, tmp_path, "ev"))
    lenient = _planned(load(jvm, fmt, tmp_path, "ev", failOnDataLoss="false"))
    with pylog.Log(os.path.join(str(tmp_path), "ev", "partition-0")) as log:
        log.remove_expired(0)  # every sealed segment goes
        lo = log.start_offset
    assert lo > 0
    with pytest.raises(Exception, match="failOnDataLoss"):
        strict.count()
    assert lenient.count() == 200 - lo


def _append(root, start, count):
    with pylog.LogStore(str(root)) as store:
        t = store.topic("ev")
        for p in range(2):
            t.partition(p).append_batch([b"v%d-%d" % (p, i) for i in range(start, start + count)])


def test_checkpoint_moves_between_readers(jvm, tmp_path):
    """One checkpoint, three runs: the JVM connector, then spark.pylog.reader=python, then the
    connector again, records appended between runs; the Parquet sink holds every record
    exactly once and each run's last offsets are the partitions' ends."""
    make_topic(tmp_path, records=60)
    ck, out = tmp_path / "ck", tmp_path / "out"
    total, described = 60, []
    for reader, more in (("jvm", 40), ("python", 25), ("jvm", 0)):
        jvm.conf.set("spark.pylog.reader", reader)
        q = (load_stream(jvm, tmp_path, maxOffsetsPerTrigger="100").select("partition", "offset", "value")
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None, (reader, q.exception())
        src = q.recentProgress[-1]["sources"][0]
        assert json.loads(src["endOffset"]) == {"ev": {"0": total, "1": total}}, (reader, src)
        described.append(src["description"].split("@")[0])
        if more:
            _append(tmp_path, total, more)
            total += more
    jvm.conf.set("spark.pylog.reader", "jvm")
    assert described[0] == described[2] == "org.pylog.spark.PylogStream", described  # the connector
    assert "python" in described[1].lower(), described  # then the Python source
    got = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in jvm.read.parquet(str(out)).collect())
    assert len(got) == 2 * total
    assert got == [(p, o, b"v%d-%d" % (p, o)) for p in range(2) for o in range(total)]


@pytest.mark.skipif(not LONG, reason="starts a standalone cluster and a Spark Connect server: PYLOG_LONG=1")
def test_cluster_and_connect_script(jvm):
    """scripts/spark-cluster-check.py: a master and two workers, the jar through spark.jars,
    ADD JAR and Spark Connect's addArtifacts; a read and a stream restart on each."""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(DATA), "..", "scripts", "spark-cluster-check.py")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert [x.split(":")[0] for x in r.stdout.splitlines() if ": ok" in x] == ["jars", "addjar", "connect"], r.stdout
