"""The topic layer's guarantees across processes and through the CLI (issue 14, cases 4, 5,
6, 8 and 9): a stale handle never recreates a deleted topic; producers and consumers notice
a changed topic; the CLI's group commits cover only what its reader took; a read-only root
can be read and is never written; a second producer waits for the partition lock.

Every test drives real processes (``run_py`` children, the ``pylog`` CLI as a subprocess)
over real files."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import py_env, run_py, strace_path

import pylog
from pylog.errors import LogLockedError, ReadOnlyLogError, UnknownTopicError
from pylog.topics import partition_for_key

#: Run as ``nobody``: the interpreter lives where nobody may not look, so the child imports
#: what it needs as root, drops to nobody (os.setuid), then runs the CLI or CODE.
AS_NOBODY = """
import array, base64, collections, difflib, fcntl, json, os, pwd, stat, sys, termios
import click, numpy, rich.console, rich.progress
import pylog, pylog.cli, pylog.consumer, pylog.log, pylog.tail, pylog.topics
nb = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nb.pw_gid)
os.setuid(nb.pw_uid)
assert os.geteuid() != 0
if sys.argv[1] == "-c":
    exec(sys.argv[2], {"root": sys.argv[3], "pylog": pylog})
else:
    pylog.cli.main(sys.argv[1:])
"""


def cli(root, *args, input=None, timeout=60, nobody=False):
    """``python -m pylog.cli --root ROOT ARGS`` in a child process (as user nobody if asked)."""
    cmd = [sys.executable, "-m", "pylog.cli", "--root", str(root), *args]
    if nobody:
        cmd = [sys.executable, "-c", AS_NOBODY, "--root", str(root), *args]
    return subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, env=py_env())


def popen_cli(root, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "pylog.cli", "--root", str(root), *args],
                            env=py_env(), **kw)


def one_line_error(p, code=1):
    err = p.stderr.decode() if isinstance(p.stderr, bytes) else p.stderr
    assert p.returncode == code, (p.returncode, err)
    assert err.startswith("pylog: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def wait_for(cond, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def locked(path):
    from pylog.topics import _locked_by_other

    return _locked_by_other(path)


def values(root, topic, partition=0):
    with pylog.LogStore(root, readonly=True) as s:
        return [bytes(r.value) for r in s.topic(topic).reader(partition).scan()]


def committed(root, topic, group, partition=0):
    from pylog.consumer import decode_offset

    p = os.path.join(root, topic, "~consumers", group, f"partition-{partition}.offset")
    if not os.path.exists(p):
        return None
    with open(p, "rb") as f:
        return decode_offset(f.read())


# ------------------------------------------------------------------------------------------
# case 4: a stale handle never recreates a deleted topic
def test_stale_handle_append_after_delete_elsewhere_raises_and_recreates_nothing(tmp_path):
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t", partitions=2)
    with pylog.LogStore(root) as s:
        t = s.topic("t")  # held; no partition open yet
        r = run_py("import pylog,sys; pylog.LogStore(sys.argv[1]).delete_topic('t')", root)
        assert r.returncode == 0, r.stderr
        time.sleep(0.15)  # past metadata_refresh_ms; the open path checks afresh anyway
        with pytest.raises(UnknownTopicError, match="deleted"):
            t.append(b"x")
        with pytest.raises(UnknownTopicError):
            t.append_batch([b"x"], partition=1)
        with pytest.raises(UnknownTopicError):
            t.partition(0)
        assert sorted(os.listdir(root)) == [".store.lock"]  # nothing recreated
        with pytest.raises(UnknownTopicError):
            s.consumer("t", group="g")  # nor a group directory inside it
        assert sorted(os.listdir(root)) == [".store.lock"]
    # the name is usable again, from another process
    r = run_py("import pylog,sys; s=pylog.LogStore(sys.argv[1]); print(s.create_topic('t').append(b'y'))", root)
    assert r.returncode == 0 and r.stdout.strip() == "(0, 0)", r.stderr


def test_deleted_and_recreated_topic_is_another_topic_to_an_old_handle(tmp_path):
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t").append(b"old")
    with pylog.LogStore(root) as s:
        t = s.topic("t")
        c = s.consumer("t", auto_offset_reset="earliest")
        assert [bytes(r.value) for r in c.poll()] == [b"old"]
        old_id = getattr(t, "id", None)
        r = run_py("""
            import pylog, sys
            s = pylog.LogStore(sys.argv[1]); s.delete_topic('t'); s.create_topic('t').append(b'new')
        """, root)
        assert r.returncode == 0, r.stderr
        time.sleep(0.15)
        with pytest.raises(UnknownTopicError, match="deleted"):
            t.append(b"stale")
        with pytest.raises(UnknownTopicError):
            c.poll()
        fresh = s.topic("t")  # the name now means the new topic
        assert fresh is not t
        assert fresh.append(b"new2") == (0, 1)
        assert fresh.id != old_id and fresh.id is not None
    assert values(root, "t") == [b"new", b"new2"]


def test_delete_refuses_while_another_process_writes_a_partition(tmp_path):
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t", partitions=2).append(b"a", partition=1)
        r = run_py("import pylog,sys; pylog.LogStore(sys.argv[1]).delete_topic('t')", root)
        assert r.returncode != 0 and "LogLockedError" in r.stderr
        assert s.topic("t").append(b"b", partition=1) == (1, 1)
    assert values(root, "t", 1) == [b"a", b"b"]


def test_cli_delete_refuses_while_pylog_produce_runs(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    prod = popen_cli(root, "produce", "t", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: locked(os.path.join(root, "t", "partition-0", ".lock")), what="producer's lock")
        d = cli(root, "topic", "delete", "t")
        assert "locked" in one_line_error(d) or "open for writing" in d.stderr.decode()
        prod.stdin.write(b"one\ntwo\n")
        prod.stdin.close()
        assert prod.wait(30) == 0, prod.stderr.read()
    finally:
        prod.kill()
    assert values(root, "t") == [b"one", b"two"]
    assert os.path.isfile(os.path.join(root, "t", "topic.json"))
    assert cli(root, "topic", "delete", "t").returncode == 0
    assert not os.path.exists(os.path.join(root, "t"))


def test_cli_consume_follow_reports_a_deleted_topic_in_one_line(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    assert cli(root, "produce", "t", input=b"a\nb\n").returncode == 0
    con = popen_cli(root, "consume", "t", "--from-beginning", "--follow", stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    try:
        assert con.stdout.readline() == b"a\n" and con.stdout.readline() == b"b\n"
        assert cli(root, "topic", "delete", "t").returncode == 0
        assert con.wait(30) == 1
        err = con.stderr.read().decode()
    finally:
        con.kill()
    assert err == "pylog: error: topic 't' was deleted\n", err
    assert not os.path.exists(os.path.join(root, "t"))


def test_half_done_delete_is_finished_at_the_next_open(tmp_path):
    """The delete killed (SIGKILL, by strace) at its first unlink, after the rename that
    commits it: the topic is gone for every reader, and the next writable open removes the
    rest."""
    if strace_path() is None:
        pytest.skip("strace not installed, or under qemu-user")
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t", "-p", "2").returncode == 0
    assert cli(root, "produce", "t", input=b"a\nb\nc\n").returncode == 0
    p = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e", "inject=unlink,unlinkat:signal=SIGKILL:when=1",
                        sys.executable, "-m", "pylog.cli", "--root", root, "topic", "delete", "t"],
                       capture_output=True, env=py_env(), timeout=60)
    assert p.returncode != 0
    assert "t~deleted" in os.listdir(root)  # killed after the rename, before the files went
    assert cli(root, "topic", "list").stdout == b""
    assert "unknown topic" in one_line_error(cli(root, "consume", "t", "--from-beginning"))
    assert cli(root, "topic", "create", "t").returncode == 0
    assert sorted(os.listdir(root)) == [".store.lock", "t"]
    assert cli(root, "consume", "t", "--from-beginning").stdout == b""


# ------------------------------------------------------------------------------------------
# case 5: partitions (and config) changed elsewhere are noticed
def test_producer_notices_partitions_added_elsewhere(tmp_path):
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t", partitions=1)
    key = next(k for k in (b"k%d" % i for i in range(100)) if partition_for_key(k, 3) == 2)
    with pylog.LogStore(root) as s:  # metadata_refresh_ms: 100 by default
        t = s.topic("t")
        assert t.append(b"before", key=key) == (0, 0)
        r = run_py("import pylog,sys; print(pylog.LogStore(sys.argv[1]).add_partitions('t', 2))", root)
        assert r.stdout.strip() == "3", r.stderr
        time.sleep(0.15)
        assert t.partitions == 3
        assert t.append(b"after", key=key) == (2, 0)  # where a fresh store puts the key
        assert t.append_batch([b"b1", b"b2"], keys=[key, key]) == [(2, 1), (2, 2)]
        r = run_py("import pylog,sys; "
                   "print(pylog.LogStore(sys.argv[1]).topic('t').partition_for(sys.argv[2].encode()))",
                   root, key.decode())
        assert r.stdout.strip() == "2"


def test_refresh_is_a_stat_at_most_every_refresh_ms(tmp_path):
    """Within metadata_refresh_ms a handle does not look at all; after it, one stat."""
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t", partitions=1)
    with pylog.LogStore(root, metadata_refresh_ms=60_000) as s:
        t = s.topic("t")
        assert run_py("import pylog,sys; pylog.LogStore(sys.argv[1]).add_partitions('t', 1)", root).returncode == 0
        assert t.partitions == 1  # not looked yet (documented staleness bound)
        t._next_check = 0.0  # the bound passed
        assert t.partitions == 2


def test_consumers_notice_added_partitions_and_config(tmp_path):
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t", partitions=1).append(b"p0")
    with pylog.LogStore(root) as s:
        solo = s.consumer("t", auto_offset_reset="latest")
        grp = s.consumer("t", group="g", auto_offset_reset="latest", rebalance_ms=20)
        assert solo.poll() == [] and grp.poll() == []
        r = run_py("""
            import pylog, sys
            s = pylog.LogStore(sys.argv[1])
            s.add_partitions('t', 2)
            s.alter_topic('t', retention_ms=12345)
            t = s.topic('t')
            t.append(b'p1', partition=1); t.append(b'p2', partition=2)
        """, root)
        assert r.returncode == 0, r.stderr
        for c in (solo, grp):
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got += [bytes(x.value) for x in c.poll(timeout_ms=50)]
            assert sorted(got) == [b"p1", b"p2"]  # new partitions read from their start
            assert c.assignment() == [0, 1, 2]
        assert s.topic("t").config.retention_ms == 12345


def test_cli_group_follow_prints_every_record_after_topic_alter(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    con = popen_cli(root, "consume", "t", "-g", "G", "--follow", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: os.path.exists(os.path.join(root, "t", "~consumers", "G", "partition-0.offset")),
                 what="the new group's first commit")
        assert cli(root, "topic", "alter", "t", "-p", "3").returncode == 0
        lines = b"".join(b"k%d\tv%d\n" % (i, i) for i in range(5))
        assert cli(root, "produce", "t", "-k", "\t", input=lines).returncode == 0
        assert len({partition_for_key(b"k%d" % i, 3) for i in range(5)}) > 1
        got = sorted(con.stdout.readline() for _ in range(5))
    finally:
        con.kill()
        con.wait()
    assert got == [b"v%d\n" % i for i in range(5)]


# ------------------------------------------------------------------------------------------
# case 6: the CLI commits what its reader took, and a new group's start position
def test_cli_group_commit_covers_only_what_the_pipe_reader_took(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    data = b"".join(b"%d\n" % i for i in range(100_000))  # far more than a pipe holds
    assert cli(root, "produce", "t", input=data).returncode == 0
    r, w = os.pipe()
    con = popen_cli(root, "consume", "t", "-g", "G", "--from-beginning", stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    assert os.read(r, 2) == b"0\n"  # the reader takes exactly one record, then goes away
    os.close(r)
    assert con.wait(30) == 0, con.stderr.read()
    assert committed(root, "t", "G") == 1
    nxt = cli(root, "consume", "t", "-g", "G", "-n", "1")
    assert nxt.stdout == b"1\n", nxt.stderr


def test_cli_group_commit_with_head(tmp_path):
    """The issue's pipeline: a group must not commit the whole fetched batch; what `head`
    read (a buffer's worth, of which it printed one line) is the most it may commit."""
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    assert cli(root, "produce", "t", input=b"x\n" * 30_000).returncode == 0
    env = py_env()
    p = subprocess.run(f"{sys.executable} -m pylog.cli --root {root} consume t -g G --from-beginning | head -n 1",
                       shell=True, capture_output=True, env=env, timeout=60)
    assert p.stdout == b"x\n" and p.stderr == b""
    c = committed(root, "t", "G")
    assert c is not None and 1 <= c < 20_000, c


def test_cli_new_group_commits_its_start_position_at_exit(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    assert cli(root, "produce", "t", input=b"old1\nold2\n").returncode == 0
    first = cli(root, "consume", "t", "-g", "g1")  # a new group at the end: reads nothing
    assert first.returncode == 0 and first.stdout == b""
    assert committed(root, "t", "g1") == 2
    assert cli(root, "produce", "t", input=b"new1\nnew2\n").returncode == 0
    second = cli(root, "consume", "t", "-g", "g1")
    assert second.stdout == b"new1\nnew2\n", second.stderr
    assert committed(root, "t", "g1") == 4


def test_cli_max_records_commits_what_was_printed(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    assert cli(root, "produce", "t", input=b"".join(b"%d\n" % i for i in range(50))).returncode == 0
    assert cli(root, "consume", "t", "-g", "G", "--from-beginning", "-n", "7").stdout.count(b"\n") == 7
    assert committed(root, "t", "G") == 7


# ------------------------------------------------------------------------------------------
# case 8: a read-only root can be read, and a read-only store writes nothing
def listing(root):
    out = []
    for d, dirs, files in os.walk(root):
        for n in sorted(dirs + files):
            st = os.lstat(os.path.join(d, n))
            out.append((os.path.relpath(os.path.join(d, n), root), st.st_size, st.st_mtime_ns, st.st_mode))
    return sorted(out)


def make_root(root):
    with pylog.LogStore(root) as s:
        t = s.create_topic("t", partitions=2, segment_bytes=4096)
        t.append_batch([b"v%04d" % i + b"." * 100 for i in range(200)], partition=0)
        t.append(b"p1", partition=1)
        s.consumer("t", group="old").commit()
    # a sealed segment's index file gone: a reader rebuilds it, in memory only
    p0 = os.path.join(root, "t", "partition-0")
    idx = sorted(n for n in os.listdir(p0) if n.endswith(".index"))
    assert len(idx) > 2
    os.unlink(os.path.join(p0, idx[0]))


def test_readonly_store_writes_nothing(tmp_path):
    root = str(tmp_path / "r")
    make_root(root)
    before = listing(root)
    with pylog.LogStore(root, readonly=True) as s:
        assert s.topics() == ["t"]
        t = s.topic("t")
        assert t.describe()["partitions"] == 2
        assert [bytes(r.value)[:5] for r in t.reader(0).scan()][:3] == [b"v0000", b"v0001", b"v0002"]
        assert t.reader(0).verify() == [] and t.reader(1).verify() == []
        c = s.consumer("t", auto_offset_reset="earliest")
        got = []
        while batch := c.poll(max_records=1000):
            got += batch
        assert len(got) == 201
        c.close()
        with pytest.raises(ReadOnlyLogError):
            t.append(b"x")
        with pytest.raises(ReadOnlyLogError):
            t.partition(0)
        with pytest.raises(ReadOnlyLogError):
            s.create_topic("u")
        with pytest.raises(ReadOnlyLogError):
            s.delete_topic("t")
        with pytest.raises(ReadOnlyLogError):
            s.add_partitions("t", 1)
        with pytest.raises(ReadOnlyLogError):
            s.consumer("t", group="g")
    assert listing(root) == before


def test_cli_reading_verbs_write_nothing(tmp_path):
    """topic list/describe, consume without a group and verify change nothing: not even the
    index file a reader rebuilds (compared: names, sizes, mtimes and modes of everything)."""
    root = str(tmp_path / "r")
    make_root(root)
    before = listing(root)
    for args in (["topic", "list"], ["topic", "describe", "t"], ["consume", "t", "--from-beginning"], ["verify"]):
        p = cli(root, *args)
        assert p.returncode == 0, (args, p.stderr)
        assert listing(root) == before, args


@pytest.fixture
def nobody_root():
    """A data root made read-only (chmod a-w) and a user that cannot write it (root ignores
    permissions, so the reading runs as ``nobody``, through os.setuid in the child)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to switch to nobody)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    base = tempfile.mkdtemp(prefix="pylog-ro-")
    os.chmod(base, 0o755)
    root = os.path.join(base, "r")
    make_root(root)
    for d, dirs, files in os.walk(root):
        for n in files:
            os.chmod(os.path.join(d, n), 0o444)
        os.chmod(d, 0o555)
    yield root
    for d, dirs, files in os.walk(base):
        os.chmod(d, 0o755)
    shutil.rmtree(base)


def test_cli_reads_a_root_the_user_cannot_write(nobody_root):
    root = nobody_root
    before = listing(root)
    assert cli(root, "topic", "list", nobody=True).stdout == b"t\n"
    d = cli(root, "topic", "describe", "t", nobody=True)
    assert d.returncode == 0 and b"Partitions: 2" in d.stdout, d.stderr
    c = cli(root, "consume", "t", "--from-beginning", "-p", "1", nobody=True)
    assert c.stdout == b"p1\n", c.stderr
    c = cli(root, "consume", "t", "--from-beginning", nobody=True)
    assert c.returncode == 0 and c.stdout.count(b"\n") == 201, c.stderr
    v = cli(root, "verify", nobody=True)
    assert v.returncode == 0 and v.stdout.startswith(b"ok: 2 partitions"), v.stderr
    # writing verbs fail in one line, and the library says what to do
    err = one_line_error(cli(root, "consume", "t", "-g", "G", nobody=True))
    assert "is not writable" in err
    r = subprocess.run([sys.executable, "-c", AS_NOBODY, "-c", """
try:
    pylog.LogStore(root)
except PermissionError as e:
    print("denied", "readonly=True" in str(e))
with pylog.LogStore(root, readonly=True) as s:
    c = s.consumer("t", auto_offset_reset="earliest", partitions=[0])
    print(len(c.poll(max_records=1000)))
""", root], capture_output=True, text=True, env=py_env(), timeout=60)
    assert r.stdout.split() == ["denied", "True", "200"], r.stderr
    assert listing(root) == before


# ------------------------------------------------------------------------------------------
# case 9: a second producer waits for the lock, which is taken before reading stdin
def test_cli_second_producer_waits_then_times_out_in_one_line(tmp_path):
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    a = popen_cli(root, "produce", "t", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # A locks before it reads a byte of input
        wait_for(lambda: locked(os.path.join(root, "t", "partition-0", ".lock")), what="A's lock")
        # B has no input yet either: it must not block on stdin, but on the lock, then give up
        b = popen_cli(root, "produce", "t", "--lock-timeout", "0.5", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        rc = b.wait(30)
        took = time.monotonic() - t0
        b.stdin.close()
        err = b.stderr.read().decode()
        assert rc == 1 and took >= 0.45, (rc, took, err)
        assert err.startswith("pylog: error: partition 0 of topic 't' is locked by another writer (waited 0.5 s)")
        assert err.count("\n") == 1
        # C waits long enough: it goes through once A is done, after A's records
        c = popen_cli(root, "produce", "t", "--lock-timeout", "30", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        c.stdin.write(b"c1\nc2\n")
        c.stdin.close()
        time.sleep(0.5)
        assert c.poll() is None  # still waiting for A
        a.stdin.write(b"a1\na2\n")
        a.stdin.close()
        assert a.wait(30) == 0
        assert c.wait(30) == 0, c.stderr.read()
    finally:
        a.kill()
    assert values(root, "t") == [b"a1", b"a2", b"c1", b"c2"]


def test_library_lock_timeout_waits_for_another_process(tmp_path):
    root = str(tmp_path)
    with pylog.LogStore(root) as s:
        s.create_topic("t")
    holder = subprocess.Popen([sys.executable, "-c", """
import pylog, sys, time
s = pylog.LogStore(sys.argv[1]); s.topic('t').append(b'first'); print('held', flush=True)
time.sleep(1.0); s.close()
""", root], stdout=subprocess.PIPE, env=py_env())
    try:
        assert holder.stdout.readline() == b"held\n"
        with pylog.LogStore(root, lock_timeout=0.1) as s:
            with pytest.raises(LogLockedError, match=r"waited 0.1 s"):
                s.topic("t").append(b"too early")
        t0 = time.monotonic()
        with pylog.LogStore(root, lock_timeout=30) as s:
            assert s.topic("t").append(b"second") == (0, 1)
        assert time.monotonic() - t0 > 0.3
    finally:
        holder.wait(30)
    assert values(root, "t") == [b"first", b"second"]
    with pytest.raises(ValueError):
        pylog.LogStore(root, lock_timeout=-1)


def test_keyed_append_batch_while_another_process_alters_the_topic(tmp_path, monkeypatch):
    """A keyed append_batch over several partitions opens them one by one; when another
    process altered the topic's config meanwhile, a metadata refresh between two opens
    closed the partitions opened before it, and append_batch raised AttributeError
    ('NoneType' object has no attribute 'append_batch'): found by the store model test.
    The batch must land whole, in the partitions its keys hash to."""
    from pylog.topics import Topic

    root = str(tmp_path / "root")
    with pylog.LogStore(root) as s:
        s.create_topic("t", 4)
    keys = [b"k%d" % i for i in range(40)]
    store = pylog.LogStore(root, metadata_refresh_ms=0)
    t = store.topic("t")
    assert len({t.partition_for(k) for k in keys}) == 4
    real_open = Topic._open
    altered = []

    def open_then_alter(self, i):  # the other process alters right after the first open
        log = real_open(self, i)
        if not altered:
            altered.append(i)
            run_py(f"import pylog; pylog.LogStore({root!r}).alter_topic('t', retention_bytes=1 << 30)")
        return log

    monkeypatch.setattr(Topic, "_open", open_then_alter)
    try:
        res = t.append_batch([b"v%d" % i for i in range(40)], keys=keys)
    finally:
        monkeypatch.undo()
    assert altered
    assert [p for p, _ in res] == [t.partition_for(k) for k in keys]
    store.close()
    with pylog.LogStore(root) as s:
        t2 = s.topic("t")
        assert t2.config.retention_bytes == 1 << 30
        got = {(p, r.offset): bytes(r.value) for p in range(4) for r in t2.reader(p).scan()}
    assert got == {(p, off): b"v%d" % i for i, (p, off) in enumerate(res)}


# ------------------------------------------------------------------------------------------
# pylog produce under faults: what it reports, and what the topic then holds
def _consumed_lines(root) -> list[bytes]:
    p = cli(root, "consume", "t", "--from-beginning")
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


@pytest.mark.parametrize("when", [1, 2, 3])
def test_cli_produce_fdatasync_eio_says_what_was_produced(tmp_path, when):
    """An fdatasync that fails (EIO, injected by strace at the Nth call) while ``pylog
    produce`` writes an fsync="always" topic: one line naming the topic and the error, and
    how many records were produced before it (the closing sync of an index failing too); the
    topic then holds a prefix of the input, at least that many records, every one intact; a
    second produce of the rest completes it."""
    if strace_path() is None:
        pytest.skip("strace not installed, or under qemu-user")
    import re

    root = str(tmp_path)
    assert cli(root, "topic", "create", "t", "-c", "fsync=always").returncode == 0
    lines = [b"%08d" % i for i in range(20_000)]
    src = tmp_path / "in.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    p = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e", f"inject=fdatasync:error=EIO:when={when}",
                        sys.executable, "-m", "pylog.cli", "--root", root, "produce", "t", str(src)],
                       capture_output=True, env=py_env(), timeout=120)
    err = one_line_error(p)
    assert "'t'" in err and "Input/output error" in err, err
    m = re.search(r"the (\d+) records? before line (\d+)|after (\d+) records? (?:were|was) produced", err)
    assert m, err
    produced = int(m.group(1) or m.group(3))
    got = _consumed_lines(root)
    assert got == lines[: len(got)], "the topic does not hold a prefix of the input"
    assert len(got) >= produced
    assert cli(root, "verify").returncode == 0
    rest = b"".join(v + b"\n" for v in lines[len(got):])
    assert cli(root, "produce", "t", input=rest).returncode == 0
    assert _consumed_lines(root) == lines


def test_cli_produce_killed_at_random_keeps_a_prefix(tmp_path):
    """``pylog produce`` from a pipe on an fsync="always" topic, SIGKILLed at a random moment,
    five times, each run fed the next 30,000 lines (slowly, the pipe then left open, so every
    run is still there to be killed) after what the topic holds: the topic is always an intact
    prefix of the input (no gap, no duplicate, no damaged record), and at the end all of it."""
    import random
    import threading

    rng = random.Random(20261124)
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t", "-c", "fsync=always", "-c", "segment_bytes=65536").returncode == 0
    lines = [b"%08d" % i for i in range(200_000)]
    grew = 0

    def stored_bytes() -> int:
        d = os.path.join(root, "t", "partition-0")
        return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".log"))

    for _ in range(5):
        have = len(_consumed_lines(root))
        p = popen_cli(root, "produce", "t", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdin is not None
        stop = threading.Event()

        def feed(start: int = have, p: subprocess.Popen = p, stop: threading.Event = stop) -> None:
            try:
                for i in range(start, min(start + 30_000, len(lines)), 500):
                    p.stdin.write(b"".join(v + b"\n" for v in lines[i : i + 500]))
                    p.stdin.flush()
                    if stop.wait(0.015):
                        return
            except (BrokenPipeError, ValueError):
                pass

        th = threading.Thread(target=feed)
        th.start()
        # killed at a random moment once it has written something (the interpreter's start
        # alone takes seconds under emulation)
        size = stored_bytes()
        deadline = time.monotonic() + 120
        while stored_bytes() == size:
            assert p.poll() is None, p.stderr.read() if p.stderr else p.returncode
            assert time.monotonic() < deadline, "produce wrote nothing in 120 s"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.8))
        assert p.poll() is None, p.stderr.read() if p.stderr else p.returncode
        p.kill()
        stop.set()
        p.wait(60)
        th.join(60)
        try:
            p.stdin.close()
        except BrokenPipeError:
            pass
        got = _consumed_lines(root)
        assert got == lines[: len(got)], "the topic does not hold a prefix of the input"
        assert have <= len(got) <= have + 30_000
        grew += len(got) > have
        v = cli(root, "verify")
        assert v.returncode == 0, v.stderr
    assert grew >= 4, "the runs were killed before their records were in the topic"
    rest = b"".join(v + b"\n" for v in lines[len(_consumed_lines(root)):])
    assert cli(root, "produce", "t", input=rest).returncode == 0
    assert _consumed_lines(root) == lines


def test_cli_produce_from_a_live_pipe_produces_each_line_as_it_comes(tmp_path):
    """``tail -f app.log | pylog produce logs``: a line is in the topic while the pipe is
    still open (produce read 4 MiB or to the end of the input before it wrote anything)."""
    root = str(tmp_path)
    assert cli(root, "topic", "create", "t").returncode == 0
    p = popen_cli(root, "produce", "t", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdin is not None
    try:
        p.stdin.write(b"first\nsecond\n")
        p.stdin.flush()
        deadline = time.monotonic() + 30
        while _consumed_lines(root) != [b"first", b"second"]:
            assert time.monotonic() < deadline, "lines written to the open pipe never reached the topic"
            time.sleep(0.1)
        p.stdin.write(b"third\n")
        p.stdin.close()
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    assert _consumed_lines(root) == [b"first", b"second", b"third"]
