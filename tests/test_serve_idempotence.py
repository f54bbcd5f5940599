"""pylog serve: idempotent producers (InitProducerId, sequence numbers checked on Produce).

A retried batch is answered as a duplicate and not appended twice, a gap is refused, and
the state survives a broker SIGKILL, so that a confluent-kafka producer with
``enable.idempotence`` whose connections are cut mid-request, and whose broker is killed
and restarted, ends with every record exactly once.
"""
from __future__ import annotations

import signal
import socket
import struct
import threading
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")

from conftest import record_syncs  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    batch,
    call,
    connect,
    create_topic,
    frame,
    init_producer_id,
    produce,
    produce_result,
)

import pylog  # noqa: E402
from pylog._backend import impl  # noqa: E402


def _idem(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    """A RecordBatch of ``values`` stamped with a producer id, epoch and base sequence."""
    out = bytearray(batch(values))
    struct.pack_into(">qhi", out, 43, pid, epoch, seq)
    struct.pack_into(">I", out, 17, impl.crc32c(bytes(out[21:])))
    return bytes(out)


def _values(root: str, topic: str, partitions: int = 1) -> list[bytes]:
    store = pylog.LogStore(root)
    try:
        t = store.topic(topic)
        out = []
        for p in range(partitions):
            log = t.reader(p)
            if log.readonly:
                log.refresh()
            out += [bytes(r.value) for r in log.read_batch(log.start_offset, max_bytes=1 << 30)]
        return out
    finally:
        store.close()



def test_retry_duplicate_gap_epoch_and_restart(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root)
    try:
        with connect(b) as s:
            create_topic(s, "i")
            pid, epoch = init_producer_id(s)
            assert init_producer_id(s)[0] != pid  # every producer its own id
            assert produce_result(call(s, produce("i", _idem([b"a", b"b"], pid, epoch, 0)), 0, 9)) == (0, 0)
            # the same batch again (a retry): the first answer, nothing appended
            assert produce_result(call(s, produce("i", _idem([b"a", b"b"], pid, epoch, 0)), 0, 9)) == (0, 0)
            assert produce_result(call(s, produce("i", _idem([b"c"], pid, epoch, 2)), 0, 9)) == (0, 2)
            # a gap: sequence 5 after 2
            assert produce_result(call(s, produce("i", _idem([b"x"], pid, epoch, 5)), 0, 9))[0] == 45
            # an older epoch after a bump
            r = call(s, frame(22, 4, {"transactional_id": None, "transaction_timeout": 60000, "producer_id": pid,
                                      "producer_epoch": epoch}), 22, 4)
            assert r.error_code == 0 and (r.producer_id, r.producer_epoch) == (pid, epoch + 1)
            assert produce_result(call(s, produce("i", _idem([b"d"], pid, epoch + 1, 0)), 0, 9)) == (0, 3)
            assert produce_result(call(s, produce("i", _idem([b"y"], pid, epoch, 3)), 0, 9))[0] == 47
            # a transactional id gets its own producer id (tests/test_serve_txn.py)
            r = call(s, frame(22, 4, {"transactional_id": "tx", "transaction_timeout": 60000, "producer_id": -1,
                                      "producer_epoch": -1}), 22, 4)
            assert r.error_code == 0 and r.producer_id not in (-1, pid)
        b.stop(signal.SIGKILL)
        b = BrokerProcess(root)
        with connect(b) as s:  # after a SIGKILL: the retry is still known, the gap still refused
            assert produce_result(call(s, produce("i", _idem([b"d"], pid, epoch + 1, 0)), 0, 9)) == (0, 3)
            assert produce_result(call(s, produce("i", _idem([b"z"], pid, epoch + 1, 3)), 0, 9))[0] == 45
            assert produce_result(call(s, produce("i", _idem([b"e"], pid, epoch + 1, 1)), 0, 9)) == (0, 4)
            assert init_producer_id(s)[0] > pid  # ids are not reused after a restart
        assert _values(root, "i") == [b"a", b"b", b"c", b"d", b"e"]
    finally:
        b.stop()


class _Proxy:
    """A TCP proxy on a free loopback port to ``port`` that, while ``cut`` is set, closes
    every connection after forwarding part of a client's request (mid-request)."""

    def __init__(self) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.target = 0
        self.cut = threading.Event()
        self.cuts = 0
        self.seen = 0
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.lsock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                continue
            threading.Thread(target=self._pipe, args=(c,), daemon=True).start()

    def _pipe(self, c: socket.socket) -> None:
        try:
            u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            c.close()
            return
        for sock in (c, u):
            sock.settimeout(0.2)
        drop_answer = False
        try:
            while not self.stop.is_set():
                for src, dst, upstream in ((c, u, True), (u, c, False)):
                    try:
                        data = src.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        return
                    if not upstream and drop_answer:
                        return  # the request was appended; its answer is lost
                    if upstream and self.cut.is_set() and len(data) > 150:  # a Produce
                        self.seen += 1
                        if self.seen % 3 == 0:
                            self.cuts += 1
                            dst.sendall(data[: len(data) // 2])  # half a request reaches the broker
                            return
                        if self.seen % 3 == 1:
                            self.cuts += 1
                            drop_answer = True
                    dst.sendall(data)
        except OSError:
            return
        finally:
            c.close()
            u.close()


def test_confluent_idempotent_producer_drops_and_sigkill_exactly_once(tmp_path):
    root = str(tmp_path / "root")
    proxy = _Proxy()
    b = BrokerProcess(root, "--advertise", f"127.0.0.1:{proxy.port}")
    proxy.target = b.port
    try:
        with connect(b) as s:
            create_topic(s, "x", partitions=2)
        errors: list = []  # type: ignore[type-arg]
        p = ck.Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "enable.idempotence": True,
                         "linger.ms": 2, "batch.num.messages": 20, "retry.backoff.ms": 50,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200,
                         "message.timeout.ms": 120000})
        n = 3000

        def done(err, msg):  # type: ignore[no-untyped-def]
            if err is not None:
                errors.append(err)

        for i in range(n):
            if i == 500:
                proxy.cut.set()  # connections cut mid-request from here on
            if i == 1500:
                proxy.cut.clear()
                p.flush(60)
                b.stop(signal.SIGKILL)  # the broker dies; a new one takes over the same root
                b = BrokerProcess(root, "--advertise", f"127.0.0.1:{proxy.port}")
                proxy.target = b.port
            if i == 2000:
                proxy.cut.set()
            if i == 2600:
                proxy.cut.clear()
            p.produce("x", value=b"v%d" % i, partition=i % 2, on_delivery=done)
            p.poll(0)
            if i % 10 == 0:
                time.sleep(0.01)
        proxy.cut.clear()
        assert p.flush(120) == 0
        assert not errors, errors[:5]
        assert proxy.cuts > 0
        got = _values(root, "x", 2)
        assert len(got) == n and sorted(got) == sorted(b"v%d" % i for i in range(n)), \
            f"{len(got)} records, {len(set(got))} distinct"
    finally:
        proxy.stop.set()
        b.stop()


@pytest.mark.parametrize("policy", ["always", "interval"])
def test_state_entry_fsynced_with_the_records_before_the_answer(tmp_path, monkeypatch, policy):
    """Under fsync=always an acknowledged batch's records are durable before the answer, so
    its producer state entry must be too, and before them (a power cut keeping the records
    and losing the entry would let a retry append them twice); under interval neither is
    fsynced per batch."""
    from pylog.serve.broker import Broker

    root = str(tmp_path / "root")
    broker = Broker(root, port=0)
    try:
        broker.store.create_topic("d", partitions=1, config=pylog.LogConfig(fsync=policy))
        synced = record_syncs(monkeypatch)
        err, base, _ = broker._append_checked("d", 0, _idem([b"a", b"b"], 1000, 0, 0))
        assert (err, base) == (0, 0)
        state = [p for p in synced if p.endswith("partition-0.producers")]
        assert len(state) == (1 if policy == "always" else 0), synced
        synced.clear()
        assert broker._append_checked("d", 0, _idem([b"a", b"b"], 1000, 0, 0))[:2] == (0, 0)  # a retry
        assert broker._append_checked("d", 0, _idem([b"c"], 1000, 0, 2))[:2] == (0, 2)
        assert len([p for p in synced if p.endswith("partition-0.producers")]) == (1 if policy == "always" else 0)
    finally:
        broker.close()
