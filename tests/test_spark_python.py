"""examples/spark_python.py, the ``$PYSPARK_PYTHON`` of the README's pipeline: a Python that
Spark starts on its own connects back to the JVM before it imports the module it runs, so the
JVM's fixed 10 s wait for the connection no longer covers pyspark's imports (the pipeline's
streaming stage failed with "Python worker failed to connect back" on a loaded machine).

The JVM is played by the test, as ``PythonWorkerFactory.createSimpleWorker`` does it: a
listening socket whose port and secret are passed in ``PYTHON_WORKER_FACTORY_PORT`` and
``PYTHON_WORKER_FACTORY_SECRET``; it accepts, reads the secret, answers ``ok``, then reads the
worker's pid. The module run is a stand-in for pyspark's streaming source runner whose import
does not finish until the test lets it: the connection must arrive before that."""
from __future__ import annotations

import importlib.util
import os
import socket
import struct
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pyspark")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")

#: imports slowly (until the file GATE exists), then runs as pyspark's runners do
SLOW_RUNNER = '''
import os, sys, time
while not os.path.exists(os.environ["GATE"]):  # the heavy imports (pyspark.sql, pyarrow ...)
    time.sleep(0.01)
from pyspark.serializers import read_int, write_int
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as f:
        write_int(read_int(f) + 1, f)   # the runner's work: answer the JVM
        f.flush()
'''


def _worker_python(tmp_path) -> str:
    """The wrapper the pipeline writes for ``$PYSPARK_PYTHON`` (its own function)."""
    spec = importlib.util.spec_from_file_location("pylog_example_pipeline", os.path.join(EXAMPLES, "pipeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    return mod.worker_python(str(bindir))


def _recv(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        assert chunk, "the worker closed the connection"
        buf += chunk
    return buf


@pytest.fixture
def jvm(tmp_path):
    """A listening socket and the environment Spark gives a worker it starts on its own."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "slow_runner.py").write_text(textwrap.dedent(SLOW_RUNNER))
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(60)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), ROOT]),
           "PYTHON_WORKER_FACTORY_PORT": str(srv.getsockname()[1]), "PYTHON_WORKER_FACTORY_SECRET": "s3cret",
           "GATE": str(tmp_path / "gate")}
    yield srv, env
    srv.close()


def test_the_worker_connects_and_authenticates_before_importing_its_module(tmp_path, jvm):
    srv, env = jvm
    p = subprocess.Popen([_worker_python(tmp_path), "-m", "slow_runner"], env=env, cwd=tmp_path)
    try:
        conn, _ = srv.accept()  # while the module's import is still held at the gate
        assert not os.path.exists(env["GATE"])
        conn.settimeout(60)
        (n,) = struct.unpack("!i", _recv(conn, 4))
        assert _recv(conn, n) == b"s3cret"
        conn.sendall(struct.pack("!i", 2) + b"ok")
        (tmp_path / "gate").touch()  # the imports may finish now
        (pid,) = struct.unpack("!i", _recv(conn, 4))
        assert pid == p.pid  # the JVM checks it: the shell wrapper and the launcher keep the pid
        conn.sendall(struct.pack("!i", 41))
        assert struct.unpack("!i", _recv(conn, 4)) == (42,)  # the module ran over that one connection
        assert p.wait(timeout=60) == 0
        conn.close()
    finally:
        p.kill()
        p.wait()


def test_a_wrong_secret_is_refused_with_one_line(tmp_path, jvm):
    srv, env = jvm
    p = subprocess.Popen([_worker_python(tmp_path), "-m", "slow_runner"], env=env, cwd=tmp_path,
                         stderr=subprocess.PIPE, text=True)
    try:
        conn, _ = srv.accept()
        (n,) = struct.unpack("!i", _recv(conn, 4))
        _recv(conn, n)
        conn.sendall(struct.pack("!i", 3) + b"err")
        assert p.wait(timeout=60) == 1
        assert p.stderr.read().strip() == "spark_python: the JVM refused this worker's secret (b'err')"
    finally:
        p.kill()
        p.wait()


def test_other_starts_run_as_plain_python(tmp_path):
    """Spark's scripts run ``$PYSPARK_PYTHON script.py``; its daemon and any module started
    without a JVM waiting run unchanged, with site-packages."""
    py = _worker_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_WORKER_FACTORY")}
    out = subprocess.run([py, "-c", "import sys, pyspark; print(sys.flags.no_site, len(sys.argv))"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["0", "1"], out.stderr
    out = subprocess.run([py, "-m", "json.tool"], input='{"a": 1}', capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and '"a": 1' in out.stdout, out.stderr
    out = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True, env=env,
                         timeout=120)  # a module from site-packages, added after the start (-S)
    assert out.returncode == 0 and out.stdout.startswith("pip "), out.stderr
    assert sys.executable in open(py).read()


def test_the_handover_is_made_only_on_the_pyspark_versions_it_was_tested_with(tmp_path, jvm):
    """The launcher reads pyspark's version without importing it; on a version outside
    TESTED it makes no early connection (the module then connects as pyspark does)."""
    import pyspark

    spec = importlib.util.spec_from_file_location("pylog_spark_python", os.path.join(EXAMPLES, "spark_python.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod._pyspark_version() == ".".join(pyspark.__version__.split(".")[:2])
    # a pyspark 9.9 on the path first: the runner alone connects, after its slow imports
    fake = tmp_path / "mods" / "pyspark"
    fake.mkdir()
    (fake / "version.py").write_text("__version__: str = '9.9.0'\n")
    srv, env = jvm
    p = subprocess.Popen([_worker_python(tmp_path), "-m", "slow_runner"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        srv.settimeout(3)
        with pytest.raises(TimeoutError):
            srv.accept()  # no connection while the module is still importing
    finally:
        p.kill()
        p.wait()
