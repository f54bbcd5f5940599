"""DescribeCluster (key 60) and DescribeLogDirs (key 35): what admin tools ask about the
broker itself.

One broker is the whole cluster: DescribeCluster names it (node 0, the controller too) and,
when asked, the operations on the cluster resource the principal may perform (a bit field
of Kafka's ``AclOperation`` codes); :func:`.authorized.cluster_operations` maps the users
file's rights to them, and :mod:`.acl` narrows the answer to the authenticated user.
DescribeLogDirs answers one log directory, the data root, with the bytes of each
partition's store files (Kafka's ``partition_size``: the segments' data, not their
indexes), ``offset_lag`` 0 (no replica is behind: there is none), and the file system's
total and usable bytes (v4+).

Both run in the broker's admin threads (:data:`.handlers.HANDLERS`).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import format as fmt
from pylog.errors import InvalidNameError, PylogError, UnknownTopicError
from pylog.serve.authorized import CLUSTER_OPS, NOT_ASKED, bits
from pylog.topicmeta import _partition_dir

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["describe_cluster", "describe_log_dirs"]

def describe_cluster(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DescribeCluster: this broker, node 0, is every broker and the controller. The
    authorized operations asked for are every cluster operation here; with a users file
    :func:`.acl.filter_response` narrows them to the user's."""
    ops = bits(CLUSTER_OPS) if req.include_cluster_authorized_operations else NOT_ASKED
    endpoint = getattr(req, "endpoint_type", 1)
    if endpoint not in (1, 2):  # 1: brokers, 2: controllers (the same process here)
        return {"error_code": E.unsupported_endpoint_type, "error_message": f"endpoint type {endpoint}",
                "endpoint_type": endpoint, "cluster_id": "pylog", "controller_id": -1, "brokers": [],
                "cluster_authorized_operations": NOT_ASKED}
    return {"error_code": 0, "error_message": None, "endpoint_type": endpoint, "cluster_id": "pylog",
            "controller_id": 0, "cluster_authorized_operations": ops,
            "brokers": [{"broker_id": 0, "host": broker.advertised_host, "port": broker.port, "rack": None,
                         "is_fenced": False}]}


def _store_bytes(path: str) -> int:
    """The bytes of a partition directory's store files (its segments' data)."""
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.name.endswith(fmt.STORE_SUFFIX):
                    try:
                        total += e.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:  # deleted by retention meanwhile
                        pass
    except FileNotFoundError:
        pass
    return total


def partition_size(broker: Broker, topic_path: str, name: str, i: int) -> int:
    """The bytes of ``name``/``i``'s store files: from its open Log (what it wrote, its write
    buffer included), else from the files (a partition is not opened to be measured)."""
    log = broker.ready(name, i)
    if log is not None:
        try:
            return log.size_bytes
        except PylogError:  # closed meanwhile: its files
            pass
    return _store_bytes(_partition_dir(topic_path, i))


def describe_log_dirs(broker: Broker, req: Any, version: int) -> dict[str, Any]:
    """DescribeLogDirs: one directory, the data root; every partition asked for (all of
    every topic when ``topics`` is null) with its size. Partitions that do not exist are
    left out, as Kafka leaves out what the directory does not hold."""
    store = broker.store
    wanted: list[tuple[str, list[int] | None]]
    if req.topics is None:
        wanted = [(n, None) for n in store.topics()]
    else:
        wanted = [(t.topic, list(t.partitions)) for t in req.topics]
    topics = []
    for name, parts in wanted:
        try:
            t = broker.topic(name)
            n = t.partitions
        except (UnknownTopicError, InvalidNameError):
            continue
        rows = [{"partition_index": i, "partition_size": partition_size(broker, t.path, name, i), "offset_lag": 0,
                 "is_future_key": False}
                for i in (range(n) if parts is None else sorted(set(parts))) if 0 <= i < n]
        if rows:
            topics.append({"name": name, "partitions": rows})
    result: dict[str, Any] = {"error_code": 0, "log_dir": store.root, "topics": topics,
                              "total_bytes": -1, "usable_bytes": -1}
    try:
        st = os.statvfs(store.root)
        result["total_bytes"], result["usable_bytes"] = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        pass
    return {"error_code": 0, "results": [result]}
