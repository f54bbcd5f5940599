"""pylog serve: where the merged pieces meet (the loop's partition cache and admin threads,
the integrity set's fences and reopens, the bounds set's response pool).

A fenced partition's writer is replaced only by the reopen, which cuts the refused
appends that recovery finds: no other request opens a writer for it behind the reopen's
back, and no request shows offsets past what was acknowledged.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("kio")

from serve_util import BrokerProcess, batch, call, connect, fetch, fetched_values, frame, produce  # noqa: E402
from test_serve_integrity import _codes, _fill, _stop_traced, _strace, needs_strace  # noqa: E402
from test_serve_integrity import small_disk as small_disk  # noqa: E402  (a fixture)

import pylog  # noqa: E402
from pylog.serve.fencing import Gate  # noqa: E402


def _latest(s, topic: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    r = call(s, frame(2, 7, {"topics": [{"name": topic, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]}), 2, 7)
    p = r.topics[0].partitions[0]
    return p.error_code, p.offset


def _fetched(s, topic: str, offset: int = 0) -> tuple[int, int, list[bytes]]:  # type: ignore[no-untyped-def]
    r = call(s, fetch(topic, offset), 1, 12)
    p = r.responses[0].partitions[0]
    return p.error_code, p.high_watermark, [v for _, v in fetched_values(r)]


@needs_strace
def test_listoffsets_of_a_fenced_partition_stops_at_the_acknowledged_end(tmp_path):
    """The fdatasync of a Produce's records fails with EIO (strace, the first two
    fdatasyncs fail): the batch of two records is refused and the partition fenced. A
    produce after the back-off tries the reopen, which fails too (the fenced writer is
    closed, none replaces it). ListOffsets (latest) then says 1, what was acknowledged and
    the high watermark Fetch shows; it said 3 on the merge: ListOffsets opened a writer of
    its own behind the reopen's back (its recovery keeps the refused records, the reopen
    would have cut them) and did not cap it, so a consumer starting at the latest offset
    would skip the next two acknowledged records."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("d", config=pylog.LogConfig(fsync="always")).append(b"a0")
    b = BrokerProcess(root, "--fence-backoff", "0.2", prefix=_strace("fdatasync:error=EIO:when=1..2"))
    try:
        with connect(b) as s:
            assert _codes(call(s, produce("d", batch([b"x1", b"x2"])), 0, 9)) == [56]
            assert _fetched(s, "d") == (0, 1, [b"a0"])
            time.sleep(0.3)  # the back-off is over: the next produce tries the reopen
            assert _codes(call(s, produce("d", batch([b"y"])), 0, 9)) == [56]
            got = [_latest(s, "d") for _ in range(4)]
            assert (0, 1) in got, got
            assert all(code == 56 or off == 1 for code, off in got), got
            assert _fetched(s, "d") == (0, 1, [b"a0"])
            time.sleep(0.3)
            assert _codes(call(s, produce("d", batch([b"y"])), 0, 9)) == [0]  # reopened at last
            assert _latest(s, "d") == (0, 2)
            assert _fetched(s, "d") == (0, 2, [b"a0", b"y"])
    finally:
        assert _stop_traced(b, signal.SIGTERM) == 0
    assert "Traceback" not in b.stderr(), b.stderr()


def test_delete_topic_during_a_reopen_answers_the_produce(small_disk):  # noqa: F811
    """DeleteTopics lands (in an admin thread) while an append thread reopens the fenced
    partition, after the reopen opened the new writer and reloaded its producer state. The
    Produce is answered with an error code; on the merge
    the reopen's ``del self._fences[key]`` raised KeyError (the delete had dropped the
    fence), which closed the producer's connection. The topic made again takes appends."""
    from pylog.serve.broker import Broker

    root = str(small_disk / "root")
    filler = str(small_disk / "filler")
    broker = Broker(root, port=0, fence_backoff=0)
    try:
        broker.store.create_topic("d", config=pylog.LogConfig(flush_messages=1))
        assert broker._append_checked("d", 0, batch([b"a0"]))[0] == 0
        _fill(filler, leave=8192)
        assert broker._append_checked("d", 0, batch([bytes([65 + i]) * 6000 for i in range(20)]))[0] == 56
        assert ("d", 0) in broker._fences
        os.unlink(filler)
        load = broker.producers.load

        def delete_meanwhile(topic: str, i: int, log: pylog.Log) -> None:
            load(topic, i, log)
            broker.producers.load = load  # type: ignore[method-assign]
            broker.delete_topic(topic)  # what an admin thread's DeleteTopics does

        broker.producers.load = delete_meanwhile  # type: ignore[method-assign]
        code = broker._append_checked("d", 0, batch([b"b"]))[0]
        assert code in (3, 6, 56), code  # unknown partition, not leader, storage error
        assert "d" not in broker.store.topics()
        broker.store.create_topic("d")
        assert broker._append_checked("d", 0, batch([b"c"]))[:2] == (0, 0)
    finally:
        broker.close()


def test_delete_topic_during_an_append_answers_the_produce(tmp_path):
    """DeleteTopics lands (in an admin thread) while an append thread appends to the
    topic, after the append opened the partition and loaded its producer state. The
    Produce is answered NOT_LEADER_OR_FOLLOWER (the client asks for metadata again); on the
    merge reading the closed log's next offset (for the acknowledged end, or for its newest
    time once inside the partition's gate) raised LogClosedError, which closed the
    producer's connection."""
    from pylog.serve.broker import Broker

    broker = Broker(str(tmp_path / "root"), port=0)
    try:
        broker.store.create_topic("d")
        assert broker._append_checked("d", 0, batch([b"a0"]))[:2] == (0, 0)
        load = broker.producers.load

        def delete_meanwhile(topic: str, i: int, log: pylog.Log) -> None:
            load(topic, i, log)
            broker.producers.load = load  # type: ignore[method-assign]
            broker.delete_topic(topic)  # what an admin thread's DeleteTopics does

        broker.producers.load = delete_meanwhile  # type: ignore[method-assign]
        assert broker._append_checked("d", 0, batch([b"b"])) == (6, -1, -1)
        assert "d" not in broker.store.topics() and ("d", 0) not in broker._acked
        broker.store.create_topic("d")
        assert broker._append_checked("d", 0, batch([b"c"]))[:2] == (0, 0)
        # the delete lands once the append entered the partition's gate (the newest time
        # is then read from the log: nothing appended by this broker yet)
        broker.store.create_topic("e").append(b"e0")
        gate = broker._gate

        class Deleting(Gate):
            def enter(self, exclusive: bool) -> None:
                super().enter(exclusive)
                broker._gate = gate  # type: ignore[method-assign]
                broker.delete_topic("e")

        broker._gate = lambda key: Deleting()  # type: ignore[method-assign]
        assert broker._append_checked("e", 0, batch([b"b"])) == (6, -1, -1)
        assert "e" not in broker.store.topics()
    finally:
        broker.close()


def test_delete_topic_right_after_an_append_answers_the_produce(tmp_path):
    """DeleteTopics lands (in an admin thread) right after an append of 10 records wrote
    them out, before the append answered: the Produce is answered (NOT_LEADER_OR_FOLLOWER)
    and the topic made again takes appends. On the merge the append read the closed log's
    start offset for its answer, outside any handler: LogClosedError closed the
    producer's connection."""
    from pylog.serve.broker import Broker

    broker = Broker(str(tmp_path / "root"), port=0)
    try:
        broker.store.create_topic("d")
        log, err = broker.partition("d", 0)
        assert log is not None and not err
        write_out = log.write_out

        def delete_after() -> None:
            write_out()
            broker.delete_topic("d")  # what an admin thread's DeleteTopics does

        log.write_out = delete_after  # type: ignore[method-assign]
        assert broker._append_checked("d", 0, batch([b"v%d" % i for i in range(10)])) == (6, -1, -1)
        broker.store.create_topic("d")
        assert broker._append_checked("d", 0, batch([b"a0"]))[:2] == (0, 0)
    finally:
        broker.close()
