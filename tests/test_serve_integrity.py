"""pylog serve: what a client was told is what the log holds, through every failure.

Idempotent producers get no duplicate when the broker is killed at any fdatasync (strace
fault injection on the broker process) or restarted; producer state that cannot be loaded
or written is answered, not a closed connection; storage errors on one partition are
answered with Kafka's code on that partition while the connection stays open; transient
resource errors (EMFILE) do not fence; a fenced partition is reopened without a restart.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import struct

import pytest

pytest.importorskip("kio")

from conftest import LONG  # noqa: E402
from serve_util import BrokerProcess, batch, call, connect, frame, produce  # noqa: E402

import pylog  # noqa: E402
from pylog._backend import impl  # noqa: E402

STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(STRACE is None, reason="strace is not installed")


def _idem(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    """A RecordBatch of ``values`` stamped with a producer id, epoch and base sequence."""
    out = bytearray(batch(values))
    struct.pack_into(">qhi", out, 43, pid, epoch, seq)
    struct.pack_into(">I", out, 17, impl.crc32c(bytes(out[21:])))
    return bytes(out)


def _values(root: str, topic: str, partition: int = 0) -> list[bytes]:
    store = pylog.LogStore(root, readonly=True)
    try:
        log = store.topic(topic).reader(partition)
        return [bytes(r.value) for r in log.read_batch(log.start_offset, max_bytes=1 << 30)]
    finally:
        store.close()


def _init(s: socket.socket) -> tuple[int, int]:
    r = call(s, frame(22, 4, {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
                              "producer_epoch": -1}), 22, 4)
    assert r.error_code == 0 and r.producer_id >= 0
    return r.producer_id, r.producer_epoch


def _result(r):  # type: ignore[no-untyped-def]
    p = r.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def _strace(spec: str) -> list[str]:
    """A command prefix running the broker under strace with the fault ``spec``."""
    return [STRACE or "strace", "-f", "-qq", "-o", os.devnull, "-e", f"inject={spec}"]


def _tracee(b: BrokerProcess) -> int | None:
    """The pid of the broker that strace (``b.proc``) runs, or None once it is gone."""
    try:
        with open(f"/proc/{b.proc.pid}/task/{b.proc.pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _stop_traced(b: BrokerProcess, sig: int = signal.SIGKILL) -> int:
    """Stop a broker run under strace: signal the broker itself (strace only detaches
    from it when signalled), then wait for strace; returns strace's exit status."""
    pid = _tracee(b)
    if pid is not None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    try:
        return b.proc.wait(30)
    finally:
        b.stop(signal.SIGKILL)


# -- 1. no duplicate across a SIGKILL at any fdatasync ---------------------------------------
@needs_strace
@pytest.mark.parametrize("when", [1, 2, 3, 4, 5, 6] if LONG else [1, 2])
def test_sigkill_at_fdatasync_then_retry_is_a_duplicate(tmp_path, when):
    """The broker is killed (SIGKILL, by strace) at its Nth fdatasync while it appends
    idempotent batches under flush.messages=1 (each batch: its intent's fdatasync, then its
    records'); after a restart the producer sends again every batch from the first one it
    got no answer for: a batch whose records survived is answered as the duplicate it is
    (same base offset), one whose records did not is appended; the log holds each record
    exactly once."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("d", config=pylog.LogConfig(fsync="always")).append(b"a0")
    pid, epoch = 1000, 0  # a producer id the partition has no state for is taken at any sequence
    sent = [[b"v%d-%d" % (k, j) for j in range(5)] for k in range(3)]
    answered = 0
    b = BrokerProcess(root, prefix=_strace(f"fdatasync:signal=SIGKILL:when={when}"))
    try:
        with connect(b) as s:
            for k, vals in enumerate(sent):
                r = call(s, produce("d", _idem(vals, pid, epoch, 1 + 5 * k)), 0, 9)
                if r is None:
                    break
                assert _result(r) == (0, 1 + 5 * k)
                answered += 1
    finally:
        _stop_traced(b)
    assert answered == (when - 1) // 2  # killed at the batch whose fdatasync it was
    b = BrokerProcess(root)
    try:
        with connect(b) as s:
            for k in range(answered, 3):
                assert _result(call(s, produce("d", _idem(sent[k], pid, epoch, 1 + 5 * k)), 0, 9)) == (0, 1 + 5 * k)
            # the next batch follows on
            assert _result(call(s, produce("d", _idem([b"n"], pid, epoch, 16)), 0, 9)) == (0, 16)
    finally:
        b.stop()
    assert _values(root, "d") == [b"a0", *sent[0], *sent[1], *sent[2], b"n"]
