"""Timestamps kept as given (``LogConfig(timestamps="as-given")``, Kafka's CreateTime):
every time-based path against a model with timestamps that go back (issue 29, item 3)."""
from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import ConfigError, InvalidTimestampError

NOW = int(time.time() * 1000)
DAY = 86_400_000


def first_at(model: list[int], t: int) -> int | None:
    """The model's answer: the first offset whose timestamp is >= t."""
    return next((i for i, ts in enumerate(model) if ts >= t), None)


# an operation: append a record (its timestamp an offset from NOW, days back), append a
# batch, roll, or reopen the log
ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(-40 * DAY, 0)),
    st.tuples(st.just("batch"), st.lists(st.integers(-40 * DAY, 0), min_size=1, max_size=6)),
    st.just(("roll",)),
    st.just(("reopen",)),
), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops, interval=st.sampled_from([0, 64, 4096]), age=st.integers(0, 45 * DAY))
def test_model_offset_for_time_and_retention(tmp_path_factory, script, interval, age):
    """Random timestamps that go back, rolls (by hand and by size) and reopens:
    offset_for_time(t) is the first offset with timestamp >= t for every t that matters,
    max_timestamp the largest, the records read back with the timestamps they were given,
    and remove_expired deletes exactly the leading sealed segments whose LARGEST timestamp
    is older than the age (Kafka's rule), keeping every segment with one within it."""
    path = str(tmp_path_factory.mktemp("asgiven") / "log")
    kw = dict(segment_bytes=4096, index_interval_bytes=interval, timestamps="as-given")
    log = pylog.Log(path, **kw)
    model: list[int] = []
    try:
        for op in script:
            if op[0] == "append":
                log.append(b"v" * 300, timestamp=NOW + op[1])
                model.append(NOW + op[1])
            elif op[0] == "batch":
                stamps = [NOW + x for x in op[1]]
                log.append_batch([b"w" * 200] * len(stamps), timestamps=stamps)
                model += stamps
            elif op[0] == "roll":
                log.roll()
            else:
                log.close()
                log = pylog.Log(path)  # the stored config: still as-given
                assert log.config.timestamps == "as-given"
        assert [r.timestamp for r in log.scan()] == model
        assert log.max_timestamp() == (max(model) if model else None)
        queries = {t + d for t in model for d in (-1, 0, 1)} | {0, NOW + 1}
        for t in sorted(queries):
            assert log.offset_for_time(t) == first_at(model, t), t
        # retention by time: the model's segments, from the log's own boundaries
        segs = [(s.base_offset, s.next_offset) for s in log._sealed]  # noqa: SLF001
        cutoff = int(time.time() * 1000) - age  # the log's clock, read later, is >= this one

        def expired(cut: int) -> int:
            n = 0
            for a, b in segs:
                if b > a and max(model[a:b]) >= cut:
                    break
                n += 1
            return n

        removed = log.remove_expired(age)
        assert expired(cutoff) <= removed <= expired(cutoff + 60_000)
        for a, b in segs[removed:]:
            assert [r.timestamp for r in log.scan(a, b)] == model[a:b]  # kept whole
        kept = log.start_offset
        for t in sorted(queries):
            want = first_at(model[kept:], t)
            assert log.offset_for_time(t) == (None if want is None else kept + want), t
    finally:
        log.close()


def test_monotonic_default_unchanged_and_across_rolls(tmp_path):
    """The default still refuses a timestamp below the newest, also right after a roll
    (the old code forgot the newest timestamp at a roll and took it)."""
    with pylog.Log(str(tmp_path / "m"), segment_bytes=4096) as log:
        assert log.config.timestamps == "monotonic"
        log.append(b"a", timestamp=1000)
        with pytest.raises(InvalidTimestampError):
            log.append(b"b", timestamp=999)
        log.roll()
        with pytest.raises(InvalidTimestampError):
            log.append(b"c", timestamp=5)
        with pytest.raises(InvalidTimestampError):
            log.append_batch([b"d"], timestamps=[5])
        assert log.append(b"e") == 1 and log.read(1).timestamp >= 1000


def test_as_given_cannot_go_back_to_monotonic(tmp_path):
    path = str(tmp_path / "g")
    with pylog.Log(path, timestamps="as-given") as log:
        log.append_batch([b"x", b"y"], timestamps=[20, 10])
    with pytest.raises(ConfigError, match="as-given"):
        pylog.Log(path, timestamps="monotonic")
    with pylog.Log(path, timestamps="append-time") as log:  # (Kafka lets a topic switch)
        log.append(b"z")
        assert log.offset_for_time(15) == 0 and log.offset_for_time(11) == 0
        assert log.offset_for_time(21) == 2  # searched in order, not bisected
    with pytest.raises(ConfigError, match="append-time"):
        pylog.Log(path, timestamps="monotonic")
    with pylog.Log(path, timestamps="as-given"):
        pass
    with pytest.raises(ConfigError, match="not one of"):
        pylog.Log(str(tmp_path / "bad"), timestamps="sometimes")
    with pylog.Log(path) as log:  # reopens as-given
        assert log.config.timestamps == "as-given"
        assert [r.timestamp for r in log.scan()][:2] == [20, 10]


def test_time_index_holds_the_running_maximum(tmp_path):
    """On disk, each time index entry holds the largest timestamp up to its record, also
    when the index is rebuilt by recovery (docs/format.md)."""
    path = str(tmp_path / "ti")
    stamps = [50, 10, 70, 20, 60, 90, 30, 40]
    with pylog.Log(path, index_interval_bytes=0, timestamps="as-given") as log:
        log.append_batch([b"v"] * len(stamps), timestamps=stamps)
        log.roll()
        arr = log._sealed[0].timeindex_array()  # noqa: SLF001
        assert arr["timestamp"].tolist() == [50, 50, 70, 70, 70, 90, 90, 90]
    for name in os.listdir(path):
        if name.endswith(".timeindex"):
            os.remove(os.path.join(path, name))  # rebuilt by the next open
    with pylog.Log(path) as log:
        assert log._sealed[0].timeindex_array()["timestamp"].tolist() == [50, 50, 70, 70, 70, 90, 90, 90]  # noqa: SLF001
        assert [log.offset_for_time(t) for t in (10, 11, 51, 61, 71, 91)] == [0, 0, 2, 2, 5, None]


def test_consumer_seek_to_timestamp_with_timestamps_that_go_back(tmp_path):
    """Consumer.seek_to_timestamp / offsets_for_time (through a read-only reader) land on
    the first record at or after the time, not the first one after the last smaller."""
    with pylog.LogStore(str(tmp_path / "root")) as store:
        topic = store.create_topic("t", partitions=1, segment_bytes=4096, timestamps="as-given")
        log = topic.partition(0)
        stamps = [NOW - 10_000, NOW - 50_000, NOW - 5_000, NOW - 60_000, NOW - 1_000]
        for ts in stamps:
            log.append(b"r" * 1500, timestamp=ts)  # two records a segment
        c = store.consumer("t", group="g")
        assert c.offsets_for_time(NOW - 20_000) == {0: 0}
        assert c.offsets_for_time(NOW - 7_000) == {0: 2}
        assert c.offsets_for_time(NOW - 2_000) == {0: 4}
        c.seek_to_timestamp(NOW - 7_000)
        assert [r.offset for r in c.poll(10)] == [2, 3, 4]
        c.close()


def test_spark_pushdown_keeps_every_matching_record(tmp_path):
    """The Spark source's timestamp pushdown on an as-given log never drops a record in the
    range (the old plan cut the range at the first record past its end)."""
    pytest.importorskip("pyspark")
    import datetime as dt

    from pyspark.sql.datasource import GreaterThanOrEqual, LessThan

    from pylog.spark.reading import PylogPushdownReader

    root = str(tmp_path / "root")
    base = 1_700_000_000_000
    stamps = [base + x for x in (100, 500, 200, 900, 300, 50, 400)]
    with pylog.LogStore(root) as store:
        log = store.create_topic("s", partitions=1, timestamps="as-given").partition(0)
        log.append_batch([b"%d" % i for i in range(len(stamps))], timestamps=stamps)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    lo, hi = epoch + dt.timedelta(milliseconds=base + 150), epoch + dt.timedelta(milliseconds=base + 450)
    filters = [GreaterThanOrEqual(("timestamp",), lo), LessThan(("timestamp",), hi)]
    reader = PylogPushdownReader({"path": root, "topic": "s"})
    back = list(reader.pushFilters(filters))
    got = []
    for sl in reader.partitions():
        for batch in reader.read(sl):
            d = batch.to_pydict()
            got += [(o, ts) for o, ts in zip(d["offset"], d["timestamp"])]
    matching = sorted(o for o, ts in got if all(
        (ts >= f.value if isinstance(f, GreaterThanOrEqual) else ts < f.value) for f in back))
    assert matching == [i for i, t in enumerate(stamps) if base + 150 <= t < base + 450] == [2, 4, 6]


def test_time_bounds(tmp_path):
    """timestamp_before_max_ms / timestamp_after_max_ms refuse explicit timestamps too far
    from the clock (append and append_batch, nothing appended); records without a
    timestamp are never refused."""
    now = int(time.time() * 1000)
    with pylog.Log(str(tmp_path / "b"), timestamps="as-given", timestamp_before_max_ms=60_000,
                   timestamp_after_max_ms=60_000) as log:
        with pytest.raises(InvalidTimestampError, match="timestamp_before_max_ms=60000"):
            log.append(b"old", timestamp=now - 3_600_000)
        with pytest.raises(InvalidTimestampError, match="timestamp_after_max_ms=60000"):
            log.append_batch([b"a", b"b"], timestamps=[now, now + 3_600_000])
        assert log.next_offset == 0
        log.append_batch([b"a", b"b"], timestamps=[now + 30_000, now - 30_000])
        log.append(b"c")
        assert log.next_offset == 3
    with pytest.raises(ConfigError, match="timestamp_after_max_ms"):
        pylog.LogConfig(timestamp_after_max_ms=-1)


@pytest.mark.parametrize("how", ["append", "append_batch", "keyed"])
def test_a_transaction_into_an_as_given_topic_keeps_its_timestamps(tmp_path, how):
    """Records a transaction stages for a topic that keeps timestamps as given are applied
    with the timestamps they were given, lower ones after higher ones included (the staging
    Log used to raise each to the running maximum before the apply kept them "as staged")."""
    with pylog.LogStore(tmp_path) as s:
        s.create_topic("g", partitions=1, config=pylog.LogConfig(timestamps="as-given"))
        s.topic("g").append(b"before", timestamp=5_000)
        stamps = [3_000, 9_000, 1_000, 4_000]
        with s.transaction() as tx:
            if how == "append":
                for i, ts in enumerate(stamps):
                    tx.append("g", b"v%d" % i, partition=0, timestamp=ts)
            elif how == "append_batch":
                tx.append_batch("g", [b"v%d" % i for i in range(4)], partition=0, timestamps=stamps)
            else:
                tx.append_batch("g", [b"v%d" % i for i in range(4)], keys=[b"k"] * 4, timestamps=stamps)
        log = s.topic("g").partition(0)
        assert [(bytes(r.value), r.timestamp) for r in log.scan(0)] == [
            (b"before", 5_000), (b"v0", 3_000), (b"v1", 9_000), (b"v2", 1_000), (b"v3", 4_000)]
