"""Chooses the C core (``native``) or its pure-Python twin (``pure``).

``PYLOG_BACKEND=native|pure`` forces one; by default pylog uses ``native`` when the
extension is built and falls back to ``pure`` with a warning otherwise.

``speedups`` is the CPython extension :mod:`pylog._speedups` (Records, reads and scans made
in C) when the native backend runs and the extension is built, else None: then pylog runs
the same operations in Python over the backend. The pure backend never uses it (it is the
test oracle, with no C at all); ``PYLOG_SPEEDUPS=0`` turns it off under ``native`` too.
"""
from __future__ import annotations

import importlib
import os
import warnings
from typing import Any

__all__ = ["NAME", "impl", "speedups"]

_choice = os.environ.get("PYLOG_BACKEND", "").strip().lower()
if _choice not in ("", "native", "pure"):
    raise ImportError(f"PYLOG_BACKEND={_choice!r}: expected 'native' or 'pure'")

if _choice == "pure":
    from pylog import _pure as impl
else:
    try:
        from pylog import _native as impl  # type: ignore[no-redef]
    except ImportError as e:
        if _choice == "native":
            raise
        warnings.warn(f"pylog's C core is not built ({e}); using the pure-Python backend", RuntimeWarning,
                      stacklevel=2)
        from pylog import _pure as impl

NAME: str = impl.NAME

speedups: Any = None
if NAME == "native" and os.environ.get("PYLOG_SPEEDUPS", "").strip() != "0":
    try:
        speedups = importlib.import_module("pylog._speedups")  # a compiled module: no import edge
    except ImportError:  # not built: the Python code paths
        speedups = None
