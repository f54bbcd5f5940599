"""Chooses the C core (``native``) or its pure-Python twin (``pure``).

``PYLOG_BACKEND=native|pure`` forces one; by default pylog uses ``native`` when the
extension is built and falls back to ``pure`` with a warning otherwise.
"""
from __future__ import annotations

import os
import warnings

__all__ = ["NAME", "impl"]

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
