"""`pylog serve` review leftovers (docs/serve.md): one error-code ladder for the admin APIs,
fetched records counted off the event loop, the C durable append kept while fsyncs are
timed for the metrics, a bounded metrics endpoint on loopback by default, CreateTopics'
configs created with the topic in one step (a power-cut sweep over every file operation),
and the copies a Fetch response makes counted in the response pool.
"""
from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest

pytest.importorskip("kio")
pytest.importorskip("prometheus_client")
from kio.schema.errors import ErrorCode as E  # noqa: E402
from serve_util import BrokerProcess, api_versions_ok, call, fetch, frame  # noqa: E402

import pylog  # noqa: E402
from pylog import vfs  # noqa: E402
from pylog.errors import (  # noqa: E402
    ConfigError,
    InvalidNameError,
    PylogError,
    TopicExistsError,
    UnknownTopicError,
)
from pylog.serve import admin_configs, configs, handlers  # noqa: E402


# -- 1. one ladder from an exception to Kafka's error code ---------------------------------------
def test_the_ladder_maps_each_exception_once():
    from pylog.serve.error_codes import code_of

    assert code_of(TopicExistsError("t")) == E.topic_already_exists
    assert code_of(UnknownTopicError("t")) == E.unknown_topic_or_partition
    assert code_of(InvalidNameError("t")) == E.unknown_topic_or_partition
    assert code_of(InvalidNameError("t"), {InvalidNameError: E.invalid_topic_exception}) == E.invalid_topic_exception
    assert code_of(ConfigError("c")) == E.invalid_config
    assert code_of(PylogError("p")) == E.invalid_request
    # an override of a rung leaves the rungs above it alone
    assert code_of(UnknownTopicError("t"), {PylogError: E.invalid_partitions}) == E.unknown_topic_or_partition
    assert code_of(PylogError("p"), {PylogError: E.invalid_partitions}) == E.invalid_partitions
    assert code_of(OSError(errno.ENOSPC, "full")) == E.kafka_storage_error
    assert code_of(ValueError("v")) == E.unknown_server_error


def _full_disk(*_a, **_k):  # type: ignore[no-untyped-def]
    raise OSError(errno.ENOSPC, "No space left on device")


def test_admin_handlers_answer_a_failing_disk_per_resource():
    """DeleteTopics, CreatePartitions and DescribeConfigs answer an OSError on one resource
    KAFKA_STORAGE_ERROR with its message, the other resources as usual (they raised it
    before: the server closed the connection)."""
    deleted = []

    def delete(name: str) -> None:
        if name == "bad":
            _full_disk()
        deleted.append(name)

    broker = SimpleNamespace(delete_topic=delete)
    out = handlers.delete_topics(broker, SimpleNamespace(topic_names=["bad", "good"]), 4)  # type: ignore[arg-type]
    assert [(r["name"], r["error_code"]) for r in out["responses"]] == [("bad", E.kafka_storage_error),
                                                                        ("good", 0)]
    assert "No space left" in out["responses"][0]["error_message"] and deleted == ["good"]

    store = SimpleNamespace(add_partitions=_full_disk)
    broker = SimpleNamespace(topic=lambda name, create=False: SimpleNamespace(partitions=1), store=store)
    req = SimpleNamespace(topics=[SimpleNamespace(name="t", count=3, assignments=None)], validate_only=False)
    out = handlers.create_partitions(broker, req, 1)  # type: ignore[arg-type]
    assert out["results"][0]["error_code"] == E.kafka_storage_error

    broker = SimpleNamespace(topic=_full_disk)
    req = SimpleNamespace(resources=[SimpleNamespace(resource_type=admin_configs.TOPIC_RESOURCE,
                                                     resource_name="t", configuration_keys=None)])
    out = admin_configs.describe_configs(broker, req, 4)  # type: ignore[arg-type]
    assert out["results"][0]["error_code"] == E.kafka_storage_error


# -- 2. fetched records counted in the fetch threads, not on the loop ---------------------------------
def test_fetched_records_are_counted_off_the_event_loop(tmp_path, monkeypatch):
    """A Fetch of 4,000 records with metrics on: the batches are walked (their record
    counts read) only in the fetch threads, never on the event loop's thread, and the
    endpoint reports every record and byte sent."""
    from pylog.serve import broker as broker_mod
    from pylog.serve import metrics as metrics_mod
    from pylog.serve import reads
    from pylog.serve.server import Server

    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        t = store.create_topic("f", partitions=1)
        t.append_batch([b"v%05d" % i for i in range(4000)], partition=0)
    walked: list[int] = []
    original = getattr(reads, "batch_records", None) or metrics_mod.batch_records

    def counting(data):  # type: ignore[no-untyped-def]
        walked.append(threading.get_ident())
        return original(data)

    monkeypatch.setattr(metrics_mod, "batch_records", counting)
    monkeypatch.setattr(broker_mod, "batch_records", counting, raising=False)

    async def main() -> tuple[int, float, float, set[int]]:
        srv = Server(root, port=0, metrics_port=0, cleanup_interval=None, cleaner_backoff=None)
        await srv.start()
        loop_thread = threading.get_ident()
        loop = asyncio.get_running_loop()
        try:
            def client() -> int:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
                    r = call(s, fetch("f", 0, max_bytes=8 << 20, partition_max_bytes=8 << 20), 1, 12)
                    return len(r.responses[0].partitions[0].records)
            size = await loop.run_in_executor(None, client)
            text = await loop.run_in_executor(None, _get, f"http://127.0.0.1:{srv.metrics_port}/metrics")
        finally:
            await srv.stop()
        return size, _sample(text, 'pylog_topic_records_out_total{topic="f"}'), \
            _sample(text, 'pylog_topic_bytes_out_total{topic="f"}'), {loop_thread}

    size, records, nbytes, loop_thread = asyncio.run(main())
    assert records == 4000 and nbytes == size > 0
    assert walked, "the records were not counted"
    assert not loop_thread & set(walked), "the event loop walked the fetched batches"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return str(r.read().decode())


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


# -- 3. the C durable append stays while fsyncs are timed ---------------------------------------------
def test_timed_fsyncs_keep_the_c_durable_append(tmp_path):
    """With the metrics endpoint on (fsyncs timed), 200 ``fsync="always"`` appends of a
    library Log lead their fdatasyncs in C (``Framer.append_durable``): the Python timed
    wrapper of fdatasync runs for at most the segment's first append (before C may lead),
    and each of the C path's fdatasyncs still reaches the fsync histogram."""
    from pylog._backend import speedups

    if getattr(getattr(speedups, "Framer", None), "append_durable", None) is None:
        pytest.skip("no C durable append in this build")
    from pylog.serve.metrics import Metrics

    m = Metrics(SimpleNamespace())  # type: ignore[arg-type]
    m.start("127.0.0.1", 0)
    timed_code = vfs.fdatasync.__code__  # the timed wrapper's code (every wrapper shares it)
    python_syncs = 0

    def profile(f, event, arg):  # type: ignore[no-untyped-def]
        nonlocal python_syncs
        if event == "call" and f.f_code is timed_code:
            python_syncs += 1

    log = pylog.Log(str(tmp_path / "log"), config=pylog.LogConfig(fsync="always"))
    try:
        sys.setprofile(profile)
        try:
            for i in range(200):
                log.append(b"r%d" % i)
        finally:
            sys.setprofile(None)
        observed = m.fsync.collect()[0]
        count = next(s.value for s in observed.samples if s.name.endswith("_count"))
    finally:
        log.close()
        m.stop()
    assert python_syncs <= 2, f"{python_syncs} of 200 durable appends took the Python path"
    assert count >= 200 - python_syncs


def test_a_replaced_fdatasync_still_sees_every_call_while_timed(tmp_path, monkeypatch):
    """A fault injector's fdatasync (here failing with EIO), timed: the C path is not taken
    for it (only the default fdatasync's timed wrapper counts as the default), so the
    injected error reaches the append, and is timed."""
    seen: list[float] = []
    log = pylog.Log(str(tmp_path / "log"), config=pylog.LogConfig(fsync="always"))
    log.append(b"first")
    calls = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(vfs, "fdatasync", failing)
    vfs.observe_syncs(seen.append)
    try:
        with pytest.raises((OSError, PylogError)):
            for i in range(5):
                log.append(b"next%d" % i)
    finally:
        vfs.unobserve_syncs(seen.append)
    assert calls and len(seen) >= len(calls)
    try:
        log.close()
    except (OSError, PylogError):
        pass


# -- 4. the metrics endpoint: loopback by default, bounded -------------------------------------------
def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_metrics_listen_on_loopback_unless_told(tmp_path):
    """A broker on 127.0.0.2 serves its metrics on 127.0.0.1 (not on the broker's address);
    ``metrics_host`` moves them."""
    from pylog.errors import InvalidArgumentError
    from pylog.serve.server import Server

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a = Server(str(tmp_path / "a"), host="127.0.0.2", port=0, metrics_port=0, cleanup_interval=None)
        await a.start()
        try:
            text = await loop.run_in_executor(None, _get, f"http://127.0.0.1:{a.metrics_port}/metrics")
            assert "pylog_connections" in text
            assert await loop.run_in_executor(None, _refused, "127.0.0.2", a.metrics_port)
        finally:
            await a.stop()
        b = Server(str(tmp_path / "b"), port=0, metrics_port=0, metrics_host="127.0.0.3", cleanup_interval=None)
        await b.start()
        try:
            text = await loop.run_in_executor(None, _get, f"http://127.0.0.3:{b.metrics_port}/metrics")
            assert "pylog_connections" in text
            assert await loop.run_in_executor(None, _refused, "127.0.0.1", b.metrics_port)
        finally:
            await b.stop()

    asyncio.run(main())
    with pytest.raises(InvalidArgumentError, match="metrics_host"):
        Server(str(tmp_path / "c"), port=0, metrics_port=0, metrics_host="")


def test_the_metrics_host_flag(tmp_path):
    """``pylog serve --metrics-host`` moves the endpoint; the ready line names it."""
    b = BrokerProcess(str(tmp_path / "root"), "--metrics-port", "0", "--metrics-host", "127.0.0.2")
    try:
        assert "metrics on http://127.0.0.2:" in b.line, b.line
        port = int(b.line.rsplit(":", 1)[1].split("/")[0])
        assert "pylog_connections" in _get(f"http://127.0.0.2:{port}/metrics")
        assert _refused("127.0.0.1", port)
    finally:
        assert b.stop() == 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_slow_loris_on_the_metrics_port_takes_neither_descriptors_nor_the_loop(tmp_path):
    """200 connections to the metrics port, each sending half a request and then nothing:
    the broker holds at most MAX_CONNECTIONS of them (descriptors and threads), answers
    Kafka clients meanwhile, and serves a scrape once they go."""
    try:
        from pylog.serve.metrics_http import MAX_CONNECTIONS
    except ImportError:  # (the bound this test holds any endpoint to)
        MAX_CONNECTIONS = 4

    b = BrokerProcess(str(tmp_path / "root"), "--metrics-port", "0")
    try:
        port = int(b.line.rsplit(":", 1)[1].split("/")[0])
        assert "metrics on http://127.0.0.1:" in b.line
        assert _get(f"http://127.0.0.1:{port}/metrics")
        time.sleep(0.3)  # the scrape's thread and descriptor gone
        fds, threads = _fds(b.proc.pid), _threads(b.proc.pid)
        attackers = []
        for _ in range(200):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            attackers.append(s)
        time.sleep(0.5)
        for s in attackers:
            try:
                s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                pass
        time.sleep(1.0)
        assert _fds(b.proc.pid) <= fds + MAX_CONNECTIONS + 1
        assert _threads(b.proc.pid) <= threads + MAX_CONNECTIONS + 1
        t = time.monotonic()
        assert api_versions_ok(b)
        assert time.monotonic() - t < 10  # generous: the loop is not held up
        for s in attackers:
            s.close()
        time.sleep(0.3)
        assert _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        assert b.stop() == 0
    assert "Traceback" not in b.stderr()


def test_the_metrics_server_bounds_request_size_and_time():
    """A request past MAX_REQUEST_BYTES is answered 431; one that does not end within the
    request timeout is closed unanswered; other methods and paths: 405 and 404."""
    from prometheus_client import CollectorRegistry, Counter

    from pylog.serve.metrics_http import MetricsServer

    reg = CollectorRegistry()
    Counter("x", "a counter", registry=reg).inc()
    srv = MetricsServer("127.0.0.1", 0, reg, max_connections=2, request_timeout=0.5, max_request_bytes=1024)
    srv.start()
    try:
        def ask(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                s.sendall(data)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
                return out

        assert ask(b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert b"x_total 1.0" in ask(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert ask(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 4000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
        assert ask(b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
        assert ask(b"GET /etc/passwd HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            t = time.monotonic()
            assert s.recv(10) == b""  # closed unanswered, after the request timeout
            assert time.monotonic() - t < 8
    finally:
        srv.stop()


# -- 5. a topic and its configs appear together ---------------------------------------------------------
def _create_request(name: str) -> SimpleNamespace:
    cfgs = [SimpleNamespace(name="retention.ms", value="123456"), SimpleNamespace(name="compression.type",
                                                                                  value="gzip")]
    return SimpleNamespace(topics=[SimpleNamespace(name=name, num_partitions=1, replication_factor=1,
                                                   assignments=[], configs=cfgs)], validate_only=False)


def _admin_stub(root: str) -> SimpleNamespace:
    return SimpleNamespace(store=pylog.LogStore(root), settings=configs.Settings(root), topic_defaults={},
                           default_partitions=1)


class _KillAt:
    """A vfs layer (``vfs.install``) that SIGKILLs the process before its ``at``-th call
    (None: counts them only): the disk as a crash at that point leaves it."""

    def __init__(self, at: int | None) -> None:
        self.at, self.calls = at, 0
        for name, op in vfs._DEFAULTS.items():
            setattr(self, name, self._wrap(op))

    def _wrap(self, op):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGKILL)
            return op(*args)
        return call


@pytest.fixture
def fast_disk(tmp_path):
    """A 32 MiB tmpfs (fsync costs nothing: a sweep of 150 creations stays fast), else the
    test's directory; unmounted afterwards."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(d)],
                             capture_output=True).returncode == 0
    yield d
    if mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_create_topics_makes_the_topic_and_its_configs_in_one_step(fast_disk):
    """CreateTopics with configs, SIGKILLed before each of its file operations in turn (a
    forked child per operation): after every kill the root holds either no topic, or the
    topic with the configs it was created with (after a restart's recovery too), never
    one without the other."""
    tmp_path = fast_disk
    want = {"retention.ms": "123456", "compression.type": "gzip"}

    def run(root: str, at: int | None) -> int:
        broker = _admin_stub(root)
        layer = _KillAt(at)
        vfs.install(layer)
        try:
            out = handlers.create_topics(broker, _create_request("t"), 7)  # type: ignore[arg-type]
        finally:
            vfs.uninstall()
        assert out["topics"][0]["error_code"] == 0, out
        broker.store.close()
        return layer.calls

    total = run(str(tmp_path / "dry"), None)
    assert total > 10
    outcomes = set()
    for at in range(1, total + 2):
        root = str(tmp_path / f"r{at}")
        pid = os.fork()
        if pid == 0:  # the child: killed at call ``at``, or done
            try:
                run(root, at)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL) or \
            (at > total and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0), (at, status)
        with pylog.LogStore(root) as store:  # the next open's recovery
            exists = "t" in store.topics()
            if exists:
                assert store.topic("t").partitions == 1
        got = configs.Settings(root).explicit("t")
        if exists:
            assert got == want, f"killed before call {at} of {total}: the topic without its configs ({got})"
        else:
            assert got == {} and not os.path.exists(os.path.join(root, "t"))
        outcomes.add(exists)
    assert outcomes == {False, True}


def test_create_topic_files_are_checked_names(tmp_path):
    """``LogStore.create_topic(files=...)`` writes only plain names into the topic."""
    with pylog.LogStore(str(tmp_path / "root")) as store:
        with pytest.raises(InvalidNameError):
            store.create_topic("t", files={"../escape": b"x"})
        assert "t" not in store.topics()
        store.create_topic("u", files={"extra.json": b"{}"})
        with open(os.path.join(store.root, "u", "extra.json"), "rb") as f:
            assert f.read() == b"{}"


# -- 6. the copies a Fetch response makes count in the response pool -----------------------------------
def test_a_hostile_consumer_of_many_partitions_holds_what_the_pool_counts(fast_disk):
    """Four connections each fetch 128 partitions (55 KB each, every one under the
    encoder's zero-copy size: the records are copied into the frame) with a large
    max_bytes, and never read. The frame (what the pool counts) is not copied again: it is
    written in slices, so the transport holds one slice of it at most; before, the frame
    was copied to bytes and the transport copied the whole unsent rest, uncounted."""
    import gc

    from pylog.serve.server import WRITE_SLICE, Server

    root = str(fast_disk / "root")
    with pylog.LogStore(root) as store:
        t = store.create_topic("wide", partitions=128, segment_bytes=1 << 20)
        for p in range(128):
            t.append_batch([bytes([p]) * 1000] * 55, partition=p)
    request = frame(1, 12, {"max_wait": 0, "min_bytes": 0, "max_bytes": 0x7FFFFFFF, "isolation_level": 0,
                            "topics": [{"topic": "wide", "partitions": [
                                {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                                for p in range(128)]}]})

    async def main() -> tuple[list[int], int]:
        srv = Server(root, port=0, cleanup_interval=None, cleaner_backoff=None)
        await srv.start()
        loop = asyncio.get_running_loop()
        socks: list[socket.socket] = []
        try:
            def attack() -> None:
                for _ in range(4):
                    s = socket.socket()
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)  # (before connect)
                    s.settimeout(20)
                    s.connect(("127.0.0.1", srv.port))
                    s.sendall(request)
                    socks.append(s)
            await loop.run_in_executor(None, attack)
            def transports() -> list[asyncio.WriteTransport]:  # this broker's side of the connections
                return [o for o in gc.get_objects() if isinstance(o, asyncio.WriteTransport)
                        and not o.is_closing() and (o.get_extra_info("sockname") or (0, 0))[1] == srv.port]
            buffered: list[int] = []
            for _ in range(50):  # until the four responses are built and stuck in their writes
                await asyncio.sleep(0.2)
                buffered = [tr.get_write_buffer_size() for tr in transports()]
                if len(buffered) == 4 and all(buffered) and srv._responses.used >= 4 * 7_000_000:
                    break
            await asyncio.sleep(0.3)
            return [tr.get_write_buffer_size() for tr in transports()], srv._responses.used
        finally:
            for s in socks:
                s.close()
            await srv.stop()

    buffered, used = asyncio.run(main())
    assert len(buffered) == 4 and all(buffered), buffered  # every response stuck in its write
    assert used >= 4 * 7_000_000, used  # four responses of 128 x 55 KB: counted
    assert max(buffered) <= WRITE_SLICE + (64 << 10), buffered  # a slice at most, never the frame
