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


def _served_table() -> dict[int, tuple[str, int, int]]:
    """The rows of docs/serve.md's "APIs and versions served": key -> (name, min, max)."""
    text = open(DOC).read()
    section = text[text.index("## APIs and versions served"):]
    section = section[:section.index("\n## ", 1)]
    rows = {}
    for m in re.finditer(r"^\| (\w+) \((\d+)\)\s*\| (\d+)(?:-(\d+))?\s*\|", section, re.M):
        name, key, lo, hi = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4) or m.group(3))
        assert key not in rows, f"API key {key} twice in the table"
        rows[key] = (name, lo, hi)
    return rows


def test_the_table_of_apis_is_what_api_versions_answers(broker):
    """Every API of the docs' table, with its versions, is what ApiVersions answers a
    client of a running broker, and nothing more."""
    from serve_util import call, connect, frame

    from pylog.serve.protocol import SERVED

    table = _served_table()
    assert len(table) >= 20
    with connect(broker) as s:
        r = call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
    assert r is not None and r.error_code == 0
    got = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert got == {k: (lo, hi) for k, (_, lo, hi) in table.items()}
    assert {k: name for k, (name, _, _) in SERVED.items()} == {k: name for k, (name, _, _) in table.items()}
