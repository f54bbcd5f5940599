"""The generated API reference is up to date, and every public name has a docstring."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gen():
    spec = importlib.util.spec_from_file_location("gen_api", os.path.join(ROOT, "docs", "gen_api.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_api_reference_is_current():
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        assert f.read() == _gen().render(), "run: python docs/gen_api.py"


def test_every_documented_name_has_a_docstring():
    lines = _gen().render().split("\n")
    bare = [lines[i] for i in range(len(lines) - 2)
            if lines[i].startswith("###") and lines[i + 1] == "" and (lines[i + 2] == "" or lines[i + 2].startswith("#"))]
    assert not bare, f"public names without a docstring: {bare}"
