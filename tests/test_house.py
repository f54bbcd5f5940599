"""The shape of the package (issue 15): no import circles, layers that import only downward,
a docstring on every module, and no module over 800 lines.

The import graph is read from the source with :mod:`ast`, not by importing anything. An edge
``a -> b`` is an import of ``pylog.b`` by ``pylog.a`` at module level (also inside a module-level
``try`` or ``if``). Imports inside functions and methods are NOT edges: they run on use, after
both modules have loaded, which is how a lower layer reaches an optional upper one (``Log.compact``
imports :mod:`pylog.compaction`). Imports under ``if TYPE_CHECKING:`` are NOT edges either: they
never run. ``from pylog import x`` is an edge to ``pylog.x`` when ``x`` is a module, and to the
package ``pylog`` otherwise. The checks work on whatever modules and packages ``pylog/`` holds.
"""
from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "pylog"
MAX_LINES = 800
#: the top-level parts above the library core: the core never imports them, at any level
UPPER = ("cli", "spark", "serve", "bench", "__main__")


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, *, module_level: bool = True) -> set[str]:
    """The pylog modules ``name`` imports (at module level, or anywhere if not
    ``module_level``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def target(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                mod = target(node)
                for a in node.names:
                    found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body)

    visit(tree.body)
    if not module_level:  # anywhere at all, including nested blocks
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                mod = target(node)
                found.update(f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod
                             for a in node.names)
    return {m for m in found if m in MODULES and m != name}


def import_graph() -> dict[str, set[str]]:
    """Module-level import edges between pylog's modules."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing
    itself): each is an import circle. Tarjan's walk, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = itertools.count()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = next(counter)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = next(counter)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph.get(v, ()):
                        found.append(sorted(comp))
    return found


def _cycle_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete circle through the component, for the failure message."""
    members = set(comp)
    path = [comp[0]]
    seen = {comp[0]: 0}
    while True:
        nxt = sorted(graph[path[-1]] & members)[0]
        if nxt in seen:
            return path[seen[nxt]:] + [nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def test_circle_finder_finds_a_circle():
    """The walk itself: a planted circle is found and named, a chain is not a circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert _cycle_in(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert circles({"a": {"a"}}) == [["a"]]


def test_edges_are_read_as_documented(tmp_path):
    """TYPE_CHECKING and function-level imports are not edges; module-level ones are."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from pylog import log\n"
        "from pylog.errors import PylogError\n"
        "if TYPE_CHECKING:\n    from pylog.topics import Topic\n"
        "def f():\n    from pylog import consumer\n")
    assert _imports("pylog.x", src) == {"pylog.log", "pylog.errors"}
    assert "pylog.consumer" in _imports("pylog.x", src, module_level=False)


def test_no_import_circles():
    graph = import_graph()
    found = [" -> ".join(_cycle_in(graph, comp)) for comp in circles(graph)]
    assert not found, "import circles among pylog's modules (module level): " + "; ".join(found)


def test_core_never_imports_the_layers_above():
    """The library core (everything but cli, spark, serve, bench and __main__) imports none
    of them, at module level or inside a function."""
    def upper(name: str) -> bool:
        return name.split(".")[1:2] and name.split(".")[1] in UPPER

    bad = {}
    for name, path in MODULES.items():
        if name == "pylog" or upper(name):
            continue
        ups = sorted(m for m in _imports(name, path, module_level=False) if upper(m))
        if ups:
            bad[name] = ups
    assert not bad, f"the core imports layers above it: {bad}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_has_a_docstring(name):
    tree = ast.parse(MODULES[name].read_text())
    doc = ast.get_docstring(tree)
    assert doc and doc.strip(), f"{MODULES[name].relative_to(PKG.parent)} has no module docstring"


def test_no_module_over_800_lines():
    over = {}
    for path in MODULES.values():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            over[path.relative_to(PKG.parent).as_posix()] = n
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def test_every_package_and_py_typed_ship_in_the_wheel():
    """pyproject.toml lists packages by hand: a new subpackage (a split into ``pylog/x/``)
    left off the list would be missing from the wheel. py.typed (PEP 561) ships too."""
    tomllib = pytest.importorskip("tomllib")
    conf = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {".".join(p.relative_to(PKG.parent).parts)
                for p in [PKG, *PKG.rglob("*")] if (p / "__init__.py").is_file()}
    assert packages - set(conf["packages"]) == set(), "packages missing from pyproject.toml"
    assert (PKG / "py.typed").is_file()
    assert "py.typed" in conf["package-data"]["pylog"]
