"""The Kafka source's options as the ``pylog`` data source takes them (issue 27 items 8-10).

Against the one local[2] SparkSession of conftest.py where Spark is what is tested (an
option refused at ``load()``, a stream's group commits), and against the readers alone
where the planning is (admission control, a compaction racing a read).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest
from conftest import commit_killed_mid_apply, py_env

import pylog

pytestmark = pytest.mark.spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("no Java runtime on PATH", allow_module_level=True)

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from pylog.serve.headers import encode_headers  # noqa: E402
from pylog.spark import PylogDataSource  # noqa: E402
from pylog.spark import options as spark_options  # noqa: E402
from pylog.spark.reading import PylogReader, _read_slice  # noqa: E402
from pylog.spark.streaming import PylogStreamReader  # noqa: E402

T0 = 1_700_000_000_000


def make_topic(root, name, partitions=2, records=20, segment_bytes=None, **config):
    """A topic whose record i of every partition has value b"v{p}-{i}" and timestamp T0 + i."""
    if segment_bytes is not None:
        config["segment_bytes"] = segment_bytes
    with pylog.LogStore(str(root)) as store:
        t = store.create_topic(name, partitions=partitions, **config)
        for p in range(partitions):
            t.partition(p).append_batch([b"v%d-%d" % (p, i) for i in range(records)],
                                        timestamps=[T0 + i for i in range(records)])


def reader(spark, root, stream=False, **options):
    r = (spark.readStream if stream else spark.read).format("pylog").option("path", str(root))
    for k, v in options.items():
        r = r.option(k, v)
    return r


def offsets(df):
    return sorted((r["topic"], r["partition"], r["offset"])
                  for r in df.select("topic", "partition", "offset").collect())


def scan(root, topic, p):
    with pylog.Log(os.path.join(str(root), topic, f"partition-{p}"), readonly=True) as log:
        return [(r.offset, bytes(r.value)) for r in log.scan()]


# --------------------------------------------------------------------------------------
# item 8: every option name is one the format takes, checked at load()
def test_unknown_and_kafka_only_options_are_refused_at_load(spark, tmp_path):
    make_topic(tmp_path, "t")

    def refused_at_load(match, **options):
        with pytest.raises(Exception, match=match):
            reader(spark, tmp_path, topic="t", **options).load()  # no action: load() itself refuses

    refused_at_load(r"pylog option startingoffset: unknown option \(did you mean startingOffsets\?\)",
                    startingOffset="earliest")
    refused_at_load(r"pylog option kafka\.bootstrap\.servers: .*not a cluster", **{"kafka.bootstrap.servers": "h:9092"})
    refused_at_load(r"pylog option kafka\.group\.id: .*groupId", **{"kafka.group.id": "g"})
    refused_at_load(r"pylog option kafka\.max\.poll\.records: ", **{"kafka.max.poll.records": "5"})
    refused_at_load(r"pylog option createTopic: applies to writes only", createTopic="true")
    refused_at_load(r"pylog option subscribePattern: give only one of", subscribePattern="t.*")
    # network tuning Kafka's source takes is accepted and has no effect; names are case-insensitive
    df = reader(spark, tmp_path, TOPIC="t", STARTINGOFFSETS=json.dumps({"t": {"0": 15}}),
                **{"fetchOffset.numRetries": "3", "kafkaConsumer.pollTimeoutMs": "10"}).load()
    assert len(offsets(df)) == 5 + 20

    # batch or stream only: refused when the read is planned (batch) or started (stream)
    with pytest.raises(Exception, match=r"pylog option startingOffsets: latest is not allowed for a batch read"):
        reader(spark, tmp_path, topic="t", startingOffsets="latest").load().collect()

    def refused(kind, match, **options):  # the readers Spark asks the data source for, without a query
        source = PylogDataSource({"path": str(tmp_path), "topic": "t", **options})
        with pytest.raises(spark_options.ConfigError, match=match):
            source.streamReader(None) if kind == "stream" else source.reader(None)

    refused("batch", r"-1 \(latest\) is not allowed", startingOffsets=json.dumps({"t": {"0": -1}}))
    refused("batch", r"pylog option maxOffsetsPerTrigger: applies to streaming reads only", maxOffsetsPerTrigger="5")
    refused("batch", r"pylog option groupId: applies to streaming reads only", groupId="g")
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        refused("stream", rf"pylog option {name}: is not valid in a streaming query", **{name: "1"})
    refused("stream", r"pylog option pushFilters: applies to batch reads only", pushFilters="true")


def test_the_option_table_is_whole():
    """Every option the readers and writers parse is in the table docs/spark.md shows, and
    the table's names are what docs/spark.md lists as the contract."""
    src = ""
    for mod in ("reading", "streaming", "writing", "__init__"):
        with open(os.path.join(os.path.dirname(spark_options.__file__), f"{mod}.py")) as f:
            src += f.read()
    parsed = set(re.findall(r'_opt\(options, "([a-z]+)"', src)) | set(re.findall(r'options\.get\("([a-z]+)"', src))
    parsed |= set(re.findall(r'_offsets_spec\(options, "([a-z]+)"', src))
    known = {o.name.lower() for o in spark_options.OPTIONS}
    assert parsed - known == set()
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "spark.md")) as f:
        doc = f.read()
    for o in spark_options.OPTIONS:
        assert f"`{o.name}`" in doc, o.name
    for name in spark_options.KAFKA_OPTIONS:
        assert f"`{name}`" in doc, name


def test_include_headers_gives_kafkas_headers_column(spark, tmp_path):
    """Kafka headers (metadata in Kafka's header encoding, as ``pylog serve`` stores them),
    other metadata (one ``pylog.metadata`` header, as the broker sends it), none (null)."""
    with pylog.LogStore(str(tmp_path)) as store:
        log = store.create_topic("h", partitions=1).partition(0)
        log.append(b"a", metadata=encode_headers([("trace", b"t1"), ("empty", None), ("k2", b"")]))
        log.append(b"b", metadata=b"\xffnot headers")
        log.append(b"c")
    plain = reader(spark, tmp_path, topic="h").load()
    assert "headers" not in plain.columns
    df = reader(spark, tmp_path, topic="h", includeHeaders="true").load()
    assert df.columns[-1] == "headers"
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    got = {bytes(r["value"]): None if r["headers"] is None else [(h["key"], None if h["value"] is None else
                                                                  bytes(h["value"])) for h in r["headers"]]
           for r in df.collect()}
    assert got == {b"a": [("trace", b"t1"), ("empty", None), ("k2", b"")],
                   b"b": [("pylog.metadata", b"\xffnot headers")], b"c": None}


def test_timestamp_options_on_non_monotonic_timestamps(spark, tmp_path):
    """startingOffsetsByTimestamp / endingOffsetsByTimestamp per partition, and
    startingTimestamp, over a topic that keeps timestamps as given (not monotonic): each
    position is the first record at or after the time. A partition with no such record
    starts at its end, or fails with startingOffsetsByTimestampStrategy=error."""
    stamps = [50, 10, 70, 20, 90, 30, 95]  # offsets 0..6
    with pylog.LogStore(str(tmp_path)) as store:
        t = store.create_topic("n", partitions=2, timestamps="as-given")
        for p in range(2):
            t.partition(p).append_batch([b"%d-%d" % (p, i) for i in range(7)],
                                        timestamps=[T0 + s for s in stamps])

    def read_offsets(**options):
        return [(p, o) for _t, p, o in offsets(reader(spark, tmp_path, topic="n", **options).load())]

    # partition 0 from the first record at/after +60 (offset 2), partition 1 from +10 (offset 0..)
    got = read_offsets(startingOffsetsByTimestamp=json.dumps({"n": {"0": T0 + 60, "1": T0 + 10}}),
                       endingOffsetsByTimestamp=json.dumps({"n": {"1": T0 + 80}}))
    assert got == [(0, o) for o in range(2, 7)] + [(1, o) for o in range(0, 4)]  # p1 ends before offset 4 (+90)
    assert read_offsets(startingTimestamp=str(T0 + 91)) == [(0, 6), (1, 6)]
    # startingTimestamp takes precedence over startingOffsetsByTimestamp and startingOffsets
    assert read_offsets(startingTimestamp=str(T0 + 91), startingOffsets=json.dumps({"n": {"0": 0}}),
                        startingOffsetsByTimestamp=json.dumps({"n": {"0": T0}})) == [(0, 6), (1, 6)]
    assert read_offsets(startingTimestamp=str(T0 + 96)) == []  # none at or after: at the end

    def plan(**options):  # the reader Spark would get, planned without a query
        return PylogReader({"path": str(tmp_path), "topic": "n", **{k.lower(): v for k, v in options.items()}}
                           ).partitions()

    with pytest.raises(spark_options.ConfigError, match=r"pylog option startingTimestamp: topic 'n' partition 0 has "
                                                        r"no record at or after"):
        plan(startingTimestamp=str(T0 + 96), startingOffsetsByTimestampStrategy="error")
    with pytest.raises(spark_options.ConfigError, match=r"pylog option startingOffsetsByTimestamp: topic 'n' has no "
                                                        r"partition 5"):
        plan(startingOffsetsByTimestamp=json.dumps({"n": {"5": T0}}))


def test_assign_subscribe_pattern_and_max_records_per_partition(spark, tmp_path):
    make_topic(tmp_path, "a", partitions=3, records=10)
    make_topic(tmp_path, "ab", partitions=1, records=4)
    make_topic(tmp_path, "b", partitions=1, records=2)

    def parts(**options):  # the plan's partitions, from the reader Spark would get (no query)
        r = PylogReader({"path": str(tmp_path), **{k.lower(): v for k, v in options.items()}})
        return sorted({(sl.topic, sl.partition) for sl in r.partitions()})

    got = sorted({(t, p) for t, p, _o in offsets(reader(spark, tmp_path, assign=json.dumps({"a": [2, 0], "b": [0]}))
                                                 .load())})
    assert got == [("a", 0), ("a", 2), ("b", 0)]
    assert parts(subscribePattern="a.*") == [("a", 0), ("a", 1), ("a", 2), ("ab", 0)]
    assert parts(subscribePattern="b") == [("b", 0)]  # the whole name matches, not a part of it
    assert parts(subscribe="b,ab") == [("ab", 0), ("b", 0)]
    with pytest.raises(pylog.UnknownTopicError, match=r"pylog option assign: topic 'a' has no partition 7"):
        parts(assign=json.dumps({"a": [7]}))
    with pytest.raises(spark_options.ConfigError, match=r"pylog option assign: expected JSON"):
        parts(assign="a")
    df = reader(spark, tmp_path, topic="a", maxRecordsPerPartition="3").load()
    assert df.rdd.getNumPartitions() == 3 * 4  # 10 records a partition: at most 3 per task
    assert len(offsets(df)) == 30


# --------------------------------------------------------------------------------------
# admission control, with the stream reader alone (Spark gives it one ReadLimit)
def test_min_offsets_per_trigger_holds_a_batch_back_until_max_trigger_delay(tmp_path):
    make_topic(tmp_path, "m", partitions=2, records=10)
    opts = {"path": str(tmp_path), "topic": "m", "startingoffsets": "earliest", "minoffsetspertrigger": "50",
            "maxtriggerdelay": "1h"}
    r = PylogStreamReader(dict(opts))
    start = r.initialOffset()
    assert start == {"m": {"0": 0, "1": 0}}
    end = r.latestOffset(start, ReadAllAvailable())  # the first trigger fires (Kafka's too)
    assert end == {"m": {"0": 10, "1": 10}}
    with pylog.LogStore(str(tmp_path)) as store:
        store.topic("m").partition(0).append_batch([b"x"] * 30)
    assert r.latestOffset(end, ReadAllAvailable()) == end  # 30 < 50: held back
    with pylog.LogStore(str(tmp_path)) as store:
        store.topic("m").partition(1).append_batch([b"y"] * 25)
    assert r.latestOffset(end, ReadAllAvailable()) == {"m": {"0": 40, "1": 35}}  # 55 >= 50
    # a delay that has passed lets a small batch through; availableNow is never held back
    r = PylogStreamReader({**opts, "maxtriggerdelay": "0s"})
    assert r.latestOffset({"m": {"0": 39, "1": 35}}, ReadAllAvailable()) == {"m": {"0": 40, "1": 35}}
    r = PylogStreamReader(dict(opts))
    r.latestOffset({"m": {"0": 0, "1": 0}}, ReadAllAvailable())
    r.prepareForTriggerAvailableNow()
    assert r.latestOffset({"m": {"0": 39, "1": 35}}, ReadAllAvailable()) == {"m": {"0": 40, "1": 35}}
    with pytest.raises(spark_options.ConfigError, match="pylog option maxTriggerDelay: expected a duration"):
        PylogStreamReader({**opts, "maxtriggerdelay": "soon"})


def test_stream_pattern_picks_up_new_topics_and_starts_by_timestamp(tmp_path):
    """A stream of subscribePattern takes a matching topic created after it started (from
    its earliest offset; a topic that does not match is not read); a new stream starts per
    startingOffsetsByTimestamp, partitions not named per startingOffsets."""
    make_topic(tmp_path, "p1", partitions=2, records=10)
    make_topic(tmp_path, "q", partitions=1, records=3)
    r = PylogStreamReader({"path": str(tmp_path), "subscribepattern": "p[0-9]", "startingoffsets": "earliest",
                           "startingoffsetsbytimestamp": json.dumps({"p1": {"1": T0 + 4}})})
    start = r.initialOffset()
    assert start == {"p1": {"0": 0, "1": 4}}
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"p1": {"0": 10, "1": 10}}
    make_topic(tmp_path, "p2", partitions=1, records=5)
    make_topic(tmp_path, "px", partitions=1, records=5)
    end2 = r.latestOffset(end, ReadAllAvailable())
    assert end2 == {"p1": {"0": 10, "1": 10}, "p2": {"0": 5}}
    got = sorted((b.column("topic")[0].as_py(), o) for sl in r.partitions(end, end2) for b in r.read(sl)
                 for o in b.column("offset").to_pylist())
    assert got == [("p2", o) for o in range(5)]


# --------------------------------------------------------------------------------------
# item 9: a stream's progress in a pylog consumer group
def _scrape_lag(root: str, group: str) -> dict[int, float]:
    from serve_util import BrokerProcess

    b = BrokerProcess(root, "--metrics-port", "0")
    try:
        url = re.search(r"metrics on (http://\S+)", b.line).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        assert b.stop() == 0
    out = {}
    for m in re.finditer(r'^pylog_group_lag\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels["group"] == group:
            out[int(labels["partition"])] = float(m.group(2))
    return out


def test_group_id_commits_each_finished_batch(spark, tmp_path):
    """A stream with groupId commits its finished batches' ends into the group: pylog
    group describe (library and command) and the broker's lag metric show its lag, 0
    after an availableNow run, the new records after more are appended. A group another
    consumer is a live member of is refused."""
    root = str(tmp_path / "root")
    make_topic(root, "g", partitions=2, records=60)

    q = (reader(spark, root, stream=True, topic="g", startingOffsets="earliest", maxOffsetsPerTrigger="50",
                groupId="spark-job").load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert len(q.recentProgress) >= 3  # 120 records, 50 a batch
    with pylog.LogStore(root) as store:
        d = store.describe_group("spark-job")
        assert [(r["partition"], r["committed"], r["lag"]) for r in d["partitions"]] == [(0, 60, 0), (1, 60, 0)]
        store.topic("g").partition(1).append_batch([b"more"] * 7)
        d = store.describe_group("spark-job", "g")
        assert [(r["partition"], r["committed"], r["lag"]) for r in d["partitions"]] == [(0, 60, 0), (1, 60, 7)]
    out = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", root, "group", "describe", "spark-job",
                          "--format", "json"], capture_output=True, text=True, env=py_env(), check=True).stdout
    assert [(r["partition"], r["lag"]) for r in json.loads(out)["partitions"]] == [(0, 0), (1, 7)]
    assert _scrape_lag(root, "spark-job") == {0: 0.0, 1: 7.0}
    # the next batch's plan commits the last one's end (the 7 read): the stream reader alone
    r = PylogStreamReader({"path": root, "topic": "g", "groupid": "spark-job"})
    end = r.latestOffset({"g": {"0": 60, "1": 60}}, ReadAllAvailable())
    r.commit(end)
    with pylog.LogStore(root) as store:
        assert [r["lag"] for r in store.describe_group("spark-job")["partitions"]] == [0, 0]
        c = store.consumer("g", group="taken")  # a live member of another group
        try:
            r = PylogStreamReader({"path": root, "topic": "g", "groupid": "taken"})
            with pytest.raises(pylog.GroupActiveError, match=r"pylog option groupId: group 'taken' of topic 'g' "
                                                             r"has live members"):
                r.latestOffset({"g": {"0": 0, "1": 0}}, ReadAllAvailable())
        finally:
            c.close()
        assert store.describe_group("taken")["partitions"][0]["committed"] is None  # untouched


# --------------------------------------------------------------------------------------
# item 10: no false data-loss alarm; a real loss still fails
def _compacted(root, name="c"):
    """A compacted topic: keys k0..k6 rewritten all along (their early records superseded,
    whole segments emptied), and one key per 50 records never rewritten (survivors in the
    middle of the range)."""
    with pylog.LogStore(str(root)) as store:
        log = store.create_topic(name, partitions=1, segment_bytes=4096).partition(0)
        for i in range(600):
            log.append(b"v%d" % i, key=b"u%d" % i if i % 50 == 7 else b"k%d" % (i % 7), timestamp=T0 + i)
        report = log.compact()
        assert report.records_removed > 400
    return scan(root, name, 0)


def test_compacted_topic_reads_without_a_data_loss_alarm(spark, tmp_path):
    """Offsets that compaction removed (at a range's ends, whole emptied segments) are gaps,
    not losses: a batch read from an offset in a gap, and the micro-batches of a stream
    whose ends fall in gaps, read exactly the records the log holds (they failed with
    CorruptRecordError). The stream is driven as Spark drives it (latestOffset with the
    ReadLimit of maxOffsetsPerTrigger, partitions, read), without a stream's start-up."""
    want = _compacted(tmp_path)
    assert want[0][0] > 0 and len(want) < 600
    got = [(o, bytes(v)) for (o, v) in reader(spark, tmp_path, topic="c", failOnDataLoss="true",
                                             startingOffsets=json.dumps({"c": {"0": 3}})).load()
           .orderBy("offset").select("offset", "value").collect()]
    assert got == want
    r = PylogStreamReader({"path": str(tmp_path), "topic": "c", "startingoffsets": "earliest",
                           "maxoffsetspertrigger": "37"})
    r.prepareForTriggerAvailableNow()
    start, rows, batches = r.initialOffset(), [], 0
    first = start["c"]["0"]
    while (end := r.latestOffset(start, r.getDefaultReadLimit())) != start:
        assert isinstance(r.getDefaultReadLimit(), ReadMaxRows)
        rows += [(o, bytes(v)) for sl in r.partitions(start, end) for b in r.read(sl)
                 for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist())]
        start, batches = end, batches + 1
    assert rows == want and batches == -(-(600 - first) // 37)


def test_compaction_between_plan_and_read_is_no_loss(tmp_path):
    """A compaction that replaces a planned segment's file (its swap) before the task reads
    it: the task reads the compacted copy (the records of the range that survived), no
    alarm (before: 'shorter than when the query was planned', or a corrupt frame)."""
    with pylog.LogStore(str(tmp_path)) as store:
        log = store.create_topic("c", partitions=1, segment_bytes=4096).partition(0)
        for i in range(300):
            log.append(b"v%d" % i, key=b"u%d" % i if i % 50 == 7 else b"k%d" % (i % 7), timestamp=T0 + i)
    r = PylogReader({"path": str(tmp_path), "topic": "c", "failondataloss": "true"})
    plan = r.partitions()
    with pylog.LogStore(str(tmp_path)) as store:
        log = store.topic("c").partition(0)
        for i in range(300, 600):  # the planned active segment rolls and is sealed
            log.append(b"v%d" % i, key=b"k%d" % (i % 7), timestamp=T0 + i)
        assert log.compact().records_removed > 0
    got = [o for sl in plan for b in _read_slice(sl) for o in b.column("offset").to_pylist()]
    assert got == [o for o, _v in scan(tmp_path, "c", 0) if o < 300]
    assert got == [i for i in range(300) if i % 50 == 7]


def test_real_loss_still_fails_and_transactions_raise_no_alarm(spark, tmp_path):
    """failOnDataLoss=true: retention deleting a planned segment, a truncation below a
    planned range, and a stream whose partition was truncated below what it already read
    fail; failOnDataLoss=false skips them. A transaction being committed (its marker in
    the partitions) and its roll forward after a crash raise no alarm."""
    make_topic(tmp_path, "r", partitions=1, records=300, segment_bytes=4096)
    d = os.path.join(str(tmp_path), "r", "partition-0")
    plan = PylogReader({"path": str(tmp_path), "topic": "r"}).partitions()
    with pylog.Log(d) as log:
        log.remove_expired(0)  # retention: every sealed segment goes
    with pytest.raises(pylog.PylogError, match="failOnDataLoss"):
        [b for sl in plan for b in _read_slice(sl)]
    plan = PylogReader({"path": str(tmp_path), "topic": "r"}).partitions()
    with pylog.Log(d) as log:
        lo = log.start_offset
        log.truncate(lo + 5)
    with pytest.raises(pylog.PylogError, match="(truncated|replaced) .*failOnDataLoss"):
        [b for sl in plan for b in _read_slice(sl)]
    skip = PylogReader({"path": str(tmp_path), "topic": "r", "failondataloss": "false"})
    assert sum(b.num_rows for sl in skip.partitions() for b in _read_slice(sl)) == 5

    # a stream that read up to 300 finds the partition truncated to lo + 5 (then one record more)
    opts = {"path": str(tmp_path), "topic": "r"}
    with pylog.Log(d) as log:
        log.append(b"new")
    assert lo + 6 < 300
    with pytest.raises(pylog.PylogError, match=rf"ends at offset {lo + 6}, before offset 300 .*truncated"):
        PylogStreamReader(dict(opts)).latestOffset({"r": {"0": 300}}, ReadAllAvailable())
    assert PylogStreamReader({**opts, "failondataloss": "false"}).latestOffset(
        {"r": {"0": 300}}, ReadAllAvailable()) == {"r": {"0": 300}}

    # a transaction committed by a process killed while it applied: readers stop at its
    # marker (no alarm, no part of it), and see all of it once a writer rolls it forward
    make_topic(tmp_path, "x", partitions=2, records=5)
    out = commit_killed_mid_apply(str(tmp_path), "x")
    assert out.returncode == 9, out.stderr
    df = reader(spark, tmp_path, topic="x", failOnDataLoss="true").load()
    assert len(offsets(df)) == 10
    with pylog.LogStore(str(tmp_path)):
        pass  # the open rolls the transaction forward
    assert len(offsets(reader(spark, tmp_path, topic="x", failOnDataLoss="true").load())) == 17
