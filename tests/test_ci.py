"""The README's test command is what CI runs: the lint and the type check run as tests, the
``test`` extra holds every module a test imports (a missing one stops the run instead of
skipping a suite), and ``.ci/run`` calls the README's commands exactly as written."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import EXTRA_MODULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600, **kw)


def _tool(module: str) -> None:
    """Skip when ``module`` is missing and the run was asked to go on without the test extra
    (PYLOG_TEST_SUBSET=1: the emulated ARM suite, whose Debian packages have no linters);
    otherwise its absence fails the run before it starts (conftest)."""
    if os.environ.get("PYLOG_TEST_SUBSET") == "1":
        pytest.importorskip(module)


def test_lint_is_clean():
    _tool("ruff")
    p = _run([sys.executable, "-m", "ruff", "check", "--no-cache", "pylog", "tests", "asv_bench", "examples"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]


def test_types_are_clean():
    _tool("mypy")
    p = _run([sys.executable, "-m", "mypy", "pylog"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]


def _extras() -> dict[str, set[str]]:
    """The optional dependencies of pyproject.toml, each as a set of lower-case names."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return {name: {re.split(r"[\[<>=!~ ;]", r)[0].lower() for r in reqs} for name, reqs in extras.items()}


def test_the_test_extra_holds_the_broker_clients_and_the_docs_tools():
    extras = _extras()
    assert extras["serve-test"] - extras["test"] == set()
    assert extras["docs"] - extras["test"] == set()
    assert "wheel" in extras["test"]  # tests/test_ready.py builds one with --no-build-isolation


def test_every_module_a_test_skips_without_comes_with_the_readme_install():
    """Each ``pytest.importorskip("X")`` of the tests names a module of EXTRA_MODULES (checked
    at the start of a run), or one the build makes; each of those is in ``[spark,test]``."""
    built = {"pylog._native", "pylog._cffi", "tomllib"}  # the build's, and the standard library's
    named = set()
    for name in os.listdir(TESTS):
        if name.endswith(".py"):
            with open(os.path.join(TESTS, name)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "importorskip" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    named.add(node.args[0].value)
    assert named, "no importorskip found: the scan is broken"
    top = {m.split(".")[0] for m in EXTRA_MODULES}
    assert {m for m in named - built if m.split(".")[0] not in top} == set()
    extras = _extras()
    dists = {d.split("[")[0] for d in EXTRA_MODULES.values()}
    assert dists - (extras["test"] | extras["spark"]) == set()


def test_a_run_without_a_test_dependency_stops_before_it_starts(tmp_path):
    """kio hidden from the interpreter: pytest stops with a usage error naming it (the broker
    suites would have been skipped); PYLOG_TEST_SUBSET=1 lets the run go on."""
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'kio' or name.startswith('kio.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', 'tests/test_serve.py']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYLOG_TEST_SUBSET"}
    env["PYTHONPATH"] = ROOT
    p = _run([sys.executable, "-c", code], env=env)
    assert p.returncode == pytest.ExitCode.USAGE_ERROR, p.stdout[-2000:] + p.stderr[-2000:]
    assert "kio" in p.stderr and 'pip install -e ".[spark,test]"' in p.stderr
    p = _run([sys.executable, "-c", code], env={**env, "PYLOG_TEST_SUBSET": "1"})
    assert p.returncode == pytest.ExitCode.NO_TESTS_COLLECTED or p.returncode == 0, p.stdout[-2000:]
    assert "kio" in p.stdout  # the module skipped: "could not import 'kio'"


def _readme_commands() -> list[str]:
    """The commands of the README's section "On a fresh machine": the install and main job, and
    the test command (the ```sh blocks that start with pip or python -m pytest)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## On a fresh machine", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    cmds = [b.strip() for b in blocks if b.startswith("pip install") or b.startswith("python -m pytest")]
    assert len(cmds) == 2, cmds
    return cmds


def test_ci_runs_the_readme_commands_exactly():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line.strip() for line in f if not line.lstrip().startswith("#")]
    install, tests = _readme_commands()
    assert install == 'pip install -e ".[spark,test]" && python examples/pipeline.py'
    assert tests == "python -m pytest"
    for cmd in (install, tests):
        assert any(line == cmd or line.endswith(" " + cmd) for line in lines), f".ci/run does not run {cmd!r}"
    # and the commands it runs are phases (not dead functions)
    assert "phase install+main-job readme_install_and_main_job" in lines
    assert "phase tests readme_tests" in lines
