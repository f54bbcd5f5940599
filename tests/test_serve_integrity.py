"""pylog serve: what a client was told is what the log holds, through every failure.

Idempotent producers get no duplicate when the broker is killed at any fdatasync (strace
fault injection on the broker process) or restarted; producer state that cannot be loaded
or written is answered, not a closed connection; storage errors on one partition are
answered with Kafka's code on that partition while the connection stays open; transient
resource errors (EMFILE) do not fence; a fenced partition is reopened without a restart.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import time

import pytest

pytest.importorskip("kio")

from conftest import LONG  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    batch,
    call,
    connect,
    create_topic,
    fetch,
    fetched_values,
    frame,
    produce,
    produce_result,
)

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



def _strace(spec: str) -> list[str]:
    """A command prefix running the broker under strace with the fault ``spec``."""
    return [STRACE or "strace", "-f", "-qq", "-o", os.devnull, "-e", f"inject={spec}"]


@contextlib.contextmanager
def _restarted(root: str):  # type: ignore[no-untyped-def]
    """A broker over ``root`` in this process (a restart, without a process's start-up
    time); its ``produce(data)`` appends one partition's data to d/0: (error, base)."""
    from pylog.serve.broker import Broker

    broker = Broker(root, port=0)
    try:
        yield lambda data, topic="d": broker._append_checked(topic, 0, data)[:2]
    finally:
        broker.close()


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
# 2: the records' fdatasync of the first batch (1, its intent's: the power cut test covers it)
@pytest.mark.parametrize("when", [1, 2, 3, 4, 5, 6] if LONG else [2])
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
                assert produce_result(r) == (0, 1 + 5 * k)
                answered += 1
    finally:
        _stop_traced(b)
    assert answered == (when - 1) // 2  # killed at the batch whose fdatasync it was
    with _restarted(root) as send:
        for k in range(answered, 3):
            assert send(_idem(sent[k], pid, epoch, 1 + 5 * k)) == (0, 1 + 5 * k)
        assert send(_idem([b"n"], pid, epoch, 16)) == (0, 16)  # the next batch follows on
    assert _values(root, "d") == [b"a0", *sent[0], *sent[1], *sent[2], b"n"]


# -- 3, 4. storage errors are answered; transient ones do not fence ------------------------
def _codes(r) -> list[int]:  # type: ignore[no-untyped-def]
    return [p.error_code for t in r.responses for p in t.partition_responses]


def _produce_all(topic: str, parts: int, values: list[bytes]) -> bytes:
    return frame(0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": i, "records": batch(values)} for i in range(parts)]}]})


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit is not installed")
def test_emfile_opening_partitions_is_answered_per_partition_and_not_fenced(tmp_path):
    """With the broker's RLIMIT_NOFILE lowered (prlimit) to what it holds open, a Produce to
    six partitions not yet open is answered: KAFKA_STORAGE_ERROR on the partitions that
    could not be opened, the connection stays open, each partition's failure is logged
    once; with the limit raised again, the same partitions take appends at once (EMFILE
    is a refusal, not damage: nothing fenced, no back-off)."""
    root = str(tmp_path / "root")
    b = BrokerProcess(root, "--fence-backoff", "3600")
    try:
        with connect(b) as s:
            create_topic(s, "m", partitions=6)
            n = _fds(b.proc.pid)
            soft = int(open(f"/proc/{b.proc.pid}/limits").read().split("Max open files")[1].split()[0])
            subprocess.run(["prlimit", f"--pid={b.proc.pid}", f"--nofile={n + 3}:"], check=True)
            try:
                for _ in range(2):
                    codes = _codes(call(s, _produce_all("m", 6, [b"x"]), 0, 9))
                    assert set(codes) <= {0, 56} and 56 in codes, codes
                failed = [i for i, c in enumerate(codes) if c == 56]
                # the connection is still open: another request on it is answered
                assert call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
            finally:
                subprocess.run(["prlimit", f"--pid={b.proc.pid}", f"--nofile={soft}:"], check=True)
            assert _codes(call(s, _produce_all("m", 6, [b"y"]), 0, 9)) == [0] * 6
    finally:
        assert b.stop() == 0
    err = b.stderr()
    for i in failed:
        assert err.count(f"partition m-{i} cannot be opened") == 1, err
    assert "Traceback" not in err and "fenced" not in err, err
    for i in range(6):
        assert _values(root, "m", i)[-1] == b"y"


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (skipped where mount is not permitted), unmounted afterwards."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(path: str, leave: int = 0) -> None:
    """Fill the file system of ``path`` to the brim with the file ``path``, then give
    back ``leave`` bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = 0
        for step in (1 << 16, 4096, 512, 1):
            while True:
                try:
                    size += os.write(fd, b"\xa5" * step)
                except OSError:
                    break
        if leave:
            os.ftruncate(fd, max(size - leave, 0))
    finally:
        os.close(fd)


def _fetched(s: socket.socket, topic: str, offset: int = 0) -> tuple[int, int, list[bytes]]:
    r = call(s, fetch(topic, offset), 1, 12)
    p = r.responses[0].partitions[0]
    return p.error_code, p.high_watermark, [v for _, v in fetched_values(r)]


def test_full_disk_refused_batch_is_never_served_and_the_partition_reopens(small_disk):
    """On a full disk a 20-record batch is refused (KAFKA_STORAGE_ERROR) after its first
    record reached the file: Fetch never serves it while the partition is fenced (the high
    watermark stays at what was acknowledged), the connection stays open; once space is
    free a produce after the back-off reopens the partition, which cuts the refused record
    that recovery found, and appends; SIGTERM on a full disk exits 0."""
    root = str(small_disk / "root")
    filler = str(small_disk / "filler")
    b = BrokerProcess(root, "--fence-backoff", "0.5")
    try:
        with connect(b) as s:
            create_topic(s, "f", flush_messages="1")
            acked = [b"a%d" % i for i in range(5)]
            assert _codes(call(s, produce("f", batch(acked)), 0, 9)) == [0]
            _fill(filler, leave=8192)  # room for the first record of the next batch only
            big = [bytes([65 + i]) * 6000 for i in range(20)]
            assert _codes(call(s, produce("f", batch(big)), 0, 9)) == [56]
            assert _fetched(s, "f") == (0, 5, acked)
            assert _codes(call(s, produce("f", batch([b"z"])), 0, 9)) == [56]  # fenced: refused
            assert _fetched(s, "f") == (0, 5, acked)
            os.unlink(filler)
            deadline = 30
            while True:  # the back-off is over after 0.5 s: a produce reopens the partition
                codes = _codes(call(s, produce("f", batch([b"after"])), 0, 9))
                if codes == [0] or deadline <= 0:
                    break
                deadline -= 1
                time.sleep(0.2)
            assert codes == [0]
            assert _fetched(s, "f") == (0, 6, [*acked, b"after"])
            _fill(filler)
            assert _codes(call(s, produce("f", batch(big)), 0, 9)) == [56]
        assert b.stop() == 0  # SIGTERM on a full disk: a clean exit
    finally:
        b.stop()
    err = b.stderr()
    assert err.count("partition f-0 is fenced") == 2, err  # once per fence, not per request
    assert "Traceback" not in err, err


def test_full_disk_recovery_still_serves_reads(small_disk):
    """A broker killed (SIGKILL) and restarted on a disk full to the brim: the partition's
    recovery cannot write its side files, yet Fetch serves what it holds; a Produce, a
    CreateTopics and Metadata's auto-creation are answered KAFKA_STORAGE_ERROR on the
    connection, which stays open; SIGTERM exits 0."""
    root = str(small_disk / "root")
    b = BrokerProcess(root)
    try:
        with connect(b) as s:
            create_topic(s, "f", flush_messages="1")
            acked = [b"a%d" % i for i in range(5)]
            assert _codes(call(s, produce("f", batch(acked)), 0, 9)) == [0]
    finally:
        b.stop(signal.SIGKILL)
    _fill(str(small_disk / "filler"))
    b = BrokerProcess(root)
    try:
        with connect(b) as s:
            assert _fetched(s, "f") == (0, 5, acked)
            assert _codes(call(s, produce("f", batch([b"x"])), 0, 9)) == [56]
            assert _fetched(s, "f") == (0, 5, acked)
            # creating a topic on the full disk: answered on that topic, the connection stays
            r = call(s, frame(19, 7, {"topics": [{"name": "g", "num_partitions": 2, "replication_factor": 1,
                                                  "configs": []}], "timeout": 5000}), 19, 7)
            assert r.topics[0].error_code == 56, r
            r = call(s, frame(3, 9, {"topics": [{"name": "h"}], "allow_auto_topic_creation": True,
                                     "include_topic_authorized_operations": False}), 3, 9)
            assert r.topics[0].error_code == 56, r
            assert _fetched(s, "f") == (0, 5, acked)
        assert b.stop() == 0
    finally:
        b.stop()
    assert "Traceback" not in b.stderr()


def test_full_disk_refused_batch_is_not_served_after_a_restart(small_disk):
    """A batch refused on a full disk (its first record reached the file) is not served
    after the broker stops (SIGTERM, exit 0) and starts again with space free."""
    root = str(small_disk / "root")
    filler = str(small_disk / "filler")
    b = BrokerProcess(root)
    try:
        with connect(b) as s:
            create_topic(s, "f", flush_messages="1")
            acked = [b"a%d" % i for i in range(5)]
            assert _codes(call(s, produce("f", batch(acked)), 0, 9)) == [0]
            _fill(filler, leave=8192)
            assert _codes(call(s, produce("f", batch([bytes([65 + i]) * 6000 for i in range(20)])), 0, 9)) == [56]
        assert b.stop() == 0
    finally:
        b.stop()
    os.unlink(filler)
    b = BrokerProcess(root)
    try:
        with connect(b) as s:
            assert _fetched(s, "f") == (0, 5, acked)
    finally:
        b.stop()


# -- 1, 2. EIO: the refused batch is never served, its retry is answered right -------------
@needs_strace
@pytest.mark.parametrize("restart", [False, True] if LONG else [False])
def test_eio_at_the_records_fdatasync_then_retry_exactly_once(tmp_path, restart):
    """The fdatasync of an idempotent batch's records fails with EIO (strace): the batch is
    answered KAFKA_STORAGE_ERROR, Fetch does not serve it, the partition is fenced. The
    producer's retry, after the back-off (the partition reopens and cuts the refused
    records) or after a broker restart (recovery may keep them: then the retry is the
    duplicate it is), is answered with base offset 1 and the log holds the batch once."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("d", config=pylog.LogConfig(fsync="always")).append(b"a0")
    pid, vals = 1000, [b"v%d" % i for i in range(5)]
    # the first fdatasync of the append thread is the intent's, the second the records'
    b = BrokerProcess(root, "--fence-backoff", "0.2", prefix=_strace("fdatasync:error=EIO:when=2"))
    try:
        with connect(b) as s:
            assert produce_result(call(s, produce("d", _idem(vals, pid, 0, 0)), 0, 9)) == (56, -1)
            assert _fetched(s, "d") == (0, 1, [b"a0"])
            if not restart:
                time.sleep(0.3)
                assert produce_result(call(s, produce("d", _idem(vals, pid, 0, 0)), 0, 9)) == (0, 1)
                assert produce_result(call(s, produce("d", _idem(vals, pid, 0, 0)), 0, 9)) == (0, 1)  # a duplicate
                assert _fetched(s, "d") == (0, 6, [b"a0", *vals])
    finally:
        assert _stop_traced(b, signal.SIGTERM) == 0
    if restart:
        with _restarted(root) as send:
            assert send(_idem(vals, pid, 0, 0)) == (0, 1)
    assert _values(root, "d") == [b"a0", *vals]


@needs_strace
def test_producer_state_that_cannot_be_rewritten_is_answered_then_loaded(tmp_path):
    """Loading a partition's producer state rewrites its file; when that file's fsync fails
    (EIO, strace) the idempotent Produce is answered KAFKA_STORAGE_ERROR on an open
    connection and nothing is appended; the next Produce loads the state and is appended,
    its retry is a duplicate, and the state is on disk: after a restart too."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("d")
    with _restarted(root) as send:
        assert send(_idem([b"a"], 1000, 0, 0)) == (0, 0)
    (name,) = os.listdir(os.path.join(root, "d", "~producers"))  # partition-0.producers
    state = os.path.join(root, "d", "~producers", name)
    b = BrokerProcess(root, prefix=[*_strace("fsync:error=EIO:when=1"), "-P", state + ".tmp"])
    try:
        with connect(b) as s:
            assert produce_result(call(s, produce("d", _idem([b"b"], 1000, 0, 1)), 0, 9)) == (56, -1)
            assert _fetched(s, "d") == (0, 1, [b"a"])
            assert produce_result(call(s, produce("d", _idem([b"b"], 1000, 0, 1)), 0, 9)) == (0, 1)
            assert produce_result(call(s, produce("d", _idem([b"b"], 1000, 0, 1)), 0, 9)) == (0, 1)
            assert produce_result(call(s, produce("d", _idem([b"c"], 1000, 0, 2)), 0, 9)) == (0, 2)
    finally:
        assert _stop_traced(b, signal.SIGTERM) == 0
    with _restarted(root) as send:
        assert send(_idem([b"c"], 1000, 0, 2)) == (0, 2)
        assert send(_idem([b"x"], 1000, 0, 9))[0] == 45  # a gap
    assert _values(root, "d") == [b"a", b"b", b"c"]


# -- 1. a real idempotent client across broker kills -----------------------------------------
@needs_strace
def test_confluent_idempotent_producer_across_sigkills_at_fdatasync(tmp_path):
    """A confluent-kafka producer with enable.idempotence sends to two partitions
    (flush.messages=1) while its broker is killed at an fdatasync (strace, a different Nth
    each time: an intent's or the records') and restarted, KILLS times
    (``PYLOG_INTEGRITY_KILLS``, default 2; more under PYLOG_LONG=1): every message is
    delivered, and the log holds each exactly once."""
    ck = pytest.importorskip("confluent_kafka")
    from test_serve_idempotence import _Proxy

    kills = int(os.environ.get("PYLOG_INTEGRITY_KILLS", "8" if LONG else "2"))
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("c", partitions=2, config=pylog.LogConfig(fsync="always"))
    proxy = _Proxy()
    n = 600 + 200 * kills
    errors: list = []  # type: ignore[type-arg]
    brokers: list[BrokerProcess] = []

    def start(when: int | None) -> None:
        prefix = _strace(f"fdatasync:signal=SIGKILL:when={when}") if when else None
        brokers.append(BrokerProcess(root, "--advertise", f"127.0.0.1:{proxy.port}", prefix=prefix))
        proxy.target = brokers[-1].port

    def done(err, msg):  # type: ignore[no-untyped-def]
        if err is not None:
            errors.append(err)

    p, left = None, -1
    try:
        start(7)
        p = ck.Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "enable.idempotence": True,
                         "linger.ms": 5, "batch.num.messages": 25, "retry.backoff.ms": 50,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200,
                         "message.timeout.ms": 120000})
        died = 0
        for i in range(n):
            p.produce("c", value=b"m%d" % i, partition=i % 2, on_delivery=done)
            p.poll(0)
            if i % 20 == 0:
                time.sleep(0.01)
            if brokers[-1].proc.poll() is not None:  # killed at its fdatasync: a new one
                died += 1
                brokers[-1].stop()
                start(7 + 5 * died if died < kills else None)
        deadline = time.monotonic() + 120
        while died < kills:  # not reached yet: send more, so that every run has its kills
            assert time.monotonic() < deadline, f"{died} of {kills} kills"
            for _ in range(20):
                p.produce("c", value=b"m%d" % n, partition=n % 2, on_delivery=done)
                n += 1
            p.flush(1)
            if brokers[-1].proc.poll() is not None:
                died += 1
                brokers[-1].stop()
                start(7 + 5 * died if died < kills else None)
        left = p.flush(120)
    finally:
        proxy.stop.set()
        for b in brokers:
            if b.proc.poll() is None:
                _stop_traced(b, signal.SIGTERM) if b.proc.args[0] == STRACE else b.stop()
    got = _values(root, "c", 0) + _values(root, "c", 1)
    dups = len(got) - len(set(got))
    print(f"{kills} kills: {n} sent, {len(got)} records, {dups} duplicates, {n - len(set(got))} missing, "
          f"{left} undelivered, {len(errors)} delivery errors")
    assert left == 0 and not errors, errors[:5]
    assert dups == 0 and sorted(got) == sorted(b"m%d" % i for i in range(n))


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit is not installed")
def test_emfile_at_a_roll_is_a_refusal_not_a_fence(tmp_path):
    """An append that must roll to a new segment while the broker has no descriptor left
    (soft RLIMIT_NOFILE lowered by prlimit) is answered KAFKA_STORAGE_ERROR; EMFILE does
    not fence: once descriptors are free the next Produce is appended at once, though the
    back-off for I/O errors is an hour."""
    root = str(tmp_path / "root")
    b = BrokerProcess(root, "--fence-backoff", "3600")
    try:
        with connect(b) as s:
            create_topic(s, "r", segment_bytes="4096")
            assert _codes(call(s, produce("r", batch([b"a" * 100])), 0, 9)) == [0]
            n = _fds(b.proc.pid)
            soft = int(open(f"/proc/{b.proc.pid}/limits").read().split("Max open files")[1].split()[0])
            subprocess.run(["prlimit", f"--pid={b.proc.pid}", f"--nofile={n}:"], check=True)
            try:
                assert _codes(call(s, produce("r", batch([b"b" * 1000] * 8)), 0, 9)) == [56]
            finally:
                subprocess.run(["prlimit", f"--pid={b.proc.pid}", f"--nofile={soft}:"], check=True)
            assert _codes(call(s, produce("r", batch([b"c" * 1000] * 8)), 0, 9)) == [0]
            assert _fetched(s, "r")[2][0] == b"a" * 100
    finally:
        assert b.stop() == 0
    err = b.stderr()
    assert "partition r-0 refused an append" in err and "is fenced" not in err, err
    assert _values(root, "r") == [b"a" * 100] + [b"c" * 1000] * 8


@needs_strace
def test_eacces_opening_a_partition_is_answered_on_that_partition(tmp_path):
    """Opening one partition fails with EACCES (strace, at the open of its lock file): a
    Produce to two partitions is answered 0 and KAFKA_STORAGE_ERROR on a connection that
    stays open; the failure is not remembered: the next Produce opens the partition and
    is appended."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("p", partitions=2)
    lock = os.path.join(root, "p", "partition-1", ".lock")
    b = BrokerProcess(root, prefix=[*_strace("openat:error=EACCES:when=1"), "-P", lock])
    try:
        with connect(b) as s:
            assert _codes(call(s, _produce_all("p", 2, [b"x"]), 0, 9)) == [0, 56]
            assert _codes(call(s, _produce_all("p", 2, [b"y"]), 0, 9)) == [0, 0]
    finally:
        assert _stop_traced(b, signal.SIGTERM) == 0
    err = b.stderr()
    assert err.count("partition p-1 cannot be opened for writing") == 1 and "Permission denied" in err, err
    assert _values(root, "p", 0) == [b"x", b"y"] and _values(root, "p", 1) == [b"y"]


def test_power_cut_at_every_step_of_an_idempotent_append(tmp_path):
    """A simulated power cut (pylog.testing.CrashFS: every file as of its last fsync, the
    bytes written since torn at a random point) before each file operation in turn of a
    broker appending an idempotent batch under fsync=always, and after its answer: after
    the cut the retry is answered with base offset 1 (a duplicate where the records were
    durable, appended where not), and the log holds the batch once."""
    from pylog.serve.broker import Broker
    from pylog.testing import CrashFS, PowerCut, simulate_crash

    vals = [b"v%d" % i for i in range(5)]
    prepared = tmp_path / "prepared"
    with pylog.LogStore(str(prepared / "root")) as store:
        store.create_topic("d", config=pylog.LogConfig(fsync="always")).append(b"a0")

    def run(fs: CrashFS, root: str) -> None:
        broker = None
        with fs:
            try:
                broker = Broker(root, port=0)
                assert broker._append_checked("d", 0, _idem(vals, 1000, 0, 0))[:2] == (0, 1)
            except PowerCut:
                pass
        if broker is not None:  # abandoned as a power cut leaves it: nothing more written
            broker._pool.shutdown()
            broker.producers.close()
            for t in list(broker.store._topics.values()):
                for log in t._logs:
                    if log is not None:
                        simulate_crash(log)
            os.close(broker._lock_fd)

    def copy(name: str) -> str:
        shutil.copytree(prepared, tmp_path / name)
        return str(tmp_path / name / "root")

    root = copy("dry")
    dry = CrashFS(root)
    run(dry, root)
    assert any(op == "fdatasync" for op, _ in dry.log)
    kept = 0  # cuts after which the records were durable (the retry is then a duplicate)
    for cut in range(1, dry.ops + 2):  # the last: a cut after the answer
        root = copy(f"cut-{cut}")
        fs = CrashFS(root, cut_after=cut, seed=cut)
        run(fs, root)
        img = fs.materialize(str(tmp_path / f"img-{cut}"))
        kept += _values(img, "d") == [b"a0", *vals]
        with _restarted(img) as send:
            assert send(_idem(vals, 1000, 0, 0)) == (0, 1), f"cut {cut}/{dry.ops}: {fs.log[-1]}"
        assert _values(img, "d") == [b"a0", *vals], f"cut {cut}/{dry.ops}: {fs.log[-1]}"
    assert 0 < kept < dry.ops + 1, (kept, dry.ops)


@needs_strace
def test_failed_intent_is_answered_and_does_not_fence_the_log(tmp_path):
    """The fdatasync of an idempotent batch's intent fails (EIO, strace, on the producer
    state file only): the batch is answered KAFKA_STORAGE_ERROR and nothing is appended;
    the partition's log is not fenced (a plain Produce is appended at once, whatever the
    back-off), and the retry loads the state again and is appended once."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("d", config=pylog.LogConfig(fsync="always")).append(b"a0")
    with _restarted(root) as send:
        assert send(_idem([b"a1"], 1000, 0, 0)) == (0, 1)
    state = os.path.join(root, "d", "~producers", "partition-0.producers")
    b = BrokerProcess(root, "--fence-backoff", "3600", prefix=[*_strace("fdatasync:error=EIO:when=1"), "-P", state])
    try:
        with connect(b) as s:
            assert produce_result(call(s, produce("d", _idem([b"b"], 1000, 0, 1)), 0, 9)) == (56, -1)
            assert _codes(call(s, produce("d", batch([b"plain"])), 0, 9)) == [0]
            assert produce_result(call(s, produce("d", _idem([b"b"], 1000, 0, 1)), 0, 9)) == (0, 3)
            assert produce_result(call(s, produce("d", _idem([b"b"], 1000, 0, 1)), 0, 9)) == (0, 3)
    finally:
        assert _stop_traced(b, signal.SIGTERM) == 0
    assert "fenced" not in b.stderr()
    assert _values(root, "d") == [b"a0", b"a1", b"plain", b"b"]


def test_producer_state_of_the_earlier_format_is_migrated(tmp_path):
    """A ``partition-N.state`` file of the earlier format (34-byte entries written after
    their records) is read once: its batches are still known (a retry is a duplicate), and
    it is replaced by ``partition-N.producers``."""
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("d").append_batch([b"a", b"b"])
    d = os.path.join(root, "d", "~producers")
    os.makedirs(d)
    body = struct.pack("<qhiiqi", 1000, 0, 0, 1, 0, 2)
    with open(os.path.join(d, "partition-0.state"), "wb") as f:
        f.write(body + struct.pack("<I", impl.crc32c(body)))
    with _restarted(root) as send:
        assert send(_idem([b"a", b"b"], 1000, 0, 0)) == (0, 0)
        assert send(_idem([b"c"], 1000, 0, 5))[0] == 45  # a gap after the known batch
    assert os.listdir(d) == ["partition-0.producers"]
    with _restarted(root) as send:
        assert send(_idem([b"a", b"b"], 1000, 0, 0)) == (0, 0)
    assert _values(root, "d") == [b"a", b"b"]
