"""pylog serve: one client cannot hold the broker's transactions (issue 28, txn_limits.py).

A hostile client opens Kafka transactions over many transactional ids and partitions,
stages a record in each and never ends them. The partitions open transactions hold are
bounded per client (an IP address here: the hostile client connects from 127.0.0.2 and
127.0.0.3, a well-behaved confluent-kafka producer from 127.0.0.1) and in all, so the
broker's descriptors stay bounded and other clients' transactions go on; past a bound the
answer is CONCURRENT_TRANSACTIONS (retriable) or, for a transaction that can never fit,
POLICY_VIOLATION. Transactional ids are bounded too (the id idle longest makes way) and
expire when idle. The counts survive a broker restart.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from serve_util import BrokerProcess, call, frame, wait_for  # noqa: E402
from test_serve_txn import _add, _end, _init, _library, _send, _topics, _txn_batch  # noqa: E402

from pylog.serve.txn_coordinator import STATE_DIR  # noqa: E402

POLICY_VIOLATION, CONCURRENT, MAPPING = 44, 51, 49
LIMITS = ("--max-txn-partitions", "12", "--max-txn-partitions-per-client", "8")


def _from(b: BrokerProcess, ip: str) -> socket.socket:
    """A connection to the broker from the loopback address ``ip`` (another client)."""
    return socket.create_connection(("127.0.0.1", b.port), timeout=20, source_address=(ip, 0))


def _fds(b: BrokerProcess) -> int:
    return len(os.listdir(f"/proc/{b.proc.pid}/fd"))


def _add_offsets(s: socket.socket, tid: str, pid: int, epoch: int, group: str) -> int:
    r = call(s, frame(25, 3, {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
                              "group_id": group}), 25, 3)
    return int(r.error_code)


def _offsets(s: socket.socket, tid: str, pid: int, epoch: int, group: str, topic: str, *parts: int) -> list[int]:
    r = call(s, frame(28, 3, {"transactional_id": tid, "group_id": group, "producer_id": pid,
                              "producer_epoch": epoch, "generation_id": -1, "member_id": "",
                              "topics": [{"name": topic, "partitions": [
                                  {"partition_index": p, "committed_offset": 1, "committed_leader_epoch": -1,
                                   "committed_metadata": ""} for p in parts]}]}), 28, 3)
    return [int(x.error_code) for t in r.topics for x in t.partitions]


def _hold(s: socket.socket, tid: str, topic: str, parts: list[int], timeout: int = 60000) -> tuple[int, int, list[int]]:
    """Open a transaction of ``tid`` on ``parts`` and stage a record in each: (pid, epoch,
    AddPartitionsToTxn's codes); nothing staged when they were refused."""
    r = _init(s, tid, timeout=timeout)
    assert r.error_code == 0
    pid, epoch = r.producer_id, r.producer_epoch
    codes = _add(s, tid, pid, epoch, topic, *parts)
    if not any(codes):
        for p in parts:
            assert _send(s, topic, p, _txn_batch([b"held"], pid, epoch, 0)) == 0
    return pid, epoch, codes


def test_one_client_cannot_hold_the_transactions(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"), *LIMITS)
    try:
        _topics(b, big=24, ok=3)
        with _from(b, "127.0.0.1") as s:  # every partition opened (so the count below is staging only)
            for p in range(24):
                _send(s, "big", p, b"")
        base = _fds(b)
        with _from(b, "127.0.0.2") as m:
            pid0, ep0, codes = _hold(m, "m0", "big", [0, 1, 2, 3, 4])
            assert codes == [0] * 5
            _pid1, _ep1, codes = _hold(m, "m1", "big", [5, 6, 7])
            assert codes == [0] * 3  # 8: the client's bound
            # more of the same client: refused, retriable, nothing staged
            pid2, ep2, codes = _hold(m, "m2", "big", [8])
            assert codes == [CONCURRENT]
            assert _send(m, "big", 8, _txn_batch([b"x"], pid2, ep2, 0)) == 48  # INVALID_TXN_STATE
            assert _add_offsets(m, "m2", pid2, ep2, "g") == CONCURRENT  # a group counts too
            # a transaction that alone can never fit: abortable
            _p, _e, codes = _hold(m, "m3", "big", list(range(9, 18)))
            assert codes == [POLICY_VIOLATION] * 9
            # many more tries, over many ids: every one refused, the descriptors stay bounded
            for i in range(30):
                _p, _e, codes = _hold(m, f"x{i}", "big", [10 + i % 14])
                assert codes == [CONCURRENT]
            held = _fds(b) - base
            assert 0 < held <= 4 * 8 + 4, held  # four per staging Log (docs/serve.md), eight of them
            with _from(b, "127.0.0.3") as m3:  # a second hostile address: 4 more, then the total's bound
                _p, _e, codes = _hold(m3, "n0", "big", [16, 17, 18, 19])
                assert codes == [0] * 4
                _p, _e, codes = _hold(m3, "n1", "big", [20])
                assert codes == [CONCURRENT]  # 12 in all

                # a well-behaved transactional producer from another address waits (its
                # client retries CONCURRENT_TRANSACTIONS), then commits once the holders end
                done: dict[str, object] = {}

                def produce() -> None:
                    p = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "good", "linger.ms": 5})
                    try:
                        p.init_transactions(20)
                        p.begin_transaction()
                        for part in range(3):
                            p.produce("ok", b"v%d" % part, partition=part)
                        p.commit_transaction(60)
                        done["ok"] = True
                    except Exception as e:  # reported by the assertion below
                        done["error"] = repr(e)

                t = threading.Thread(target=produce)
                t.start()
                time.sleep(3)
                assert "ok" not in done and "error" not in done, done  # still waiting: 12 held
                assert _end(m, "m0", pid0, ep0, False) == 0  # five partitions freed
                t.join(60)
                assert done.get("ok") is True, done
        assert _library(b.root, "ok") == [b"v0", b"v1", b"v2"]
        assert not any(v == b"held" for v in _library(b.root, "big"))
    finally:
        b.stop()


def test_timeouts_free_the_holdings_and_restarts_count_them(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root, *LIMITS)
    try:
        _topics(b, t=10)
        with _from(b, "127.0.0.2") as m:
            _hold(m, "short", "t", [0, 1, 2, 3], timeout=1000)
            _hold(m, "long", "t", [4, 5, 6, 7])
            assert _hold(m, "more", "t", [8])[2] == [CONCURRENT]
            # the short one times out (the broker aborts it): its four partitions are free
            assert wait_for(lambda: _hold(m, "more", "t", [8])[2] == [0], timeout=15)
        os.kill(b.proc.pid, signal.SIGKILL)
        b.proc.wait(10)
    finally:
        b.stop()
    # a restart restores the open transactions ("long" and "more": 5 partitions of
    # 127.0.0.2) and counts them against their client
    b = BrokerProcess(root, *LIMITS)
    try:
        with _from(b, "127.0.0.2") as m:
            assert _hold(m, "again", "t", [9, 0, 1])[2] == [0] * 3  # 8
            assert _hold(m, "again2", "t", [2])[2] == [CONCURRENT]
        with _from(b, "127.0.0.1") as s:
            assert _hold(s, "other", "t", [2, 3, 4])[2] == [0] * 3  # 11 in all, 3 of this client
            assert _hold(s, "other2", "t", [5, 6])[2] == [CONCURRENT] * 2  # 13 > 12
    finally:
        b.stop()


def test_offsets_sent_count_as_partitions(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"), "--max-txn-partitions", "6", "--max-txn-partitions-per-client", "6")
    try:
        _topics(b, src=8)
        with _from(b, "127.0.0.2") as m:
            r = _init(m, "o")
            pid, epoch = r.producer_id, r.producer_epoch
            assert _add_offsets(m, "o", pid, epoch, "g") == 0  # 1
            assert _offsets(m, "o", pid, epoch, "g", "src", 0, 1, 2, 3) == [0] * 4  # 5
            assert _offsets(m, "o", pid, epoch, "g", "src", 0, 1) == [0, 0]  # the same ones again: 5
            assert _offsets(m, "o", pid, epoch, "g", "src", 4, 5) == [POLICY_VIOLATION] * 2  # 7 > 6: never
            assert _offsets(m, "o", pid, epoch, "g", "src", 4) == [0]  # 6
            assert _end(m, "o", pid, epoch, True) == 0  # committed: the group has them, the holding freed
            assert _add(m, "o", pid, epoch, "src", *range(6)) == [0] * 6
    finally:
        b.stop()
    off = os.path.join(str(tmp_path / "root"), "src", "~consumers", "g")
    assert sorted(os.listdir(off)) == [f"partition-{p}.offset" for p in range(5)]


def _state_files(root: str) -> int:
    return len([n for n in os.listdir(os.path.join(root, STATE_DIR)) if n.endswith(".json")])


def test_transactional_ids_are_bounded_and_expire(tmp_path):
    root = str(tmp_path / "root")
    b = BrokerProcess(root, "--max-transactional-ids", "4")
    try:
        _topics(b, t=4)
        with _from(b, "127.0.0.2") as m:
            first = _init(m, "t0")
            for i in range(1, 4):
                assert _init(m, f"t{i}").error_code == 0
                time.sleep(0.05)
            assert _init(m, "t1").error_code == 0  # used again: t0 is the one idle longest
            assert _state_files(root) == 4
            assert _init(m, "t4").error_code == 0  # takes t0's place
            assert _state_files(root) == 4
            # t0's old producer is unknown now (still fenced); t0 starts afresh with a new id
            assert _add(m, "t0", first.producer_id, first.producer_epoch, "t", 0) == [MAPPING]
            again = _init(m, "t0")  # takes t2's place (t1 and t3..t4 are newer)
            assert again.error_code == 0 and again.producer_id != first.producer_id
            # every known id with a transaction open: a new id waits (retriable)
            for i, tid in enumerate(["t0", "t1", "t3", "t4"]):
                r = _init(m, tid)
                assert _add(m, tid, r.producer_id, r.producer_epoch, "t", i) == [0]
            assert _init(m, "t5").error_code == CONCURRENT
            assert _state_files(root) == 4
            # more new ids: each refused, the files stay at the bound
            for i in range(40):
                assert _init(m, f"flood{i}").error_code == CONCURRENT
            assert _state_files(root) == 4
    finally:
        b.stop()
    # idle ids expire (transactional.id.expiration.ms, here from a server.properties file);
    # those with an open transaction do not
    conf = tmp_path / "server.properties"
    conf.write_text("transactional.id.expiration.ms=1000\n")
    b = BrokerProcess(root, "--config", str(conf))
    try:
        with _from(b, "127.0.0.2") as m:
            r = _init(m, "idle")
            assert r.error_code == 0
            assert wait_for(lambda: _state_files(root) == 4, timeout=20)  # t0..t4's 4 open ones stay
            assert _add(m, "idle", r.producer_id, r.producer_epoch, "t", 0) == [MAPPING]
    finally:
        b.stop()


def test_bounds_are_checked(tmp_path):
    from pylog.errors import InvalidArgumentError
    from pylog.serve.txn_limits import TxnLimits

    for bad in ({"max_partitions": 0}, {"max_ids": -1}, {"max_partitions_per_client": True},
                {"id_expiration": 0}):
        with pytest.raises(InvalidArgumentError, match="must be a positive"):
            TxnLimits(**bad)  # type: ignore[arg-type]
    r = subprocess.run([sys.executable, "-m", "pylog.cli", "--root", str(tmp_path), "serve", "--port", "0",
                        "--max-txn-partitions", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--max-txn-partitions" in r.stderr and "0" in r.stderr


def _list(s: socket.socket) -> dict[str, str]:
    r = call(s, frame(66, 0, {"state_filters": [], "producer_id_filters": []}), 66, 0)
    return {x.transactional_id: x.transaction_state for x in r.transaction_states}


def _state(root: str, tid: str) -> dict:  # type: ignore[type-arg]
    import hashlib
    import json

    with open(os.path.join(root, STATE_DIR, hashlib.sha256(tid.encode()).hexdigest() + ".json")) as f:
        return json.load(f)  # type: ignore[no-any-return]


def test_a_forgotten_id_keeps_its_transaction_numbers(tmp_path):
    """An id forgotten (to make way) and made again goes on from its last committed
    transaction's number: a restart judges a PrepareCommit by the store's sink, so a number
    starting again at 1 would take an undecided commit for a committed one."""
    root = str(tmp_path / "root")
    b = BrokerProcess(root, "--max-transactional-ids", "1")
    try:
        _topics(b, t=1)
        with _from(b, "127.0.0.2") as m:
            for i in range(3):
                r = _init(m, "v")
                assert _add(m, "v", r.producer_id, r.producer_epoch, "t", 0) == [0]
                assert _send(m, "t", 0, _txn_batch([b"v%d" % i], r.producer_id, r.producer_epoch, 0)) == 0
                assert _end(m, "v", r.producer_id, r.producer_epoch, True) == 0
            assert _state(root, "v")["seq"] == 3
            assert _init(m, "other").error_code == 0  # v makes way
            assert _state_files(root) == 1
            assert _init(m, "v").error_code == 0  # v again: a new producer id, its numbers go on
            assert _state(root, "v")["seq"] == 3
    finally:
        b.stop()


def test_a_client_making_ids_displaces_its_own(tmp_path):
    """A client making ids by the dozen takes the places of its own idle ids, not of another
    client's idle one: the other's producer goes on with its next transaction."""
    b = BrokerProcess(str(tmp_path / "root"), "--max-transactional-ids", "6")
    try:
        _topics(b, t=1)
        with _from(b, "127.0.0.1") as s:
            v = _init(s, "victim")
            assert _add(s, "victim", v.producer_id, v.producer_epoch, "t", 0) == [0]
            assert _end(s, "victim", v.producer_id, v.producer_epoch, True) == 0
            with _from(b, "127.0.0.2") as m:
                for i in range(50):
                    assert _init(m, f"junk{i}").error_code == 0
            assert "victim" in _list(s)
            assert _add(s, "victim", v.producer_id, v.producer_epoch, "t", 0) == [0]  # its next transaction
    finally:
        b.stop()


def test_what_a_transaction_holds_is_charged_to_who_asks(tmp_path):
    """Refused offsets are not charged; a client adding partitions to another client's
    transaction (it can learn its producer id from DescribeTransactions) is charged for
    them, so it cannot borrow the other's budget."""
    b = BrokerProcess(str(tmp_path / "root"), *LIMITS)
    try:
        _topics(b, t=24)
        with _from(b, "127.0.0.1") as s, _from(b, "127.0.0.2") as m:
            v = _init(s, "victim")
            assert _add(s, "victim", v.producer_id, v.producer_epoch, "t", 0) == [0]
            assert _add_offsets(s, "victim", v.producer_id, v.producer_epoch, "g") == 0
            for _ in range(9):  # a refused offset, again and again: never charged
                assert _offsets(s, "victim", v.producer_id, v.producer_epoch, "g", "t", 99) == [3]
            assert _offsets(s, "victim", v.producer_id, v.producer_epoch, "g", "t", 0) == [0]  # 3 held
            _p, _e, codes = _hold(m, "mine", "t", list(range(1, 9)))
            assert codes == [0] * 8  # the other client's own 8
            assert _add(m, "victim", v.producer_id, v.producer_epoch, "t", 9, 10) == [CONCURRENT] * 2
            assert _add(s, "victim", v.producer_id, v.producer_epoch, "t", 11) == [0]  # the victim's own: fine
    finally:
        b.stop()


def test_a_commit_stopped_by_an_io_error_completes(tmp_path):
    """An I/O error after a commit's point (here writing the group's offsets: a file where
    their directory goes) is answered KAFKA_STORAGE_ERROR; once the disk is right the commit
    completes (the client's retry or the broker's own look, every half second), the offsets
    are written and what the transaction held is free again."""
    root = str(tmp_path / "root")
    b = BrokerProcess(root, "--max-txn-partitions", "12", "--max-txn-partitions-per-client", "6")
    try:
        _topics(b, t=8)
        block = os.path.join(root, "t", "~consumers", "g")
        with _from(b, "127.0.0.2") as m:
            r = _init(m, "a")
            pid, epoch = r.producer_id, r.producer_epoch
            assert _add(m, "a", pid, epoch, "t", 0, 1, 2, 3) == [0] * 4
            for p in range(4):
                assert _send(m, "t", p, _txn_batch([b"a%d" % p], pid, epoch, 0)) == 0
            assert _add_offsets(m, "a", pid, epoch, "g") == 0
            assert _offsets(m, "a", pid, epoch, "g", "t", 0) == [0]  # 6 held
            os.makedirs(os.path.dirname(block), exist_ok=True)
            with open(block, "w"):
                pass  # a file where the group's directory goes: its offsets cannot be written
            assert _end(m, "a", pid, epoch, True) == 56  # KAFKA_STORAGE_ERROR
            assert sorted(_library(root, "t")) == [b"a0", b"a1", b"a2", b"a3"]  # past the commit point
            assert _end(m, "a", pid, epoch, True) == 56  # still failing: the same answer, nothing else
            assert _add_offsets(m, "a", pid, epoch, "g") == CONCURRENT  # no new transaction over it
            os.unlink(block)
            assert wait_for(lambda: _list(m).get("a") == "CompleteCommit", timeout=15)
            assert _end(m, "a", pid, epoch, True) == 0  # the client's retry: done
            assert os.path.exists(os.path.join(block, "partition-0.offset"))
            assert _hold(m, "b", "t", [0, 1, 2, 3, 4, 5])[2] == [0] * 6  # all 6 free again
    finally:
        b.stop()


def test_failed_begin_and_restart_keep_the_state_right(tmp_path):
    """A transaction that could not begin (its staging could not be made) leaves the id as
    it was (EndTxn answers, the connection stays); a restart keeps the groups of an open
    transaction (TxnOffsetCommit for them goes on)."""
    root = str(tmp_path / "root")
    b = BrokerProcess(root)
    try:
        _topics(b, t=2)
        with _from(b, "127.0.0.2") as m:
            r = _init(m, "a")
            pid, epoch = r.producer_id, r.producer_epoch
            txn_dir = os.path.join(root, "~txn")
            moved = txn_dir + ".away"
            if os.path.isdir(txn_dir):
                os.rename(txn_dir, moved)
            with open(txn_dir, "w"):
                pass  # no transaction can begin
            assert _add(m, "a", pid, epoch, "t", 0) == [56]
            assert _list(m)["a"] == "Empty"
            assert _end(m, "a", pid, epoch, True) == 48  # INVALID_TXN_STATE: none open (answered)
            os.unlink(txn_dir)
            if os.path.isdir(moved):
                os.rename(moved, txn_dir)
            assert _add(m, "a", pid, epoch, "t", 0) == [0]
            assert _add_offsets(m, "a", pid, epoch, "g") == 0
        os.kill(b.proc.pid, signal.SIGKILL)
        b.proc.wait(10)
    finally:
        b.stop()
    b = BrokerProcess(root)
    try:
        with _from(b, "127.0.0.2") as m:
            assert _offsets(m, "a", pid, epoch, "g", "t", 1) == [0]  # the group came back with it
            assert _end(m, "a", pid, epoch, True) == 0
    finally:
        b.stop()


def test_a_client_aborts_a_transaction_a_bound_refused(tmp_path):
    """POLICY_VIOLATION (a transaction that alone would go past the per-client bound) is an
    abortable error: confluent-kafka aborts, and the producer goes on with a smaller one."""
    b = BrokerProcess(str(tmp_path / "root"), "--max-txn-partitions-per-client", "2")
    try:
        _topics(b, t=3)
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "big", "linger.ms": 50})
        p.init_transactions(20)
        for ok in (True, False):  # after a committed transaction too
            if ok:
                p.begin_transaction()
                p.produce("t", b"first", partition=0)
                p.commit_transaction(30)
            p.begin_transaction()
            for part in range(3):
                p.produce("t", b"too-wide", partition=part)
            with pytest.raises(ck.KafkaException) as e:
                p.commit_transaction(30)
            err = e.value.args[0]
            assert err.txn_requires_abort() and not err.fatal(), err
            p.abort_transaction(30)
        p.begin_transaction()
        p.produce("t", b"fits", partition=1)
        p.commit_transaction(30)
        assert sorted(_library(b.root, "t")) == [b"first", b"fits"]
    finally:
        b.stop()
