"""Every public name of the API reference has a docstring (the docs site's strict build fails
otherwise; tests/test_ready.py builds the site)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hooks():
    spec = importlib.util.spec_from_file_location("pylog_docs_hooks", os.path.join(ROOT, "docs", "_ext", "hooks.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_documented_name_has_a_docstring():
    assert _hooks().undocumented() == []


def test_a_name_without_a_docstring_is_found(monkeypatch):
    import pylog.groups

    monkeypatch.setattr(pylog.groups.groups, "__doc__", None)
    monkeypatch.setattr(pylog.Log.append, "__doc__", "")
    assert _hooks().undocumented() == ["pylog.Log.append", "pylog.groups.groups"] or \
        sorted(_hooks().undocumented()) == ["pylog.Log.append", "pylog.groups.groups"]
