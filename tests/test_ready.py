"""pylog as a new user meets it (issue 17): a plain install in a fresh virtual environment,
the command driven through subprocesses, the documentation site build.

The fresh-venv tests (marker ``venv``) build a wheel of this checkout and ``pip install`` it
without extras into a new ``python -m venv``: they need the package index (or pip's
configured find-links); ``-m "not venv"`` skips them offline.
"""
from __future__ import annotations

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
    p = _run([sys.executable, "-m", "venv", str(tmp / "env")])
    assert p.returncode == 0, p.stderr
    bindir = tmp / "env" / "bin"
    p = _run([str(bindir / "python"), "-m", "pip", "install", "-q", str(wheel)], timeout=900)
    assert p.returncode == 0, p.stderr
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
    assert any("columnar/Arrow" in t and 'SKIP (arrow: pyarrow is not installed: pip install "pylog-commitlog[arrow]")' in t
               for t in targets)
    assert "command: pylog bench --compare --quick --no-kib --repeat 1 --records 5000" in out
    skipped = sum(" SKIP (" in t for t in targets)
    assert f", {skipped} skipped (peer not run)" in out
    p = _run([str(venv / "pylog"), "bench", "--compare", "--help"], env=_clean_env(), cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("usage: pylog bench --compare"), p.stderr
