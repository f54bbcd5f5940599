"""Topics and consumers (skipped until ``pylog.topics`` / ``pylog.consumer`` exist).

* ``TopicAppend``: ``topic.append`` of 1,000 keyed records (the key hash picks the
  partition), ``topic.append_batch`` of them, and one ``append_batch`` per partition.
* ``ConsumerPoll``: a consumer group polls 100,000 records of a 4-partition topic (built once
  in ``setup_cache``) in polls of 500, then commits.
"""
from __future__ import annotations

import os

from .common import BaseIO, make_values, no_fsync, optional, setup  # noqa: F401

PARTITIONS = 4
N_POLL = 100_000


def _store_cls():
    return optional("pylog.topics").LogStore


class TopicAppend(BaseIO):
    params = [1, 4]
    param_names = ["partitions"]

    def setup(self, partitions: int) -> None:
        LogStore = _store_cls()
        self.store = LogStore(self.tmpdir())
        self.store.create_topic("bench", partitions=partitions, fsync="never")
        self.topic = self.store.topic("bench")
        self.values = make_values(1000, 100)
        self.keys = [b"user-%d" % i for i in range(1000)]

    def teardown(self, partitions: int) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()
        super().teardown()

    def time_topic_append_keyed(self, partitions: int) -> None:
        append = self.topic.append
        for k, v in zip(self.keys, self.values):
            append(v, key=k)

    def time_partition_append_batch(self, partitions: int) -> None:
        for p in range(partitions):
            self.topic.partition(p).append_batch(self.values)

    def time_topic_append_batch_keyed(self, partitions: int) -> None:
        """``Topic.append_batch``: the keys pick partitions, one batch per partition."""
        self.topic.append_batch(self.values, keys=self.keys)


class ConsumerPoll:
    number = 1
    repeat = (3, 10, 20.0)
    warmup_time = 0.0

    def setup_cache(self) -> str:
        LogStore = _store_cls()
        root = os.path.abspath("topic-root")
        values = make_values(1000, 100)
        with no_fsync(), LogStore(root) as store:
            store.create_topic("bench", partitions=PARTITIONS, fsync="never")
            topic = store.topic("bench")
            for p in range(PARTITIONS):
                part = topic.partition(p)
                for _ in range(N_POLL // PARTITIONS // 1000):
                    part.append_batch(values)
                part.roll()
        return root

    setup_cache.timeout = 300

    def setup(self, root: str) -> None:
        LogStore = _store_cls()
        self.store = LogStore(root)
        self.group = f"g{os.getpid()}"
        self.n = 0

    def teardown(self, root: str) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()

    def time_poll_all(self, root: str) -> None:
        consumer = self.store.consumer("bench", group=self.group + str(self.n))
        self.n += 1
        got = 0
        while got < N_POLL:
            recs = consumer.poll(max_records=500)
            if not recs:
                break
            got += len(recs)
        consumer.commit()
        consumer.close()
