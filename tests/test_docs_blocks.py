"""Every code block of the README and docs/ runs as written, in order, page by page (issue 26),
so the docs cannot drift from the code.

A page's blocks run in one fresh folder (also ``$HOME``), with this checkout's ``pylog`` on the
path: ```` ```python ```` in a fresh interpreter, ```` ```sh ```` with bash (``-e -o pipefail``),
```` ```console ```` line by line: each ``$ COMMAND`` must exit 0, unless the line after it
shows the error it prints (``pylog: error: ...``). Other fences (text, json, toml ...) are not
code. HTML comments right before a fence steer the run (invisible on the site):

* ``<!-- docs-test: skip REASON -->``: the block is not run (it needs a server, Spark, root,
  the network, or it installs or runs for minutes); the reason is listed in the summary.
* ``<!-- docs-test: setup COMMAND -->``: a shell command run before the block (the input files
  an example reads, say); before a Python block, Python run first in its interpreter (the
  ``store`` a fragment uses).
* ``<!-- docs-test: skip-line TEXT -->``: lines containing TEXT are not run (``--follow``
  waits for Ctrl-C).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                               if n.endswith(".md"))
RUN = ("python", "sh", "console")
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!-- docs-test: (skip-line|skip|setup) ?(.*?) -->\s*$")


def blocks(text: str) -> list[dict]:
    """The fenced blocks of a page: ``lang``, ``code``, ``line`` (1-based, of the fence) and
    the ``skip`` / ``setup`` / ``skip-line`` marks of the comments right before it."""
    out, marks, lines, i = [], [], text.splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        mark = _MARK.match(lines[i])
        if mark:
            marks.append((mark.group(1), mark.group(2)))
        elif m and m.group(1) != "":
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append({"lang": m.group(1), "code": "\n".join(lines[i + 1:j]) + "\n", "line": i + 1,
                        "skip": [v for k, v in marks if k == "skip"], "setup": [v for k, v in marks if k == "setup"],
                        "skip-line": [v for k, v in marks if k == "skip-line"]})
            marks, i = [], j
        elif lines[i].strip():
            marks = []
        i += 1
    return out


def _env(home: str, shim: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYLOG_") or k == "PYLOG_BACKEND"}
    env.update(HOME=home, PYTHONPATH=ROOT, PATH=shim + os.pathsep + env.get("PATH", ""), COLUMNS="100")
    return env


def _shim(tmp_path) -> str:
    """A folder with ``pylog`` and ``python``: this checkout's command and this interpreter."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "pylog").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m pylog \"$@\"\n")
    (d / "python").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    for n in ("pylog", "python"):
        os.chmod(d / n, 0o755)
    return str(d)


def _console(code: str, skip_lines: list[str]) -> list[tuple[str, bool]]:
    """(command, expected to fail) of each ``$`` line of a console block."""
    lines = code.splitlines()
    out = []
    for k, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        cmd = line[2:]
        if any(s in cmd for s in skip_lines):
            continue
        nxt = lines[k + 1] if k + 1 < len(lines) else ""
        out.append((cmd, nxt.startswith("pylog: error:")))
    return out


@pytest.mark.slow  # about 2 minutes for all pages on a busy 2-core machine: out of the quick pass
@pytest.mark.parametrize("page", PAGES)
def test_the_code_blocks_of_a_page_run_in_order(page, tmp_path):
    with open(os.path.join(ROOT, page)) as f:
        found = [b for b in blocks(f.read()) if b["lang"] in RUN]
    if not found:
        pytest.skip(f"{page} has no code blocks")
    work = tmp_path / "work"
    work.mkdir()
    env = _env(str(work), _shim(tmp_path))
    ran = 0

    def run(argv: list[str], what: str, fail: bool = False, stdin: str | None = None) -> None:
        p = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300, input=stdin)
        if fail:
            assert p.returncode != 0, f"{what} was to fail, and exited 0:\n{p.stdout[-2000:]}"
        else:
            assert p.returncode == 0, f"{what} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"

    for b in found:
        where = f"{page}:{b['line']} ({b['lang']})"
        if b["skip"]:
            continue
        if b["lang"] == "python":  # its setup: Python run first, in the same interpreter
            run([sys.executable, "-"], where, stdin="\n".join(b["setup"] + [b["code"]]))
        else:
            for cmd in b["setup"]:
                run(["bash", "-e", "-c", cmd], f"{where} setup {cmd!r}")
        if b["lang"] == "sh":
            code = "".join(line for line in b["code"].splitlines(keepends=True)
                           if not any(s in line for s in b["skip-line"]))
            run(["bash", "-e", "-o", "pipefail", "-c", code], where)
        elif b["lang"] == "console":
            for cmd, fail in _console(b["code"], b["skip-line"]):
                if cmd.startswith("export "):  # the session's environment, for the lines after it
                    name, _, value = cmd[7:].partition("=")
                    value = value.split("#")[0].strip()
                    env[name] = env["HOME"] + value[1:] if value.startswith("~") else value
                    continue
                run(["bash", "-o", "pipefail", "-c", cmd], f"{where} `{cmd}`", fail=fail)
        ran += 1
    assert ran or all(b["skip"] for b in found)


def test_every_skipped_block_says_why():
    for page in PAGES:
        with open(os.path.join(ROOT, page)) as f:
            for b in blocks(f.read()):
                for reason in b["skip"]:
                    assert len(reason) > 5, f"{page}:{b['line']}: a skip without a reason"


def test_the_block_reader():
    text = ("intro\n\n<!-- docs-test: skip needs a server -->\n```sh\npylog serve\n```\n\n"
            "<!-- docs-test: setup echo x > a.txt -->\n<!-- docs-test: skip-line --follow -->\n"
            "```console\n$ pylog produce t a.txt\n$ pylog consume t --follow\n$ pylog x\npylog: error: no\n```\n"
            "```text\nnot code\n```\n")
    b = blocks(text)
    assert [(x["lang"], x["line"], x["skip"], x["setup"]) for x in b] == [
        ("sh", 4, ["needs a server"], []), ("console", 10, [], ["echo x > a.txt"]), ("text", 16, [], [])]
    assert _console(b[1]["code"], b[1]["skip-line"]) == [("pylog produce t a.txt", False), ("pylog x", True)]
