"""Generate docs/api.md from pylog's docstrings: ``python docs/gen_api.py``.

tests/test_docs.py checks the page is up to date, so the API reference cannot drift from
the code."""
from __future__ import annotations

import importlib
import inspect
import pathlib

SECTIONS = [
    ("pylog", ["Log", "LogConfig", "Record", "crc32c", "backend", "backend_features"]),
    ("pylog.topics", None),
    ("pylog.consumer", None),
    ("pylog.groups", None),
    ("pylog.compaction", None),
    ("pylog.errors", None),
    ("pylog.testing", ["CrashFS", "PowerCut", "simulate_crash", "LogMachine"]),
    ("pylog.arrow", None),
    ("pylog.spark", None),
]


def _doc(obj) -> str:
    d = inspect.getdoc(obj) or ""
    return d.strip()


def _sig(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def _public(mod) -> list[str]:
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == mod.__name__ and (inspect.isclass(v) or inspect.isfunction(v))]
    return list(names)


def render() -> str:
    out = ["# API reference", "", "Generated from the docstrings by `docs/gen_api.py`; do not edit by hand.", ""]
    for modname, names in SECTIONS:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        out += [f"## `{modname}`", ""]
        if mod.__doc__ and modname != "pylog":
            out += [inspect.cleandoc(mod.__doc__), ""]
        for name in names or _public(mod):
            obj = getattr(mod, name, None)
            if obj is None:
                continue
            if inspect.isclass(obj):
                out += [f"### class `{name}{_sig(obj)}`", "", _doc(obj), ""]
                if name == "LogMachine":
                    continue  # its methods are hypothesis rules, described by the class docstring
                for mname, member in sorted(vars(obj).items()):
                    if mname.startswith("_") and mname not in ("__init__",):
                        continue
                    if mname == "__init__":
                        continue
                    if isinstance(member, property):
                        out += [f"#### `{name}.{mname}` (property)", "", _doc(member), ""]
                    elif inspect.isfunction(member) or isinstance(member, (classmethod, staticmethod)):
                        fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                        out += [f"#### `{name}.{mname}{_sig(fn)}`", "", _doc(fn), ""]
            elif inspect.isfunction(obj):
                out += [f"### `{name}{_sig(obj)}`", "", _doc(obj), ""]
            else:
                out += [f"### `{name}`", "", f"`{obj!r}`" if not isinstance(obj, frozenset) else "a frozenset of feature names", ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    path = pathlib.Path(__file__).with_name("api.md")
    path.write_text(render())
    print(f"wrote {path}")
