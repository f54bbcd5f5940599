"""Shared fixtures and hypothesis profiles.

Profiles (``HYPOTHESIS_PROFILE``): ``default`` for a quick local run, ``ci`` (set by
``.ci/run``), ``expensive`` (also chosen by ``PYLOG_LONG=1``) for the long soak.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

LONG = os.environ.get("PYLOG_LONG") == "1"

# A run started in the background by a non-interactive shell (`cmd &`, `nohup cmd &`) has
# SIGINT ignored, and every child would inherit that: the tests that interrupt a child (Ctrl-C)
# must give it what a terminal gives. A caught handler here is reset to the default in each
# child at exec, where Python then raises KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# under qemu-user (scripts/test-arm.sh): the property tests exercise the platform's code paths;
# the deep search of the input space is x86's (the same Python and C on every CPU)
settings.register_profile("emulated", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("expensive", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "expensive" if LONG else "default"))


# The modules the README's install (``pip install -e ".[spark,test]"``) provides, by import name,
# with the distribution that has each. A missing one stops the run before it starts: its tests
# would otherwise skip whole suites (the broker's, the docs site's) behind a line of the summary.
# PYLOG_TEST_SUBSET=1 lets a run without them go on, skipping their tests: the emulated ARM suite
# (scripts/test-arm.sh) and cibuildwheel's test run set it.
EXTRA_MODULES = {
    "hypothesis": "hypothesis", "psutil": "psutil", "crc32c": "crc32c", "pyarrow": "pyarrow",
    "wheel": "wheel", "ruff": "ruff", "mypy": "mypy",
    "kio": "kio", "kafka": "kafka-python", "confluent_kafka": "confluent-kafka", "aiokafka": "aiokafka",
    "cryptography": "cryptography", "lz4": "lz4", "zstandard": "zstandard", "cramjam": "cramjam",
    "snappy": "python-snappy", "mkdocs": "mkdocs", "material": "mkdocs-material",
    "mkdocstrings": "mkdocstrings", "mkdocstrings_handlers.python": "mkdocstrings[python]",
    "lmdb": "lmdb", "rocksdict": "rocksdict", "queuelib": "queuelib", "redis": "redis",
    "prometheus_client": "prometheus_client",
}
if sys.version_info >= (3, 11):  # the spark extra needs 3.11
    EXTRA_MODULES["pyspark"] = "pyspark"


def missing_extras() -> list[str]:
    """The distributions of EXTRA_MODULES that are not installed."""
    import importlib.util

    missing = []
    for mod, dist in EXTRA_MODULES.items():
        try:
            found = importlib.util.find_spec(mod) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            missing.append(dist)
    return missing


def pytest_configure(config):
    """Refuse to start without the test extra (see EXTRA_MODULES)."""
    if os.environ.get("PYLOG_TEST_SUBSET") == "1":
        return
    missing = missing_extras()
    if missing:
        raise pytest.UsageError(
            f"the test dependencies {', '.join(missing)} are not installed, and the tests that need them would "
            'be skipped: pip install -e ".[spark,test]" (or set PYLOG_TEST_SUBSET=1 to run without them)')


def scaled(ci: int, long: int) -> int:
    """An iteration count: ``ci`` normally, ``long`` with PYLOG_LONG=1."""
    return long if LONG else ci


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def py_env() -> dict[str, str]:
    """The environment of a child interpreter that imports this checkout's pylog and the
    tests' helpers."""
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + HERE}


def run_py(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a fresh interpreter that imports this checkout's pylog
    and the tests' helpers; its output is captured as text."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=timeout, env=py_env())


def commit_killed_mid_apply(root: str, topic: str) -> subprocess.CompletedProcess:
    """A store transaction (3 records into partition 0 of ``topic``, 4 into partition 1)
    committed by a child process killed (exit status 9) once partition 0 is applied and
    two stray records were flushed into partition 1: decided, never published."""
    return run_py("""
        import os, sys, pylog
        from pylog import transactions as T
        real = T._apply
        def _apply(log, d, e, *more):
            if e["partition"] == 1:
                log.append_batch([b"torn"] * 2); log.flush(); os._exit(9)
            real(log, d, e, *more)
        T._apply = _apply
        with pylog.LogStore(sys.argv[1]) as s, s.transaction() as tx:
            tx.append_batch(sys.argv[2], [b"c0"] * 3, partition=0)
            tx.append_batch(sys.argv[2], [b"c1"] * 4, partition=1)
    """, str(root), topic)


def record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths this process fsyncs or fdatasyncs through :mod:`pylog.vfs` from now on
    (the list fills as they happen)."""
    from pylog import vfs

    synced: list[str] = []

    def watch(real):  # type: ignore[no-untyped-def]
        def sync(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)
        return sync

    monkeypatch.setattr(vfs, "fsync", watch(vfs.fsync))
    monkeypatch.setattr(vfs, "fdatasync", watch(vfs.fdatasync))
    return synced


def store_files(path: str) -> list[str]:
    """The store files (``*.log``) of the log at ``path``, in offset order, as paths."""
    from pylog import format as fmt

    return sorted(os.path.join(path, n) for n in os.listdir(path)
                  if fmt.parse_segment_name(n, fmt.STORE_SUFFIX) is not None)


def store_frames(store: str) -> list[tuple[int, int, int]]:
    """(position, size, offset) of every whole frame of a store file, read from its length
    fields alone (no CRC check: an oracle independent of the C core); stops at a frame that
    is cut short or has an impossible length (zeros, a torn write)."""
    import struct

    from pylog import format as fmt

    with open(store, "rb") as f:
        data = f.read()
    out, pos = [], fmt.FILE_HEADER_SIZE
    while pos + fmt.FRAME_HEADER_SIZE <= len(data):
        length = struct.unpack_from("<I", data, pos)[0]
        size = length + 8
        if length < 28 or pos + size > len(data):
            break
        out.append((pos, size, struct.unpack_from("<Q", data, pos + 8)[0]))
        pos += size
    return out


def scan_rows(log, start=None, stop=None) -> list[tuple]:
    """(offset, timestamp, key, value, metadata) of every record of ``log.scan()``, the
    fields as bytes (None where the record has none)."""
    def b(x):
        return None if x is None else bytes(x)

    return [(r.offset, r.timestamp, b(r.key), b(r.value), b(r.metadata)) for r in log.scan(start, stop)]


@pytest.fixture
def log_dir(tmp_path):
    """A fresh directory for one Log."""
    return str(tmp_path / "log")


@pytest.fixture
def make_log(log_dir):
    """Factory for Logs on ``log_dir``; closes them all at teardown."""
    import pylog

    logs = []

    def make(path=None, **kw):
        log = pylog.Log(path or log_dir, **kw)
        logs.append(log)
        return log

    yield make
    for log in logs:
        try:
            log.close()
        except Exception:
            pass


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every Spark test (starting one costs 5-15 s), with the
    ``pylog`` format registered. The tests using it import pyspark (and skip without it).
    The JVM connector's jar (built here when javac is there and it is missing or stale) is
    on ``spark.jars``; ``spark.pylog.reader=python`` keeps ``format("pylog")`` on the Python
    source, and tests/test_spark_jvm.py switches it to ``jvm`` for its own reads."""
    from pyspark.sql import SparkSession

    from pylog import spark as pylog_spark
    from pylog.spark import jvm_build

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    jar = pylog_spark.jar_path()
    if jvm_build.SOURCE_DIR.is_dir() and (jar is None or jvm_build.stale(Path(jar))):
        jvm_build.build(quiet=True)
        jar = pylog_spark.jar_path()
    builder = SparkSession.builder
    if jar is not None:
        builder = builder.config("spark.jars", jar).config("spark.pylog.reader", "python")
    session = (
        builder.master("local[2]")
        .appName("pylog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pylog_spark.register(session)
    yield session
    session.stop()


def strace_path() -> str | None:
    """strace, where its fault injection (``-e inject=SYSCALL:...``) reaches this interpreter's
    system calls; None when it is not installed, or under qemu-user (the ARM suite sets
    ``QEMU_CPU``), where strace sees the emulator's host calls: named and counted differently
    from the guest's (an aarch64 guest has no rename(2), for one), so a sweep would inject
    nothing the test expects."""
    import shutil

    if os.environ.get("QEMU_CPU"):
        return None
    return shutil.which("strace")
