"""The Log against a list model (pylog.testing.LogMachine), under hypothesis."""
from hypothesis import settings

from pylog.testing import LogMachine

from conftest import scaled

LogMachine.TestCase.settings = settings(
    max_examples=scaled(40, 400), stateful_step_count=scaled(40, 80), deadline=None
)
TestLogMachine = LogMachine.TestCase
