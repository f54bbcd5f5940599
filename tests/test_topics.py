"""LogStore and Topic: layout, names, partitioner, persistence, retention."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.topics import check_name, murmur2, partition_for_key

# Kafka's UtilsTest.testMurmur2 vectors (signed 32-bit results)
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key,expected", sorted(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(key, expected):
    assert murmur2(key) == expected


def test_partition_for_key_is_kafkas_formula():
    for key, h in KAFKA_MURMUR2.items():
        for n in (1, 3, 7, 12):
            assert partition_for_key(key, n) == (h & 0x7FFFFFFF) % n
    assert partition_for_key(memoryview(b"abc"), 5) == (479470107 & 0x7FFFFFFF) % 5
    with pytest.raises(TypeError):
        partition_for_key("abc", 3)


@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(data):
    h = murmur2(data)
    assert -(1 << 31) <= h < (1 << 31)
    assert murmur2(data) == h


@pytest.fixture
def store(tmp_path):
    s = pylog.LogStore(tmp_path / "root")
    yield s
    s.close()


def test_create_layout_and_reopen(tmp_path):
    root = tmp_path / "root"
    with pylog.LogStore(root) as s:
        t = s.create_topic("orders", partitions=3, segment_bytes=8192, retention_ms=1000)
        assert t.partitions == 3
        assert s.topics() == ["orders"]
        assert sorted(p for p in os.listdir(root / "orders") if p.startswith("partition-")) == [
            "partition-0", "partition-1", "partition-2"]
        p, off = t.append(b"v", key=b"k")
        assert (p, off) == (partition_for_key(b"k", 3), 0)
    with pylog.LogStore(root) as s:
        t = s.topic("orders")
        assert t.config.segment_bytes == 8192 and t.config.retention_ms == 1000
        assert t.partition(p).config.segment_bytes == 8192
        assert bytes(t.partition(p).read(0).value) == b"v"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "x" * 250, "a b", "é", "a\x00b", "~x", "a~creating"])
def test_bad_names_touch_nothing(tmp_path, name):
    root = tmp_path / "root"
    with pylog.LogStore(root) as s:
        before = sorted(os.listdir(root))
        with pytest.raises(pylog.InvalidNameError):
            s.create_topic(name)
        with pytest.raises(pylog.InvalidNameError):
            s.topic(name)
        with pytest.raises(pylog.InvalidNameError):
            s.delete_topic(name)
        assert sorted(os.listdir(root)) == before
    assert sorted(os.listdir(tmp_path)) == ["root"]


def test_name_rules():
    for ok in ("a", "A-b_c.d", "x" * 249, ".hidden", "..x", "0"):
        assert check_name(ok) == ok
    with pytest.raises(pylog.InvalidNameError):
        check_name(5)


def test_exists_unknown_delete(store):
    store.create_topic("t", 2)
    with pytest.raises(pylog.TopicExistsError):
        store.create_topic("t")
    with pytest.raises(pylog.UnknownTopicError):
        store.topic("nope")
    with pytest.raises(pylog.UnknownTopicError):
        store.delete_topic("nope")
    store.topic("t").append(b"x")
    store.delete_topic("t")
    assert store.topics() == []
    assert not os.path.exists(os.path.join(store.root, "t"))
    t = store.create_topic("t", 1)  # the name can be reused
    assert t.partition(0).next_offset == 0


def test_bad_partition_and_config(store):
    t = store.create_topic("t", 2)
    with pytest.raises(pylog.UnknownPartitionError):
        t.partition(2)
    with pytest.raises(pylog.UnknownPartitionError):
        t.append(b"x", partition=-1)
    with pytest.raises(TypeError):
        t.partition("0")
    with pytest.raises(pylog.ConfigError):
        store.create_topic("u", 1, segment_bytes=1)
    with pytest.raises(pylog.ConfigError):
        store.create_topic("v", 1, no_such_option=1)
    with pytest.raises(ValueError):
        store.create_topic("w", 0)
    assert store.topics() == ["t"]


def test_corrupt_topic_file_is_a_config_error(tmp_path):
    root = tmp_path / "root"
    with pylog.LogStore(root) as s:
        s.create_topic("t", 1)
    (root / "t" / "topic.json").write_text("{not json")
    with pylog.LogStore(root) as s:
        with pytest.raises(pylog.ConfigError):
            s.topic("t")
    (root / "t" / "topic.json").write_text(json.dumps({"version": 1, "partitions": 1, "config": {"segment_bytes": -5}}))
    with pylog.LogStore(root) as s:
        with pytest.raises(pylog.ConfigError):
            s.topic("t")


def test_add_partitions_and_alter(tmp_path):
    root = tmp_path / "root"
    with pylog.LogStore(root) as s:
        t = s.create_topic("t", 2)
        t.append(b"a", partition=1)
        assert s.add_partitions("t", 3) == 5
        assert t.partitions == 5
        t.append(b"b", partition=4)
        cfg = s.alter_topic("t", retention_ms=5)
        assert cfg.retention_ms == 5
        assert t.partition(0).config.retention_ms == 5
        with pytest.raises(pylog.ConfigError):
            s.alter_topic("t", segment_bytes=3)
    with pylog.LogStore(root) as s:
        t = s.topic("t")
        assert t.partitions == 5 and t.config.retention_ms == 5
        assert bytes(t.partition(4).read(0).value) == b"b"
        assert bytes(t.partition(1).read(0).value) == b"a"


def test_leftovers_of_a_crash_are_removed(tmp_path):
    root = tmp_path / "root"
    os.makedirs(root / "half~creating" / "partition-0")
    os.makedirs(root / "old~deleted")
    with pylog.LogStore(root) as s:
        assert s.topics() == []
    assert sorted(os.listdir(root)) == [".store.lock"]


def test_second_writer_is_locked_out_and_delete_refuses(tmp_path):
    root = tmp_path / "root"
    with pylog.LogStore(root) as a, pylog.LogStore(root) as b:
        a.create_topic("t", 1)
        a.topic("t").append(b"x")
        with pytest.raises(pylog.LogLockedError):
            b.topic("t").partition(0)
        with pytest.raises(pylog.LogLockedError):
            b.delete_topic("t")
        assert b.topics() == ["t"]
        # reading works next to the writer
        assert b.topic("t").reader(0).next_offset >= 0


def test_keyless_spread_and_batches(store):
    t = store.create_topic("t", 4)
    parts = [t.append(b"x")[0] for _ in range(8)]
    assert sorted(set(parts)) == [0, 1, 2, 3]
    res = t.append_batch([b"a", b"b", b"c"])
    assert len({p for p, _ in res}) == 1  # sticky: one batch, one partition
    keys = [b"k%d" % i for i in range(50)]
    res = t.append_batch([b"v%d" % i for i in range(50)], keys=keys)
    for i, (p, off) in enumerate(res):
        assert p == partition_for_key(keys[i], 4)
        rec = t.partition(p).read(off)
        assert bytes(rec.key) == keys[i] and bytes(rec.value) == b"v%d" % i
    res = t.append_batch([b"z"] * 3, partition=2)
    assert [p for p, _ in res] == [2, 2, 2]
    with pytest.raises(ValueError):
        t.append_batch([b"a"], keys=[b"a", b"b"])
    with pytest.raises(TypeError):
        t.append_batch(b"abc")


@settings(max_examples=25)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(min_size=1, max_size=8)), st.binary(max_size=16)),
                min_size=1, max_size=60),
       st.integers(1, 5))
def test_topic_against_model(tmp_path_factory, ops, n):
    """Every record lands where the model says, in order, readable after reopen."""
    root = tmp_path_factory.mktemp("topics")
    model: dict[int, list[tuple[bytes | None, bytes]]] = {i: [] for i in range(n)}
    with pylog.LogStore(root) as s:
        t = s.create_topic("m", n)
        for key, value in ops:
            p, off = t.append(value, key=key)
            if key is not None:
                assert p == partition_for_key(key, n)
            assert off == len(model[p])
            model[p].append((key, value))
    with pylog.LogStore(root) as s:
        t = s.topic("m")
        for p in range(n):
            got = [(None if r.key is None else bytes(r.key), bytes(r.value)) for r in t.partition(p).scan()]
            assert got == model[p]


def test_enforce_retention_per_topic(tmp_path):
    with pylog.LogStore(tmp_path / "r") as s:
        t = s.create_topic("old", 1, segment_bytes=4096, retention_bytes=4096)
        c = s.create_topic("keep", 1, segment_bytes=4096, cleanup_policy="compact", retention_bytes=4096)
        for i in range(400):
            t.append(b"x" * 50, timestamp=1000)
            c.append(b"x" * 50, key=b"k", timestamp=1000)
        before = t.partition(0).start_offset
        res = s.enforce_retention()
        assert res[("old", 0)] > 0
        assert ("keep", 0) not in res  # compacted topics are not cut by retention
        assert t.partition(0).start_offset > before
        assert c.partition(0).start_offset == 0


def test_store_close_releases_locks_and_is_idempotent(tmp_path):
    root = tmp_path / "r"
    s = pylog.LogStore(root)
    s.create_topic("t", 2).append(b"x")
    s.close()
    s.close()
    with pytest.raises(pylog.LogClosedError):
        s.topics()
    with pylog.LogStore(root) as s2:
        s2.topic("t").partition(0).append(b"y")  # the lock is free


def test_describe(store):
    t = store.create_topic("t", 2, segment_bytes=4096)
    for i in range(200):
        t.append(b"x" * 40, partition=0)
    d = t.describe()
    p0 = d["partition_info"][0]
    assert p0["next_offset"] == 200 and p0["segments"] > 1 and p0["size_bytes"] > 8000
    assert d["partition_info"][1]["next_offset"] == 0


@given(st.binary(max_size=100))
def test_murmur2_c_core_matches_pure_oracle(data):
    from pylog import _pure
    from pylog._backend import impl

    assert impl.murmur2(data) == _pure.murmur2(data)
