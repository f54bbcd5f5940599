"""What a newcomer hit (issue 26): silent data hazards, and messages that named the wrong
thing. Each test is a reproduction from the trial, with the behaviour it asked for."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import pylog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the command as user nobody: what it imports is loaded before the switch (the interpreter's
# packages may be unreadable to nobody), as in tests/test_seam_topics.py
AS_NOBODY = """
import json, os, pwd, sys
import click, numpy, rich.console
import pylog, pylog.cli, pylog.consumer, pylog.groups, pylog.log, pylog.topics
nb = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nb.pw_gid)
os.setuid(nb.pw_uid)
assert os.geteuid() != 0
pylog.cli.main(sys.argv[1:])
"""


def cli(root, *args, input=None, nobody=False) -> subprocess.CompletedProcess:
    """``python -m pylog --root ROOT ARGS...`` with this checkout's pylog (as user nobody
    if asked)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("PYLOG_ROOT", None)
    argv = [sys.executable, *(["-c", AS_NOBODY] if nobody else ["-m", "pylog"]), "--root", str(root), *args]
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=120, env=env)


def ok(p) -> str:
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr}"
    return p.stdout


def error(p, code=1) -> str:
    """The one line a failing command prints."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pylog: error: "), p.stderr
    return lines[0]


def _rows(root, topic) -> list[dict]:
    return [json.loads(x) for x in ok(cli(root, "consume", topic, "--from-beginning", "--format", "json")).splitlines()]


# ---- 1. produce --format json: a missing value is an error, not a tombstone -------------
def test_a_json_line_without_a_value_is_refused_not_a_tombstone(tmp_path):
    root = tmp_path / "r"
    ok(cli(root, "topic", "create", "users", "-c", "cleanup_policy=compact"))
    p = cli(root, "produce", "users", "--format", "json",
            input='{"key": "u1", "value": "Ann"}\n{"key": "u1", "vaule": "Bob"}\n')
    err = error(p)
    assert err.startswith('pylog: error: line 2 is not a record: has no "value" (or "value_base64") field')
    assert "(1 record before it was produced and kept)" in err
    rows = _rows(root, "users")
    assert [(r["key"], r["value"]) for r in rows] == [("u1", "Ann")]  # no tombstone for u1
    # an explicit null is still a tombstone; value_base64 alone is a value
    ok(cli(root, "produce", "users", "--format", "json",
           input='{"key": "u1", "value": null}\n{"key": "u2", "value_base64": "AP8="}\n'))
    rows = _rows(root, "users")
    assert [(r["key"], r["value"]) for r in rows][1:] == [("u1", None), ("u2", None)]
    assert rows[2]["value_base64"] == "AP8="


# ---- 2. offset in log --------------------------------------------------------------------
def test_offset_in_log_is_what_read_finds(tmp_path):
    with pylog.Log(str(tmp_path / "l")) as log:
        log.append_batch([b"a", b"b", b"c"])
        assert len(log) == 3 and bytes(log.read(0).value) == b"a"
        assert [o in log for o in (-1, 0, 1, 2, 3, 100)] == [False, True, True, True, False, False]
        with pytest.raises(pylog.ArgumentTypeError, match="int offset, got str"):
            "0" in log  # noqa: B015
        with pytest.raises(pylog.ArgumentTypeError):
            True in log  # noqa: B015
    with pylog.Log(str(tmp_path / "l"), readonly=True) as ro:
        assert 2 in ro and 3 not in ro
        with pylog.Log(str(tmp_path / "l")) as w:
            w.append(b"d")
        ro.refresh()
        assert 3 in ro


def test_offset_in_a_compacted_log_is_false_where_the_record_was_removed(tmp_path):
    path = str(tmp_path / "c")
    with pylog.Log(path, segment_bytes=4096, cleanup_policy="compact") as log:
        for i in range(100):
            log.append(b"v%03d" % i + b"x" * 200, key=b"k%d" % (i % 3))
        log.compact()
        gone = [o for o in range(log.start_offset, log.next_offset) if o not in log]
        assert gone, "compaction removed nothing: the test proves nothing"
        for o in gone:
            with pytest.raises(pylog.OffsetRemovedError):
                log.read(o)
        assert log.next_offset - 1 in log


def test_in_on_a_topic_finds_its_partitions_and_refuses_an_offset(tmp_path):
    with pylog.LogStore(str(tmp_path / "s")) as store:
        t = store.create_topic("t", partitions=2)
        t.append_batch([b"x"] * 4)
        other = store.create_topic("u")
        assert t.partition(1) in t and t.reader(0) in t
        assert other.partition(0) not in t
        with pytest.raises(pylog.ArgumentTypeError, match="offset is per partition"):
            0 in t  # noqa: B015
        assert 0 in t.reader(0) or 0 in t.reader(1)
    with pylog.LogStore(str(tmp_path / "s"), readonly=True) as ro:
        t = ro.topic("t")
        assert all(log in t for log in t)


# ---- 3. a commit past the log end; lag as the next consumer sees it ------------------------
def test_a_commit_past_the_log_end_is_refused(tmp_path):
    root = str(tmp_path / "d")
    with pylog.LogStore(root) as s:
        s.create_topic("t").append_batch([b"x"] * 10)
        c = s.consumer("t", group="g")
        c.poll()
        with pytest.raises(pylog.OffsetOutOfRangeError, match="cannot commit offset 100 .* past the log end 10"):
            c.commit({0: 100})
        assert c.committed(0) is None  # nothing was committed
        c.seek(0, 50)  # a position past the end, then a commit of the positions
        with pytest.raises(pylog.OffsetOutOfRangeError, match="offset 50"):
            c.commit()
        c.commit({0: 10})  # the end itself: caught up
        c.close()
        row = s.describe_group("g")["partitions"][0]
        assert (row["committed"], row["log_end"], row["lag"], row["out_of_range"]) == (10, 10, 0, False)
        c = s.consumer("t", group="g")
        assert c.poll() == []
        c.close()


def test_lag_of_a_committed_offset_outside_the_log_counts_what_the_next_consumer_reads(tmp_path):
    """The log was truncated below the group's committed offset (as recovery can): the next
    consumer starts over from the earliest offset, and the lag says so (not 0)."""
    root = tmp_path / "d"
    with pylog.LogStore(str(root)) as s:
        s.create_topic("t").append_batch([b"x"] * 10)
        c = s.consumer("t", group="g")
        assert len(c.poll()) == 10
        c.commit()
        c.close()
        s.topic("t").partition(0).truncate(4)
        row = s.describe_group("g")["partitions"][0]
        assert (row["committed"], row["log_end"], row["lag"], row["out_of_range"]) == (10, 4, 4, True)
        c = s.consumer("t", group="g")
        assert len(c.poll()) == row["lag"]  # what the lag promised
        c.close()
    out = ok(cli(root, "group", "describe", "g")).splitlines()
    assert out[1].split()[3:6] == ["10", "4", "4*"]
    assert out[2].startswith("* the committed offset is outside the log")


# ---- messages ----------------------------------------------------------------------------
def test_seek_to_a_negative_offset_names_the_partitions_range(tmp_path):
    with pylog.LogStore(str(tmp_path / "d")) as s:
        s.create_topic("t").append_batch([b"v%d" % i for i in range(10)])
        with s.consumer("t", group="g") as c:
            with pytest.raises(pylog.OffsetOutOfRangeError) as e:
                c.seek(0, -1)
    assert str(e.value) == "offset -1 is out of range: an offset is >= 0 (partition 0 holds [0, 10))"


def test_auto_offset_reset_none_says_nothing_is_committed(tmp_path):
    with pylog.LogStore(str(tmp_path / "d")) as s:
        s.create_topic("t").append(b"x")
        with s.consumer("t", group="fresh", auto_offset_reset="none") as c:
            with pytest.raises(pylog.OffsetOutOfRangeError) as e:
                c.poll()
        assert str(e.value) == ("group 'fresh' has no committed offset for partition 0 of topic 't', "
                                "and auto_offset_reset='none'")
        with s.consumer("t", group="fresh2", auto_offset_reset="none", partitions=[0]) as c:
            c.seek(0, 7)
            with pytest.raises(pylog.OffsetOutOfRangeError) as e:
                c.poll()
        assert "position 7 in partition 0 of topic 't' is outside the log [0, 1)" in str(e.value)
        assert "-1" not in str(e.value)


def test_produce_while_pylog_serve_serves_the_root_names_the_broker(tmp_path):
    pytest.importorskip("kio")
    from serve_util import BrokerProcess

    root = tmp_path / "data"
    ok(cli(root, "topic", "create", "orders"))
    broker = BrokerProcess(str(root))
    try:
        p = cli(root, "produce", "orders", "--lock-timeout", "30", input="x\n")
    finally:
        broker.stop()
    err = error(p)
    assert err == (f"pylog: error: pylog serve is serving the data root {str(root)!r} and writes its partitions: "
                   "produce through the broker (a Kafka client, e.g. kcat -P)")
    ok(cli(root, "produce", "orders", input="x\n"))  # the broker stopped: the command writes again


def test_a_file_in_the_way_of_the_root_is_named(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = error(cli(afile / "sub", "topic", "create", "t"))
    assert err == f"pylog: error: data root {str(afile / 'sub')!r} cannot be a directory: {str(afile)!r} is a file"
    with pytest.raises(NotADirectoryError, match="not a directory .a file has that name.") as e:
        pylog.Log(str(afile / "sub" / "log"))
    assert e.value.filename == str(afile)
    with pytest.raises(NotADirectoryError):
        pylog.LogStore(str(afile))
    assert afile.read_text() == "x"


def test_topic_alter_to_the_same_partition_count_changes_nothing_and_says_so(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "t", "-p", "2"))
    assert error(cli(root, "topic", "alter", "t", "-p", "2")) == \
        "pylog: error: topic t has 2 partitions already; nothing changed"
    # a smaller count is refused before a config in the same command changes anything
    assert "can only be added" in error(cli(root, "topic", "alter", "t", "-p", "1", "-c", "retention_ms=1000"))
    assert json.loads(ok(cli(root, "topic", "describe", "t", "--format", "json")))["config"]["retention_ms"] != 1000
    assert ok(cli(root, "topic", "alter", "t", "-p", "3")).strip() == "altered topic t"


def test_a_mistyped_root_is_an_error_for_the_listing_verbs(tmp_path):
    missing = tmp_path / "no-such-root"
    for verb in (["topic", "list"], ["group", "list"]):
        assert error(cli(missing, *verb)) == \
            f"pylog: error: data root {str(missing)!r} does not exist (create a topic first, or pass --root)"
    assert not missing.exists()


def _listing(root) -> list:
    return sorted((d, n, os.stat(os.path.join(d, n)).st_size, os.stat(os.path.join(d, n)).st_mtime_ns)
                  for d, dirs, files in os.walk(root) for n in dirs + files)


def test_group_list_and_describe_read_a_root_the_user_cannot_write(tmp_path):
    """As every other reading verb: no write access needed, and nothing written."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root (to run the command as nobody)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="pylog-ro-")  # pytest's own temporary folders are closed to nobody
    os.chmod(base, 0o755)
    root = os.path.join(base, "d")
    ok(cli(root, "topic", "create", "orders", "-p", "2"))
    ok(cli(root, "produce", "orders", input="a\nb\nc\n"))
    ok(cli(root, "consume", "orders", "-g", "g1", "--from-beginning"))
    for d, dirs, files in os.walk(root):
        for n in files:
            os.chmod(os.path.join(d, n), 0o444)
        os.chmod(d, 0o555)
    before = _listing(root)
    try:
        assert ok(cli(root, "group", "list", nobody=True)) == "g1\n"
        out = ok(cli(root, "group", "describe", "g1", nobody=True)).splitlines()
        assert [line.split()[5] for line in out[1:3]] == ["0", "0"]  # LAG: all consumed
        info = json.loads(ok(cli(root, "group", "describe", "g1", "--format", "json", nobody=True)))
        assert sum(r["lag"] for r in info["partitions"]) == 0
        assert _listing(root) == before
    finally:
        for d, dirs, files in os.walk(root):
            os.chmod(d, 0o755)
        shutil.rmtree(base)


def test_log_and_store_refuse_a_directory_of_another_kind_and_write_nothing(tmp_path):
    root = str(tmp_path / "store")
    with pylog.LogStore(root) as s:
        s.create_topic("t").append(b"x")
    before = _listing(root)
    part = os.path.join(root, "t", "partition-0")
    for make, path, words in ((pylog.Log, root, "a LogStore's data root"),
                              (pylog.Log, os.path.join(root, "t"), "a topic"),
                              (pylog.LogStore, part, "the directory of a Log"),
                              (pylog.LogStore, os.path.join(root, "t"), "the directory of a topic")):
        with pytest.raises(pylog.InvalidArgumentError, match=words):
            make(path)
    with pytest.raises(pylog.InvalidArgumentError):
        pylog.Log(root, readonly=True)
    assert _listing(root) == before
    # the right kinds still open
    with pylog.Log(part, readonly=True) as log:
        assert bytes(log.read(0).value) == b"x"
    with pylog.LogStore(root, readonly=True) as s:
        assert s.topics() == ["t"]
    from pylog import fileutil, topicmeta, topics

    assert (fileutil.TOPIC_FILE, fileutil.STORE_LOCK) == (topicmeta.TOPIC_FILE, topics.STORE_LOCK)


def test_the_hint_of_a_truncate_into_a_compacted_segment_is_where_a_truncate_works(tmp_path):
    import re

    with pylog.Log(str(tmp_path / "c"), segment_bytes=4096, cleanup_policy="compact") as log:
        for i in range(300):
            log.append(b"v%03d" % i + b"x" * 60, key=b"k%d" % (i % 50))
        log.compact()
        segs = log.segments()
        assert len(segs) > 3
        hints = set()
        for off in (3, segs[1]["base_offset"]):
            with pytest.raises(pylog.PylogError, match="lies in a compacted segment") as e:
                log.truncate(off)
            hints.add(int(re.search(r"outside a compacted segment is (\d+)$", str(e.value)).group(1)))
        (hint,) = hints  # one answer, not the end of whichever segment was hit
        assert hint > segs[1]["next_offset"]
        with pytest.raises(pylog.PylogError):
            log.truncate(hint - 1)
        log.truncate(hint)
        assert log.next_offset == hint


def test_transaction_error_is_exported_where_the_docs_say():
    from pylog import errors, transactions

    assert pylog.TransactionError is errors.TransactionError is transactions.TransactionError
    assert issubclass(pylog.TransactionError, pylog.PylogError) and "TransactionError" in pylog.__all__


def test_partition_for_a_key_that_is_not_bytes_is_a_typed_error(tmp_path):
    with pylog.LogStore(str(tmp_path / "s")) as s:
        t = s.create_topic("t", partitions=3)
        for bad, name in ((None, "NoneType"), (7, "int")):
            with pytest.raises(pylog.ArgumentTypeError, match=f"key must be bytes-like, got {name}"):
                t.partition_for(bad)
        assert t.partition_for(b"k") == t.partition_for(bytearray(b"k"))


def test_a_negative_timestamp_is_a_usage_error_before_any_input(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "t"))
    p = cli(root, "produce", "t", "--timestamp", "-1", input="x\n")
    assert p.returncode == 2 and "'-1' is before the epoch" in p.stderr, p.stderr
    assert _rows(root, "t") == []


def test_kafka_headers_round_trip_between_the_command_and_a_kafka_client(tmp_path):
    """produce --header reaches a Kafka consumer as headers; consume --format json shows a
    Kafka producer's headers decoded."""
    pytest.importorskip("kio")
    kafka = pytest.importorskip("kafka")
    from serve_util import BrokerProcess

    root = tmp_path / "data"
    ok(cli(root, "topic", "create", "t"))
    ok(cli(root, "produce", "t", "--header", "lang=en", "--header", "source=import", input="x\n"))
    assert "--header" in error(cli(root, "produce", "t", "--header", "nosep", input="y\n"), 2)
    broker = BrokerProcess(str(root))
    try:
        producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)
        producer.send("t", b"y", headers=[("lang", b"fr")]).get(timeout=30)
        producer.close()
        consumer = kafka.KafkaConsumer("t", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                       consumer_timeout_ms=10_000)
        got = [(m.value, m.headers) for m in consumer]
        consumer.close()
    finally:
        broker.stop()
    assert got == [(b"x", [("lang", b"en"), ("source", b"import")]), (b"y", [("lang", b"fr")])]
    rows = _rows(root, "t")
    assert [r.get("headers") for r in rows] == [[["lang", "en"], ["source", "import"]], [["lang", "fr"]]]
