"""The README's examples: the quickstart (the smoke test without Spark) runs and leaves nothing
behind; the Spark pipeline removes its temporary data root on every exit, and runs a stage
again only when Spark's Python worker failed to connect back."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def _env(tmp: str, **extra: str) -> dict[str, str]:
    """This checkout's pylog, temporary folders under ``tmp``."""
    return {**os.environ, "PYTHONPATH": ROOT, "TMPDIR": tmp, **extra}


def test_quickstart_runs_the_library_and_the_command_and_cleans_up(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "quickstart.py")], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(str(tmp)), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the pylog command: 3 records" in p.stdout and "ok: backend" in p.stdout
    assert os.listdir(tmp) == []


def test_pipeline_removes_its_data_root_when_it_fails(tmp_path):
    """Spark cannot start (no Java at JAVA_HOME): the job fails after it made and filled its
    temporary data root, and removes it."""
    pytest.importorskip("pyspark")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "pipeline.py"), "--events", "100"],
                       capture_output=True, text=True, cwd=tmp_path,
                       env=_env(str(tmp), JAVA_HOME=str(tmp_path / "no-java")), timeout=300)
    assert p.returncode != 0
    assert "JAVA_GATEWAY_EXITED" in p.stderr or "Java" in p.stderr, p.stderr[-2000:]
    assert [n for n in os.listdir(tmp) if n.startswith("pylog-pipeline-")] == []


def _pipeline():
    spec = importlib.util.spec_from_file_location("pylog_example_pipeline", os.path.join(EXAMPLES, "pipeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_stage_runs_again_after_a_connect_back_failure_a_bounded_number_of_times(capsys):
    pipeline = _pipeline()
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("[STREAM_FAILED] ... org.apache.spark.SparkException: Python worker failed to connect "
                               "back. ... java.net.SocketTimeoutException: Accept timed out")

    pipeline.with_retry(flaky, "stream", pause=0)
    assert len(calls) == 2
    assert "did not connect back" in capsys.readouterr().err

    def always() -> None:
        calls.append(1)
        raise RuntimeError("Python worker failed to connect back")

    calls.clear()
    with pytest.raises(pipeline.ConnectBackError, match="did not connect back within the JVM's 10 s in 3 runs"):
        pipeline.with_retry(always, "stream", pause=0)
    assert len(calls) == pipeline.ATTEMPTS == 3  # a few more times, not forever

    def other() -> None:
        calls.append(1)
        raise ValueError("a real error")

    calls.clear()
    with pytest.raises(ValueError):
        pipeline.with_retry(other, "batch", pause=0)
    assert len(calls) == 1  # any other failure is not retried
