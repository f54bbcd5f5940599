"""A griffe extension for the API reference: pylog's docstrings use Sphinx roles
(``:class:`~pylog.Log```, ``:meth:`scan```) and double backticks, which Markdown does not know;
they are shown as inline code."""
from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")
_DOUBLE = re.compile(r"``([^`]+)``")


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` and ````code```` in every docstring as ```code```."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None:
            text = _ROLE.sub(lambda m: f"`{m.group(1)}`", obj.docstring.value)
            obj.docstring.value = _DOUBLE.sub(r"`\1`", text)
