"""pylog serve: Kafka transactions with aiokafka's and kafkajs's transactional producers.

Each commits one transaction (records and a group's offsets) and aborts another: a
read_committed consumer reads the committed records only, the group's offset is the
committed one.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import textwrap

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")
from serve_util import BrokerProcess  # noqa: E402
from test_serve_txn import _library, _read, _topics, _values  # noqa: E402


@pytest.fixture()
def broker(tmp_path):
    b = BrokerProcess(str(tmp_path / "root"))
    yield b
    b.stop()


def _committed(b: BrokerProcess, group: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
    try:
        return c.committed([ck.TopicPartition(topic, 0)], timeout=10)[0].offset  # type: ignore[no-any-return]
    finally:
        c.close()


def test_aiokafka_transactions(broker):
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.structs import TopicPartition

    _topics(broker, aio=1, src=1)

    async def run() -> None:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-tx",
                                      enable_idempotence=True)
        await p.start()
        try:
            async with p.transaction():
                for i in range(3):
                    await p.send_and_wait("aio", b"ok-%d" % i, partition=0)
                await p.send_offsets_to_transaction({TopicPartition("src", 0): 7}, "aio-group")
            with pytest.raises(RuntimeError):
                async with p.transaction():
                    await p.send_and_wait("aio", b"aborted", partition=0)
                    await p.send_offsets_to_transaction({TopicPartition("src", 0): 9}, "aio-group")
                    raise RuntimeError("abort it")
        finally:
            await p.stop()

    asyncio.run(run())
    assert _values(_read(broker, "aio", 1, expect=3)) == [b"ok-0", b"ok-1", b"ok-2"]
    assert _library(broker.root, "aio") == [b"ok-0", b"ok-1", b"ok-2"]
    assert _committed(broker, "aio-group", "src") == 7


_KAFKAJS = textwrap.dedent("""
    const { Kafka, logLevel } = require("kafkajs");
    const kafka = new Kafka({ clientId: "kjs-tx", brokers: [process.argv[2]], logLevel: logLevel.NOTHING });
    const producer = kafka.producer({ transactionalId: "kjs-tx", idempotent: true, maxInFlightRequests: 1 });
    (async () => {
      await producer.connect();
      let t = await producer.transaction();
      await t.send({ topic: "kjs", messages: [0, 1, 2].map(i => ({ value: "ok-" + i, partition: 0 })) });
      await t.sendOffsets({ consumerGroupId: "kjs-group",
                            topics: [{ topic: "src", partitions: [{ partition: 0, offset: "5" }] }] });
      await t.commit();
      t = await producer.transaction();
      await t.send({ topic: "kjs", messages: [{ value: "aborted", partition: 0 }] });
      await t.sendOffsets({ consumerGroupId: "kjs-group",
                            topics: [{ topic: "src", partitions: [{ partition: 0, offset: "8" }] }] });
      await t.abort();
      await producer.disconnect();
      console.log("DONE");
    })().catch(e => { console.log("ERROR " + e); process.exit(1); });
""")


@pytest.fixture(scope="module")
def kafkajs(tmp_path_factory):
    """A folder with kafkajs installed (npm); the test is skipped without node, npm or a registry."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the kafkajs test")
    d = tmp_path_factory.mktemp("kafkajs-txn")
    try:
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", "kafkajs@2"], cwd=d,
                           capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install kafkajs timed out (offline?)")
    if r.returncode != 0 or not os.path.isdir(d / "node_modules" / "kafkajs"):
        pytest.skip(f"npm install kafkajs failed (offline?): {r.stderr[-300:]}")
    (d / "txn.js").write_text(_KAFKAJS)
    return d


def test_kafkajs_transactions(broker, kafkajs):
    _topics(broker, kjs=1, src=1)
    r = subprocess.run(["node", "txn.js", broker.bootstrap], cwd=kafkajs, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "DONE" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert _values(_read(broker, "kjs", 1, expect=3)) == [b"ok-0", b"ok-1", b"ok-2"]
    assert _library(broker.root, "kjs") == [b"ok-0", b"ok-1", b"ok-2"]
    assert _committed(broker, "kjs-group", "src") == 5
