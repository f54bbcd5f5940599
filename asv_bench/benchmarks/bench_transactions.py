"""Committing a store transaction (``pylog.transactions``): the apply that copies staged
records into their partitions, the path of every Spark write and sink batch.

* ``TransactionCommit``: 100,000 records of 100 B staged for one partition by 1 or 4
  contributors (as Spark tasks stage them; several are merged by timestamp), then committed.
  Staging is in ``setup``; the timed part is the commit (a columnar scan of the staged Logs,
  ``append_batch`` of ``PackedBytes``, the fsyncs).
"""
from __future__ import annotations

import numpy as np

from .common import BaseIO, make_values, optional

N = 100_000


class TransactionCommit(BaseIO):
    params = [1, 4]
    param_names = ["contributors"]
    # one commit per sample: setup stages a new transaction before each (asv runs setup
    # per repeat; no warm-up calls, a committed transaction cannot commit again)
    number = 1
    repeat = 5
    warmup_time = 0

    def setup(self, contributors: int) -> None:
        LogStore = optional("pylog.topics").LogStore
        tx_mod = optional("pylog.transactions")
        self.store = LogStore(self.tmpdir())
        self.store.create_topic("t", partitions=1)
        self.txn = tx_mod.begin_external(self.store.root)
        values = make_values(N // contributors, 100)
        parts = []
        for c in range(contributors):
            stager = tx_mod.Stager(self.store.root, self.txn)
            # interleaved timestamps: the merge of several contributors takes them in runs
            ts = np.arange(len(values), dtype=np.int64) * contributors + c
            stager.append_batch("t", 0, values, timestamps=ts)
            parts += stager.prepare()
        self.tx = tx_mod.Transaction(self.store, txn_id=self.txn)
        self.tx.add_staged(parts)

    def teardown(self, contributors: int) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()
        super().teardown()

    def time_commit(self, contributors: int) -> None:
        self.tx.commit()
