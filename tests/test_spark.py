"""The PySpark data source (pylog.spark) against a real local[2] SparkSession.

One SparkSession (the ``spark`` fixture of conftest.py) serves every Spark test (starting one
costs 5-15 s). Skipped when pyspark, pyarrow or a Java runtime is missing.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import commit_killed_mid_apply

import pylog
import pylog.transactions

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("no Java runtime on PATH", allow_module_level=True)

from pyspark.sql import functions as F  # noqa: E402

from pylog import spark as pylog_spark  # noqa: E402


def make_topic(root, name, partitions=2, records=100, segment_bytes=None, value=lambda p, i: b"v%d-%d" % (p, i),
               key=None, metadata=None, ts0=1_700_000_000_000):
    """A topic (LogStore layout); record i of every partition has timestamp ts0 + i."""
    opts = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
    with pylog.LogStore(str(root)) as store:
        topic = store.create_topic(name, partitions=partitions, **opts)
        for p in range(partitions):
            log = topic.partition(p)
            for i in range(records):
                log.append(value(p, i), key=None if key is None else key(p, i),
                           metadata=None if metadata is None else metadata(p, i), timestamp=ts0 + i)


def read(spark, root, topic, **options):
    r = spark.read.format("pylog").option("path", str(root)).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def rows(df):
    return sorted((r["partition"], r["offset"], None if r["value"] is None else bytes(r["value"]))
                  for r in df.collect())


def txn_dirs(root):
    """Transactions under the root's ~txn (staging left behind, undecided or unfinished)."""
    d = os.path.join(str(root), "~txn")
    return sorted(n for n in os.listdir(d) if len(n) == 32 or n.startswith(".new-")) if os.path.isdir(d) else []


def log_contents(root, topic):
    out = {}
    for d in sorted(glob.glob(os.path.join(str(root), topic, "partition-*"))):
        with pylog.Log(d, readonly=True) as log:
            out[os.path.basename(d)] = [(r.offset, r.timestamp, None if r.key is None else bytes(r.key),
                                         None if r.value is None else bytes(r.value),
                                         None if r.metadata is None else bytes(r.metadata)) for r in log.scan()]
    return out


# --------------------------------------------------------------------------------------
def test_import_pylog_does_not_import_pyspark():
    code = "import sys, pylog; print('pyspark' in sys.modules, 'pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_read_every_column(spark, tmp_path):
    make_topic(tmp_path, "t", partitions=2, records=300, segment_bytes=4096,
               key=lambda p, i: None if i % 3 == 0 else b"k%d" % i,
               metadata=lambda p, i: b"m%d" % i if i % 2 else None,
               value=lambda p, i: None if i == 7 else b"v%d-%d" % (p, i))
    df = read(spark, tmp_path, "t")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "metadata"]
    assert df.rdd.getNumPartitions() > 2  # one input partition per segment
    got = sorted(df.collect(), key=lambda r: (r["partition"], r["offset"]))
    want = log_contents(tmp_path, "t")
    assert len(got) == 600
    for r in got:
        off, ts, k, v, m = want[f"partition-{r['partition']}"][r["offset"]]
        assert r["offset"] == off and r["topic"] == "t" and r["timestampType"] == 0
        assert (None if r["key"] is None else bytes(r["key"])) == k
        assert (None if r["value"] is None else bytes(r["value"])) == v
        assert (None if r["metadata"] is None else bytes(r["metadata"])) == m
        assert int(r["timestamp"].timestamp() * 1000) == ts


def test_write_read_round_trip_sizes(spark, tmp_path):
    values = [b"", b"x", os.urandom(1 << 20), b"", os.urandom(1000), os.urandom(1 << 20)]
    values += [b"%d" % i for i in range(200)]
    df = spark.createDataFrame([(v, b"k%d" % (i % 7)) for i, v in enumerate(values)], "value binary, key binary")
    (df.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "rt")
     .option("partitions", "3").save())
    back = read(spark, tmp_path, "rt")
    got = back.select("value", "key", "partition").collect()
    assert sorted(bytes(r["value"]) for r in got) == sorted(values)
    assert {r["partition"] for r in got} <= {0, 1, 2}
    # the same key always lands in the same partition
    by_key = {}
    for r in got:
        by_key.setdefault(bytes(r["key"]), set()).add(r["partition"])
    assert all(len(s) == 1 for s in by_key.values())
    assert back.agg(F.sum(F.length("value"))).first()[0] == sum(map(len, values))
    assert txn_dirs(tmp_path) == []


def test_writes_into_an_fsync_always_topic(spark, tmp_path):
    """The batch writer and the streaming sink commit into a topic whose partitions run
    under fsync="always" (each append of the apply made durable through the group commit):
    every row arrives once, the topic keeps its policy, no staging is left behind."""
    with pylog.LogStore(str(tmp_path)) as store:
        store.create_topic("dur", partitions=3, fsync="always")
    make_topic(tmp_path, "src", partitions=2, records=50)
    values = [b"b%d" % i for i in range(300)]
    df = spark.createDataFrame([(v, b"k%d" % (i % 11)) for i, v in enumerate(values)], "value binary, key binary")
    df.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "dur").save()
    _stream_copy(spark, tmp_path, "src", "dur", ckpt=str(tmp_path / "ckpt"))
    got = [v for part in log_contents(tmp_path, "dur").values() for (_o, _t, _k, v, _m) in part]
    want = values + [b"v%d-%d" % (p, i) for p in range(2) for i in range(50)]
    assert sorted(got) == sorted(want)
    with pylog.LogStore(str(tmp_path)) as store:
        assert store.topic("dur").config.fsync == "always"
    assert txn_dirs(tmp_path) == []


def test_write_columns_partition_timestamp_metadata_and_strings(spark, tmp_path):
    df = spark.createDataFrame(
        [("a", 1, 1_700_000_000_000, "m1"), ("b", 0, 1_700_000_000_500, None), ("c", 1, 1_700_000_000_100, "m3")],
        "value string, partition int, ts long, metadata string",
    ).withColumn("timestamp", F.timestamp_millis("ts")).drop("ts")
    df.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "cols") \
        .option("partitions", "2").save()
    c = log_contents(tmp_path, "cols")
    assert [(v, ts, m) for _o, ts, _k, v, m in c["partition-0"]] == [(b"b", 1_700_000_000_500, None)]
    # sorted by timestamp within the partition (pylog timestamps never decrease)
    assert [(v, ts, m) for _o, ts, _k, v, m in c["partition-1"]] == [
        (b"a", 1_700_000_000_000, b"m1"), (b"c", 1_700_000_000_100, b"m3")]
    late = spark.createDataFrame([("d", 1, 5)], "value string, partition int, ts long") \
        .withColumn("timestamp", F.timestamp_millis("ts")).drop("ts")
    w = late.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "cols")
    with pytest.raises(Exception, match="lateTimestamps"):
        w.save()
    assert log_contents(tmp_path, "cols") == c
    w.option("lateTimestamps", "clamp").save()
    assert log_contents(tmp_path, "cols")["partition-1"][-1][1:4:2] == (1_700_000_000_100, b"d")


def test_offsets_and_timestamp_options(spark, tmp_path):
    make_topic(tmp_path, "o", partitions=2, records=50, segment_bytes=4096)
    df = read(spark, tmp_path, "o", startingOffsets=json.dumps({"o": {"0": 10, "1": -2}}),
              endingOffsets=json.dumps({"o": {"0": 20, "1": -1}}))
    r = rows(df)
    assert [x[1] for x in r if x[0] == 0] == list(range(10, 20))
    assert [x[1] for x in r if x[0] == 1] == list(range(50))
    with pytest.raises(Exception, match="latest is not allowed for a batch read"):  # as Kafka's source
        read(spark, tmp_path, "o", startingOffsets="latest").count()
    df = read(spark, tmp_path, "o", startingTimestamp=str(1_700_000_000_000 + 45))
    assert sorted({x[1] for x in rows(df)}) == list(range(45, 50))
    df = read(spark, tmp_path, "o", minPartitions="9")
    assert df.rdd.getNumPartitions() >= 9 and df.count() == 100
    assert sorted(rows(df)) == sorted(rows(read(spark, tmp_path, "o")))


def test_multiple_topics(spark, tmp_path):
    make_topic(tmp_path, "a", partitions=1, records=5)
    make_topic(tmp_path, "b", partitions=2, records=3)
    df = spark.read.format("pylog").option("path", str(tmp_path)).option("topics", "a,b").load()
    assert sorted((r["topic"], r["partition"]) for r in df.groupBy("topic", "partition").count().collect()) == [
        ("a", 0), ("b", 0), ("b", 1)]
    assert df.count() == 11


@pytest.mark.filterwarnings("ignore:Arrow optimization failed:RuntimeWarning")
def test_failed_job_leaves_every_partition_as_it_was(spark, tmp_path):
    make_topic(tmp_path, "ab", partitions=2, records=10)
    before = log_contents(tmp_path, "ab")

    @F.udf("binary")
    def boom(v):
        if v == b"explode":
            raise ValueError("task failed on purpose")
        return v

    data = [(b"v%d" % i,) for i in range(200)] + [(b"explode",)]
    df = spark.createDataFrame(data, "value binary").repartition(2).select(boom("value").alias("value"))
    with pytest.raises(Exception, match="task failed on purpose"):
        df.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "ab").save()
    assert log_contents(tmp_path, "ab") == before
    assert txn_dirs(tmp_path) == []


def test_crashed_commit_is_hidden_from_spark_and_rolled_forward(spark, tmp_path):
    """A process killed while it applied a committed transaction: Spark planning stops at the
    partitions' last stable offsets (not at the torn records, and not after the part applied
    to partition 0: the transaction is not published), and the next write's store open rolls
    the transaction forward."""
    make_topic(tmp_path, "j", partitions=2, records=5)
    out = commit_killed_mid_apply(str(tmp_path), "j")
    assert out.returncode == 9, out.stderr
    # partition 0 was applied in full, partition 1 is behind its marker: both stop at their
    # markers until the transaction is published (it used to show in partition 0 alone)
    assert read(spark, tmp_path, "j").count() == 10
    assert b"torn" not in {bytes(r["value"]) for r in read(spark, tmp_path, "j").collect()}
    spark.createDataFrame([(b"new",)], "value binary").write.format("pylog").mode("append") \
        .option("path", str(tmp_path)).option("topic", "j").option("partitions", "2").save()
    c = log_contents(tmp_path, "j")
    assert [r[3] for r in c["partition-1"][5:9]] == [b"c1"] * 4
    assert b"torn" not in {r[3] for part in c.values() for r in part}
    assert sum(len(v) for v in c.values()) == 10 + 7 + 1
    assert txn_dirs(tmp_path) == []


def test_stream_restart_no_loss_no_duplicates_new_partitions(spark, tmp_path):
    make_topic(tmp_path, "s", partitions=2, records=120)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run():
        q = (spark.readStream.format("pylog").option("path", str(tmp_path)).option("topic", "s")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "150").load()
             .select("partition", "offset", "value")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        return q

    q = run()
    assert q.lastProgress is not None
    got = spark.read.parquet(out)
    assert got.count() == 240
    last = max(glob.glob(os.path.join(ckpt, "offsets", "[0-9]*")), key=lambda p: int(os.path.basename(p)))
    with open(last) as f:
        offsets = json.loads(f.read().splitlines()[-1])  # the source's offset, as Spark stored it
    assert list(offsets["s"]) == ["0", "1"] and offsets["s"] == {"0": 120, "1": 120}
    # more data, and a new partition, then restart from the checkpoint
    with pylog.LogStore(str(tmp_path)) as store:
        store.add_partitions("s", 1)
        store.topic("s").partition(0).append_batch([b"late%d" % i for i in range(30)])
        store.topic("s").partition(2).append_batch([b"p2-%d" % i for i in range(7)])
    run()
    got = spark.read.parquet(out)
    keys = [(r["partition"], r["offset"]) for r in got.collect()]
    assert len(keys) == len(set(keys)) == 240 + 30 + 7
    assert sorted(o for p, o in keys if p == 0) == list(range(150))
    assert sorted(o for p, o in keys if p == 2) == list(range(7))
    batches = len(glob.glob(os.path.join(ckpt, "commits", "[0-9]*")))
    assert batches >= 3  # maxOffsetsPerTrigger=150 split the first 240 rows in two batches


def test_stream_sink_is_exactly_once_per_batch(spark, tmp_path):
    make_topic(tmp_path, "src", partitions=2, records=40)
    ckpt = str(tmp_path / "ckpt")

    def run():
        q = (spark.readStream.format("pylog").option("path", str(tmp_path)).option("topic", "src")
             .option("startingOffsets", "earliest").load().select("value", "key")
             .writeStream.format("pylog").option("path", str(tmp_path)).option("topic", "dst")
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        q.awaitTermination(120)

    run()
    first = log_contents(tmp_path, "dst")
    assert sum(len(v) for v in first.values()) == 80
    # a crash after the sink committed but before Spark recorded it: Spark replays the batch
    commits = sorted(glob.glob(os.path.join(ckpt, "commits", "[0-9]*")), key=lambda p: int(os.path.basename(p)))
    os.unlink(commits[-1])
    crc = os.path.join(os.path.dirname(commits[-1]), "." + os.path.basename(commits[-1]) + ".crc")
    if os.path.exists(crc):
        os.unlink(crc)
    run()
    assert log_contents(tmp_path, "dst") == first
    sinks = json.load(open(os.path.join(str(tmp_path), "~txn", "sinks.json")))
    assert list(sinks.values()) == [int(os.path.basename(commits[-1]))]
    assert txn_dirs(tmp_path) == []  # no micro-batch leaves its staging behind


def _stream_copy(spark, root, src, dst, ckpt=None, **options):
    w = (spark.readStream.format("pylog").option("path", str(root)).option("topic", src)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20").load().select("value")
         .writeStream.format("pylog").option("path", str(root)).option("topic", dst))
    if ckpt is not None:
        w = w.option("checkpointLocation", ckpt)
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    q.awaitTermination(120)
    if q.exception() is not None:
        raise q.exception()


def test_stream_sink_refuses_a_checkpoint_it_is_not_told(spark, tmp_path):
    """13(a): with the checkpoint from the SQL conf, the sink cannot tell two queries apart:
    it refuses (before, both shared one id and the second's batches were skipped)."""
    make_topic(tmp_path, "src", partitions=1, records=100)
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "conf-ckpt"))
    try:
        with pytest.raises(Exception, match="pylog sink needs the query's checkpoint"):
            _stream_copy(spark, tmp_path, "src", "dst", queryName="q1")
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    assert sum(len(v) for v in log_contents(tmp_path, "dst").values()) == 0
    # two queries, each with its own checkpoint, into one root: both write everything
    _stream_copy(spark, tmp_path, "src", "dst", str(tmp_path / "ck1"))
    _stream_copy(spark, tmp_path, "src", "dst", str(tmp_path / "ck2"))
    assert sum(len(v) for v in log_contents(tmp_path, "dst").values()) == 200
    assert txn_dirs(tmp_path) == []


def test_stream_sink_reset_checkpoint_is_a_new_sink(spark, tmp_path):
    """13(b): a query reset by deleting its checkpoint restarts its batch ids at 0; its
    batches are new ones, not replays."""
    make_topic(tmp_path, "src", partitions=1, records=60)
    ckpt = str(tmp_path / "ckpt")
    _stream_copy(spark, tmp_path, "src", "dst", ckpt)
    assert len(glob.glob(os.path.join(ckpt, "commits", "[0-9]*"))) == 3
    shutil.rmtree(ckpt)
    _stream_copy(spark, tmp_path, "src", "dst", ckpt)
    assert sum(len(v) for v in log_contents(tmp_path, "dst").values()) == 120
    assert txn_dirs(tmp_path) == []


def test_clear_errors(spark, tmp_path):
    make_topic(tmp_path, "e", partitions=1, records=3)

    def fails(match, **options):
        with pytest.raises(Exception, match=match):
            read(spark, options.pop("root", tmp_path), options.pop("topic", "e"), **options).collect()

    fails(r"option path: no such directory", root=tmp_path / "missing")
    fails(r"option topic: no topic 'nope'", topic="nope")
    fails(r"option topic: invalid topic name", topic="../e")
    fails(r"option startingOffsets: expected earliest, latest or JSON", startingOffsets="yesterday")
    fails(r"option endingOffsets: 'earliest' is not allowed", endingOffsets="earliest")
    fails(r"option minPartitions: expected an integer", minPartitions="many")
    fails(r"option failOnDataLoss: expected true or false", failOnDataLoss="maybe")
    fails(r"option startingOffsets: topic 'e' partition 0: 99 is past the latest offset 3",
          startingOffsets=json.dumps({"e": {"0": 99}}))
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("pylog").mode("overwrite").option("path", str(tmp_path)).option("topic", "e").save()
    with pytest.raises(Exception, match="needs a value column"):
        df.withColumnRenamed("value", "v").write.format("pylog").mode("append").option("path", str(tmp_path)) \
            .option("topic", "e").save()
    with pytest.raises(Exception, match="createTopic"):
        df.write.format("pylog").mode("append").option("path", str(tmp_path)).option("topic", "new") \
            .option("createTopic", "false").save()


def test_data_loss_option(spark, tmp_path):
    make_topic(tmp_path, "r", partitions=1, records=200, segment_bytes=4096)
    with pylog.Log(os.path.join(str(tmp_path), "r", "partition-0")) as log:
        log.remove_expired(0)  # retention: every sealed segment goes
        lo = log.start_offset
    assert lo > 0
    start = json.dumps({"r": {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        read(spark, tmp_path, "r", startingOffsets=start).collect()
    df = read(spark, tmp_path, "r", startingOffsets=start, failOnDataLoss="false")
    assert [x[1] for x in rows(df)] == list(range(lo, 200))


def test_value_digest_matches_log(spark, tmp_path):
    """A full scan through Spark equals the log, byte for byte (hash of every value)."""
    make_topic(tmp_path, "h", partitions=2, records=2000, segment_bytes=32 << 10,
               value=lambda p, i: hashlib.sha256(b"%d-%d" % (p, i)).digest() * (i % 5))
    want = hashlib.sha256()
    for part in log_contents(tmp_path, "h").values():
        for r in part:
            want.update(r[3])
    got = hashlib.sha256()
    for r in read(spark, tmp_path, "h").orderBy("partition", "offset").select("value").collect():
        got.update(bytes(r["value"]))
    assert got.hexdigest() == want.hexdigest()


# --------------------------------------------------------------------------------------
# the pieces, without a SparkSession
def test_offsets_are_canonical_and_limit_split_by_backlog():
    assert json.dumps(pylog_spark._canonical({"b": {10: 1, 2: 5}, "a": {"0": 3}})) == \
        '{"a": {"0": 3}, "b": {"2": 5, "10": 1}}'
    take = pylog_spark._split_limit({("t", "0"): 900, ("t", "1"): 100, ("t", "2"): 0}, 100)
    assert take == {("t", "0"): 90, ("t", "1"): 10, ("t", "2"): 0}
    take = pylog_spark._split_limit({("t", "0"): 1, ("t", "1"): 1, ("t", "2"): 1}, 2)
    assert sum(take.values()) == 2 and max(take.values()) == 1
    assert pylog_spark._split_limit({("t", "0"): 3}, 10) == {("t", "0"): 3}


def test_late_task_cannot_recreate_an_aborted_staging(tmp_path):
    """A task attempt that runs after the job was aborted fails; it does not bring the
    transaction's staging directory back."""
    import pyarrow as pa

    make_topic(tmp_path, "f", partitions=2, records=1)
    w = pylog_spark.PylogWriter({"path": str(tmp_path), "topic": "f"},
                                pylog_spark.StructType.fromDDL("value binary"))
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b"]})
    first = w.write(iter([batch]))
    assert len(txn_dirs(tmp_path)) == 1
    w.abort([first, None])
    assert txn_dirs(tmp_path) == []
    with pytest.raises(pylog.transactions.TransactionError, match="aborted|does not exist"):
        w.write(iter([batch]))
    assert txn_dirs(tmp_path) == []
    # and one whose transaction disappears between its start and its first staged row
    w2 = pylog_spark.PylogWriter({"path": str(tmp_path), "topic": "f"},
                                 pylog_spark.StructType.fromDDL("value binary"))
    stager = pylog.transactions.Stager(str(tmp_path), w2.committer.txn)
    w2.abort([])
    with pytest.raises(pylog.transactions.TransactionError, match="aborted"):
        stager.append("f", 0, b"late")
    assert txn_dirs(tmp_path) == []


@pytest.mark.parametrize("recreate", [True, False])
def test_a_write_never_commits_into_a_topic_deleted_since_it_was_planned(tmp_path, recreate):
    """A batch write planned for topic f, whose commit comes after another process deleted
    f (and, or not, created a new f): the commit fails and no staged row lands anywhere
    (it committed them into the new f, a different topic, or made f again)."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    make_topic(tmp_path, "f", partitions=2, records=1)
    w = pylog_spark.PylogWriter({"path": str(tmp_path), "topic": "f"},
                                StructType([StructField("value", BinaryType())]))
    staged = w.write(iter([pa.RecordBatch.from_pydict({"value": [b"a", b"b"]})]))
    with pylog.LogStore(str(tmp_path)) as store:
        store.delete_topic("f")
        if recreate:
            store.create_topic("f", partitions=2).append(b"new", partition=0)
    with pytest.raises(pylog.transactions.TransactionError, match="deleted since|does not exist"):
        w.commit([staged])
    if recreate:
        assert sorted(v for part in log_contents(tmp_path, "f").values() for (*_x, v, _m) in part) == [b"new"]
    else:
        assert not os.path.exists(os.path.join(str(tmp_path), "f"))
    assert txn_dirs(tmp_path) == []


def test_packed_bytes_append(tmp_path):
    from pylog.log import PackedBytes

    with pylog.Log(str(tmp_path / "p")) as log:
        log.append_batch(PackedBytes(b"abcdef", [1, 0xFFFFFFFF, 2, 0, 3]),
                         keys=PackedBytes(b"k", [0xFFFFFFFF, 1, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]))
        got = [(None if r.key is None else bytes(r.key), None if r.value is None else bytes(r.value))
               for r in log.scan()]
    assert got == [(None, b"a"), (b"k", None), (None, b"bc"), (None, b""), (None, b"def")]
    with pytest.raises(ValueError, match="lengths add up to"):
        PackedBytes(b"abc", [1, 1])


def test_a_spark_read_sees_no_part_of_a_batch_split_by_a_roll(spark, tmp_path, monkeypatch):
    """A batch framed across a roll, read by Spark when the roll has sealed the batch's first
    records and made the next segment, the rest not yet written: the read shows none of the
    batch (a crash then would cut all of it); once the batch is written it shows whole. The
    same promise as tests/test_torn_writes.py's readers, through Spark's Python workers."""
    from pylog import checkpoint

    root = tmp_path / "root"
    store = pylog.LogStore(str(root))
    log = store.create_topic("split", partitions=1, segment_bytes=4096).partition(0)
    log.append_batch([b"a" * 100] * 5)
    log.flush()
    seen: list[list[int]] = []
    in_batch = [False]
    real = checkpoint.write_recovery_point

    def at_roll(dirpath, offset):  # type: ignore[no-untyped-def]
        real(dirpath, offset)
        if in_batch[0] and not seen:  # the first roll inside the batch: the next segment is there
            seen.append(sorted(r["offset"] for r in read(spark, root, "split").select("offset").collect()))

    monkeypatch.setattr(checkpoint, "write_recovery_point", at_roll)
    in_batch[0] = True
    first = log.append_batch([b"b" * 100] * 100)
    in_batch[0] = False
    assert seen, "the batch did not cross a roll"
    assert seen[0] == list(range(5))
    log.flush()
    offsets = sorted(r["offset"] for r in read(spark, root, "split").select("offset").collect())
    assert offsets == list(range(first + 100))
    store.close()


def test_timestamp_type_is_kafkas_for_an_append_time_topic(spark, tmp_path):
    """timestampType is 1 (Kafka's LogAppendTime) in a topic whose timestamps are the time of
    the append, and 0 (CreateTime) in the others, partition by partition of the read."""
    root = tmp_path / "root"
    with pylog.LogStore(str(root)) as store:
        store.create_topic("appended", partitions=2, config=pylog.LogConfig(timestamps="append-time"))
        store.create_topic("given", partitions=1, config=pylog.LogConfig(timestamps="as-given"))
        for p in range(2):
            store.topic("appended").partition(p).append_batch([b"a%d" % i for i in range(5)])
        store.topic("given").partition(0).append(b"g", timestamp=5)
    got = {r["timestampType"] for r in read(spark, root, "appended").collect()}
    assert got == {1}
    assert [(r["timestampType"], r["timestamp"].year) for r in read(spark, root, "given").collect()] == [(0, 1970)]


def test_a_write_into_an_as_given_topic_keeps_timestamps_as_given(spark, tmp_path):
    """A topic with ``timestamps="as-given"`` (Kafka's CreateTime) keeps what the rows say:
    no error for a timestamp below the partition's latest, no clamp, no reordering (the
    writer used to raise or clamp them as for a topic whose timestamps never decrease)."""
    root = tmp_path / "root"
    with pylog.LogStore(str(root)) as store:
        store.create_topic("given", partitions=1, config=pylog.LogConfig(timestamps="as-given"))
        store.topic("given").partition(0).append(b"first", timestamp=1_700_000_000_900)
    df = spark.createDataFrame([("a", 1_700_000_000_500), ("b", 1_700_000_000_100), ("c", 1_700_000_001_000)],
                               "value string, ts long").coalesce(1) \
        .withColumn("timestamp", F.timestamp_millis("ts")).drop("ts")
    df.write.format("pylog").mode("append").option("path", str(root)).option("topic", "given").save()
    c = log_contents(root, "given")["partition-0"]
    assert [(v, ts) for _o, ts, _k, v, _m in c] == [
        (b"first", 1_700_000_000_900), (b"a", 1_700_000_000_500), (b"b", 1_700_000_000_100),
        (b"c", 1_700_000_001_000)]
