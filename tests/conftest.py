"""Shared fixtures and hypothesis profiles.

Profiles (``HYPOTHESIS_PROFILE``): ``default`` for a quick local run, ``ci`` (set by
``.ci/run``), ``expensive`` (also chosen by ``PYLOG_LONG=1``) for the long soak.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

LONG = os.environ.get("PYLOG_LONG") == "1"

settings.register_profile("default", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("expensive", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "expensive" if LONG else "default"))


def scaled(ci: int, long: int) -> int:
    """An iteration count: ``ci`` normally, ``long`` with PYLOG_LONG=1."""
    return long if LONG else ci


@pytest.fixture
def log_dir(tmp_path):
    """A fresh directory for one Log."""
    return str(tmp_path / "log")


@pytest.fixture
def make_log(log_dir):
    """Factory for Logs on ``log_dir``; closes them all at teardown."""
    import pylog

    logs = []

    def make(path=None, **kw):
        log = pylog.Log(path or log_dir, **kw)
        logs.append(log)
        return log

    yield make
    for log in logs:
        try:
            log.close()
        except Exception:
            pass
