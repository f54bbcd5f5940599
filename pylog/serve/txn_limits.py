"""The bounds of Kafka transactions on ``pylog serve``: what open transactions may hold.

An open transaction holds, for each partition AddPartitionsToTxn added to it, a staging
Log (about four descriptors once a record is staged there, and the staged records on disk)
until it commits, aborts or times out (``transaction.timeout.ms``, at most 15 minutes).
Every transactional id the broker knows holds its state file and about a kilobyte of
memory. Without bounds one client could take the broker's descriptors (and with them its
connections and partitions) or memory, so (docs/serve.md, "Limits and defaults"):

* **Partitions in open transactions**, over all of them (``max_partitions``) and over
  the transactions begun by one client (``max_partitions_per_client``: one SASL user,
  or one IP address when clients do not log in). Each partition added, each group
  added (AddOffsetsToTxn) and each partition whose offset the transaction sends
  (TxnOffsetCommit) counts one, so the memory of open transactions is bounded too.
  A request past either bound is answered CONCURRENT_TRANSACTIONS (51, retriable: the
  client retries until other transactions end, or its own times out); a transaction that
  alone would hold more than ``max_partitions_per_client`` can never fit and is answered
  POLICY_VIOLATION (44, an abortable error: the client aborts it).
* **Transactional ids known** (``max_ids``): a new id past it takes the place of an id
  with no transaction open, of the client that made the most ids, the one idle longest
  (as though Kafka's ``transactional.id.expiration.ms`` had passed for it: a zombie of
  that id is still fenced, its producer id being unknown; the id's transaction numbers go
  on from the store's sink if it comes back); when every known id has one open, the new
  id's InitProducerId is answered CONCURRENT_TRANSACTIONS. Ids idle for ``id_expiration``
  seconds (Kafka's ``transactional.id.expiration.ms``, 7 days) are forgotten.

The counts are kept under one lock; the coordinator charges what a transaction holds to
the client that asked for it (kept in the id's state file, so a restart counts a
restored transaction again).
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog.errors import InvalidArgumentError

__all__ = ["TxnLimits", "MAX_PARTITIONS", "MAX_PARTITIONS_PER_CLIENT", "MAX_IDS", "ID_EXPIRATION"]

#: Partitions in open transactions at once, over all clients (about 4 descriptors each).
MAX_PARTITIONS = 2000
#: Partitions in the open transactions begun by one client (a SASL user or an IP address).
MAX_PARTITIONS_PER_CLIENT = 1000
#: Transactional ids the broker keeps state for.
MAX_IDS = 10000
#: Seconds an id with no open transaction is kept after its last change (Kafka's
#: ``transactional.id.expiration.ms``: 7 days).
ID_EXPIRATION = 7 * 24 * 3600.0


class TxnLimits:
    """The counts and bounds of one broker's transactions (see the module docstring).

    ``max_partitions``, ``max_partitions_per_client``, ``max_ids``: positive integers;
    ``id_expiration``: seconds (> 0). Thread-safe."""

    def __init__(self, max_partitions: int = MAX_PARTITIONS,
                 max_partitions_per_client: int = MAX_PARTITIONS_PER_CLIENT,
                 max_ids: int = MAX_IDS, id_expiration: float = ID_EXPIRATION) -> None:
        for name, value in (("max_txn_partitions", max_partitions),
                            ("max_txn_partitions_per_client", max_partitions_per_client),
                            ("max_transactional_ids", max_ids)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, not {value!r}")
        if isinstance(id_expiration, bool) or not isinstance(id_expiration, (int, float)) or not id_expiration > 0:
            raise InvalidArgumentError(f"transactional_id_expiration must be a positive number of seconds, "
                                       f"not {id_expiration!r}")
        self.max_partitions = max_partitions
        self.max_partitions_per_client = min(max_partitions_per_client, max_partitions)
        self.max_ids = max_ids
        self.id_expiration = float(id_expiration)
        self._lock = threading.Lock()
        self.total = 0  # partitions held by open transactions
        self.by_owner: collections.Counter[str] = collections.Counter()

    def take(self, owner: str, held: int, more: int) -> int:
        """Charge ``more`` partitions to ``owner``'s transaction holding ``held`` already:
        0 when they fit (and are counted), else the error code to answer."""
        if more <= 0:
            return 0
        if held + more > self.max_partitions_per_client:
            return E.policy_violation  # this transaction alone can never fit
        with self._lock:
            if self.total + more > self.max_partitions or self.by_owner[owner] + more > self.max_partitions_per_client:
                return E.concurrent_transactions  # until other transactions end
            self.total += more
            self.by_owner[owner] += more
        return 0

    def count(self, owner: str, n: int) -> None:
        """Count ``n`` partitions of a transaction restored at start (over the bounds if
        they were lowered since: new ones wait until it ends)."""
        with self._lock:
            self.total += n
            self.by_owner[owner] += n

    def release(self, owner: str, n: int) -> None:
        """A transaction of ``owner`` holding ``n`` partitions ended."""
        if n <= 0:
            return
        with self._lock:
            self.total -= n
            self.by_owner[owner] -= n
            if self.by_owner[owner] <= 0:
                del self.by_owner[owner]

    def evictable(self, states: Iterable[Any], now: float, full: bool) -> list[Any]:
        """The ids to forget: those idle past ``id_expiration`` with no transaction open
        and, when ``full`` (a new id wants a place), one idle id of the client that made
        the most ids (so a client making ids by the thousand displaces its own, not other
        clients'): the one idle longest, one lost to a restart or a timeout last (its
        client still has an abort to send). ``states``: objects with ``client`` (who made
        the id), ``open`` (a transaction open), ``lost`` and ``used`` (time of the last
        change)."""
        states = list(states)
        idle = [st for st in states if not st.open]
        out = [st for st in idle if now - st.used > self.id_expiration]
        if full and not out and idle:
            made = collections.Counter(st.client for st in states)
            biggest = max(made[st.client] for st in idle)
            out = [min((st for st in idle if made[st.client] == biggest), key=lambda st: (st.lost, st.used))]
        return out
