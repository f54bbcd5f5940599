"""pylog as a new user meets it (issue 17): a plain install in a fresh virtual environment,
the command driven through subprocesses, the documentation site build.

The fresh-venv tests (marker ``venv``) build a wheel of this checkout and ``pip install`` it
without extras into a new ``python -m venv``: they need the package index (or pip's
configured find-links); ``-m "not venv"`` skips them offline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

DIST = "pylog-commitlog"


def _run(argv, *, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with this checkout installed as a user would: ``pip install <wheel>``,
    no extras. Returns its bin directory."""
    tmp = tmp_path_factory.mktemp("venv")
    wh = tmp / "wheels"
    p = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "-w", str(wh), ROOT], timeout=600)
    assert p.returncode == 0, p.stderr
    (wheel,) = list(wh.glob("pylog_commitlog-*.whl"))
    # PYTHONPATH is dropped: with the checkout on it, pip would find this distribution's
    # metadata there and install nothing
    p = _run([sys.executable, "-m", "venv", str(tmp / "env")], env=_clean_env())
    assert p.returncode == 0, p.stderr
    bindir = tmp / "env" / "bin"
    p = _run([str(bindir / "python"), "-m", "pip", "install", "-q", str(wheel)], timeout=900, env=_clean_env())
    assert p.returncode == 0, p.stderr
    assert (bindir / "pylog").is_file(), "pip installed no pylog command"
    return bindir


def _clean_env(**extra) -> dict[str, str]:
    """The environment without this checkout on the path (the venv must stand alone)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYLOG_ROOT", "PYLOG_BACKEND")}
    env.update(extra)
    return env


@pytest.mark.venv
def test_plain_install_has_the_runtime_deps_and_no_more(venv):
    p = _run([str(venv / "python"), "-c",
              "import importlib.metadata as m, re; "
              "print('\\n'.join(sorted(re.split('[ ;<>=!]', r)[0].lower() for r in m.requires('pylog-commitlog') "
              "if 'extra ==' not in r)))"], env=_clean_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["cffi", "click", "numpy", "rich"]


@pytest.mark.venv
def test_plain_install_gives_a_working_command(venv, tmp_path):
    env = _clean_env()
    root = str(tmp_path / "data")
    pylog = str(venv / "pylog")
    p = _run([pylog, "--version"], env=env, cwd=tmp_path)
    assert p.returncode == 0 and "pylog, version" in p.stdout, p.stderr
    p = _run([pylog, "--root", root, "topic", "create", "orders", "-p", "2"], env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = _run([pylog, "--root", root, "produce", "orders", "-k", ":"], input="a:1\nb:2\nc:3\n",
             env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # python -m pylog is the same command
    p = _run([str(venv / "python"), "-m", "pylog", "--root", root, "consume", "orders", "--from-beginning"],
             env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == ["1", "2", "3"]
    p = _run([pylog, "--root", root, "verify"], env=env, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("ok: 2 partitions"), p.stdout + p.stderr


@pytest.mark.venv
@pytest.mark.parametrize("code, extra, module", [
    ("import pylog, tempfile; pylog.Log(tempfile.mkdtemp()).read_arrow()", "arrow", "pyarrow"),
    ("import pylog.arrow", "arrow", "pyarrow"),
    ("import pylog.spark", "spark", "pyspark"),
])
def test_a_missing_extra_is_one_line_naming_it(venv, tmp_path, code, extra, module):
    wrapped = (f"import pylog\ntry:\n    {code.replace(';', chr(10) + '   ')}\n"
               f"except pylog.MissingExtraError as e:\n"
               f"    assert isinstance(e, ImportError) and e.extra == {extra!r} and e.module == {module!r}\n"
               f"    print(e)\n")
    p = _run([str(venv / "python"), "-c", wrapped], env=_clean_env(), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"{'pylog.arrow (read_arrow)' if extra == 'arrow' else 'pylog.spark'} needs "
                                     f'{module}, which is not installed: pip install "{DIST}[{extra}]"']
    # unhandled, it is still this line last, and no ModuleNotFoundError
    p = _run([str(venv / "python"), "-c", code], env=_clean_env(), cwd=tmp_path)
    assert p.returncode == 1
    assert "ModuleNotFoundError" not in p.stderr
    assert p.stderr.splitlines()[-1].startswith("pylog.errors.MissingExtraError: ")


@pytest.mark.venv
def test_bench_compare_from_a_plain_install_skips_missing_peers(venv, tmp_path):
    """The comparison runs from the installed package (no source checkout, no PYTHONPATH); the
    peers of the bench extra are not installed, so they and their targets are skipped."""
    p = _run([str(venv / "pylog"), "bench", "--compare", "--quick", "--records", "5000", "--no-kib",
              "--repeat", "1"], env=_clean_env(), cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    out = p.stdout
    assert "peer skipped: lmdb: the lmdb package is not installed" in out
    targets = [line for line in out.splitlines() if line.startswith("target: ")]
    lmdb = [t for t in targets if "lmdb" in t]
    assert lmdb and all(" SKIP (lmdb: the lmdb package is not installed)" in t for t in lmdb), lmdb
    skip = 'SKIP (arrow: pyarrow is not installed: pip install "pylog-commitlog[arrow]")'
    assert any("columnar/Arrow" in t and skip in t for t in targets)
    assert "command: pylog bench --compare --quick --no-kib --repeat 1 --records 5000" in out
    skipped = sum(" SKIP (" in t for t in targets)
    assert f", {skipped} skipped (peer not run)" in out
    p = _run([str(venv / "pylog"), "bench", "--compare", "--help"], env=_clean_env(), cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("usage: pylog bench --compare"), p.stderr


# ----------------------------------------------------------------------------------------
# the command, through subprocesses (this checkout's pylog)
def cli(root, *args, input=None, timeout=120, env=None) -> subprocess.CompletedProcess:
    """``python -m pylog --root ROOT ARGS...`` with this checkout's pylog."""
    e = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    e.pop("PYLOG_ROOT", None)
    argv = [sys.executable, "-m", "pylog"] + (["--root", str(root)] if root is not None else []) + list(args)
    return _run(argv, input=input, timeout=timeout, env=e)


def ok(p) -> str:
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr}"
    return p.stdout


def one_line_error(p, code, *words) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pylog: error: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_topic_describe_counts_the_records_a_compacted_partition_holds(tmp_path):
    import pylog

    root = tmp_path / "d"
    with pylog.LogStore(root) as store:
        t = store.create_topic("c", 1, cleanup_policy="compact", segment_bytes=4096)
        for i in range(300):
            t.append(b"v%d" % i * 10, key=b"k%d" % (i % 35))
        store.compact("c")
        held = sum(1 for _ in t.reader(0).scan())
    assert held == 35
    out = ok(cli(root, "topic", "describe", "c"))
    assert "\tRecords: 35\t" in out and "NextOffset: 300" in out, out
    info = json.loads(ok(cli(root, "topic", "describe", "c", "--format", "json")))
    assert info["partition_info"][0]["records"] == 35


def _committed_group(tmp_path):
    """A topic of 2 partitions, 10 records each (timestamps 1000.., 1 s apart), and group g
    having consumed 3 records of each partition."""
    import pylog

    root = tmp_path / "d"
    with pylog.LogStore(root) as store:
        t = store.create_topic("orders", 2)
        for p in range(2):
            for i in range(10):
                t.append(b"r%d" % i, partition=p, timestamp=1_000_000 + i * 1000)
        with store.consumer("orders", group="g", auto_offset_reset="earliest") as c:
            for p in range(2):
                c.seek(p, 3)
            c.commit()
    return root


def test_group_list_describe_and_topic_describe_show_lag(tmp_path):
    root = _committed_group(tmp_path)
    assert ok(cli(root, "group", "list")).split() == ["g"]
    assert json.loads(ok(cli(root, "group", "list", "--topic", "orders", "--format", "json"))) == ["g"]
    out = ok(cli(root, "group", "describe", "g"))
    lines = out.splitlines()
    assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "OWNER"]
    assert lines[1].split() == ["g", "orders", "0", "3", "10", "7", "-"]
    assert lines[2].split() == ["g", "orders", "1", "3", "10", "7", "-"]
    assert "0 live members" in out
    info = json.loads(ok(cli(root, "group", "describe", "g", "--format", "json")))
    assert [(r["partition"], r["committed"], r["log_end"], r["lag"], r["owner"]) for r in info["partitions"]] == \
        [(0, 3, 10, 7, None), (1, 3, 10, 7, None)]
    assert "Groups: g" in ok(cli(root, "topic", "describe", "orders"))
    one_line_error(cli(root, "group", "describe", "nope"), 1, "unknown group 'nope'")


def test_group_reset_each_way_and_dry_run(tmp_path):
    import pylog

    root = _committed_group(tmp_path)

    def committed():
        with pylog.LogStore(root) as s:
            return [r["committed"] for r in s.describe_group("g")["partitions"]]

    out = ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-earliest", "--dry-run"))
    assert "(dry run: nothing written)" in out and out.splitlines()[1].split() == ["g", "orders", "0", "3", "0"]
    assert committed() == [3, 3]
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-earliest"))
    assert committed() == [0, 0]
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-latest", "-p", "1"))
    assert committed() == [0, 10]
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-offset", "4"))
    assert committed() == [4, 4]
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-offset", "99"))  # clamped, as Kafka does
    assert committed() == [10, 10]
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--shift-by", "-3"))
    assert committed() == [7, 7]
    # 1,000,000 ms after the epoch is 1970-01-01T00:16:40Z: offset 5 has timestamp 1,005,000
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-datetime", "1970-01-01T00:16:45Z"))
    assert committed() == [5, 5]
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-datetime", "1970-01-01T01:16:44+01:00"))
    assert committed() == [4, 4]
    # the group's next consumer starts there
    with pylog.LogStore(root) as s, s.consumer("orders", group="g", partitions=[0]) as c:
        assert c.poll(1)[0].offset == 4
    # the API, the same
    with pylog.LogStore(root) as s:
        plan = s.reset_group("g", "orders", shift_by=2, partitions=[0])
        assert plan == [{"topic": "orders", "partition": 0, "old": 4, "new": 6}]
        with pytest.raises(pylog.InvalidArgumentError, match="exactly one"):
            s.reset_group("g", "orders", to_earliest=True, to_offset=1)
    assert committed() == [6, 4]


@pytest.mark.parametrize("args, code, words", [
    (["--to-earliest", "--to-latest"], 2, ["exactly one", "--to-earliest, --to-latest"]),
    ([], 2, ["exactly one", "(got none)"]),
    (["--to-datetime", "yesterday"], 2, ["--to-datetime", "'yesterday' is not an ISO 8601"]),
    (["--to-offset", "-1"], 2, ["--to-offset"]),
])
def test_group_reset_bad_options(tmp_path, args, code, words):
    root = _committed_group(tmp_path)
    one_line_error(cli(root, "group", "reset", "g", "--topic", "orders", *args), code, *words)


def test_live_members_are_shown_and_protect_the_group(tmp_path):
    root = _committed_group(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, pylog\n"
         "s = pylog.LogStore(sys.argv[1]); c = s.consumer('orders', group='g')\n"
         "print(c.assignment(), flush=True); sys.stdin.read()", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert holder.stdout.readline().strip() == "[0, 1]"
        out = ok(cli(root, "group", "describe", "g"))
        row = out.splitlines()[1]
        assert row.split()[:6] == ["g", "orders", "0", "3", "10", "7"]
        assert f"member-0 pid {holder.pid} host" in row
        assert "1 live member: member-0 pid" in out
        one_line_error(cli(root, "group", "reset", "g", "--topic", "orders", "--to-earliest"), 1,
                       "group 'g' has live members", f"pid {holder.pid}")
        one_line_error(cli(root, "group", "delete", "g"), 1, "live members")
    finally:
        holder.stdin.close()
        holder.wait(30)
    import pylog

    with pylog.LogStore(root) as s:  # refused: nothing changed
        assert [r["committed"] for r in s.describe_group("g")["partitions"]] == [3, 3]
    assert ok(cli(root, "group", "describe", "g")).splitlines()[1].split()[-1] == "-"  # no owner now
    ok(cli(root, "group", "reset", "g", "--topic", "orders", "--to-earliest"))
    assert ok(cli(root, "group", "delete", "g")).strip() == "deleted group g from topic orders"
    assert ok(cli(root, "group", "list")) == ""
    with pylog.LogStore(root) as s:
        assert s.groups() == []
        with pytest.raises(pylog.UnknownGroupError):
            s.delete_group("g")


# ----------------------------------------------------------------------------------------
# the API: errors raised on purpose are PylogErrors (and still the builtin they refine)
def test_bad_arguments_are_pylog_errors_and_still_value_errors(tmp_path):
    import pylog

    with pylog.Log(tmp_path / "log") as log:
        log.append_batch([b"a"] * 100)
        cases = [(lambda: list(log.scan(300)), pylog.InvalidArgumentError, ValueError, "start=300"),
                 (lambda: log.append_batch([]), pylog.InvalidArgumentError, ValueError, "at least one value"),
                 (lambda: log.append("text"), pylog.ArgumentTypeError, TypeError, "str")]
        with pylog.LogStore(tmp_path / "root") as store:
            cases.append((lambda: store.create_topic("t", partitions=0), pylog.InvalidArgumentError, ValueError,
                          "partitions=0"))
            for fn, cls, builtin, words in cases:
                with pytest.raises(pylog.PylogError) as ei:
                    fn()
                assert isinstance(ei.value, cls) and isinstance(ei.value, builtin), type(ei.value).__mro__
                assert words in str(ei.value)
        assert len(log) == 100  # nothing written by the refused calls


def test_record_repr_previews_its_bytes(tmp_path):
    import pylog

    with pylog.Log(tmp_path / "log") as log:
        log.append(b"x" * 100, key=b"k", metadata=b"m")
        log.append(None)
        log.roll()  # sealed: the fields are memoryviews over the map
        r = log.read(0)
        assert isinstance(r.value, memoryview)
        assert repr(r) == (f"Record(offset=0, timestamp={r.timestamp}, key=b'k', "
                           f"value=b'{'x' * 24}'... (100 B), metadata=b'm')")
        assert "value=None" in repr(log.read(1))


# ----------------------------------------------------------------------------------------
# the CLI a person expects (issue 17, item 5)
def test_bare_pylog_and_pylog_topic_print_the_help(tmp_path):
    for args, first in (((), "Usage: pylog [OPTIONS] COMMAND"), (("topic",), "Usage: pylog topic [OPTIONS]"),
                        (("group",), "Usage: pylog group [OPTIONS]")):
        p = cli(None, *args)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert p.stdout.startswith(first), p.stdout[:200]
        assert "Commands:" in p.stdout


def test_root_works_after_the_verb_too(tmp_path):
    root = tmp_path / "d"
    ok(cli(None, "topic", "create", "orders", "--root", str(root)))
    ok(cli(None, "produce", "orders", "--root", str(root), input="x\n"))
    assert ok(cli(None, "consume", "orders", "--from-beginning", "--root", str(root))) == "x\n"
    assert ok(cli(tmp_path / "elsewhere", "topic", "list", "--root", str(root))) == "orders\n"  # the later wins


def test_exit_codes_usage_2_failure_1(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    one_line_error(cli(root, "topic", "create", "bad/name"), 2, "invalid topic name")
    one_line_error(cli(root, "topic", "create", "t", "-c", "segment_bytes=1"), 2, "segment_bytes=1 is out of range")
    one_line_error(cli(root, "consume", "orders", "--group", "../g"), 2, "invalid group name")
    one_line_error(cli(root, "topic", "describe", "missing"), 1, "unknown topic")
    one_line_error(cli(root, "topic", "create", "orders"), 1, "already exists")
    assert sorted(os.listdir(root)) == [".store.lock", "orders"] or "t" not in os.listdir(root)


def test_consume_into_head_exits_0(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    ok(cli(root, "produce", "orders", input="".join(f"{i}\n" for i in range(200_000))))
    p = _run(["bash", "-c", f"set -o pipefail; {sys.executable} -m pylog --root {root} consume orders "
              f"--from-beginning | head -1; echo status=${{PIPESTATUS[0]}}"], env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.splitlines() == ["0", "status=0"], p.stdout + p.stderr
    assert p.stderr == ""


def test_ctrl_c_ends_follow_quietly(tmp_path):
    import signal

    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    ok(cli(root, "produce", "orders", input="first\n"))
    proc = subprocess.Popen([sys.executable, "-m", "pylog", "--root", str(root), "consume", "orders",
                             "--from-beginning", "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert proc.stdout.readline() == "first\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and err == "", (proc.returncode, err)


@pytest.mark.parametrize("args, words", [
    (["--offset", "5", "--from-beginning", "-p", "0"], "--offset and --from-beginning contradict"),
    (["--template", "%s", "--format", "json"], "--template and --format contradict"),
    (["--print-key", "--format", "json"], "--print-key is for the text format"),
    (["--template", "%x"], "unknown field %x"),
    (["--idle-timeout", "soon"], "'soon' is not a duration"),
])
def test_conflicting_or_bad_consume_options_are_refused(tmp_path, args, words):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    one_line_error(cli(root, "consume", "orders", *args), 2, words)


def _values(root, topic="orders", *extra):
    return json.loads("[" + ",".join(ok(cli(root, "consume", topic, "--from-beginning", "--format", "json",
                                            *extra)).splitlines()) + "]")


def test_produce_a_bad_line_keeps_the_records_before_it(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders", "-c", "max_record_bytes=10"))
    err = one_line_error(cli(root, "produce", "orders", "-k", ":", input="a:1\nb:2\nnokey\nc:3\n"), 1)
    assert err == "pylog: error: line 3 has no key separator ':' (2 records before it were produced and kept)"
    assert [(r["key"], r["value"]) for r in _values(root)] == [("a", "1"), ("b", "2")]
    err = one_line_error(cli(root, "produce", "orders", input="x\n" + "y" * 20 + "\nz\n"), 1)
    assert err == ("pylog: error: line 2 is a record of 20 bytes, larger than max_record_bytes=10 "
                   "(1 record before it was produced and kept)")
    assert [r["value"] for r in _values(root)] == ["1", "2", "x"]
    # JSON lines: the same, with the line number
    err = one_line_error(cli(root, "produce", "orders", "--format", "json",
                             input='{"value": "j1"}\n{"value": "j2"}\n{"value": \n{"value": "j4"}\n'), 1)
    assert err.startswith("pylog: error: line 3 is not a record: not valid JSON")
    assert err.endswith("(2 records before it were produced and kept)")
    assert [r["value"] for r in _values(root)] == ["1", "2", "x", "j1", "j2"]


def test_produce_crlf_tombstones_metadata_timestamps(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    ok(cli(root, "produce", "orders", "-k", ":", input="a:1\r\nb:2\r\nc:3"))
    ok(cli(root, "produce", "orders", "-k", ":", "--null-marker", "NULL", "-H", "src=test",
           "--timestamp", "2030-01-01T00:00:00Z", input="a:NULL\r\nd:4\n"))
    rows = _values(root)
    assert [(r["key"], r["value"]) for r in rows] == [("a", "1"), ("b", "2"), ("c", "3"), ("a", None), ("d", "4")]
    assert [r["metadata"] for r in rows[3:]] == ["src=test", "src=test"]
    assert [r["timestamp"] for r in rows[3:]] == [1893456000000] * 2


def test_json_lines_round_trip(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders", "-p", "3"))
    ok(cli(root, "topic", "create", "copy", "-p", "3"))
    lines = ['{"key": "k1", "value": "v1", "metadata": "m", "timestamp": 1000, "partition": 2}',
             '{"key": "k1", "value": null, "timestamp": 1001, "partition": 2}',
             '{"value_base64": "AP8=", "key_base64": "/w==", "partition": 0, "timestamp": 5}',
             '{"value": {"n": 1}, "partition": 1}']
    ok(cli(root, "produce", "orders", "--format", "json", input="\n".join(lines) + "\n"))
    rows = _values(root)
    assert [(r["partition"], r["key"], r["value"], r["metadata"]) for r in rows] == [
        (0, None, None, None), (1, None, '{"n":1}', None), (2, "k1", "v1", "m"), (2, "k1", None, None)]
    assert rows[0]["key_base64"] == "/w==" and rows[0]["value_base64"] == "AP8="
    assert [r["timestamp"] for r in rows if r["partition"] != 1] == [5, 1000, 1001]
    dumped = ok(cli(root, "consume", "orders", "--from-beginning", "--format", "json"))
    ok(cli(root, "produce", "copy", "--format", "json", input=dumped))
    strip = [{k: v for k, v in r.items() if k != "topic"} for r in rows]
    assert [{k: v for k, v in r.items() if k != "topic"} for r in _values(root, "copy")] == strip


def test_consume_template_and_idle_timeout(tmp_path):
    import time

    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    ok(cli(root, "produce", "orders", "-k", ":", "--timestamp", "77", input="a:hello\nb:\n"))
    out = ok(cli(root, "consume", "orders", "--from-beginning", "-F", r"%t/%p@%o %T %k=%s (%K,%S) %h\n"))
    assert out == "orders/0@0 77 a=hello (1,5) null\norders/0@1 77 b= (1,0) null\n"
    t = time.monotonic()
    out = ok(cli(root, "consume", "orders", "--from-beginning", "--idle-timeout", "1500ms"))
    took = time.monotonic() - t
    assert out == "hello\n\n" and 1.4 < took < 30, took


def test_human_units_in_config(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders", "-c", "segment_bytes=64MiB", "-c", "retention_ms=7d",
           "-c", "retention_bytes=1GB"))
    cfg = json.loads(ok(cli(root, "topic", "describe", "orders", "--format", "json")))["config"]
    assert (cfg["segment_bytes"], cfg["retention_ms"], cfg["retention_bytes"]) == (64 << 20, 7 * 86_400_000, 10**9)
    ok(cli(root, "topic", "alter", "orders", "-c", "segment_ms=12h"))
    assert json.loads(ok(cli(root, "topic", "describe", "orders", "--format", "json")))["config"]["segment_ms"] == \
        12 * 3_600_000
    one_line_error(cli(root, "topic", "alter", "orders", "-c", "segment_bytes=64XB"), 2, "'64XB' is not a size")


def test_format_json_on_every_verb_that_prints_data(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    ok(cli(root, "topic", "create", "kv", "-c", "cleanup_policy=compact"))
    ok(cli(root, "produce", "orders", input="a\nb\n"))
    ok(cli(root, "consume", "orders", "-g", "g", "--from-beginning"))
    seg = os.path.join(root, "orders", "partition-0", "00000000000000000000")
    verbs = [["topic", "list"], ["topic", "describe"], ["consume", "orders", "--from-beginning"], ["verify"],
             ["recover"], ["retention"], ["compact"], ["group", "list"], ["group", "describe", "g"],
             ["group", "reset", "g", "--topic", "orders", "--to-earliest", "--dry-run"],
             ["dump", seg + ".log", "-d"], ["dump", seg + ".index"], ["bench", "-n", "1000"]]
    for v in verbs:
        out = ok(cli(root, *v, "--format", "json"))
        docs = [json.loads(line) for line in out.splitlines()] if v[0] in ("consume", "dump", "recover") \
            else [json.loads(out)]
        assert docs, v
    assert json.loads(ok(cli(root, "verify", "--format", "json")))["ok"] is True
    assert json.loads(ok(cli(root, "topic", "list", "--format", "json"))) == ["kv", "orders"]


def test_a_damaged_committed_offset_file_is_one_line(tmp_path):
    root = tmp_path / "d"
    ok(cli(root, "topic", "create", "orders"))
    ok(cli(root, "produce", "orders", input="a\nb\n"))
    ok(cli(root, "consume", "orders", "-g", "g", "--from-beginning"))
    with open(os.path.join(root, "orders", "~consumers", "g", "partition-0.offset"), "wb") as f:
        f.write(b"garbage")
    p = cli(root, "consume", "orders", "-g", "g", "--from-beginning")
    assert p.returncode == 0 and p.stdout == "a\nb\n"
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pylog: warning: committed offset file ") and "damaged" in lines[0]


# ----------------------------------------------------------------------------------------
# the documentation site
def test_the_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs, mkdocstrings) is not installed")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    p = _run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", os.path.join(ROOT, "mkdocs.yml"),
              "--site-dir", str(site)], cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "WARNING" not in p.stderr
    import re

    index = re.sub(r"<[^>]+>", "", (site / "index.html").read_text())  # the text, without highlighting
    assert "pip install pylog-commitlog" in index
    api = (site / "api.html").read_text()
    # the reference comes from the docstrings: a method, its docstring, and the roles rewritten
    assert 'id="pylog.Log.append_batch"' in api and "recovery_report" in api
    assert 'id="pylog.groups.reset_group"' in api and "exactly one of" in api
    assert ":class:" not in api and ":meth:" not in api
    # the broker's library names (issue 26), and every error under pylog.errors
    for name in ("pylog.serve.server.Server", "pylog.serve.security.add_user", "pylog.serve.headers.decode_headers",
                 "pylog.errors.TransactionError"):
        assert f'id="{name}"' in api, name
    bench = (site / "benchmarks.html").read_text()
    for png in ("compare-throughput.png", "compare-latency.png", "compare-targets.png"):
        assert f"img/{png}" in bench and (site / "img" / png).stat().st_size > 10_000


@pytest.mark.venv
def test_plain_install_has_the_extension(venv):
    """The wheel carries pylog._speedups (issue 16) and a plain install uses it."""
    p = _run([str(venv / "python"), "-c",
              "import pylog, pylog._speedups as s; print(pylog.backend, 'speedups' in pylog.backend_features, "
              "s.__file__.rsplit('/', 1)[-1])"], env=_clean_env(), cwd="/")
    assert p.returncode == 0, p.stderr
    backend, used, name = p.stdout.split()
    assert (backend, used) == ("native", "True")
    assert name == "_speedups.abi3.so" or name.startswith("_speedups.cpython-")  # abi3 unless free-threaded
