"""Filter pushdown of the pylog data source (pylog.spark.pushdown): a pushed read returns what
the same query returns without pushdown, and plans (and reads) only the slices it needs.

The planner is checked without Spark against a model (every record, filtered in Python) by
hypothesis; the Spark tests run the same kind of queries through a real session.
"""
from __future__ import annotations

import datetime as dt
import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pylog

pytestmark = pytest.mark.spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from pylog.spark import PylogPushdownReader, PylogReader  # noqa: E402
from pylog.spark.pushdown import MAX_RANGES  # noqa: E402

TS0 = 1_700_000_000_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
RECORDS = {"a": (3, 400), "b": (2, 60)}  # topic: (partitions, records per partition)


def ts_ms(p, i):
    """Non-decreasing with repeats (three records per millisecond step, steps of 7 ms)."""
    return TS0 + (i // 3) * 7 + p


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pushdown"))
    with pylog.LogStore(root) as s:
        for name, (nparts, n) in RECORDS.items():
            topic = s.create_topic(name, partitions=nparts, segment_bytes=4096)  # several segments
            for p in range(nparts):
                log = topic.partition(p)
                for i in range(n):
                    log.append(b"%s-%d-%d" % (name.encode(), p, i), timestamp=ts_ms(p, i))
    model = [{"topic": t, "partition": p, "offset": i, "timestamp": EPOCH + dt.timedelta(milliseconds=ts_ms(p, i)),
              "value": b"%s-%d-%d" % (t.encode(), p, i)}
             for t, (nparts, n) in RECORDS.items() for p in range(nparts) for i in range(n)]
    return root, model


# -- an evaluator of Spark's filter objects on a model row, written apart from the planner's
def holds(f, row):
    if isinstance(f, Not):
        v = holds(f.child, row)
        return None if v is None else not v
    x = row[f.attribute[0]]
    if isinstance(f, IsNull):
        return x is None
    if isinstance(f, IsNotNull):
        return x is not None
    if isinstance(f, EqualNullSafe):
        return x == f.value
    if isinstance(f, In):
        if x in f.value:
            return True
        return None if None in f.value else False
    if f.value is None:
        return None
    if isinstance(f, EqualTo):
        return x == f.value
    if isinstance(f, GreaterThan):
        return x > f.value
    if isinstance(f, GreaterThanOrEqual):
        return x >= f.value
    if isinstance(f, LessThan):
        return x < f.value
    if isinstance(f, LessThanOrEqual):
        return x <= f.value
    if isinstance(f, StringStartsWith):
        return x.startswith(f.value)
    raise AssertionError(f"no model for {f}")


def model_rows(model, filters, topics):
    return sorted((r["topic"], r["partition"], r["offset"]) for r in model
                  if r["topic"] in topics and all(holds(f, r) is True for f in filters))


def plan_and_read(root, topics, filters, **options):
    """Push ``filters`` into a reader, read every planned slice in this process; return
    (rows read, rows after Spark would apply the filters handed back, slices, handed back)."""
    opts = {"path": root, "topic": ",".join(topics), **{k.lower(): v for k, v in options.items()}}
    reader = PylogPushdownReader(opts)  # as PylogDataSource.reader makes it (lower-case keys)
    back = list(reader.pushFilters(list(filters)))
    assert all(any(b is f for f in filters) for b in back)  # Spark's contract: the same objects
    slices = reader.partitions()
    got = []
    for sl in slices:
        for batch in reader.read(sl):
            d = batch.to_pydict()
            got += [{"topic": t, "partition": p, "offset": o, "timestamp": ts, "value": v}
                    for t, p, o, ts, v in zip(d["topic"], d["partition"], d["offset"], d["timestamp"], d["value"])]
    read_rows = sorted((r["topic"], r["partition"], r["offset"]) for r in got)
    for r in got:
        assert r["value"] == b"%s-%d-%d" % (r["topic"].encode(), r["partition"], r["offset"])
    after = sorted((r["topic"], r["partition"], r["offset"]) for r in got if all(holds(f, r) is True for f in back))
    return read_rows, after, slices, back


# -- filters hypothesis draws
def _ts(ms, us):
    return EPOCH + dt.timedelta(milliseconds=ms, microseconds=us)


offsets = st.one_of(st.integers(-5, 410), st.sampled_from([10**12, -(10**12)]))
partitions = st.integers(-1, 4)
stamps = st.builds(_ts, st.integers(TS0 - 20, TS0 + 140 * 7 + 20), st.sampled_from([0, 0, 1, 500, 999]))


def _filter(col, values):
    one = st.sampled_from([EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual])
    return st.one_of(
        st.builds(lambda c, v: c((col,), v), one, values),
        st.builds(lambda vs: In((col,), tuple(vs)), st.lists(values, max_size=5)),
        st.sampled_from([IsNull((col,)), IsNotNull((col,))]),
    )


simple = st.one_of(_filter("offset", offsets), _filter("partition", partitions), _filter("timestamp", stamps),
                   _filter("topic", st.sampled_from(["a", "b", "c"])))
filters_st = st.lists(st.one_of(simple, simple.map(Not)), max_size=4)


@given(filters=filters_st, topics=st.sampled_from([["a"], ["a", "b"]]))
def test_pushed_plan_reads_exactly_the_matching_records(store, filters, topics):
    """Every filter drawn is one the planner takes (integer/timestamp literals, short IN
    lists): the slices hold exactly the matching records, and with the filters handed back
    applied as Spark would, the result is the model's."""
    root, model = store
    read_rows, after, _slices, back = plan_and_read(root, topics, filters)
    want = model_rows(model, filters, topics)
    assert after == want
    assert read_rows == want  # the plan is exact, not a superset
    assert all(f.attribute[0] == "timestamp" if not isinstance(f, Not) else f.child.attribute[0] == "timestamp"
               for f in back)  # only timestamp filters go back (re-checked by Spark)


def test_pushed_plan_with_filters_it_cannot_take(store):
    """Null literals, a long IN list, other columns, non-integers: handed back, and the
    result after Spark applies them is still the model's."""
    root, model = store
    long_in = In(("offset",), tuple(range(0, 3 * (MAX_RANGES + 1), 3)))
    cases = [
        [EqualTo(("offset",), None)],
        [Not(In(("offset",), (1, None)))],
        [long_in],
        [long_in, EqualTo(("partition",), 1)],
        [EqualTo(("value",), b"a-0-3")],
        [GreaterThan(("offset",), 2.5)],
        [EqualTo(("partition",), "1")],
        [StringStartsWith(("topic",), "a"), LessThan(("offset",), 4)],
    ]
    for filters in cases:
        _read, after, _slices, back = plan_and_read(root, ["a", "b"], filters)
        assert after == model_rows(model, filters, ["a", "b"]), filters
    _read, _after, _slices, back = plan_and_read(root, ["a"], [long_in])
    assert back == [long_in]
    assert max(o for _t, _p, o in _read) <= 3 * MAX_RANGES  # still pruned to the IN list's hull


def test_pushed_plan_shrinks(store):
    """A selective query plans only the slices it needs: one partition, offsets 100..109 is
    one or two slices of that partition, not one per segment of every partition."""
    root, _model = store
    full = PylogReader({"path": root, "topic": "a"}).partitions()
    assert len(full) > 6 and {s.partition for s in full} == {0, 1, 2}
    read_rows, _after, slices, back = plan_and_read(
        root, ["a"], [EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 100), LessThan(("offset",), 110)])
    assert back == []
    assert read_rows == [("a", 1, o) for o in range(100, 110)]
    assert 1 <= len(slices) <= 2 and {s.partition for s in slices} == {1}
    assert sum(s.end_offset - s.start_offset for s in slices) == 10
    # a time range: through the time index, one partition's records 30..59 (ts steps of 7 ms)
    lo, hi = _ts(ts_ms(0, 30), 0), _ts(ts_ms(0, 60), 0)
    read_rows, _after, slices, back = plan_and_read(
        root, ["a"], [EqualTo(("partition",), 0), GreaterThanOrEqual(("timestamp",), lo), LessThan(("timestamp",), hi)])
    assert read_rows == [("a", 0, o) for o in range(30, 60)]
    assert sum(s.end_offset - s.start_offset for s in slices) == 30
    # an empty range plans nothing; an offset past the end too
    for filters in ([GreaterThan(("offset",), 5), LessThan(("offset",), 6)], [GreaterThanOrEqual(("offset",), 10**12)],
                    [EqualTo(("partition",), 7)]):
        _r, _a, slices, _b = plan_and_read(root, ["a"], filters)
        assert slices == []


def test_pushed_filters_meet_the_offset_options(store):
    """Pushed offset ranges are intersected with startingOffsets/endingOffsets."""
    root, model = store
    filters = [GreaterThanOrEqual(("offset",), 40), LessThan(("offset",), 120)]
    read_rows, _after, _slices, _back = plan_and_read(
        root, ["a"], filters, startingOffsets='{"a": {"0": 100}}', endingOffsets='{"a": {"1": 50, "2": -1}}')
    want = [r for r in model_rows(model, filters, ["a"])
            if (r[1] != 0 or r[2] >= 100) and (r[1] != 1 or r[2] < 50)]
    assert read_rows == want


# -- through Spark
def spark_read(spark, root, topics, pushdown):
    r = spark.read.format("pylog").option("path", root).option("topic", ",".join(topics))
    if pushdown:
        r = r.option("pushFilters", "true")
    return r.load()


@pytest.fixture
def pushdown_conf(spark):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    yield spark
    spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def _lit_ts(ms, us=0):
    return F.lit(_ts(ms, us)).cast("timestamp")


QUERIES = [
    ("partition = 1", lambda: F.col("partition") == 1),
    ("offset range", lambda: (F.col("offset") >= 100) & (F.col("offset") < 110)),
    ("offset > and <=", lambda: (F.col("offset") > 390) & (F.col("offset") <= 1000)),
    ("offset in", lambda: F.col("offset").isin(0, 5, 399, 400, 10**9)),
    ("not offset in", lambda: ~F.col("offset").isin(0, 5) & (F.col("offset") < 8)),
    ("offset !=", lambda: (F.col("offset") != 3) & (F.col("offset") <= 5)),
    ("empty", lambda: (F.col("offset") > 10) & (F.col("offset") < 5)),
    ("past the end", lambda: F.col("offset") >= 10**6),
    ("negative", lambda: F.col("offset") < 0),
    ("partition in + offset", lambda: F.col("partition").isin(0, 2) & (F.col("offset") == 7)),
    ("partition >", lambda: F.col("partition") > 0),
    ("timestamp >=", lambda: F.col("timestamp") >= _lit_ts(ts_ms(0, 200))),
    ("timestamp range + partition", lambda: (F.col("timestamp") > _lit_ts(ts_ms(1, 30), 500))
     & (F.col("timestamp") < _lit_ts(ts_ms(1, 60))) & (F.col("partition") == 1)),
    ("timestamp =", lambda: F.col("timestamp") == _lit_ts(ts_ms(2, 90))),
    ("timestamp out of range", lambda: F.col("timestamp") < _lit_ts(TS0 - 1)),
    ("topic", lambda: (F.col("topic") == "b") & (F.col("offset") < 3)),
    ("or (not pushed)", lambda: (F.col("offset") == 3) | (F.col("partition") == 1)),
]


def test_spark_pushed_results_equal_unpushed(pushdown_conf, store):
    spark = pushdown_conf
    root, _model = store
    for name, cond in QUERIES:
        def rows(pushdown, cond=cond):
            # a DataFrame per query: Spark 4.3 keeps a pushed plan on the relation (see docs/spark.md)
            df = spark_read(spark, root, ["a", "b"], pushdown=pushdown)
            return sorted((r["topic"], r["partition"], r["offset"], bytes(r["value"]))
                          for r in df.filter(cond()).collect())
        assert rows(True) == rows(False), name


def test_spark_pushed_plan_shrinks(pushdown_conf, store):
    """Spark plans one task per slice the pushed filters leave."""
    spark = pushdown_conf
    root, _model = store
    n_full = spark_read(spark, root, ["a"], pushdown=True).rdd.getNumPartitions()
    assert n_full > 6
    sel = spark_read(spark, root, ["a"], pushdown=True).filter(
        (F.col("partition") == 1) & (F.col("offset") >= 100) & (F.col("offset") < 110))
    assert sel.rdd.getNumPartitions() <= 2
    assert sorted(r["offset"] for r in sel.collect()) == list(range(100, 110))
    plan = spark._jvm.PythonSQLUtils.explainString(sel._jdf.queryExecution(), "formatted")
    assert "EqualTo(partition,1), GreaterThanOrEqual(offset,100), LessThan(offset,110)]" in plan, plan
    assert "Filter (" not in plan, plan  # all trusted to the source: no Filter step after the scan
    nothing = spark_read(spark, root, ["a"], pushdown=True).filter(F.col("offset") > 10**6)
    assert nothing.count() == 0 and nothing.rdd.getNumPartitions() == 1  # Spark's placeholder, reads nothing


def test_spark_pushdown_option_needs_spark_conf(spark, store):
    """Without Spark's pushdown conf the default reader (no pushFilters) is used; the option
    asks for the pushdown reader, which Spark then refuses with a message naming its conf."""
    root, _model = store
    assert spark_read(spark, root, ["b"], pushdown=False).count() == 2 * 60
    with pytest.raises(Exception, match="filterPushdown"):
        spark_read(spark, root, ["b"], pushdown=True).count()


def test_planning_opens_each_partition_once(store, monkeypatch):
    """Opening a read-only log walks its active segment (the dominant cost of planning a read
    of a big topic): a plan, with pushed filters and a timestamp range, opens each once."""
    import pylog.spark.reading as reading

    reading._close_kept()  # no log kept from an earlier plan in this process
    opened = []
    real = reading._open_reader

    def counting(root, topic, p):
        opened.append((topic, p))
        return real(root, topic, p)

    monkeypatch.setattr(reading, "_open_reader", counting)
    lo = _ts(ts_ms(0, 30), 0)
    reader = PylogPushdownReader({"path": store[0], "topic": "a,b", "minpartitions": "12"})
    reader.pushFilters([GreaterThanOrEqual(("timestamp",), lo), LessThan(("offset",), 300)])
    assert reader.partitions()
    assert sorted(opened) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]


def test_partitions_a_filter_drops_are_not_opened(store, monkeypatch):
    """partition = 1 plans without opening the other partitions' logs (opening walks the
    active segment); the offset options still name partitions that exist."""
    import pylog.spark.reading as reading

    reading._close_kept()  # no log kept from an earlier plan in this process
    opened = []
    real = reading._open_reader
    monkeypatch.setattr(reading, "_open_reader", lambda root, t, p: opened.append((t, p)) or real(root, t, p))
    read_rows, _after, _slices, _back = plan_and_read(
        store[0], ["a", "b"], [EqualTo(("partition",), 1), StringStartsWith(("topic",), "a")],
        startingOffsets='{"a": {"0": 100, "1": 390}}')
    assert read_rows == [("a", 1, o) for o in range(390, 400)]
    assert opened == [("a", 1)]
    with pytest.raises(pylog.errors.ConfigError, match="has no partition 5"):
        plan_and_read(store[0], ["a"], [EqualTo(("partition",), 1)], startingOffsets='{"a": {"5": 1}}')


def test_logs_kept_between_plans_follow_every_change(tmp_path, monkeypatch):
    """A planning process keeps its read-only logs between plans (refreshed: only new frames
    are walked) while the segment files stay the same, and opens them again when they do not:
    each plan still reads exactly what the partitions hold."""
    import pylog.spark.reading as reading

    reading._close_kept()
    root = str(tmp_path)
    opened = []
    real = pylog.Log
    monkeypatch.setattr(reading.pylog, "Log", lambda *a, **k: opened.append(a[0]) or real(*a, **k))

    def contents():
        reader = PylogReader({"path": root, "topic": "k"})
        out = []
        for sl in reader.partitions():
            for batch in reader.read(sl):
                d = batch.to_pydict()
                out += list(zip(d["partition"], d["offset"], d["value"]))
        return sorted(out)

    with real(os.path.join(root, "k", "partition-0"), segment_bytes=1 << 20, retention_bytes=1) as log:
        log.append_batch([b"a%d" % i for i in range(100)])
        log.flush()
        assert contents() == [(0, i, b"a%d" % i) for i in range(100)]
        assert len(opened) == 1
        log.append_batch([b"b%d" % i for i in range(10)])  # the tail grew: refreshed, not opened
        log.flush()
        want = [(0, i, b"a%d" % i) for i in range(100)] + [(0, 100 + i, b"b%d" % i) for i in range(10)]
        assert contents() == want and len(opened) == 1
        assert contents() == want and len(opened) == 1
        log.truncate(105)  # a truncation
        assert contents() == want[:105]
        log.roll()
        log.append(b"c")
        log.flush()
        assert contents() == want[:105] + [(0, 105, b"c")]
        assert log.enforce_retention() > 0  # retention
        start = log.start_offset
        assert contents() == [r for r in want[:105] + [(0, 105, b"c")] if r[1] >= start]
    shutil.rmtree(os.path.join(root, "k"))  # the topic made again, other records
    with real(os.path.join(root, "k", "partition-0")) as log:
        log.append_batch([b"new%d" % i for i in range(3)])
        log.flush()
        assert contents() == [(0, i, b"new%d" % i) for i in range(3)]
    reading._close_kept()


def test_kept_logs_see_a_compaction(tmp_path):
    """Compaction rewrites a sealed segment under the same name: a kept log is opened again
    (a refresh alone would keep the old segment's view)."""
    import pylog.spark.reading as reading

    reading._close_kept()
    root = str(tmp_path)

    def contents():
        reader = PylogReader({"path": root, "topic": "c"})
        return sorted((o, v) for sl in reader.partitions() for b in reader.read(sl)
                      for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist()))

    with pylog.Log(os.path.join(root, "c", "partition-0"), cleanup_policy="compact") as log:
        for i in range(60):
            log.append(b"v%d" % i, key=b"k%d" % (i % 3))
        log.roll()
        log.append(b"last", key=b"z")
        log.flush()
        assert len(contents()) == 61
        log.compact()
        log.flush()
        with pylog.Log(os.path.join(root, "c", "partition-0"), readonly=True) as fresh:
            want = sorted((r.offset, bytes(r.value)) for r in fresh.scan())
        assert len(want) < 61
        assert contents() == want
    reading._close_kept()
