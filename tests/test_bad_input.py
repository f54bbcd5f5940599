"""Bad input at every public entry point of Log (crash-tests.md §6 scenario 8).

Each call gets a typed error whose message names the offending value (or its type, for a
wrong type), and nothing on disk changes: the directory's names and bytes are compared
before and after.
"""
from __future__ import annotations

import os

import pytest

import pylog
from pylog import format as fmt

BIG = fmt.MAX_TIMESTAMP_MS + 1


def snapshot(path: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[name] = f.read()
    return out


@pytest.fixture
def log(tmp_path):
    path = str(tmp_path / "log")
    lg = pylog.Log(path, fsync="always", segment_bytes=4096, max_record_bytes=1000)
    for i in range(50):
        lg.append(b"v%d" % i, timestamp=10_000 + i)
    lg.flush()
    yield lg
    lg.close()


class Odd:
    def __repr__(self) -> str:
        return "<Odd>"


# (name, call, expected exception types, text that must appear in the message)
CASES = [
    ("append str value", lambda l: l.append("text"), TypeError, "str"),
    ("append int value", lambda l: l.append(12345), TypeError, "int"),
    ("append float value", lambda l: l.append(1.5), TypeError, "float"),
    ("append object value", lambda l: l.append(Odd()), TypeError, "Odd"),
    ("append dict value", lambda l: l.append({"a": 1}), TypeError, "str"),  # iterates str keys
    ("append str key", lambda l: l.append(b"v", key="k"), TypeError, "str"),
    ("append int metadata", lambda l: l.append(b"v", metadata=7), TypeError, "int"),
    ("append oversized", lambda l: l.append(b"x" * 1001), pylog.RecordTooLargeError, "1001"),
    ("append oversized key+value", lambda l: l.append(b"x" * 600, key=b"k" * 401), pylog.RecordTooLargeError, "1001"),
    ("append oversized stream", lambda l: l.append(iter([b"x" * 600, b"y" * 600])), pylog.RecordTooLargeError, "1200"),
    ("append failing stream", lambda l: l.append(iter([b"a", 5])), TypeError, "int"),
    ("append negative timestamp", lambda l: l.append(b"v", timestamp=-1), pylog.InvalidTimestampError, "-1"),
    ("append absurd timestamp", lambda l: l.append(b"v", timestamp=BIG), pylog.InvalidTimestampError, str(BIG)),
    ("append timestamp going back", lambda l: l.append(b"v", timestamp=9_000), pylog.InvalidTimestampError, "9000"),
    ("append str timestamp", lambda l: l.append(b"v", timestamp="now"), TypeError, "str"),
    ("append float timestamp", lambda l: l.append(b"v", timestamp=1.5e12), TypeError, "float"),
    ("append bool timestamp", lambda l: l.append(b"v", timestamp=True), TypeError, "bool"),
    ("append wrong expected_offset", lambda l: l.append(b"v", expected_offset=7), pylog.OffsetMismatchError, "7"),
    ("append negative expected_offset", lambda l: l.append(b"v", expected_offset=-3), pylog.OffsetMismatchError, "-3"),
    ("append str expected_offset", lambda l: l.append(b"v", expected_offset="50"), TypeError, "str"),
    ("batch empty", lambda l: l.append_batch([]), ValueError, "at least one"),
    ("batch single bytes", lambda l: l.append_batch(b"abc"), TypeError, "bytes"),
    ("batch str", lambda l: l.append_batch("abc"), TypeError, "str"),
    ("batch int", lambda l: l.append_batch(5), TypeError, "int"),
    ("batch with a str", lambda l: l.append_batch([b"a", "b"]), TypeError, "str"),
    ("batch with an int", lambda l: l.append_batch([b"a", 3]), TypeError, "int"),
    ("batch oversized", lambda l: l.append_batch([b"a", b"x" * 1001]), pylog.RecordTooLargeError, "1001"),
    ("batch keys length", lambda l: l.append_batch([b"a", b"b"], keys=[b"k"]), ValueError, "1"),
    ("batch timestamps length", lambda l: l.append_batch([b"a"], timestamps=[20_000, 20_001]), ValueError, "2"),
    ("batch timestamps decreasing", lambda l: l.append_batch([b"a", b"b"], timestamps=[20_002, 20_001]),
     pylog.InvalidTimestampError, "20001"),
    ("batch timestamps negative", lambda l: l.append_batch([b"a"], timestamps=[-5]), pylog.InvalidTimestampError, "-5"),
    ("batch timestamps absurd", lambda l: l.append_batch([b"a"], timestamps=[BIG]), pylog.InvalidTimestampError,
     str(BIG)),
    ("batch timestamps below latest", lambda l: l.append_batch([b"a"], timestamps=[5]), pylog.InvalidTimestampError,
     "5"),
    ("batch timestamps floats", lambda l: l.append_batch([b"a"], timestamps=[1.5]), TypeError, "float"),
    ("read negative", lambda l: l.read(-1), pylog.OffsetOutOfRangeError, "-1"),
    ("read at end", lambda l: l.read(50), pylog.OffsetOutOfRangeError, "50"),
    ("read far past end", lambda l: l.read(1 << 62), pylog.OffsetOutOfRangeError, str(1 << 62)),
    ("read str", lambda l: l.read("3"), TypeError, "str"),
    ("read float", lambda l: l.read(3.0), TypeError, "float"),
    ("read None", lambda l: l.read(None), TypeError, "NoneType"),
    ("read bool", lambda l: l.read(True), TypeError, "bool"),
    ("read_batch negative", lambda l: l.read_batch(-2), pylog.OffsetOutOfRangeError, "-2"),
    ("read_batch past end", lambda l: l.read_batch(51), pylog.OffsetOutOfRangeError, "51"),
    ("read_batch max_bytes negative", lambda l: l.read_batch(0, max_bytes=-1), ValueError, "-1"),
    ("read_batch max_bytes str", lambda l: l.read_batch(0, max_bytes="1"), TypeError, "str"),
    ("read_batch max_records 0", lambda l: l.read_batch(0, max_records=0), ValueError, "0"),
    ("read_batch max_records float", lambda l: l.read_batch(0, max_records=2.0), TypeError, "float"),
    ("scan start after stop", lambda l: list(l.scan(10, 5)), ValueError, "10"),
    ("scan stop past end", lambda l: list(l.scan(0, 99)), pylog.OffsetOutOfRangeError, "99"),
    ("scan negative start", lambda l: list(l.scan(-4, 5)), pylog.OffsetOutOfRangeError, "-4"),
    ("scan str", lambda l: list(l.scan("0")), TypeError, "str"),
    ("truncate negative", lambda l: l.truncate(-1), pylog.OffsetOutOfRangeError, "-1"),
    ("truncate past end", lambda l: l.truncate(51), pylog.OffsetOutOfRangeError, "51"),
    ("truncate str", lambda l: l.truncate("1"), TypeError, "str"),
    ("remove_expired negative", lambda l: l.remove_expired(-1), ValueError, "-1"),
    ("remove_expired str", lambda l: l.remove_expired("1"), TypeError, "str"),
    ("offset_for_time str", lambda l: l.offset_for_time("x"), TypeError, "str"),
    ("offset_for_time float", lambda l: l.offset_for_time(1.5), TypeError, "float"),
]


@pytest.mark.parametrize("name,call,exc,text", CASES, ids=[c[0] for c in CASES])
def test_bad_call_raises_and_changes_nothing(log, name, call, exc, text):
    before = snapshot(log.path)
    n = log.next_offset
    with pytest.raises(exc) as e:
        call(log)
    assert isinstance(e.value, (pylog.PylogError, TypeError, ValueError, IndexError))
    assert text in str(e.value), f"{name}: {text!r} not in {str(e.value)!r}"
    assert log.next_offset == n
    log.flush()
    assert snapshot(log.path) == before, name
    # the log still works
    assert bytes(log.read(n - 1).value) == b"v%d" % (n - 1)
    assert log.append(b"ok", timestamp=30_000) == n


CONFIG_CASES = [
    (dict(segment_bytes=100), "100"),
    (dict(segment_bytes=1 << 40), str(1 << 40)),
    (dict(segment_bytes="big"), "big"),
    (dict(fsync="sometimes"), "sometimes"),
    (dict(fsync=True), "True"),
    (dict(index_interval_bytes=-1), "-1"),
    (dict(max_record_bytes=-5), "-5"),
    (dict(flush_messages=0), "0"),
    (dict(flush_ms=-10), "-10"),
    (dict(retention_bytes=-1), "-1"),
    (dict(retention_ms=1.5), "1.5"),
    (dict(cached_segments=-2), "-2"),
    (dict(initial_offset=-1), "-1"),
    (dict(preallocate="yes"), "yes"),
    (dict(cleanup_policy="shred"), "shred"),
    (dict(no_such_option=1), "no_such_option"),
]


@pytest.mark.parametrize("opts,text", CONFIG_CASES, ids=[next(iter(c[0])) + "=" + repr(next(iter(c[0].values())))
                                                         for c in CONFIG_CASES])
def test_bad_config(tmp_path, opts, text):
    path = str(tmp_path / "log")
    with pytest.raises((pylog.ConfigError, TypeError)) as e:
        pylog.Log(path, **opts)
    assert text in str(e.value)
    # an existing log is left alone too
    with pylog.Log(path) as lg:
        lg.append(b"x")
    before = snapshot(path)
    with pytest.raises((pylog.ConfigError, TypeError)) as e:
        pylog.Log(path, **opts)
    assert text in str(e.value)
    assert snapshot(path) == before
    with pylog.Log(path) as lg:  # and the lock was released
        assert lg.next_offset == 1


def test_initial_offset_cannot_change(tmp_path):
    path = str(tmp_path / "log")
    with pylog.Log(path, initial_offset=100) as lg:
        lg.append(b"x")
    before = snapshot(path)
    with pytest.raises(pylog.ConfigError) as e:
        pylog.Log(path, initial_offset=5)
    assert "5" in str(e.value) and "100" in str(e.value)
    assert snapshot(path) == before


@pytest.mark.parametrize("bad,exc,text", [
    (None, TypeError, "NoneType"),
    (123, TypeError, "int"),
    (b"bytes-path", TypeError, "bytes"),
    ("", ValueError, "empty"),
])
def test_bad_path_types(bad, exc, text):
    with pytest.raises(exc) as e:
        pylog.Log(bad)
    assert text in str(e.value)


def test_path_is_a_file(tmp_path):
    p = tmp_path / "file"
    p.write_bytes(b"not a log")
    with pytest.raises(OSError) as e:
        pylog.Log(str(p))
    assert str(p) in str(e.value)
    assert p.read_bytes() == b"not a log"


def test_readonly_on_missing_dir(tmp_path):
    p = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as e:
        pylog.Log(p, readonly=True)
    assert p in str(e.value)
    assert not os.path.exists(p)


def test_readonly_log_refuses_writes(tmp_path):
    path = str(tmp_path / "log")
    with pylog.Log(path) as lg:
        lg.append(b"x")
    before = snapshot(path)
    with pylog.Log(path, readonly=True) as r:
        for call in (lambda: r.append(b"y"), lambda: r.append_batch([b"y"]), lambda: r.truncate(0),
                     r.flush, r.roll, lambda: r.remove_expired(0), r.enforce_retention):
            with pytest.raises(pylog.ReadOnlyLogError) as e:
                call()
            assert path in str(e.value)
    assert snapshot(path) == before


def test_closed_log_refuses_everything(tmp_path):
    path = str(tmp_path / "log")
    lg = pylog.Log(path)
    lg.append(b"x")
    lg.close()
    before = snapshot(path)
    for call in (lambda: lg.append(b"y"), lambda: lg.append_batch([b"y"]), lambda: lg.read(0),
                 lambda: lg.read_batch(0), lambda: list(lg.scan()), lambda: lg.truncate(0), lg.flush,
                 lg.roll, lambda: lg.offset_for_time(0), lg.verify, lambda: lg.next_offset,
                 lg.enforce_retention, lambda: lg.remove_expired(0)):
        with pytest.raises(pylog.LogClosedError) as e:
            call()
        assert path in str(e.value)
    assert snapshot(path) == before
