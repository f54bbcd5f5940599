"""`pylog serve` keeps its bounds against hostile clients (docs/serve.md, "Limits and defaults").

Memory: zip bombs in every codec the broker accepts, a Fetch naming partitions many times,
unfinished frames on many connections; each attack runs against a broker subprocess with
its default limits and the test reads the broker's peak RSS (VmHWM in /proc/PID/status,
reset before each attack through /proc/PID/clear_refs). Connections: max.connections and
max.connections.per.ip refused at accept and logged once per interval, a frame-size header
held by the request timeout, the soft RLIMIT_NOFILE raised to the hard limit. Shutdown:
requests that arrive while the broker stops are answered or closed, never a traceback.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import pytest

pytest.importorskip("kio")

from conftest import ROOT, py_env  # noqa: E402
from serve_util import (  # noqa: E402
    BrokerProcess,
    api_versions_ok,
    batch,
    call,
    connect,
    create_topic,
    fetch,
    frame,
    produce,
    recv_exact,
    wait_for,
)

import pylog  # noqa: E402
from pylog import crc32c  # noqa: E402

MiB = 1 << 20
#: The documented bound of the broker's RSS under every attack here, with default limits
#: (docs/serve.md, "Limits and defaults").
RSS_BOUND = 512 * MiB


# -- measuring the broker -----------------------------------------------------------------------
def peak_rss(pid: int) -> int:
    """The peak resident set (VmHWM) of process ``pid`` since it started or since
    :func:`reset_peak`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def reset_peak(pid: int) -> None:
    """Reset VmHWM to the current RSS (Linux: ``5`` written to /proc/PID/clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


# -- building the attacks -------------------------------------------------------------------------
HEADER = struct.Struct(">qiibIhiqqqhii")
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def compress(codec: str, data: bytes) -> bytes:
    """``data`` compressed as a Kafka producer does it for ``codec``."""
    if codec == "gzip":
        c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == "snappy":
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data))
    if codec == "lz4":
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    import zstandard

    return bytes(zstandard.ZstdCompressor(level=3).compress(data))


def bomb(codec: str, size: int, records: int = 1) -> bytes:
    """A valid RecordBatch v2 of ``records`` records whose values are ``size`` zero bytes in
    all, its records section compressed with ``codec``: little on the wire, ``size`` when
    decompressed."""
    plain = batch([bytes(size // records)] * records)
    section = compress(codec, plain[61:])
    (base, _len, epoch, magic, _crc, _attrs, last, ts, mts, pid, pep, seq, count) = HEADER.unpack_from(plain)
    head = bytearray(HEADER.pack(base, 49 + len(section), epoch, magic, 0, CODECS[codec], last, ts, mts, pid, pep,
                                 seq, count))
    body = bytes(head[21:]) + section
    head[17:21] = struct.pack(">I", crc32c(body))
    return bytes(head[:21]) + body


def produce_many(topic: str, parts: dict[int, bytes]) -> bytes:
    """A Produce v9 frame of ``parts`` (partition -> record batches) of ``topic``."""
    return frame(0, 9, {"acks": -1, "timeout": 30000, "topic_data": [
        {"name": topic, "partition_data": [{"index": i, "records": r} for i, r in parts.items()]}]})


def fetch_many(topic: str, partitions: list[int], max_bytes: int = 0x7FFFFFFF,
               partition_max_bytes: int = 0x7FFFFFFF) -> bytes:
    """A Fetch v12 frame naming ``partitions`` of ``topic`` (repeats kept), from offset 0."""
    return frame(1, 12, {"max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
                         "topics": [{"topic": topic, "partitions": [
                             {"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes}
                             for p in partitions]}]})


def read_response(sock: socket.socket) -> bytes | None:
    """One whole response frame (after its size), or None when the broker closed."""
    head = recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">i", head)
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            return None
        got += k
    return bytes(out)


def decode_response(data: bytes, key: int, version: int):  # type: ignore[no-untyped-def]
    """The kio entity of a response frame's bytes (after its size)."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    cls = load_response_schema(key, version)
    _hdr, used = entity_reader(cls.__header_schema__)(data, 0)
    return entity_reader(cls)(data, used)[0]


def close_soon(sock: socket.socket) -> bool:
    """The broker closed ``sock`` without answering (EOF or a reset), within its timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def source(ip: str) -> socket.socket:
    """A connection from the loopback address ``ip`` (127.0.0.2, ...: another client IP)."""
    s = socket.socket()
    s.settimeout(20)
    s.bind((ip, 0))
    return s


def served(b: BrokerProcess) -> bool:
    """A new connection is answered (not refused)."""
    try:
        return api_versions_ok(b)
    except ConnectionError:
        return False


# -- memory ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A broker with default limits over a root holding topic ``big``: two partitions of
    40 MiB (1 MiB records), and topic ``z`` (four partitions) for the bombs."""
    root = str(tmp_path_factory.mktemp("limits") / "root")
    store = pylog.LogStore(root)
    t = store.create_topic("big", partitions=2)
    for p in range(2):
        for _ in range(40):
            t.append(bytes(MiB), partition=p)
    store.create_topic("z", partitions=4)
    store.close()
    b = BrokerProcess(root)
    yield b
    assert b.stop() == 0, b.stderr()
    assert "Traceback" not in b.stderr()


@pytest.mark.parametrize("codec", list(CODECS))
def test_zip_bombs_stay_within_the_request_budget(loaded, codec):
    """Sixteen batches of 31 MiB of zeros over two partitions of one Produce (each batch
    alone is within the 32 MiB budget; their sum, 496 MiB, is not): the partition whose
    batch goes over the budget is refused MESSAGE_TOO_LARGE, the broker's peak RSS stays
    under the bound, and it serves on."""
    one = bomb(codec, 31 * MiB)
    req = produce_many("z", {0: one * 8, 1: one * 8})
    assert len(req) < 16 * len(one) + 1000
    reset_peak(loaded.proc.pid)
    with connect(loaded) as s:
        s.settimeout(120)
        s.sendall(req)
        got = read_response(s)
    assert got is not None
    codes = [p.error_code for p in decode_response(got, 0, 9).responses[0].partition_responses]
    assert codes == [10, 10]  # MESSAGE_TOO_LARGE: each partition's second batch is over what is left
    assert peak_rss(loaded.proc.pid) < RSS_BOUND
    assert api_versions_ok(loaded)


def test_decompression_budget_is_shared_by_the_partitions_of_a_request(loaded):
    """20 MiB of gzip per partition: one partition fits in the 32 MiB budget, the second
    does not (in its own request it would)."""
    twenty = bomb("gzip", 20 * MiB, records=20)  # 1 MiB records: within max.message.bytes
    with connect(loaded) as s:
        s.settimeout(60)
        s.sendall(produce_many("z", {2: twenty, 3: twenty}))
        got = read_response(s)
        assert got is not None
        codes = [p.error_code for p in decode_response(got, 0, 9).responses[0].partition_responses]
        assert codes == [0, 10]
        s.sendall(produce_many("z", {3: twenty}))
        got = read_response(s)
        assert got is not None
        assert [p.error_code for p in decode_response(got, 0, 9).responses[0].partition_responses] == [0]


def test_decode_records_takes_from_a_shared_budget():
    from pylog.serve.records import BatchError, Budget, decode_records

    data = bomb("zstd", 1 << 20, records=4)
    budget = Budget(3 << 19)  # 1.5 MiB: one batch of 1 MiB, not two
    assert decode_records(data, budget).count == 4
    assert budget.left == (3 << 19) - (len(batch([bytes(1 << 18)] * 4)) - 61)  # its records section
    with pytest.raises(BatchError) as e:
        decode_records(data, budget)
    assert e.value.code == 10 and "decompression budget" in str(e.value)
    assert decode_records(data, 1 << 21).count == 4  # an int: a budget of its own


def test_fetch_naming_partitions_many_times_is_answered_once_within_fetch_max_bytes(loaded):
    """A Fetch of both 40 MiB partitions, each named ten times, asking for 2 GiB: each
    partition is answered once, the records are at most fetch.max.bytes (55 MiB) in all,
    and the broker's peak RSS stays under the bound."""
    reset_peak(loaded.proc.pid)
    with connect(loaded) as s:
        s.settimeout(120)
        s.sendall(fetch_many("big", [0, 1] * 10))
        got = read_response(s)
    assert got is not None and len(got) < 56 * MiB
    r = decode_response(got, 1, 12)
    assert [t.topic for t in r.responses] == ["big"]
    parts = r.responses[0].partitions
    assert [p.partition_index for p in parts] == [0, 1]
    sizes = [len(p.records or b"") for p in parts]
    assert 50 * MiB < sum(sizes) <= 55 * MiB
    assert peak_rss(loaded.proc.pid) < RSS_BOUND


def test_a_partition_named_twice_takes_its_last_offset_and_first_place(loaded):
    """Kafka reads a Fetch into a map: a repeated partition keeps its first place and its
    last fetch offset and limit."""
    from kafka.record.memory_records import MemoryRecords

    req = frame(1, 12, {"max_wait": 0, "min_bytes": 0, "max_bytes": 4 * MiB, "isolation_level": 0, "topics": [
        {"topic": "big", "partitions": [{"partition": 1, "fetch_offset": 0, "partition_max_bytes": MiB + 200},
                                        {"partition": 0, "fetch_offset": 7, "partition_max_bytes": MiB + 200}]},
        {"topic": "big", "partitions": [{"partition": 1, "fetch_offset": 3, "partition_max_bytes": MiB + 200}]}]})
    with connect(loaded) as s:
        s.sendall(req)
        got = read_response(s)
    assert got is not None
    r = decode_response(got, 1, 12)
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in r.responses] == [("big", [1, 0])]
    firsts = []
    for p in r.responses[0].partitions:
        recs = MemoryRecords(bytes(p.records))
        firsts.append(next(iter(recs.next_batch())).offset)
    assert firsts == [3, 7]


def test_unfinished_frames_on_many_connections_wait_for_the_pool(loaded):
    """Eight connections each send 90 MiB of a 90 MiB frame, less one byte, and twenty
    send half of a 60 KB frame: the large frames take their bytes from the shared pool
    (queued.max.request.bytes, 100 MiB), so one is read and the others are not; small
    requests are still answered, a 2 MiB Produce waits for the pool and is answered
    once the attackers leave, and the peak RSS stays under the bound."""
    reset_peak(loaded.proc.pid)
    big = [connect(loaded) for _ in range(8)]
    small = [connect(loaded) for _ in range(20)]
    for s in small:
        s.sendall(struct.pack(">i", 60_000) + bytes(30_000))
    sent = [0] * len(big)

    def push(i: int) -> None:
        s = big[i]
        s.settimeout(1.0)
        try:
            s.sendall(struct.pack(">i", 90 * MiB))
            chunk = bytes(MiB)
            while sent[i] < 90 * MiB - MiB:
                s.sendall(chunk)
                sent[i] += MiB
            s.sendall(chunk[: MiB - 1])
            sent[i] += MiB - 1
        except TimeoutError:  # the broker stopped reading this socket (or its buffers are full)
            pass

    threads = [threading.Thread(target=push, args=(i,)) for i in range(len(big))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert max(sent) == 90 * MiB - 1  # one frame was read all but its last byte
    assert sorted(sent)[-2] < 20 * MiB  # the others wait for the pool: kernel buffers at most
    assert api_versions_ok(loaded)  # small frames do not wait for the pool
    waiting = connect(loaded)
    waiting.sendall(produce_many("z", {0: batch([bytes(MiB)] * 2)}))
    waiting.settimeout(1.0)
    with pytest.raises(TimeoutError):
        waiting.recv(1)  # its 2 MiB frame waits behind the attackers' in the pool
    assert peak_rss(loaded.proc.pid) < RSS_BOUND
    for s in big + small:
        s.close()
    waiting.settimeout(30)
    got = read_response(waiting)
    waiting.close()
    assert got is not None
    assert [p.error_code for p in decode_response(got, 0, 9).responses[0].partition_responses] == [0]
    assert peak_rss(loaded.proc.pid) < RSS_BOUND


def test_fetch_responses_nobody_reads_hold_at_most_the_response_pool(loaded):
    """Ten connections each ask for both 40 MiB partitions and never read: the responses
    being written hold at most twice fetch.max.bytes in all (the first two get 55 MiB, the
    others what is left, at least one record), so the peak RSS stays under the bound; once
    they go, a consumer is answered."""
    import select

    reset_peak(loaded.proc.pid)
    greedy = [connect(loaded) for _ in range(10)]
    for s in greedy:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        s.sendall(fetch_many("big", [0, 1]))

    def answered() -> list[socket.socket]:
        poller = select.poll()  # not select(): late in a full run this process's descriptors pass 1024
        for s in greedy:
            poller.register(s, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(0)}
        return [s for s in greedy if s.fileno() in ready]

    seen, still = -1, 0
    while still < 4:  # until no new connection has got an answer for 2 s
        time.sleep(0.5)
        n = len(answered())
        still = still + 1 if n == seen else 0
        seen = n
    sizes = [struct.unpack(">i", s.recv(4, socket.MSG_PEEK))[0] for s in answered()]
    assert sum(sizes) <= 2 * 55 * MiB + len(sizes) * (MiB + 1000), sizes  # the pool, and a record each over
    assert peak_rss(loaded.proc.pid) < RSS_BOUND
    for s in greedy:
        s.close()
    with connect(loaded) as s:
        s.settimeout(30)
        s.sendall(fetch_many("big", [0], max_bytes=3 * MiB))
        got = read_response(s)
    assert got is not None
    assert 2 * MiB < len(decode_response(got, 1, 12).responses[0].partitions[0].records) <= 3 * MiB
    assert peak_rss(loaded.proc.pid) < RSS_BOUND


# -- connections ----------------------------------------------------------------------------------
def test_connection_limits_refuse_at_accept_and_log_once(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"), "--max-connections", "4", "--max-connections-per-ip", "2")
    try:
        held = [connect(b), connect(b)]
        for s in held:  # both served
            assert call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
        with connect(b) as s:  # a third from 127.0.0.1: closed at accept, nothing read
            assert close_soon(s)
        for ip in ("127.0.0.2", "127.0.0.3"):  # other addresses, up to max.connections
            s = source(ip)
            s.connect(("127.0.0.1", b.port))
            assert call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
            held.append(s)
        s = source("127.0.0.4")
        s.connect(("127.0.0.1", b.port))
        assert close_soon(s)  # max.connections (4) reached
        s.close()
        for _ in range(200):  # a flood of refused connections: one log line, no traceback
            with connect(b) as s:
                assert close_soon(s)
        held.pop(0).close()  # its place comes back (once the broker has seen it close)
        assert wait_for(lambda: served(b), 10)
        for s in held:
            s.close()
    finally:
        assert b.stop() == 0
    err = b.stderr()
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if "refusing connections" in x]
    assert 1 <= len(lines) <= 3, lines
    assert "max.connections.per.ip (2) reached by 127.0.0.1" in lines[0] or "max.connections (4)" in lines[0]


def test_a_started_size_is_under_the_request_timeout(tmp_path):
    """Three bytes of a frame's size, then silence: closed after the request timeout
    (1 s here), not after the idle timeout (10 minutes); a silent connection that has
    started nothing stays open."""
    b = BrokerProcess(str(tmp_path / "root"), "--request-timeout", "1s")
    try:
        idle = connect(b)
        with connect(b) as s:
            s.sendall(b"\0\0\0")
            start = time.monotonic()
            assert close_soon(s)  # within the 20 s socket timeout
            assert time.monotonic() - start < 15
        assert call(idle, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}), 18, 3)
        idle.close()
    finally:
        assert b.stop() == 0


def test_limit_flags_are_checked_before_anything_starts(tmp_path, capsys):
    """A bad bound is a usage error naming the flag and the value; nothing is created."""
    from pylog.cli import main
    from pylog.serve import Server

    for args, words in ((["--queued-max-request-bytes", "1MiB"], "at least --max-request-bytes"),
                        (["--fetch-max-bytes", "lots"], "'lots' is not a size"),
                        (["--max-connections", "0"], "--max-connections"),
                        (["--request-timeout", "0s"], "not a positive duration")):
        with pytest.raises(SystemExit) as e:
            main(["--root", str(tmp_path / "r"), "serve", "--port", "0", *args])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err, (args, err)
    assert not (tmp_path / "r").exists()
    with pytest.raises(pylog.errors.InvalidArgumentError, match="max_connections must be a positive integer, not 0"):
        Server(str(tmp_path / "r"), max_connections=0)
    with pytest.raises(pylog.errors.InvalidArgumentError, match=r"queued_max_request_bytes \(10\) must be at least"):
        Server(str(tmp_path / "r"), queued_max_request_bytes=10)


def test_open_files_limit_raised_and_running_out_refuses_at_accept(tmp_path):
    """Started with a soft RLIMIT_NOFILE of 32 and a hard one of 64, the broker runs with 64.
    Then 150 clients connect: those without a descriptor are closed at accept and counted
    in one warning line, not a traceback per attempt (asyncio's accept loop logs up to 100
    per round), and the broker serves once they go."""
    if not shutil.which("prlimit"):
        pytest.skip("prlimit (util-linux) is not installed")
    cmd = ["prlimit", "--nofile=32:64", "--", sys.executable, "-m", "pylog.cli", "--root", str(tmp_path / "r"),
           "serve", "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=py_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        with open(f"/proc/{proc.pid}/limits") as f:
            row = next(x for x in f if x.startswith("Max open files")).split()
        assert row[3:5] == ["64", "64"]
        socks = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(150)]
        refused = 0
        for s in socks[-60:]:  # past the limit: closed unanswered
            s.sendall(frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}))
            refused += close_soon(s)
        assert refused == 60
        for s in socks:
            s.close()

        def fresh() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                    return call(s, frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}),
                                18, 3) is not None
            except ConnectionError:
                return False
        assert wait_for(fresh, 10)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err[:3000]
    lines = [x for x in err.splitlines() if "refusing connections: no descriptor left (EMFILE" in x]
    assert 1 <= len(lines) <= 3, err[:3000]
    assert "raised from 32 to 64" in err
    assert "open files limit (64) is below max.connections (1000)" in err


# -- shutdown -------------------------------------------------------------------------------------
def test_requests_during_shutdown_are_answered_or_closed_without_tracebacks(tmp_path):
    """SIGTERM while clients produce, fetch, ask for metadata and open new connections, and
    one long poll waits (max_wait 60 s): the long poll is answered at once, every other
    request is answered or its connection closed, the broker exits 0 and logs no traceback."""
    b = BrokerProcess(str(tmp_path / "root"))
    with connect(b) as s:
        create_topic(s, "sd", 2)
    stop = threading.Event()
    answered = [0] * 4
    problems: list[str] = []
    reqs = [(produce("sd", batch([b"v" * 100] * 10)), 0, 9), (fetch("sd", 0, max_wait=50), 1, 12),
            (frame(3, 12, {"topics": None}), 3, 12)]

    def client(i: int) -> None:
        while not stop.is_set():
            try:
                with connect(b) as s:
                    for _ in range(20):
                        data, key, version = reqs[(i + answered[i]) % len(reqs)]
                        s.sendall(data)
                        got = read_response(s)
                        if got is None:
                            return  # closed by the broker: allowed
                        decode_response(got, key, version)  # whole and well-formed
                        answered[i] += 1
            except (ConnectionError, TimeoutError):
                return  # refused or reset while stopping: allowed
            except Exception as e:  # noqa: BLE001 - a malformed answer is the failure we look for
                problems.append(repr(e))
                return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    poll = connect(b)
    poll.sendall(fetch("sd", 1 << 20, max_wait=60_000, min_bytes=1))  # past the end: waits for data
    assert wait_for(lambda: min(answered) >= 5, 30)
    start = time.monotonic()
    os.kill(b.proc.pid, signal.SIGTERM)
    poll.settimeout(20)
    got = read_response(poll)  # answered when the broker stops, not after 60 s or never
    poll.close()
    stop.set()
    for t in threads:
        t.join(30)
    assert b.proc.wait(30) == 0
    assert time.monotonic() - start < 20
    assert got is not None and decode_response(got, 1, 12).responses[0].partitions[0].records in (None, b"")
    assert not problems, problems
    err = b.stderr()
    assert "Traceback" not in err and " ERROR " not in err, err


def test_the_broker_returns_freed_buffers_to_the_kernel(monkeypatch):
    """``serve`` fixes glibc's mmap threshold (a freed 1 MiB buffer leaves the heap); a
    threshold the user set in the environment is left alone."""
    from pylog.serve.server import return_freed_buffers

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert return_freed_buffers() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert return_freed_buffers() is True
