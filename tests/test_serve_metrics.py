"""pylog serve: the Prometheus endpoint (issue 29, item 10), DescribeCluster and
DescribeLogDirs (item 9).

The endpoint is scraped over HTTP while confluent-kafka producers and consumers and raw
frames work against a real broker process; the numbers are checked against what was sent
(batch bytes, records), what was fetched, and what a group left unconsumed. DescribeCluster
goes through confluent-kafka's AdminClient (librdkafka asks with Metadata v10) and a raw
DescribeCluster frame, DescribeLogDirs through kafka-python's admin client; the authorized
operations follow the users file's rights.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
import urllib.request

import pytest

pytest.importorskip("kio")
pytest.importorskip("prometheus_client")
ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka.admin import AclOperation, AdminClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serve_util import BrokerProcess, batch, call, connect, create_topic, fetch, frame, produce, wait_for  # noqa: E402

from pylog.serve import security  # noqa: E402

STRACE = shutil.which("strace")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metrics_url(b: BrokerProcess) -> str:
    m = re.search(r"metrics on (http://\S+)", b.line)
    assert m, b.line
    return m.group(1)


def value(m, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def _rk(b: BrokerProcess, **kw):  # type: ignore[no-untyped-def]
    return {"bootstrap.servers": b.bootstrap, **kw}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker with a metrics endpoint for the tests of this module (a process start is
    seconds on a loaded machine); before it starts, pylog's own consumer commits offsets
    of group "old" on topic "pre" (see the lag test)."""
    import pylog

    root = str(tmp_path_factory.mktemp("metrics") / "root")
    with pylog.LogStore(root) as store:
        t = store.create_topic("pre", partitions=2, fsync="never")
        t.append_batch([b"v%d" % i for i in range(10)], partition=0)
        t.append_batch([b"w%d" % i for i in range(4)], partition=1)
        c = store.consumer("pre", group="old")
        try:
            c.commit({0: 6, 1: 1})
        finally:
            c.close()
    b = BrokerProcess(root, "--metrics-port", "0")
    yield b
    assert b.stop() == 0
    assert "Traceback" not in b.stderr()


def test_bytes_records_requests_connections_and_lag_through_real_clients(broker):
    """Produce: a raw batch (its exact bytes) and 60 records from confluent-kafka; bytes and
    records in are what was sent. Fetch: a raw fetch's batch bytes and records are counted
    out. A confluent-kafka consumer group commits after 40 of 60 records: its lag is the 20
    unconsumed, and grows with what is produced after. Requests are counted per API with
    their latency; connections open are counted; every fdatasync of a flush.messages=1
    topic is in the fsync histogram."""
    url = metrics_url(broker)
    assert scrape(url)  # the endpoint answers before any client came
    with connect(broker) as s:
        create_topic(s, "m", partitions=1, flush_messages="1")
        raw = batch([b"raw-%d" % i for i in range(7)])
        assert call(s, produce("m", raw), 0, 9).responses[0].partition_responses[0].error_code == 0
        m = scrape(url)
        assert value(m, "pylog_topic_bytes_in_total", topic="m") == len(raw)
        assert value(m, "pylog_topic_records_in_total", topic="m") == 7
        assert value(m, "pylog_connections") == 1
        assert value(m, "pylog_fsync_seconds_count") >= 1  # fsync=always: the batch's fdatasync
        assert value(m, "pylog_request_seconds_count", api="Produce") == 1
        assert value(m, "pylog_request_seconds_count", api="CreateTopics") == 1
        assert value(m, "pylog_request_seconds_bucket", api="Produce", le="+Inf") == 1
        assert value(m, "pylog_request_seconds_sum", api="Produce") > 0

        # confluent-kafka: what it sent, from its own statistics (the batch sizes of topic m)
        sent = []
        p = ck.Producer(_rk(broker, **{"linger.ms": 5, "statistics.interval.ms": 100,
                                       "stats_cb": lambda js: sent.append(js)}))
        for i in range(60):
            p.produce("m", b"value-%03d" % i, key=b"k%d" % (i % 3))
        assert p.flush(20) == 0
        end = time.monotonic() + 1
        while time.monotonic() < end:  # the statistics reports after the last batch
            p.poll(0.1)
        m = scrape(url)
        assert value(m, "pylog_topic_records_in_total", topic="m") == 67
        # bytes in: the raw batch and the batches librdkafka sent (the batch sizes of topic m
        # in its statistics, each report's window summed)
        assert any(_batch_bytes(js, "m") for js in sent)
        assert value(m, "pylog_topic_bytes_in_total", topic="m") == len(raw) + sum(_batch_bytes(js, "m") for js in sent)

        # a raw fetch: the batch bytes it got are counted out, with their records
        before = scrape(url)
        r = call(s, fetch("m", 0), 1, 12)
        got = r.responses[0].partitions[0].records
        m = scrape(url)
        assert value(m, "pylog_topic_bytes_out_total", topic="m") - \
            value(before, "pylog_topic_bytes_out_total", topic="m") == len(got)
        assert value(m, "pylog_topic_records_out_total", topic="m") - \
            value(before, "pylog_topic_records_out_total", topic="m") == 67
        assert value(m, "pylog_request_seconds_count", api="Fetch") >= 1

    # the consumer group: reads 40 of the 60, commits there
    c = ck.Consumer(_rk(broker, **{"group.id": "g1", "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    try:
        c.subscribe(["m"])
        seen = 0
        last = None
        while seen < 47:
            msg = c.poll(1.0)
            if msg is None or msg.error():
                continue
            seen += 1
            last = msg
        assert last is not None
        c.commit(message=last, asynchronous=False)  # committed offset 47: 20 left
        m = wait_for(lambda: (lambda x: x if value(x, "pylog_group_lag", group="g1", topic="m", partition="0") == 20
                              else None)(scrape(url)), timeout=10)
        assert m, scrape(url)
        assert value(m, "pylog_group_committed_offset", group="g1", topic="m", partition="0") == 47
        assert value(m, "pylog_connections") >= 1
        # librdkafka prefetches: every record went out at least once
        assert value(m, "pylog_topic_records_out_total", topic="m") >= 67 + 47
        assert value(m, "pylog_request_seconds_count", api="OffsetCommit") == 1
        assert value(m, "pylog_request_seconds_count", api="JoinGroup") >= 1
    finally:
        c.close()
    p = ck.Producer(_rk(broker))
    for i in range(5):
        p.produce("m", b"more-%d" % i)
    assert p.flush(20) == 0
    m = scrape(url)
    assert value(m, "pylog_group_lag", group="g1", topic="m", partition="0") == 25
    assert value(m, "pylog_topic_records_in_total", topic="m") == 72
    del p  # its connections close: none is left open
    assert wait_for(lambda: value(scrape(url), "pylog_connections") == 0, timeout=10)
    assert value(scrape(url), "pylog_fenced_partitions") == 0


def _batch_bytes(js: str, topic: str) -> int:
    import json

    t = json.loads(js).get("topics", {}).get(topic)
    return int(t["batchsize"]["sum"]) if t else 0


def test_group_lag_of_partitions_the_broker_has_not_opened(broker):
    """Offsets committed by pylog's own consumer before the broker started (the fixture),
    on partitions no client has touched since: the scrape reads them and the partitions'
    ends, per partition."""
    m = scrape(metrics_url(broker))
    assert value(m, "pylog_group_committed_offset", group="old", topic="pre", partition="0") == 6
    assert value(m, "pylog_group_lag", group="old", topic="pre", partition="0") == 4
    assert value(m, "pylog_group_committed_offset", group="old", topic="pre", partition="1") == 1
    assert value(m, "pylog_group_lag", group="old", topic="pre", partition="1") == 3


def test_two_brokers_in_one_process_keep_their_own_metrics(tmp_path):
    """Two Servers in one process, each with its own registry and endpoint: no clash, and
    each counts its own topics only; stopping one stops its endpoint."""
    from pylog.serve.server import Server

    async def main() -> None:
        a = Server(str(tmp_path / "a"), port=0, metrics_port=0)
        b = Server(str(tmp_path / "b"), port=0, metrics_port=0)
        await a.start()
        try:
            await b.start()
            try:
                assert a.metrics_port != b.metrics_port
                loop = asyncio.get_running_loop()

                def work() -> None:
                    for srv, topic in ((a, "ta"), (b, "tb")):
                        p = ck.Producer({"bootstrap.servers": f"127.0.0.1:{srv.port}"})
                        p.produce(topic, b"x")
                        assert p.flush(20) == 0
                await loop.run_in_executor(None, work)
                ma = await loop.run_in_executor(None, scrape, f"http://127.0.0.1:{a.metrics_port}/metrics")
                mb = await loop.run_in_executor(None, scrape, f"http://127.0.0.1:{b.metrics_port}/metrics")
                assert value(ma, "pylog_topic_records_in_total", topic="ta") == 1
                assert ("pylog_topic_records_in_total", (("topic", "tb"),)) not in ma
                assert value(mb, "pylog_topic_records_in_total", topic="tb") == 1
                assert ("pylog_topic_records_in_total", (("topic", "ta"),)) not in mb
            finally:
                port = b.metrics_port
                await b.stop()
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        finally:
            await a.stop()

    asyncio.run(main())


def test_metrics_port_is_checked():
    from pylog.errors import InvalidArgumentError
    from pylog.serve.server import Server

    for bad in (-1, 65536, "9100", True):
        with pytest.raises(InvalidArgumentError, match="metrics_port"):
            Server("unused", port=0, metrics_port=bad)  # type: ignore[arg-type]


def test_metrics_without_prometheus_client_names_the_extra(monkeypatch):
    import importlib.util

    from pylog.errors import MissingExtraError
    from pylog.serve.server import Server

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "prometheus_client"
                        else find(name, *a))
    with pytest.raises(MissingExtraError, match=r"pylog-commitlog\[serve\]"):
        Server("unused", port=0, metrics_port=0)
    Server("unused", port=0)  # no metrics: not needed


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_fenced_partition_is_counted(tmp_path):
    """An fdatasync failing with EIO (strace) fences a flush.messages=1 partition: the scrape
    counts it and names it."""
    root = str(tmp_path / "root")
    store = os.path.join(root, "f", "partition-0", "00000000000000000000.log")  # only its fdatasyncs fail
    b = BrokerProcess(root, "--metrics-port", "0", "--fence-backoff", "3600",
                      prefix=[STRACE, "-f", "-qq", "-o", os.devnull, "-e", "inject=fdatasync:error=EIO:when=1+",
                              "-P", store])
    try:
        url = metrics_url(b)
        with connect(b) as s:
            create_topic(s, "f", flush_messages="1")
            codes = []
            for i in range(5):
                r = call(s, produce("f", batch([b"x%d" % i])), 0, 9)
                codes.append(r.responses[0].partition_responses[0].error_code)
                if codes[-1]:
                    break
            assert codes[-1] == 56, codes  # KAFKA_STORAGE_ERROR: fenced
        m = scrape(url)
        assert value(m, "pylog_fenced_partitions") == 1
        assert value(m, "pylog_partition_fenced", topic="f", partition="0") == 1
        assert value(m, "pylog_fsync_seconds_count") >= 1
        # strace only detaches when signalled: the broker itself is stopped
        with open(f"/proc/{b.proc.pid}/task/{b.proc.pid}/children") as f:
            os.kill(int(f.read().split()[0]), signal.SIGTERM)
        assert b.proc.wait(60) == 0
    finally:
        b.stop(signal.SIGKILL)


# -- DescribeCluster and DescribeLogDirs -----------------------------------------------------
ALL_CLUSTER_OPS = {AclOperation.ALTER, AclOperation.ALTER_CONFIGS, AclOperation.CLUSTER_ACTION,
                   AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
                   AclOperation.IDEMPOTENT_WRITE}


def test_describe_cluster_through_confluent_and_raw(broker):
    """confluent-kafka's describe_cluster (librdkafka asks with Metadata v10) and a raw
    DescribeCluster v0-v2: one broker, node 0, the controller; without a users file every
    cluster operation is authorized; not asked for, none are answered."""
    b = broker
    a = AdminClient(_rk(b))
    d = a.describe_cluster(include_authorized_operations=True).result(20)
    assert d.cluster_id == "pylog"
    assert d.controller.id == 0 and [(n.id, n.host, n.port) for n in d.nodes] == [(0, "127.0.0.1", b.port)]
    assert set(d.authorized_operations) == ALL_CLUSTER_OPS
    assert a.describe_cluster().result(20).authorized_operations is None
    with connect(b) as s:
        for v in (0, 1, 2):
            body = {"include_cluster_authorized_operations": True}
            if v >= 1:
                body["endpoint_type"] = 1
            if v >= 2:
                body["include_fenced_brokers"] = True
            r = call(s, frame(60, v, body), 60, v)
            assert r.error_code == 0 and r.cluster_id == "pylog" and r.controller_id == 0
            assert [(x.broker_id, x.host, x.port) for x in r.brokers] == [(0, "127.0.0.1", b.port)]
            assert r.cluster_authorized_operations == sum(1 << op.value for op in ALL_CLUSTER_OPS)
        r = call(s, frame(60, 0, {"include_cluster_authorized_operations": False}), 60, 0)
        assert r.cluster_authorized_operations == -2147483648
        r = call(s, frame(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 9}), 60, 1)
        assert r.error_code == 115  # UNSUPPORTED_ENDPOINT_TYPE


@pytest.fixture(scope="module")
def users_broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("users")
    users = str(d / "users.json")
    security.add_user(users, "admin", "admin-secret")
    security.add_user(users, "maker", "maker-secret", read=["*"], groups=[])  # writes (so creates) any topic
    security.add_user(users, "writer", "writer-secret", read=[], write=["public"], groups=[])
    security.add_user(users, "reader", "reader-secret", read=["public"], write=[], groups=[])
    b = BrokerProcess(str(d / "root"), "--users", users, "--max-failed-logins", "0")
    a = AdminClient(_sasl(b, "admin"))
    from confluent_kafka.admin import NewTopic

    for f in a.create_topics([NewTopic("public", 2), NewTopic("private", 1)]).values():
        f.result(20)
    p = ck.Producer(_sasl(b, "admin"))
    for i in range(30):
        p.produce("public", b"p" * 100, partition=i % 2)
        p.produce("private", b"q" * 50)
    assert p.flush(20) == 0
    yield b
    assert b.stop() == 0


def _sasl(b: BrokerProcess, user: str, **kw):  # type: ignore[no-untyped-def]
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user, "sasl.password": user + "-secret", **kw}


@pytest.mark.parametrize("user, ops", [
    ("admin", ALL_CLUSTER_OPS),
    ("maker", {AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.IDEMPOTENT_WRITE,
               AclOperation.CREATE}),
    ("writer", {AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.IDEMPOTENT_WRITE}),
    ("reader", {AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS}),
])
def test_describe_cluster_authorized_operations_follow_the_users_file(users_broker, user, ops):
    a = AdminClient(_sasl(users_broker, user))
    d = a.describe_cluster(include_authorized_operations=True).result(20)
    assert set(d.authorized_operations) == ops


def _dir_sizes(root: str, topic: str, parts: int) -> dict[int, int]:
    out = {}
    for i in range(parts):
        d = os.path.join(root, topic, f"partition-{i}")
        out[i] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log"))
    return out


def _log_dirs(b: BrokerProcess, topics=None, **kw):  # type: ignore[no-untyped-def]
    admin = kafka.KafkaAdminClient(bootstrap_servers=b.bootstrap, **kw)
    try:
        return admin.describe_log_dirs(topics)
    finally:
        admin.close()


def _sizes(result) -> dict[tuple[str, int], int]:  # type: ignore[no-untyped-def]
    """{(topic, partition): size} of kafka-python's describe_log_dirs answer."""
    out = {}
    for broker in result if isinstance(result, list) else [result]:
        for d in broker["log_dirs"] if "log_dirs" in broker else broker["results"]:
            for t in d["topics"]:
                for p in t["partitions"]:
                    out[(t.get("topic", t.get("name")), p["partition_index"])] = p["partition_size"]
    return out


def test_describe_log_dirs_sizes_per_partition(users_broker):
    """kafka-python's describe_log_dirs: one directory (the data root), every partition
    with the bytes of its store files; a user sees only the topics it may describe."""
    b = users_broker
    admin_kw = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}
    got = _log_dirs(b, None, sasl_plain_username="admin", sasl_plain_password="admin-secret", **admin_kw)
    sizes = _sizes(got)
    want = {("public", i): n for i, n in _dir_sizes(b.root, "public", 2).items()}
    want.update({("private", 0): _dir_sizes(b.root, "private", 1)[0]})
    assert {k: v for k, v in sizes.items() if k[0] in ("public", "private")} == want
    assert all(v > 1500 for k, v in want.items() if k[0] == "public"), want  # 15 records of 100 bytes each
    got = _log_dirs(b, {"public": [1]}, sasl_plain_username="admin", sasl_plain_password="admin-secret", **admin_kw)
    assert _sizes(got) == {("public", 1): want[("public", 1)]}
    got = _log_dirs(b, None, sasl_plain_username="reader", sasl_plain_password="reader-secret", **admin_kw)
    assert set(_sizes(got)) == {("public", 0), ("public", 1)}


def test_describe_log_dirs_raw_answers_the_root_and_free_space(broker):
    """DescribeLogDirs v1 and v4 as raw frames: the data root's path, partitions that do
    not exist left out, the file system's total and usable bytes at v4."""
    b = broker
    root = b.root
    with connect(b) as s:
        create_topic(s, "r", partitions=2)
        call(s, produce("r", batch([b"abc"] * 3), partition=1), 0, 9)
        for v in (1, 4):
            r = call(s, frame(35, v, {"topics": [{"topic": "r", "partitions": [0, 1, 7]},
                                                 {"topic": "nope", "partitions": [0]}]}), 35, v)
            assert len(r.results) == 1
            res = r.results[0]
            assert res.error_code == 0 and os.path.samefile(res.log_dir, root)
            assert [(t.name, [(p.partition_index, p.partition_size) for p in t.partitions]) for t in res.topics] \
                == [("r", [(0, _dir_sizes(root, "r", 2)[0]), (1, _dir_sizes(root, "r", 2)[1])])]
            if v >= 4:
                st = os.statvfs(root)
                assert res.total_bytes == st.f_blocks * st.f_frsize and 0 < res.usable_bytes <= res.total_bytes
