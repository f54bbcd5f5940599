"""The transaction APIs of ``pylog serve`` (:data:`pylog.serve.handlers.HANDLERS`): the
wire side of :class:`~pylog.serve.txn_coordinator.TxnCoordinator`, in the broker's admin
threads. InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and TxnOffsetCommit also take
the client asking (:data:`BY_CLIENT`: the server passes it), whom what they add to a
transaction is charged to (:mod:`.txn_limits`).
"""
from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog.serve.txn_state import COMPLETE_ABORT, COMPLETE_COMMIT, EMPTY, ONGOING, PREPARE_COMMIT

if TYPE_CHECKING:
    from pylog.serve.broker import Broker
    from pylog.serve.txn_coordinator import TxnCoordinator

__all__ = ["init_producer_id", "add_partitions_to_txn", "add_offsets_to_txn", "end_txn", "txn_offset_commit",
           "describe_transactions", "list_transactions", "BY_CLIENT"]

_NO_TIME = datetime.datetime.fromtimestamp(-0.001, datetime.timezone.utc)  # written as -1


def _txns(broker: Broker) -> TxnCoordinator:
    txns = broker.txns
    if txns is None:
        raise RuntimeError("the broker has no transaction coordinator")
    return txns  # type: ignore[no-any-return]


def init_producer_id(broker: Broker, req: Any, version: int, client: str = "") -> dict[str, Any]:
    """InitProducerId: with a transactional id the coordinator's, else the idempotent one."""
    if req.transactional_id is None or broker.txns is None:
        return broker.producers.init_producer_id(req, version)
    return _txns(broker).init_producer_id(req, client)


def _forward(method: str, api: str, by_client: bool) -> Callable[..., dict[str, Any]]:
    """The handler of ``api``: the coordinator's ``method`` with the request (and, when
    ``by_client``, the client asking)."""
    def handler(broker: Broker, req: Any, version: int, client: str = "") -> dict[str, Any]:
        fn = getattr(_txns(broker), method)
        return fn(req, client) if by_client else fn(req)  # type: ignore[no-any-return]
    handler.__name__ = handler.__qualname__ = api
    handler.__doc__ = f"{api}: :meth:`TxnCoordinator.{method}`."
    return handler


add_partitions_to_txn = _forward("add_partitions", "add_partitions_to_txn", True)
add_offsets_to_txn = _forward("add_offsets", "add_offsets_to_txn", True)
txn_offset_commit = _forward("txn_offset_commit", "txn_offset_commit", True)
end_txn = _forward("end_txn", "end_txn", False)

#: The API keys whose handlers take the client asking (a fourth argument).
BY_CLIENT = frozenset({22, 24, 25, 28})


def describe_transactions(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DescribeTransactions: each id's state, producer and partitions."""
    out = []
    for tid in req.transactional_ids:
        st = _txns(broker).known(tid)
        if st is None:
            out.append({"error_code": E.transactional_id_not_found, "transactional_id": tid,
                        "transaction_state": "", "transaction_start_time": _NO_TIME, "producer_id": -1,
                        "producer_epoch": -1, "topics": []})
            continue
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(st.partitions):
            by_topic.setdefault(t, []).append(p)
        out.append({"error_code": 0, "transactional_id": tid, "transaction_state": st.state,
                    "transaction_timeout": st.timeout_ms,
                    "transaction_start_time": datetime.datetime.fromtimestamp(st.started, datetime.timezone.utc)
                    if st.state == ONGOING else _NO_TIME,
                    "producer_id": st.pid, "producer_epoch": st.epoch,
                    "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]})
    return {"transaction_states": out}


def list_transactions(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """ListTransactions: the ids, filtered by state, producer id and (v1) duration."""
    known = {EMPTY, ONGOING, PREPARE_COMMIT, COMPLETE_COMMIT, COMPLETE_ABORT, "PrepareAbort", "Dead",
             "PrepareEpochFence"}
    states = set(req.state_filters)
    pids = set(req.producer_id_filters)
    longer = getattr(req, "duration_filter", -1)
    now = time.time()
    out = []
    for st in _txns(broker).states():
        if states and st.state not in states or pids and st.pid not in pids:
            continue
        if longer >= 0 and not (st.state == ONGOING and (now - st.started) * 1000 >= longer):
            continue
        out.append({"transactional_id": st.tid, "producer_id": st.pid, "transaction_state": st.state})
    return {"error_code": 0, "unknown_state_filters": sorted(states - known), "transaction_states": out}
