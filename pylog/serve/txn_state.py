"""The state of one transactional id on ``pylog serve`` (:mod:`.txn_coordinator`): its
producer id and epoch, the state of its transaction, and what the open one holds.

:meth:`TxnState.to_json` is what ``ROOT/.serve.txns/ID.json`` holds (docs/serve.md,
"Transactions"); :meth:`TxnState.from_json` reads it back at a start.
"""
from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pylog.transactions import Transaction

__all__ = ["TxnState", "EMPTY", "ONGOING", "PREPARE_COMMIT", "COMPLETE_COMMIT", "COMPLETE_ABORT"]

#: The states of a transactional id, as Kafka names them (DescribeTransactions).
EMPTY, ONGOING, PREPARE_COMMIT, COMPLETE_COMMIT, COMPLETE_ABORT = (
    "Empty", "Ongoing", "PrepareCommit", "CompleteCommit", "CompleteAbort")


class TxnState:
    """One transactional id: its producer, epoch, state and open pylog transaction."""

    def __init__(self, tid: str, pid: int, epoch: int, timeout_ms: int) -> None:
        self.tid = tid
        self.pid = pid
        self.epoch = epoch
        self.timeout_ms = timeout_ms
        self.state = EMPTY
        self.partitions: set[tuple[str, int]] = set()
        self.groups: set[str] = set()
        # (group, topic, partition) -> (offset, leader epoch, metadata)
        self.offsets: dict[tuple[str, str, int], tuple[int, int, str]] = {}
        self.txn: Transaction | None = None
        self.seq = 0  # transactions committed (the sink's value)
        self.started = 0.0  # time.time() of the transaction's start
        self.lost = False  # aborted by the broker (restart, timeout): the epoch must be bumped
        self.lock = threading.RLock()
        # (topic, partition) -> the last batches' (first, last) sequences, this epoch
        self.seqs: dict[tuple[str, int], list[tuple[int, int]]] = {}
        # (topic, partition) -> the first sequence staged in the open transaction (durable:
        # after a restart, it and the staged count say which sequences are staged)
        self.first: dict[tuple[str, int], int] = {}
        self.synced: set[tuple[str, int]] = set()  # staging directories fsynced
        self.client = ""  # the client whose InitProducerId made the id (txn_limits.py)
        self.owner = ""  # the client that began the open transaction
        # client -> partitions, groups and offsets of the open transaction charged to it
        self.held_by: collections.Counter[str] = collections.Counter()
        self.refused = False  # a bound refused to begin a transaction: the client's abort is 0
        self.used = 0.0  # time.time() of the last change of state

    @property
    def held(self) -> int:
        """What the open transaction holds (partitions, groups, offsets), over all clients."""
        return sum(self.held_by.values())

    @property
    def open(self) -> bool:
        """Whether a transaction is open (or being committed)."""
        return self.state in (ONGOING, PREPARE_COMMIT)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TxnState:
        """The state :meth:`to_json` wrote (KeyError, TypeError, ValueError when damaged)."""
        st = cls(str(d["transactional_id"]), int(d["producer_id"]), int(d["producer_epoch"]), int(d["timeout_ms"]))
        st.state, st.seq, st.lost = str(d["state"]), int(d["seq"]), bool(d.get("lost"))
        st.partitions = {(str(t), int(p)) for t, p in d.get("partitions", [])}
        st.groups = {str(g) for g in d.get("groups", [])}
        st.offsets = {(str(g), str(t), int(p)): (int(o), int(e), str(m)) for g, t, p, o, e, m in d.get("offsets", [])}
        st.started = float(d.get("started", 0.0))
        st.first = {(str(t), int(p)): int(s) for t, p, s in d.get("first_seqs", [])}
        st.owner, st.used = str(d.get("owner", "")), float(d.get("used", st.started))
        st.client = str(d.get("client", st.owner))
        held = d.get("held_by")  # (a file of an earlier broker: all of it the owner's)
        st.held_by = collections.Counter({str(k): int(v) for k, v in held.items()} if isinstance(held, dict)
                                         else {st.owner: len(st.partitions) + len(st.groups) + len(st.offsets)})
        return st

    def to_json(self) -> dict[str, Any]:
        return {"transactional_id": self.tid, "producer_id": self.pid, "producer_epoch": self.epoch,
                "timeout_ms": self.timeout_ms, "state": self.state, "seq": self.seq, "lost": self.lost,
                "started": self.started, "partitions": sorted(self.partitions), "groups": sorted(self.groups),
                "pylog_txn": self.txn.id if self.txn is not None else None, "owner": self.owner,
                "client": self.client, "used": self.used, "held_by": dict(sorted(self.held_by.items())),
                "first_seqs": [[t, p, s] for (t, p), s in sorted(self.first.items())],
                "offsets": [[g, t, p, *v] for (g, t, p), v in sorted(self.offsets.items())]}
