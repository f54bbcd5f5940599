"""The `pylog` command, driven as a user would: subprocess, stdin/stdout, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, store_frames

import pylog

# Commands run in a child process forked from a "zygote" that has already imported
# pylog.cli (starting Python and importing numpy costs ~0.5-2 s a command on a busy CI
# machine). Each command still is its own process, with its own stdin, stdout, stderr,
# working directory, environment and exit status. ``real=True`` starts a fresh interpreter.
ZYGOTE = r"""
import os, pickle, struct, sys
import pylog.cli

def readn(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            os._exit(0)
        b += c
    return b

while True:
    (n,) = struct.unpack("<I", readn(4))
    argv, cwd, env, inp, out, err = pickle.loads(readn(n))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path, flags in ((0, inp, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                f = os.open(path, flags, 0o644)
                os.dup2(f, fd)
                os.close(f)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            try:
                pylog.cli.main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    os.write(1, struct.pack("<i", os.waitstatus_to_exitcode(status)))
"""


class _Zygote:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, argv, cwd, env, input, tmp):
        import pickle
        import struct

        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        inp, out, err = (os.path.join(tmp, n) for n in ("stdin", "stdout", "stderr"))
        with open(inp, "wb") as f:
            f.write(input or b"")
        req = pickle.dumps((argv, cwd, env, inp, out, err))
        self.proc.stdin.write(struct.pack("<I", len(req)) + req)  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        (rc,) = struct.unpack("<i", self.proc.stdout.read(4))  # type: ignore[union-attr]
        with open(out, "rb") as f1, open(err, "rb") as f2:
            return subprocess.CompletedProcess(argv, rc, f1.read(), f2.read())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(10)


_ZYGOTE = _Zygote()


@pytest.fixture(scope="module", autouse=True)
def _zygote():
    yield
    _ZYGOTE.close()


@pytest.fixture(autouse=True)
def _io_dir(tmp_path_factory):
    global _IO
    _IO = str(tmp_path_factory.mktemp("io"))


_IO = ""


def run(root, *args, input=None, env=None, timeout=60, cwd=None, real=False):
    e = dict(os.environ)
    e.pop("PYLOG_ROOT", None)
    if env:
        e.update(env)
    argv = []
    if root is not None:
        argv += ["--root", str(root)]
    argv += list(args)
    if real:
        return subprocess.run([sys.executable, "-m", "pylog.cli", *argv], input=input, capture_output=True,
                              timeout=timeout, env=e, cwd=cwd)
    return _ZYGOTE.run(argv, str(cwd or os.getcwd()), e, input, _IO)


def ok(p):
    assert p.returncode == 0, (p.returncode, p.stderr.decode())
    return p.stdout.decode()


def one_line_error(p, code=None):
    err = p.stderr.decode()
    assert p.returncode != 0
    if code is not None:
        assert p.returncode == code, (p.returncode, err)
    assert err.startswith("pylog: error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "data"
    ok(run(r, "topic", "create", "orders", "--partitions", "3"))
    return r


def test_round_trip_and_keys(root):
    ok(run(root, "produce", "orders", "--key-separator", ":", input=b"a:1\nb:2\nc:3\na:4\n", real=True))
    out = ok(run(root, "consume", "orders", "--from-beginning", real=True))
    assert sorted(out.split()) == ["1", "2", "3", "4"]
    out = ok(run(root, "consume", "orders", "--from-beginning", "--format", "json"))
    recs = [json.loads(line) for line in out.splitlines()]
    by_key = {}
    for r in recs:
        by_key.setdefault(r["key"], []).append((r["partition"], r["value"]))
    assert by_key["a"] == [(by_key["a"][0][0], "1"), (by_key["a"][0][0], "4")]  # same key, same partition
    assert {r["topic"] for r in recs} == {"orders"}
    with pylog.LogStore(root) as s:
        assert s.topic("orders").partition_for(b"a") == by_key["a"][0][0]
    out = ok(run(root, "consume", "orders", "--from-beginning", "--print-key", "--key-separator", "="))
    assert sorted(out.split()) == ["a=1", "a=4", "b=2", "c=3"]


def test_produce_from_files_and_max_records(root, tmp_path):
    f1 = tmp_path / "one.txt"
    f1.write_bytes(b"x1\nx2\n")
    f2 = tmp_path / "two.txt"
    f2.write_bytes(b"y1\ny2\ny3")  # no final newline
    ok(run(root, "produce", "orders", str(f1), str(f2), "--partition", "1"))
    out = ok(run(root, "consume", "orders", "--from-beginning", "--partition", "1"))
    assert out.split() == ["x1", "x2", "y1", "y2", "y3"]
    out = ok(run(root, "consume", "orders", "--from-beginning", "-n", "2"))
    assert out.split() == ["x1", "x2"]
    out = ok(run(root, "consume", "orders", "--offset", "3", "--partition", "1"))
    assert out.split() == ["y2", "y3"]


def test_group_commits_between_runs(root):
    ok(run(root, "produce", "orders", input=b"".join(b"%d\n" % i for i in range(10))))
    a = ok(run(root, "consume", "orders", "--group", "g", "--from-beginning", "-n", "4")).split()
    b = ok(run(root, "consume", "orders", "--group", "g", "--from-beginning")).split()
    assert len(a) == 4 and len(b) == 6
    assert sorted(a + b, key=int) == [str(i) for i in range(10)]
    assert ok(run(root, "consume", "orders", "--group", "g")) == ""


def test_topic_commands(root):
    assert ok(run(root, "topic", "list")).split() == ["orders"]
    ok(run(root, "topic", "create", "compacted", "-c", "cleanup_policy=compact", "-c", "segment_bytes=8192"))
    out = ok(run(root, "topic", "describe", "compacted"))
    assert "cleanup_policy=compact" in out and "segment_bytes=8192" in out
    info = json.loads(ok(run(root, "topic", "describe", "orders", "--format", "json")))
    assert info["partitions"] == 3 and len(info["partition_info"]) == 3
    ok(run(root, "topic", "alter", "orders", "--partitions", "5"))
    assert json.loads(ok(run(root, "topic", "describe", "orders", "--format", "json")))["partitions"] == 5
    ok(run(root, "topic", "delete", "compacted"))
    assert ok(run(root, "topic", "list")).split() == ["orders"]
    ok(run(root, "topic", "delete", "nope", "--if-exists"))
    ok(run(root, "topic", "create", "orders", "--if-not-exists"))


def test_root_from_env_and_default(tmp_path):
    r = tmp_path / "envroot"
    ok(run(None, "topic", "create", "t", env={"PYLOG_ROOT": str(r)}))
    assert os.path.isdir(r / "t")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    ok(run(None, "topic", "create", "u", cwd=cwd, real=True))
    assert os.path.isdir(cwd / "pylog-data" / "u")
    assert one_line_error(run(None, "topic", "create", "../u", cwd=cwd, real=True), 2)  # a usage error


def test_verify_ok_and_corrupt(root):
    ok(run(root, "produce", "orders", "--partition", "0",
           input=b"".join(b"record-%05d\n" % i for i in range(3000))))
    out = ok(run(root, "verify"))
    assert out.startswith("ok:")
    ok(run(root, "verify", "orders"))
    with pylog.LogStore(root) as s:
        s.alter_topic("orders", segment_bytes=4096)
        log = s.topic("orders").partition(0)
        log.append(b"more")
        log.roll()
        seg = log.segments()[0]["path"]
    with open(seg, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0x55]))
    p = run(root, "verify")
    err = one_line_error(p, 1)
    assert "corrupt record" in err
    assert "orders/partition-0" in p.stdout.decode() and "CRC32C mismatch" in p.stdout.decode()


def test_dump_files(root):
    ok(run(root, "produce", "orders", "--partition", "2", "-k", ":", input=b"k:hello\nk2:world\n"))
    d = root / "orders" / "partition-2"
    out = ok(run(None, "dump", str(d / "00000000000000000000.log"), "--print-data"))
    assert "offset: 0" in out and "offset: 1" in out and '"hello"' in out and 'key: "k2"' in out
    out = ok(run(None, "dump", str(d / "00000000000000000000.index")))
    assert "offset: 0 position: 32" in out
    out = ok(run(None, "dump", str(d / "00000000000000000000.timeindex")))
    assert "timestamp:" in out
    # a torn tail: dump prints the good frames, then fails on the bad one
    data = (d / "00000000000000000000.log").read_bytes()
    torn = root / "torn.log"
    torn.write_bytes(data[:-3])
    p = run(None, "dump", str(torn))
    assert "offset: 0" in p.stdout.decode()
    one_line_error(p, 1)
    # zeros after the last frame (a preallocated store, or a tail never written) are no
    # bad frame: dump says how many and exits 0; garbage after them still fails
    zeroed = root / "zeroed.log"
    zeroed.write_bytes(data + bytes(5000))
    out = ok(run(None, "dump", str(zeroed)))
    assert "offset: 1" in out and "zeros: 5000 bytes after the last record" in out
    zeroed.write_bytes(data + bytes(5000) + b"\x07")
    p = run(None, "dump", str(zeroed))
    assert "offset: 1" in p.stdout.decode()
    one_line_error(p, 1)
    # in a sealed segment (a later one beside it) zeros where records were are lost records
    ok(run(root, "topic", "create", "z", "-c", "segment_bytes=4096"))
    ok(run(root, "produce", "z", input=b"".join(b"%s\n" % (b"v" * 100) for _ in range(100))))
    zd = root / "z" / "partition-0"
    first = sorted(zd.glob("*.log"))[0]
    assert len(list(zd.glob("*.log"))) > 1
    raw = bytearray(first.read_bytes())
    pos = store_frames(str(first))[-2][0]
    raw[pos:] = bytes(len(raw) - pos)  # the last two records, exactly
    first.write_bytes(bytes(raw))
    one_line_error(run(None, "dump", str(first)), 1)


def test_recover_retention_compact(root):
    ok(run(root, "topic", "create", "cl", "-c", "cleanup_policy=compact", "-c", "segment_bytes=4096"))
    ok(run(root, "produce", "cl", "-k", ":", input=b"".join(b"k%d:%s\n" % (i % 3, b"v" * 50) for i in range(300))))
    out = ok(run(root, "compact"))
    assert "records removed" in out
    out = ok(run(root, "consume", "cl", "--from-beginning", "--print-key"))
    assert len(out.splitlines()) < 100
    out = ok(run(root, "retention"))
    assert out.strip().endswith("deleted")
    out = ok(run(root, "recover"))
    assert "orders/partition-0" in out and "cl/partition-0" in out


def test_bench_runs_and_compare_is_in_the_package(tmp_path):
    out = ok(run(tmp_path / "x", "bench", "-n", "2000", "-s", "10"))
    assert "produce:" in out and "consume:" in out
    # from any directory, not only a source checkout (tests/test_ready.py runs it installed)
    out = ok(run(None, "bench", "--compare", "--help", cwd=tmp_path, real=True, env={"PYTHONPATH": ROOT}))
    assert "usage: pylog bench --compare" in out and "--peers" in out


@pytest.mark.parametrize("cmd", [[], ["topic"], ["topic", "create"], ["produce"], ["consume"], ["verify"],
                                 ["dump"], ["bench"], ["recover"], ["topic", "describe"], ["compact"]])
def test_help_everywhere(tmp_path, cmd):
    out = ok(run(tmp_path, *cmd, "--help"))
    assert "Usage:" in out


BAD = [
    # (args, stdin, expected exit code, text in the error): 2 for what is wrong with the
    # command line itself (docs/cli.md), names and -c values included; 1 for a failure
    (["topic", "create", "bad/name"], None, 2, "invalid topic name"),
    (["topic", "create", ".."], None, 2, "invalid topic name"),
    (["topic", "create", "a" * 250], None, 2, "invalid topic name"),
    (["topic", "create", "x y"], None, 2, "invalid topic name"),
    (["topic", "create", "orders"], None, 1, "already exists"),
    (["topic", "create", "t2", "--partitions", "0"], None, 2, "partitions"),
    (["topic", "create", "t2", "-c", "segment_bytes=1"], None, 2, "segment_bytes"),
    (["topic", "create", "t2", "-c", "nonsense=1"], None, 2, "unknown config"),
    (["topic", "create", "t2", "-c", "novalue"], None, 2, "NAME=VALUE"),
    (["topic", "delete", "missing"], None, 1, "unknown topic"),
    (["topic", "describe", "missing"], None, 1, "unknown topic"),
    (["topic", "alter", "orders"], None, 2, "nothing to change"),
    (["topic", "alter", "orders", "--partitions", "2"], None, 1, "can only be added"),
    (["produce", "missing"], b"x\n", 1, "unknown topic"),
    (["produce", "orders", "-k", ":"], b"a:1\nnokey\n", 1, "line 2 has no key separator"),
    (["produce", "orders", "--partition", "9"], b"x\n", 1, "no partition 9"),
    (["produce", "orders", "no-such-file.txt"], None, 1, "cannot read"),
    (["produce", "orders", "-k", ""], b"x\n", 2, "key-separator"),
    (["consume", "missing"], None, 1, "unknown topic"),
    (["consume", "orders", "--offset", "5"], None, 2, "--offset needs --partition"),
    (["consume", "orders", "--offset", "abc", "-p", "0"], None, 2, "not an offset"),
    (["consume", "orders", "--offset", "-3", "-p", "0"], None, 2, "negative"),
    (["consume", "orders", "--offset", "99", "-p", "0"], None, 1, "out of range"),
    (["consume", "orders", "--partition", "7"], None, 1, "no partition 7"),
    (["consume", "orders", "--group", "../g"], None, 2, "invalid group name"),
    (["consume", "orders", "--format", "xml"], None, 2, "xml"),
    (["consume", "orders", "--max-records", "0"], None, 2, "max-records"),
    (["verify", "missing"], None, 1, "unknown topic"),
    (["compact", "orders"], None, 1, "cleanup_policy=delete"),
    (["dump", "no-such.log"], None, 1, "cannot read"),
    (["nosuchcommand"], None, 2, "No such command"),
    (["topic", "create"], None, 2, "Missing argument"),
]


@pytest.mark.parametrize("args,stdin,code,text", BAD, ids=[" ".join(b[0])[:40] for b in BAD])
def test_bad_inputs_are_one_line_errors(root, args, stdin, code, text):
    before = sorted(os.listdir(root))
    p = run(root, *args, input=stdin)
    err = one_line_error(p, code)
    assert text in err, err
    assert sorted(os.listdir(root)) == before  # nothing created or deleted


def test_bad_roots(tmp_path, root):
    missing = tmp_path / "missing"
    one_line_error(run(missing, "consume", "orders"), 1)
    assert not missing.exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "not a directory" in one_line_error(run(afile, "topic", "create", "t"), 1)
    assert "not a directory" in one_line_error(run(afile, "topic", "list"), 1)
    if os.geteuid() != 0:  # root can read anything
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0)
        try:
            one_line_error(run(locked, "topic", "list"), 1)
        finally:
            os.chmod(locked, 0o755)


def test_unreadable_and_damaged_files(root, tmp_path):
    (root / "orders" / "topic.json").write_text("{broken")
    err = one_line_error(run(root, "topic", "describe", "orders"), 1)
    assert "not valid JSON" in err
    bad = tmp_path / "garbage.log"
    bad.write_bytes(b"\x00" * 100)
    assert "bad file header" in one_line_error(run(None, "dump", str(bad)), 1)
    odd = tmp_path / "thing.txt"
    odd.write_bytes(b"x")
    assert "unknown file kind" in one_line_error(run(None, "dump", str(odd)), 1)


def test_locked_partition_is_a_one_line_error(root):
    with pylog.LogStore(root) as s:
        s.topic("orders").partition(0).append(b"held")
        err = one_line_error(run(root, "produce", "orders", "--partition", "0", input=b"x\n"), 1)
        assert "locked" in err
        # consuming next to a live writer works
        s.topic("orders").partition(0).flush()
        assert ok(run(root, "consume", "orders", "--from-beginning", "-p", "0")).split() == ["held"]


def test_consume_into_a_closed_pipe(root):
    ok(run(root, "produce", "orders", input=b"".join(b"%d\n" % i for i in range(50000))))
    p = subprocess.run(f"{sys.executable} -m pylog.cli --root {root} consume orders --from-beginning | head -1",
                       shell=True, capture_output=True)
    assert p.stdout.strip() != b"" and b"Traceback" not in p.stderr


def test_python_m_pylog_and_python_m_pylog_cli_are_the_same_command():
    """``python -m pylog`` and ``python -m pylog.cli`` (a package since issue 15) are the same
    command. That pyproject lists the package, so a wheel has the command, is checked with
    every other package by tests/test_house.py::test_every_package_and_py_typed_ship_in_the_wheel."""
    outs = [subprocess.run([sys.executable, "-m", m, "--help"], cwd=ROOT, capture_output=True)
            for m in ("pylog", "pylog.cli")]
    assert outs[0].returncode == outs[1].returncode == 0 and outs[0].stdout == outs[1].stdout
    assert b"produce" in outs[0].stdout and b"Traceback" not in outs[0].stderr + outs[1].stderr
