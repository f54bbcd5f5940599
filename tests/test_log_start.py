"""``Log.delete_records``: a durable log start mark that every reader honours (issue 29: the
broker's DeleteRecords made a log-level promise), under both backends."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import pylog
from pylog.errors import OffsetOutOfRangeError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _env(backend: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["PYLOG_BACKEND"] = backend
    return env


def _py(code: str, backend: str, *args: str) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=_env(backend),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


# the writer: 200 records of ~60 B in 4 KiB segments (~60 a segment), timestamps 1000 + i
WRITE = """
import sys, pylog
store = pylog.LogStore(sys.argv[1])
store.create_topic("t", partitions=1, segment_bytes=4096)
log = store.topic("t").partition(0)
for i in range(200):
    log.append(b"v%03d" % i + b"." * 50, key=b"k%d" % i, timestamp=1000 + i)
g = store.consumer("t", group="g")
g.poll(10)
g.commit()   # the group's position: 10
g.close()
ro = pylog.Log(sys.argv[1] + "/t/partition-0", readonly=True)   # a reader opened before
assert next(iter(ro)).offset == 0
segs = sorted(f for f in __import__("os").listdir(sys.argv[1] + "/t/partition-0") if f.endswith(".log"))
assert log.delete_records(150) == 150
assert log.delete_records(100) == 150          # at or below the start: nothing changes
left = sorted(f for f in __import__("os").listdir(sys.argv[1] + "/t/partition-0") if f.endswith(".log"))
first_base = int(left[0][:-4])
assert len(left) < len(segs) and first_base < 150, (segs, left)   # 150 lies inside the first kept
ro.refresh()
print(ro.start_offset, next(iter(ro)).offset, ro.offset_for_time(0))
store.close()
"""

# every reader, in a fresh process: the Log, a read-only Log, Consumer, read_arrow
READ = """
import sys, json, pylog
from pylog.errors import OffsetOutOfRangeError
out = {}
for ro in (False, True):
    log = pylog.Log(sys.argv[1] + "/t/partition-0", readonly=ro)
    r = out["ro" if ro else "rw"] = {}
    r["start"] = log.start_offset
    r["len"] = len(log)
    r["iter_first"] = next(iter(log)).offset
    r["count"] = sum(1 for _ in log)
    for what, f in (("read", lambda: log.read(149)), ("read_batch", lambda: log.read_batch(140)),
                    ("scan", lambda: list(log.scan(149, 160)))):
        try:
            f()
            r[what] = "served"
        except OffsetOutOfRangeError as e:
            r[what] = [e.offset, e.start_offset]
    r["read150"] = bytes(log.read(150).value[:4]).decode()
    r["in"] = [149 in log, 150 in log]
    r["time0"] = log.offset_for_time(0)
    r["time1100"] = log.offset_for_time(1100)
    r["time1170"] = log.offset_for_time(1170)
    r["arrow"] = log.read_arrow().column("offset")[0].as_py()
    log.close()
store = pylog.LogStore(sys.argv[1])
g = store.consumer("t", group="g")      # committed 10: below the start, reset to earliest
out["group_first"] = g.poll(5)[0].offset
g.close()
c = store.consumer("t")
out["consumer_first"] = c.poll(5)[0].offset
c.close()
store.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["native", "pure"])
def test_delete_records_is_honoured_by_every_reader(tmp_path, backend):
    if backend == "native":
        pytest.importorskip("pylog._native")
    root = str(tmp_path / "root")
    # a read-only Log opened before the delete picks the mark up at its refresh
    assert _py(WRITE, backend, root).split() == ["150", "150", "150"]
    got = json.loads(_py(READ, backend, root))
    for kind in ("rw", "ro"):
        r = got[kind]
        assert r["start"] == 150 and r["len"] == 50 and r["iter_first"] == 150 and r["count"] == 50
        assert r["read"] == [149, 150] and r["read_batch"] == [140, 150] and r["scan"] == [149, 150]
        assert r["read150"] == "v150" and r["in"] == [False, True]
        # by time: never below the start (the records at 0..149 hold the earlier timestamps)
        assert r["time0"] == 150 and r["time1100"] == 150 and r["time1170"] == 170
        assert r["arrow"] == 150
    assert got["group_first"] == 150 and got["consumer_first"] == 150

    # pylog consume (the CLI) from the beginning starts at the mark
    p = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", root, "consume", "t", "--from-beginning",
                        "-F", "%o\n"], env=_env(backend), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    offsets = [int(x) for x in p.stdout.split()]
    assert offsets == list(range(150, 200))


def test_delete_records_bounds_truncate_retention_and_reopen(tmp_path):
    path = str(tmp_path / "p")
    log = pylog.Log(path, segment_bytes=4096)
    for i in range(200):
        log.append(b"x" * 50, timestamp=1000 + i)
    with pytest.raises(OffsetOutOfRangeError, match="before=201"):
        log.delete_records(201)
    with pytest.raises(pylog.errors.ArgumentTypeError):
        log.delete_records("5")  # type: ignore[arg-type]
    assert log.delete_records(200) == 200  # everything: an empty log that still counts on
    assert len(log) == 0 and log.read_batch(200) == []
    assert log.append(b"y") == 200 and log.start_offset == 200
    with pytest.raises(OffsetOutOfRangeError):  # a truncate cannot go below the mark
        log.truncate(150)
    log.close()
    log = pylog.Log(path)
    assert log.start_offset == 200 and [r.offset for r in log] == [200]
    log.close()


def test_a_mark_past_the_end_is_lowered_at_open(tmp_path):
    """A mark past the records (only a copied-in file can be: delete_records makes the records
    below it durable first) is lowered to the log's end, so new appends are served."""
    from pylog import checkpoint

    path = str(tmp_path / "p")
    log = pylog.Log(path)
    for _ in range(10):
        log.append(b"x")
    log.close()
    checkpoint.write_log_start(path, 50)
    log = pylog.Log(path)
    assert log.start_offset == 10 and checkpoint.read_log_start(path) == 10
    assert log.append(b"new") == 10 and [r.offset for r in log] == [10]
    log.close()


def test_delete_records_is_durable_before_it_returns(tmp_path):
    """Before delete_records returns, the store holding the records below the mark is
    fsynced, then the mark's file is written, fsynced and renamed into place, and the
    directory fsynced (strace shows the order, paths resolved with -y)."""
    path = str(tmp_path / "p")
    code = f"""
import os, pylog
log = pylog.Log({path!r}, fsync="never", segment_bytes=4096)
for i in range(100):
    log.append(b"x" * 50)
os.write(1, b"delete\\n")
log.delete_records(70)
os.write(1, b"deleted\\n")
"""
    tr = str(tmp_path / "tr")
    p = subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync,rename,write", "-o", tr,
                        sys.executable, "-c", code], env=_env(""), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = open(tr).read().splitlines()
    begin = next(i for i, ln in enumerate(lines) if 'write(1' in ln and '"delete\\n"' in ln)
    end = next(i for i, ln in enumerate(lines) if 'write(1' in ln and '"deleted\\n"' in ln)
    calls = lines[begin:end]

    def at(pred):
        return next(i for i, ln in enumerate(calls) if pred(ln))

    store_sync = at(lambda ln: "sync(" in ln and ".log>" in ln)
    mark_sync = at(lambda ln: "sync(" in ln and "log-start-offset.tmp>" in ln)
    renamed = at(lambda ln: "rename(" in ln and "log-start-offset" in ln)
    dir_sync = at(lambda ln: "sync(" in ln and ln.split("<", 1)[1].startswith(path + ">"))
    assert store_sync < mark_sync < renamed < dir_sync, calls
    log = pylog.Log(path)
    assert log.start_offset == 70
    log.close()


def test_an_old_brokers_log_start_file_is_honoured_and_moved_into_the_mark(tmp_path):
    """A data root from a broker that kept DeleteRecords' offset in TOPIC/~log-start: the
    broker still serves it, and moves it into the partition's mark, which the library reads."""
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient, OffsetSpec
    from serve_util import BrokerProcess

    root = str(tmp_path / "root")
    store = pylog.LogStore(root)
    store.create_topic("old", partitions=1, segment_bytes=4096)
    log = store.topic("old").partition(0)
    for i in range(100):
        log.append(b"x" * 50)
    store.close()
    os.makedirs(os.path.join(root, "old", "~log-start"))
    with open(os.path.join(root, "old", "~log-start", "partition-0"), "w") as f:
        f.write("60")
    b = BrokerProcess(root)
    try:
        a = AdminClient({"bootstrap.servers": b.bootstrap})
        tp = ck.TopicPartition("old", 0)
        got = a.list_offsets({tp: OffsetSpec.earliest()})[tp].result(20)
        assert got.offset == 60
    finally:
        assert b.stop() == 0
    assert not os.path.exists(os.path.join(root, "old", "~log-start", "partition-0"))
    log = pylog.Log(os.path.join(root, "old", "partition-0"), readonly=True)
    assert log.start_offset == 60 and next(iter(log)).offset == 60
    log.close()


def test_the_spark_sources_plan_starts_at_the_mark(tmp_path):
    """The Spark source's planning (no JVM: its offset bounds and the slices of a partition)
    starts at the mark; a range from below it is data loss unless failOnDataLoss=false."""
    pytest.importorskip("pyspark")
    from pylog.spark import reading

    root = str(tmp_path / "root")
    store = pylog.LogStore(root)
    store.create_topic("t", partitions=1, segment_bytes=4096)
    log = store.topic("t").partition(0)
    for i in range(200):
        log.append(b"v%03d" % i + b"." * 50)
    log.delete_records(150)
    store.close()
    assert reading._bounds(root, ["t"]) == {"t": {0: (150, 200)}}
    with pytest.raises(pylog.errors.PylogError, match="offset 0 .* starts at 150"):
        reading._plan_partition(root, "t", 0, 0, 200, True)
    slices = reading._plan_partition(root, "t", 0, 0, 200, False)
    assert slices[0].start_offset == 150 and sum(s.end_offset - s.start_offset for s in slices) == 50
