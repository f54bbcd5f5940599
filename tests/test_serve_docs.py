"""The kcat and kafka-python examples of docs/serve.md, run against a broker as written
(only the port changes)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("kio")
pytest.importorskip("kafka")

from conftest import ROOT, py_env  # noqa: E402
from serve_util import BrokerProcess  # noqa: E402

DOC = os.path.join(ROOT, "docs", "serve.md")


def _block(heading: str, lang: str) -> str:
    text = open(DOC).read()
    section = text[text.index(heading):]
    m = re.search(r"```" + lang + r"\n(.*?)```", section, re.S)
    assert m, f"no {lang} block under {heading}"
    return m.group(1)


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    assert b.stop() == 0


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian package) not installed")
def test_kcat_example(broker):
    script = _block("## Example: kcat", "sh").replace("127.0.0.1:9092", broker.bootstrap)
    expected = [line[2:] for line in script.splitlines() if line.startswith("# ")]
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected == ["0 k1 hello lang=en", "1 k2 world lang=en"]


def test_kafka_python_example(broker):
    code = _block("## Example: kafka-python", "python").replace("127.0.0.1:9092", broker.bootstrap)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=py_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["0 b'k1' b'hello' [('lang', b'en')]"]
