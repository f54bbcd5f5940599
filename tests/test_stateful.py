"""The Log against a list model (pylog.testing.LogMachine), under hypothesis."""
from conftest import scaled
from hypothesis import settings

from pylog.testing import LogMachine

LogMachine.TestCase.settings = settings(
    max_examples=scaled(40, 400), stateful_step_count=scaled(40, 80), deadline=None
)
TestLogMachine = LogMachine.TestCase


class _Draw:
    """A stand-in for hypothesis's ``data`` that always draws ``value``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def draw(self, _strategy):
        return self.value


def test_a_zeroed_block_past_the_flushed_records(monkeypatch):
    """CI's falsifying example, replayed: a crash zeroes 512 bytes from the first frame on
    (nothing flushed), with whole frames after them. Recovery keeps them and reports the
    damage (it cuts only a torn tail); the machine checks the damage lies past every
    flushed record and cuts it as the operator would, and every record left reads back."""
    monkeypatch.setattr("pylog.testing.note", lambda _message: None)
    m = LogMachine()
    try:
        m.open(buffer=0, cached=0, initial=0, interval=0, segment_bytes=4096)
        m.append(key=b"\0\0\0", value=b"\0\0\0")
        m.append_batch(in_place=False, values=[b""], with_keys=True)
        m.append_batch(in_place=False, values=[b""] * 6, with_keys=False)
        m.append_batch(in_place=False, values=[b""] * 7, with_keys=False)
        assert len(m.model) == 15
        m.crash(data=_Draw(32), mode="zero")
        m.offsets_agree()
        assert len(m.model) == 0  # the damage began at offset 0: nothing is left
        m.append(key=None, value=b"after")
        m.offsets_agree()
        m.read(data=_Draw(0))
    finally:
        m.teardown()
