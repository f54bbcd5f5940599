"""MkDocs hook of the documentation site: a public name of the API reference without a
docstring is a warning, so the strict build (``mkdocs build --strict``) fails on it."""
from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys

log = logging.getLogger("mkdocs.plugins.pylog")

#: The modules of docs/api.md, and (None) every public name of each, or the names listed.
API = [
    ("pylog", ["Log", "LogConfig", "Record", "crc32c", "LogStore", "Topic", "Consumer"]),
    ("pylog.topics", None),
    ("pylog.consumer", None),
    ("pylog.groups", None),
    ("pylog.compaction", None),
    ("pylog.errors", None),
    ("pylog.testing", ["CrashFS", "PowerCut", "simulate_crash", "LogMachine"]),
    ("pylog.arrow", None),
    ("pylog.serve.server", ["Server", "serve"]),
    ("pylog.serve.security", ["add_user"]),
    ("pylog.serve.headers", ["encode_headers", "decode_headers", "is_headers"]),
]


def undocumented() -> list[str]:
    """The public names (and their public methods and properties) without a docstring."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    bare = []
    for modname, names in API:
        try:
            mod = importlib.import_module(modname)
        except ImportError:  # an optional extra that is not installed
            continue
        for name in names or getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if obj is None or isinstance(obj, (str, frozenset, int)):
                continue
            if not inspect.getdoc(obj):
                bare.append(f"{modname}.{name}")
            if inspect.isclass(obj) and name != "LogMachine":
                members: dict = {}  # pylog.Log's methods live in the parts it inherits
                for klass in reversed(inspect.getmro(obj)):
                    if klass.__module__.split(".")[0] == "pylog":
                        members.update(vars(klass))
                for mname, member in members.items():
                    if mname.startswith("_"):
                        continue
                    fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                    if (inspect.isfunction(fn) or isinstance(member, property)) and not (fn.__doc__ or "").strip():
                        bare.append(f"{modname}.{name}.{mname}")
    return bare


def on_pre_build(config, **kwargs):  # noqa: ANN001, D103
    for name in undocumented():
        log.warning(f"public name without a docstring: {name}")
