#!/usr/bin/env python3
"""librdkafka's own test suite against ``pylog serve`` (docs/serve.md, "librdkafka's test suite").

    python3 scripts/librdkafka-suite.py build          # fetch and build the test runner once
    python3 scripts/librdkafka-suite.py run            # build if needed, run, write the table
    python3 scripts/librdkafka-suite.py run 0011 0052  # only these tests (table left alone)
    python3 scripts/librdkafka-suite.py run --check    # exit 1 where a result differs from the table
    python3 scripts/librdkafka-suite.py table          # the last run's table again (raw.json)

1. librdkafka's source comes from a package registry: the npm package
   ``@confluentinc/kafka-javascript`` carries it whole (``deps/librdkafka``, with its tests/
   folder). The release is pinned (``NPM_PACKAGE`` below: the newest whose librdkafka is
   nearest the one confluent-kafka bundles here) and fetched with ``npm pack``.
2. It is built once (``./configure`` with the libraries this machine has, ``make libs``, then
   ``make -C tests build``: ~25 min on 2 cores) into the work folder, which later runs reuse:
   ``$PYLOG_RDK_WORK``, else ``$CI_WORK/librdkafka``, else ``.ci-work/librdkafka`` in the repo.
3. ``run`` starts ``pylog serve`` on a free loopback port over a fresh data root, with
   ``num.partitions=4`` and ``auto.create.topics.enable=true`` (the suite expects 4 partitions
   in auto-created topics), writes the suite's ``test.conf``, and runs each applicable test in
   its own test runner (``-Q`` quick mode, ``TEST_KAFKA_VERSION=4.0.0``), each with a timeout
   (``PYLOG_RDK_TIMEOUT`` seconds, default 300). Tests that do not apply to one broker (they need
   a cluster, SASL/SSL/Kerberos, a broker they can restart, or the mock cluster only) are listed
   with the reason and not run; the local tests (no broker) are left to librdkafka's own CI.
4. The per-test table (passed / not applicable and why / failing and why) is written into
   docs/serve.md between ``<!-- rdk-suite:begin -->`` and ``<!-- rdk-suite:end -->``; the
   reasons for known failures are in ``KNOWN_FAILURES``. It exits 1 if a test fails that is not
   listed there, or a listed one passes (the table is then stale).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NPM_PACKAGE = "@confluentinc/kafka-javascript@1.10.1"  # carries librdkafka 2.15.1
BEGIN = "<!-- rdk-suite:begin -->"
END = "<!-- rdk-suite:end -->"


def work_dir() -> Path:
    """The cached work folder (see the module docstring)."""
    if os.environ.get("PYLOG_RDK_WORK"):
        return Path(os.environ["PYLOG_RDK_WORK"])
    if os.environ.get("CI_WORK"):
        return Path(os.environ["CI_WORK"]) / "librdkafka"
    return REPO / ".ci-work" / "librdkafka"


def src_dir() -> Path:
    """Where librdkafka's source is unpacked."""
    return work_dir() / "librdkafka"


def runner_path() -> Path:
    """The built test runner; present only after a whole build (see ``build``)."""
    return src_dir() / "tests" / "test-runner"


def built() -> bool:
    """True if a whole build is cached."""
    return (work_dir() / "build.ok").exists() and runner_path().exists()


def _sh(cmd: list[str], cwd: Path, log: Path) -> None:
    print(f"rdk-suite: {' '.join(cmd)} (in {cwd.name}, log {log.name})", flush=True)
    with open(log, "ab") as out:
        subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=True)


def build() -> None:
    """Fetch librdkafka's source from the npm registry and build its test runner, once."""
    if built():
        print(f"rdk-suite: cached build in {work_dir()}", flush=True)
        return
    work = work_dir()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    log.write_bytes(b"")
    tgz = sorted(work.glob("*.tgz"))
    if not tgz:
        _sh(["npm", "pack", NPM_PACKAGE, "--pack-destination", str(work)], work, log)
        tgz = sorted(work.glob("*.tgz"))
    shutil.rmtree(src_dir(), ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        with tarfile.open(tgz[-1]) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith("package/deps/librdkafka/")]
            tf.extractall(tmp, members=members, filter="data")
        os.rename(Path(tmp) / "package" / "deps" / "librdkafka", src_dir())
    src = src_dir()
    jobs = str(os.cpu_count() or 2)
    # no Kerberos (SASL GSSAPI needs cyrus-sasl) and no curl (OIDC): the suite's tests of them
    # need a broker set up for them anyway; the codecs are bundled or found on the machine
    _sh(["./configure", "--disable-gssapi", "--disable-curl"], src, log)
    _sh(["make", "-j", jobs, "libs"], src, log)
    _sh(["make", "-j", jobs, "-C", "tests", "build"], src, log)
    (work / "build.ok").write_text(NPM_PACKAGE + "\n")
    print(f"rdk-suite: built {runner_path()}", flush=True)


# -- the tests ---------------------------------------------------------------------------------

#: Why a failing test fails against pylog serve (the table shows it; a test listed here that
#: passes, or one failing that is not listed, makes ``run`` exit 1: the table is then stale).
KNOWN_FAILURES: dict[str, str] = {
}

_FLAG_REASONS = {
    "TEST_F_LOCAL": "local: runs without a broker (librdkafka's mock cluster or none)",
    "TEST_F_MANUAL": "manual: started only by hand",
    "TEST_F_SOCKEM": "needs librdkafka's socket emulation (sockem), left out of quick mode (-E)",
    "TEST_F_KNOWN_ISSUE": "a known issue of librdkafka's own (TEST_F_KNOWN_ISSUE): its runner skips it",
}


def declared_tests(src: Path) -> list[tuple[str, str | None]]:
    """Every test of tests/test.c's table, in order, with why it does not apply to one
    ``pylog serve`` (None: it does, and is run)."""
    text = re.sub(r"/\*.*?\*/", " ", (src / "tests" / "test.c").read_text(), flags=re.S)
    table = text[text.index("struct test tests[] = {"):]
    table = table[:table.index("{NULL}")]
    table = re.sub(r"\s+", " ", re.sub(r"(?m)^\s*#.*$", "", table))  # (#if WITH_SOCKEM ...)
    out: list[tuple[str, str | None]] = []
    for m in re.finditer(r"_TEST\( ?(\w+) ?,(.*?)\) ?,(?= ?_TEST\(|\s*$)", table + " "):
        name, rest = m.group(1), m.group(2)
        why = next((r for f, r in _FLAG_REASONS.items() if re.search(rf"\b{f}\b", rest)), None)
        ver = re.search(r"TEST_BRKVER\( ?(\d+), ?(\d+)", rest)
        if why is None and ver and (int(ver.group(1)), int(ver.group(2))) > (4, 0):
            why = f"needs Kafka {ver.group(1)}.{ver.group(2)} (share groups, KIP-932); the suite runs as 4.0.0"
        sc = re.search(r'\.scenario ?= ?"([\w,]+)"', rest)
        if why is None and sc and "default" not in sc.group(1).split(","):
            if "noautocreate" in sc.group(1).split(","):
                SCENARIOS[name] = "noautocreate"  # run with -s noautocreate on a second broker
            else:
                why = f"scenario {sc.group(1)}: a broker set up as librdkafka's CI sets it for that scenario"
        if why is None and name in NEEDS_REPLICAS:
            why = NEEDS_REPLICAS[name]
        out.append((name, why))
    return out


_RF3 = ("creates its topics with replication factor 3 (librdkafka's CI runs a cluster of three brokers): "
        "one broker refuses it with INVALID_REPLICATION_FACTOR, as Kafka's would")
#: Tests that ask for three replicas: they need a cluster (checked by a run: each fails at its
#: first CreateTopics).
NEEDS_REPLICAS = {
    "0103_transactions": _RF3 + "; run one at a time (SUBTESTS), its two parts that create no such topic, "
                         "misuse_txn and fenced_txn, pass, and the six others stop at that CreateTopics",
    "0107_topic_recreate": _RF3, "0111_delay_create_topics": _RF3}


#: Tests of librdkafka's ``noautocreate`` scenario (found by :func:`declared_tests`): run with
#: ``-s noautocreate`` against a second broker with auto.create.topics.enable=false.
SCENARIOS: dict[str, str] = {}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROW = re.compile(r"^\|\s*(\w+)\s*\|\s*(\w+)\s*\|\s*([\d.]+)s\s*\|\s*(.*)$")


_BANNER = re.compile(r"=+ Test (\w+) (PASSED|FAILED|SKIPPED) =+")
_FAILED_AT = re.compile(r'### Test "([^" (]+)[^"]*" failed at ([^:]+:\d+):(\S*?) at ')
_SKIPPING = re.compile(r"\[(\w+)\s*/[^\]]*\] (?:WARNING: )?SKIPPING TEST: (.*)")


def summary_rows(output: str) -> dict[str, tuple[str, str]]:
    """{test name: (state, its fail or skip message)}: the runner's summary table, else its
    banners (the summary is lost when the runner dies after its tests, e.g. in an exit
    handler)."""
    rows: dict[str, tuple[str, str]] = {}
    text = _ANSI.sub("", output)
    why: dict[str, str] = {}
    for line in text.splitlines():
        m = _FAILED_AT.search(line)
        if m:
            why.setdefault(m.group(1), f"{m.group(2)}: {m.group(3)}")
        m2 = _SKIPPING.search(line)
        if m2:
            why.setdefault(m2.group(1).strip(), m2.group(2).strip())
        m3 = _BANNER.search(line)
        if m3:
            rows[m3.group(1)] = (m3.group(2), "")
    for line in text.splitlines():
        m4 = _ROW.match(line.strip())
        if m4 and m4.group(1) != "TEST":
            rows[m4.group(1)] = (m4.group(2), m4.group(4).strip())
    return {n: (st, msg or why.get(n, "")) for n, (st, msg) in rows.items()}


class Broker:
    """``pylog serve`` on a free loopback port over ``root``, with the suite's broker configs."""

    def __init__(self, root: Path, conf: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = open(root.parent / "broker.log", "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pylog.cli", "--root", str(root), "serve", "--host", "127.0.0.1",
             "--port", "0", "--config", str(conf)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"pylog serve did not start: {line!r} (see broker.log)")
        self.bootstrap = f"127.0.0.1:{m.group(2)}"

    def alive(self) -> bool:
        """Whether the broker is still running."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL after 30 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


#: Tests also run once per sub-test (``SUBTESTS``), so that the table shows each part: 0081
#: per admin API.
SPLIT = {"0081": ("0081-admin.c", "do_test_apis")}


def sub_tests(number: str) -> list[str]:
    """The sub-test functions the test ``number`` calls (see ``SPLIT``), in order."""
    if number not in SPLIT:
        return []
    fname, func = SPLIT[number]
    text = (src_dir() / "tests" / fname).read_text()
    body = text[text.index(f"static void {func}("):]
    body = body[:body.index("\n}\n")]
    out: list[str] = []
    for m in re.finditer(r"\b(do_test_\w+)\(", body):
        if m.group(1) != func and m.group(1) not in out:
            out.append(m.group(1))
    return out


def run_one(number: str, names: list[str], conf: Path, timeout: float, bootstrap: str,
            sub: str | None = None, scenario: str = "default") -> dict[str, tuple[str, str]]:
    """One test runner for the tests numbered ``number`` (with ``sub``: only that sub-test,
    reported as ``NAME/SUB``) in librdkafka's test ``scenario``: {name: (state, message)}."""
    libs = os.pathsep.join(str(src_dir() / d) for d in ("src", "src-cpp"))
    env = {**os.environ, "TEST_KAFKA_VERSION": "4.0.0", "RDKAFKA_TEST_CONF": str(conf),
           "LD_LIBRARY_PATH": libs + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
           "KAFKA_PATH": str(_kafka_path(work_dir())), "BROKERS": bootstrap}
    env.pop("TESTS", None)
    env.pop("SUBTESTS", None)
    if sub is not None:
        env["SUBTESTS"] = sub + ":"  # (the name is FUNCTION:LINE: one function, not its longer namesakes)
        names = [f"{n}/{sub.removeprefix('do_test_')}" for n in names]
    tests = src_dir() / "tests"
    stem = number + (f"-{sub}" if sub else "") + ("" if scenario == "default" else f"-{scenario}")
    logf = work_dir() / "logs" / f"{stem}.log"
    t0 = time.monotonic()
    try:
        # stdbuf: the summary is printed to stdout at exit, lost if the runner then aborts
        p = subprocess.run(["stdbuf", "-oL", "./test-runner", "-Q", "-L", "-E", "-s", scenario, number],
                           cwd=tests, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           start_new_session=True)
        out = p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        logf.write_text(out)
        return {n: ("TIMEOUT", f"no result in {timeout:.0f} s") for n in names}
    logf.write_text(out)
    rows = summary_rows(out)
    got = {}
    for n in names:
        state, msg = rows.get(n.split("/")[0],
                              ("FAILED" if p.returncode else "SKIPPED", f"no summary row (exit {p.returncode})"))
        got[n] = (state, msg)
    print(f"rdk-suite: {number}: " + ", ".join(f"{n} {s}" for n, (s, _m) in got.items())
          + f" ({time.monotonic() - t0:.0f} s)", flush=True)
    return got


def table(results: list[tuple[str, str, str]]) -> str:
    """The markdown table of (test, result, why) and its tally line."""
    tally: dict[str, int] = {}
    for n, res, _w in results:
        if "/" not in n:  # a sub-test's row is a part of its test's
            tally[res] = tally.get(res, 0) + 1
    applicable = tally.get("passed", 0) + tally.get("failing", 0)
    lines = [
        f"librdkafka {_rdk_version()} (`{NPM_PACKAGE}`), quick mode, TEST_KAFKA_VERSION=4.0.0, "
        "one test runner per test number (and per admin API of 0081): "
        f"**{tally.get('passed', 0)} of {applicable} applicable tests pass**; "
        f"{tally.get('not applicable', 0)} do not apply. Written by "
        "`python3 scripts/librdkafka-suite.py run`.",
        "",
        "| test | result | why |",
        "| --- | --- | --- |",
    ]
    for n, res, why in results:
        lines.append(f"| {n} | {res} | {why.replace('|', '/')} |")
    return "\n".join(lines)


def _rdk_version() -> str:
    h = (src_dir() / "src" / "rdkafka.h").read_text()
    m = re.search(r"#define RD_KAFKA_VERSION\s+0x([0-9a-fA-F]{8})", h)
    if not m:
        return "?"
    v = int(m.group(1), 16)
    return f"{v >> 24}.{(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}"


def write_table(text: str) -> None:
    """Put ``text`` between the markers in docs/serve.md."""
    doc = REPO / "docs" / "serve.md"
    s = doc.read_text()
    a, b = s.index(BEGIN) + len(BEGIN), s.index(END)
    doc.write_text(s[:a] + "\n" + text + "\n" + s[b:])


def documented() -> dict[str, str]:
    """{test: result} as the table in docs/serve.md has it."""
    s = (REPO / "docs" / "serve.md").read_text()
    rows = s[s.index(BEGIN):s.index(END)].splitlines()
    return {c[1].strip(): c[2].strip() for c in (r.split("|") for r in rows)
            if len(c) > 3 and re.fullmatch(r" \d{4}_[\w/]+ ", c[1])}


def run(only: list[str], check: bool = False) -> int:
    """Run the applicable tests (or ``only`` these numbers) against a fresh pylog serve.
    ``check``: leave docs/serve.md alone and exit 1 where a result differs from its table."""
    from concurrent.futures import ThreadPoolExecutor

    timeout = float(os.environ.get("PYLOG_RDK_TIMEOUT", "300"))
    jobs = int(os.environ.get("PYLOG_RDK_JOBS", "2"))
    declared = declared_tests(src_dir())
    work = work_dir()
    (work / "logs").mkdir(exist_ok=True)
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    bconf = run_dir / "server.properties"
    bconf.write_text("num.partitions=4\nauto.create.topics.enable=true\n")
    broker = Broker(run_dir / "root", bconf)
    noauto: Broker | None = None
    confs: dict[str, tuple[Path, str]] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the broker on the way out
    try:
        conf = run_dir / "test.conf"
        conf.write_text(f"metadata.broker.list={broker.bootstrap}\ntest.topic.random=true\n"
                        "test.timeout.multiplier=2\n")
        groups: dict[tuple[str, str], list[str]] = {}  # (number, scenario): names
        for name, why in declared:
            if why is None and (not only or name[:4] in only):
                groups.setdefault((name[:4], SCENARIOS.get(name, "default")), []).append(name)
        tasks: list[tuple[str, list[str], str | None, str]] = [
            (n, names, None, sc) for (n, sc), names in groups.items()]
        tasks += [(n, names, sub, sc) for (n, sc), names in groups.items() for sub in sub_tests(n)]
        if any(t[3] == "noautocreate" for t in tasks):
            (run_dir / "noauto").mkdir()
            nconf = run_dir / "noauto" / "server.properties"
            nconf.write_text("num.partitions=4\nauto.create.topics.enable=false\n")
            noauto = Broker(run_dir / "noauto" / "root", nconf)
            confs = {"noautocreate": (run_dir / "noauto" / "test.conf", noauto.bootstrap)}
            confs["noautocreate"][0].write_text(conf.read_text().replace(broker.bootstrap, noauto.bootstrap))
        confs["default"] = (conf, broker.bootstrap)
        got: dict[str, tuple[str, str]] = {}
        with ThreadPoolExecutor(jobs) as ex:
            for res in ex.map(lambda t: run_one(t[0], t[1], confs[t[3]][0], timeout, confs[t[3]][1], t[2],
                                                scenario=t[3]), tasks):
                got.update(res)
        if not broker.alive() or (noauto is not None and not noauto.alive()):
            print("rdk-suite: pylog serve died during the run (see broker.log)", flush=True)
    finally:
        broker.stop()
        if noauto is not None:
            noauto.stop()
    (work / "raw.json").write_text(json.dumps(got, indent=1))
    return report(declared, got, only, check)


def report(declared: list[tuple[str, str | None]], got: dict[str, tuple[str, str]], only: list[str],
           check: bool) -> int:
    """The table of a run's results (``got``: {test: (state, message)}), written into
    docs/serve.md unless ``only`` or ``check``; 1 where a result is not as listed."""
    work = work_dir()
    results = []
    stale = []
    listed: list[tuple[str, str | None]] = []
    for name, why in declared:
        listed.append((name, why))
        if why is None:
            listed += [(f"{name}/{sub.removeprefix('do_test_')}", None) for sub in sub_tests(name[:4])]
    for name, why in listed:
        if only and name[:4] not in only:
            continue
        if why is not None:
            results.append((name, "not applicable", why))
            continue
        state, msg = got[name]
        if state == "PASSED":
            results.append((name, "passed", ""))
            if name in KNOWN_FAILURES:
                stale.append(f"{name} passes (listed in KNOWN_FAILURES)")
        elif state == "SKIPPED":
            results.append((name, "not applicable", msg or "skipped by the test itself"))
        else:
            why_fail = KNOWN_FAILURES.get(name)
            if why_fail is None:
                stale.append(f"{name} {state}: {msg}")
            results.append((name, "failing", why_fail or f"{state.lower()}: {msg[:200]}"))
    (work / "results.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    if check:
        doc = documented()
        stale += [f"{n}: {res}, docs/serve.md says {doc.get(n)}" for n, res, _w in results if doc.get(n) != res]
    elif not only:
        write_table(text)
    print(text.splitlines()[0], flush=True)
    for line in stale:
        print(f"rdk-suite: not as listed: {line}", flush=True)
    return 1 if stale else 0


def kafka_topics(argv: list[str]) -> int:
    """A stand-in for Kafka's ``bin/kafka-topics.sh`` over the Admin API (confluent-kafka):
    ``--bootstrap-server B`` with ``--create --topic T [--partitions N]
    [--replication-factor R] [--config K=V]...``, ``--alter --topic T --partitions N`` or
    ``--delete --topic T``; the tests that create their topics with it (0052, 0077, 0045)
    find it through ``KAFKA_PATH``."""
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    ap = argparse.ArgumentParser(prog="kafka-topics.sh")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--replication-factor", type=int, default=1)
    ap.add_argument("--config", action="append", default=[])
    verb = ap.add_mutually_exclusive_group(required=True)
    for v in ("--create", "--alter", "--delete"):
        verb.add_argument(v, action="store_true")
    a = ap.parse_args(argv)
    admin = AdminClient({"bootstrap.servers": a.bootstrap_server})
    if a.create:
        configs = dict(c.split("=", 1) for c in a.config)
        fut = admin.create_topics([NewTopic(a.topic, a.partitions or 1, a.replication_factor, config=configs)])
    elif a.alter:
        fut = admin.create_partitions([NewPartitions(a.topic, a.partitions)])
    else:
        fut = admin.delete_topics([a.topic])
    try:
        fut[a.topic].result(30)
    except Exception as e:  # noqa: BLE001 (the tool prints the error and exits 1)
        print(f"kafka-topics.sh: {e}", file=sys.stderr)
        return 1
    return 0


def kafka_acls(argv: list[str]) -> int:
    """A stand-in for Kafka's ``bin/kafka-acls.sh`` over the Admin API (confluent-kafka):
    ``--bootstrap-server B --add|--remove [--force]`` with one principal
    (``--allow-principal P`` or ``--deny-principal P``), ``--operation OP``... , the hosts
    (``--allow-host``/``--deny-host``, default ``*``) and ``--topic T`` or ``--group G``
    (``--resource-pattern-type literal|prefixed``); the tests that set ACLs (0109, 0115, 0119)
    find it through ``KAFKA_PATH``."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    ap = argparse.ArgumentParser(prog="kafka-acls.sh")
    ap.add_argument("--bootstrap-server", required=True)
    verb = ap.add_mutually_exclusive_group(required=True)
    verb.add_argument("--add", action="store_true")
    verb.add_argument("--remove", action="store_true")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--allow-principal")
    ap.add_argument("--deny-principal")
    ap.add_argument("--allow-host", default="*")
    ap.add_argument("--deny-host", default="*")
    ap.add_argument("--operation", action="append", default=[])
    ap.add_argument("--topic")
    ap.add_argument("--group")
    ap.add_argument("--resource-pattern-type", default="literal")
    a = ap.parse_args(argv)
    allow = a.allow_principal is not None
    principal = a.allow_principal if allow else a.deny_principal
    if principal is None or not a.operation or (a.topic is None) == (a.group is None):
        print("kafka-acls.sh: one principal, --operation and one of --topic, --group", file=sys.stderr)
        return 1
    rtype, name = (ResourceType.TOPIC, a.topic) if a.topic is not None else (ResourceType.GROUP, a.group)
    pattern = getattr(ResourcePatternType, a.resource_pattern_type.upper())
    permission = AclPermissionType.ALLOW if allow else AclPermissionType.DENY
    host = a.allow_host if allow else a.deny_host
    admin = AdminClient({"bootstrap.servers": a.bootstrap_server})
    ops = [getattr(AclOperation, o.upper()) for o in a.operation]
    try:
        if a.add:
            futs = admin.create_acls([AclBinding(rtype, name, pattern, principal, host, o, permission) for o in ops])
        else:
            futs = admin.delete_acls([AclBindingFilter(rtype, name, pattern, principal, host, o, permission)
                                      for o in ops])
        for fut in futs.values():
            fut.result(30)
    except Exception as e:  # noqa: BLE001 (the tool prints the error and exits 1)
        print(f"kafka-acls.sh: {e}", file=sys.stderr)
        return 1
    return 0


def _kafka_path(work: Path) -> Path:
    """A folder with ``bin/kafka-topics.sh`` and ``bin/kafka-acls.sh`` running
    :func:`kafka_topics` and :func:`kafka_acls`."""
    kp = work / "kafka"
    (kp / "bin").mkdir(parents=True, exist_ok=True)
    for tool in ("kafka-topics", "kafka-acls"):
        sh = kp / "bin" / f"{tool}.sh"
        sh.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "
                      f"{tool} \"$@\"\n")
        sh.chmod(0o755)
    return kp


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kafka-topics"]:
        return kafka_topics(argv[1:])
    if argv[:1] == ["kafka-acls"]:
        return kafka_acls(argv[1:])
    ap.add_argument("verb", choices=["build", "run", "table"])
    ap.add_argument("tests", nargs="*", help="test numbers (run): only these")
    ap.add_argument("--check", action="store_true",
                    help="run: leave docs/serve.md alone, exit 1 where a result differs from its table")
    args = ap.parse_args(argv)
    if args.verb == "table":  # the last run's table again (after KNOWN_FAILURES changed)
        raw = json.loads((work_dir() / "raw.json").read_text())
        return report(declared_tests(src_dir()), {k: tuple(v) for k, v in raw.items()}, args.tests, args.check)
    build()
    if args.verb == "build":
        return 0
    return run(args.tests, args.check)


if __name__ == "__main__":
    sys.exit(main())
