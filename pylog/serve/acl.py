"""Rights over the requests of an authenticated user: what :mod:`.server` removes from a
request before it is handled, what it answers for the removed parts, and what it leaves
out of an answer.

The rights are the users file's (:class:`.security.Users`); Kafka's operations map to
them as its authorizer maps them to ACLs:

============================  ==========================================================
topic READ                    Fetch, OffsetCommit and TxnOffsetCommit (with group READ),
                              DescribeProducers
topic WRITE                   Produce; CreateTopics, DeleteTopics, CreatePartitions,
                              DeleteRecords, Metadata's auto-creation, AlterConfigs,
                              IncrementalAlterConfigs
topic DESCRIBE (READ or       Metadata, OffsetFetch, DescribeConfigs (pylog's topic
WRITE)                        configs hold no secret: DESCRIBE_CONFIGS is DESCRIBE here),
                              OffsetForLeaderEpoch, ListOffsets (as Kafka: DESCRIBE)
group READ (``groups``)       JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
                              OffsetFetch
group DESCRIBE (READ or       FindCoordinator, DescribeGroups, ListGroups (the others are
DELETE)                       left out)
group DELETE                  DeleteGroups
transactional id WRITE        InitProducerId with the id, FindCoordinator of the id,
(``transactional_ids``)       AddPartitionsToTxn (and topic WRITE), AddOffsetsToTxn and
                              TxnOffsetCommit (and group READ), EndTxn,
                              DescribeTransactions, ListTransactions (the others are left out)
cluster (see                  DescribeCluster's authorized operations; DescribeLogDirs
:mod:`.admin_cluster`)        lists the topics the user may DESCRIBE
============================  ==========================================================

A refused topic is answered TOPIC_AUTHORIZATION_FAILED (29) and a refused group
GROUP_AUTHORIZATION_FAILED (30), with no data; a request for every topic (Metadata,
OffsetFetch without topics) or every group (ListGroups) leaves out what the user may not
see instead, as Kafka does.
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog.serve.authorized import NOT_ASKED, cluster_operations
from pylog.serve.security import Users

__all__ = ["filter_request", "add_denied", "filter_response"]

#: key -> (the request's topic list field, the topic's name field, the response's list
#: field, its name field, its partition list field, the partition index field, the right:
#: "read", "write" or "describe")
_TOPICS: dict[int, tuple[str, str, str, str, str, str, str]] = {
    0: ("topic_data", "name", "responses", "name", "partition_responses", "index", "write"),
    1: ("topics", "topic", "responses", "topic", "partitions", "partition_index", "read"),
    2: ("topics", "name", "topics", "name", "partitions", "partition_index", "describe"),  # ListOffsets
    8: ("topics", "name", "topics", "name", "partitions", "partition_index", "read"),
    47: ("topics", "name", "topics", "name", "partitions", "partition_index", "read"),  # OffsetDelete
    21: ("topics", "name", "topics", "name", "partitions", "partition_index", "write"),  # DeleteRecords
    23: ("topics", "topic", "topics", "topic", "partitions", "partition", "describe"),  # OffsetForLeaderEpoch
    61: ("topics", "name", "topics", "name", "partitions", "partition_index", "read"),  # DescribeProducers
    28: ("topics", "name", "topics", "name", "partitions", "partition_index", "read"),  # TxnOffsetCommit
}
#: Group APIs naming one group: key -> what the refusal holds besides its error code.
_ONE_GROUP: dict[int, dict[str, Any]] = {
    11: {"generation_id": -1, "protocol_name": "", "protocol_type": "", "leader": "", "members": []},
    14: {"assignment": b""},
    12: {},
    13: {"members": []},
}
GROUP_DENIED = E.group_authorization_failed
TXN_DENIED = E.transactional_id_authorization_failed
TOPIC_DENIED = E.topic_authorization_failed
TOPIC_RESOURCE, GROUP_RESOURCE = 2, 32
_NO_TIME = datetime.datetime.fromtimestamp(-0.001, datetime.timezone.utc)  # a start time of -1
#: A row of the removed parts of a request: (the response's list field, the row).
Denied = list[tuple[str, dict[str, Any]]]


def _may_topic(users: Users, user: str, topic: str, right: str) -> bool:
    if right == "describe":
        return users.may_describe(user, topic)
    return users.may(user, topic, right == "write")


def _partitions_of(key: int, t: Any) -> list[int]:
    if key == 0:
        return [p.index for p in t.partition_data]
    if key in (1, 23):
        return [p.partition for p in t.partitions]
    if key == 61:
        return list(t.partition_indexes)
    return [p.partition_index for p in t.partitions]


def _topic_rows(key: int, topic: str, parts: list[int], code: int) -> dict[str, Any]:
    _f, _n, _out, out_name, parts_field, index, _r = _TOPICS[key]
    return {out_name: topic, parts_field: [
        {index: p, "error_code": code, "base_offset": -1, "high_watermark": -1, "last_stable_offset": -1,
         "log_start_offset": -1, "offset": -1, "timestamp": -1, "records": b"", "low_watermark": -1,
         "leader_epoch": -1, "end_offset": -1} for p in parts]}


def _filter_topics(users: Users, user: str, key: int, body: Any) -> tuple[Any, Denied]:
    field, name, out_field, *_rest, right = _TOPICS[key]
    keep, denied = [], []
    for t in getattr(body, field):
        if _may_topic(users, user, getattr(t, name), right):
            keep.append(t)
        else:
            denied.append((out_field, _topic_rows(key, getattr(t, name), _partitions_of(key, t), TOPIC_DENIED)))
    if denied:
        body = dataclasses.replace(body, **{field: tuple(keep)})
    return body, denied


def _filter_admin(users: Users, user: str, key: int, body: Any) -> tuple[Any, Denied]:
    """CreateTopics (19), DeleteTopics (20), CreatePartitions (37): the topics ``user`` may
    not write are removed and answered TOPIC_AUTHORIZATION_FAILED."""
    names = list(body.topic_names) if key == 20 else [t.name for t in body.topics]
    refused = {n for n in names if not users.may(user, n, True)}
    if not refused:
        return body, []
    if key == 20:
        body = dataclasses.replace(body, topic_names=tuple(n for n in body.topic_names if n not in refused))
    else:
        body = dataclasses.replace(body, topics=tuple(t for t in body.topics if t.name not in refused))
    field = {19: "topics", 20: "responses", 37: "results"}[key]
    return body, [(field, {"name": n, "error_code": TOPIC_DENIED, "num_partitions": -1, "replication_factor": -1,
                           "error_message": f"not authorised to write topic {n!r}"})
                  for n in names if n in refused]


def _group_denied_row(key: int, group: str, code: int = GROUP_DENIED) -> tuple[str, dict[str, Any]]:
    if key == 15:
        return "groups", {"error_code": GROUP_DENIED, "group_id": group, "group_state": "", "protocol_type": "",
                          "protocol_data": "", "members": [], "authorized_operations": -2147483648}
    if key == 42:
        return "results", {"group_id": group, "error_code": GROUP_DENIED}
    if key == 9:
        return "groups", {"group_id": group, "error_code": GROUP_DENIED, "topics": []}
    return "coordinators", {"key": group, "node_id": -1, "host": "", "port": -1, "error_code": code,
                            "error_message": f"not authorised for {group!r}"}


def _may_coordinate(users: Users, user: str, key_type: int, name: str) -> bool:
    """FindCoordinator: DESCRIBE on the group (key type 0) or the transactional id (1)."""
    if key_type == 1:
        return users.may_transact(user, name)
    return key_type != 0 or users.may_group(user, name, "describe")


def _filter_groups(users: Users, user: str, key: int, body: Any, version: int
                   ) -> tuple[Any, Denied, dict[str, Any] | None]:
    """The group APIs: (body, denied rows, a refusal of the whole request or None)."""
    if key in _ONE_GROUP:
        if users.may_group(user, body.group_id, "read"):
            return body, [], None
        return body, [], {**_ONE_GROUP[key], "error_code": GROUP_DENIED, "member_id": getattr(body, "member_id", "")}
    if key == 8:  # OffsetCommit: every partition refused without group READ
        if users.may_group(user, body.group_id, "read"):
            return body, [], None
        return body, [], {"topics": [{"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": GROUP_DENIED} for p in t.partitions]}
            for t in body.topics]}
    if key == 9 and version < 8:
        if users.may_group(user, body.group_id, "read"):
            return body, [], None
        return body, [], {"error_code": GROUP_DENIED, "topics": []}
    if key == 10 and version < 4:
        if _may_coordinate(users, user, body.key_type, body.key):
            return body, [], None
        return body, [], {"error_code": TXN_DENIED if body.key_type == 1 else GROUP_DENIED, "node_id": -1,
                          "error_message": f"not authorised for {body.key!r}", "host": "", "port": -1}
    field, op = {9: ("groups", "read"), 10: ("coordinator_keys", "describe"), 15: ("groups", "describe"),
                 42: ("groups_names", "delete")}[key]
    keep, denied = [], []
    for g in getattr(body, field):
        name = g.group_id if key == 9 else g
        if _may_coordinate(users, user, body.key_type, name) if key == 10 else users.may_group(user, name, op):
            keep.append(g)
        else:
            denied.append(_group_denied_row(key, name, TXN_DENIED if key == 10 and body.key_type == 1
                                            else GROUP_DENIED))
    if denied:
        body = dataclasses.replace(body, **{field: tuple(keep)})
    return body, denied, None


def _filter_configs(users: Users, user: str, body: Any, alter: bool = False) -> tuple[Any, Denied]:
    """DescribeConfigs: the topics ``user`` may not see are answered TOPIC_AUTHORIZATION_FAILED;
    ``alter`` (AlterConfigs, IncrementalAlterConfigs): those it may not write."""
    keep, denied = [], []
    for r in body.resources:
        if r.resource_type == GROUP_RESOURCE and not users.may_group(user, r.resource_name, "describe"):
            denied.append(("responses" if alter else "results", {
                "error_code": GROUP_DENIED, "resource_type": r.resource_type, "resource_name": r.resource_name,
                "configs": [], "error_message": f"not authorised to see group {r.resource_name!r}"}))
        elif r.resource_type == TOPIC_RESOURCE and not (users.may(user, r.resource_name, True) if alter
                                                      else users.may_describe(user, r.resource_name)):
            what = "alter" if alter else "describe"
            denied.append(("responses" if alter else "results", {
                "error_code": TOPIC_DENIED, "resource_type": r.resource_type, "resource_name": r.resource_name,
                "configs": [], "error_message": f"not authorised to {what} topic {r.resource_name!r}"}))
        else:
            keep.append(r)
    if denied:
        body = dataclasses.replace(body, resources=tuple(keep))
    return body, denied


def _refuse_txn(users: Users, user: str, key: int, body: Any) -> dict[str, Any] | None:
    """The answer refusing a transaction API request as a whole, or None: the transactional
    id needs WRITE (53); AddOffsetsToTxn and TxnOffsetCommit group READ (30); every topic
    of AddPartitionsToTxn WRITE (29; the others OPERATION_NOT_ATTEMPTED, as Kafka answers)."""
    tid = body.v3_and_below_transactional_id if key == 24 else body.transactional_id
    code = 0
    if not users.may_transact(user, tid):
        code = TXN_DENIED
    elif key in (25, 28) and not users.may_group(user, body.group_id, "read"):
        code = GROUP_DENIED
    if key == 24:
        topics = body.v3_and_below_topics
        if not code and all(users.may(user, t.name, True) for t in topics):
            return None
        return {"results_by_topic_v3_and_below": [{"name": t.name, "results_by_partition": [
            {"partition_index": p, "partition_error_code": code or (
                E.operation_not_attempted if users.may(user, t.name, True) else TOPIC_DENIED)}
            for p in t.partitions]} for t in topics]}
    if not code:
        return None
    if key == 28:
        return {"topics": [{"name": t.name, "partitions": [{"partition_index": p.partition_index, "error_code": code}
                                                          for p in t.partitions]} for t in body.topics]}
    return {"error_code": code}


def filter_request(users: Users, user: str | None, key: int, body: Any, version: int
                   ) -> tuple[Any, Denied, dict[str, Any] | None]:
    """(the request without what ``user`` may not touch, the answers for what was removed
    (see :func:`add_denied`), the answer to the whole request when it is refused, else None)."""
    if user is None:
        return body, [], None
    if key == 22 and body.transactional_id is not None and not users.may_transact(user, body.transactional_id):
        return body, [], {"error_code": TXN_DENIED, "producer_id": -1, "producer_epoch": -1}
    if key in (24, 25, 26, 28):  # the transaction APIs
        refused = _refuse_txn(users, user, key, body)
        if refused is not None:
            return body, [], refused
    if key == 65:  # DescribeTransactions: the ids the user may not use are answered 53
        keep = [t for t in body.transactional_ids if users.may_transact(user, t)]
        denied = [("transaction_states", {"error_code": TXN_DENIED, "transactional_id": t, "transaction_state": "",
                                          "producer_id": -1, "producer_epoch": -1, "topics": [],
                                          "transaction_start_time": _NO_TIME})
                  for t in body.transactional_ids if not users.may_transact(user, t)]
        return dataclasses.replace(body, transactional_ids=tuple(keep)), denied, None
    if key == 47 and not users.may_group(user, body.group_id, "delete"):  # OffsetDelete: group DELETE
        return body, [], {"error_code": GROUP_DENIED, "topics": []}
    if key in (8, 9, 10, 11, 12, 13, 14, 15, 42):
        body, denied, refused = _filter_groups(users, user, key, body, version)
        if refused is not None:
            return body, [], refused
        if key != 8:
            return body, denied, None
    else:
        denied = []
    if key in _TOPICS:
        body, more = _filter_topics(users, user, key, body)
        return body, denied + more, None
    if key in (19, 20, 37):
        body, denied = _filter_admin(users, user, key, body)
    elif key == 32:
        body, denied = _filter_configs(users, user, body)
    elif key in (33, 44):  # AlterConfigs, IncrementalAlterConfigs: topic WRITE
        body, denied = _filter_configs(users, user, body, alter=True)
    return body, denied, None


def add_denied(data: dict[str, Any], denied: Denied) -> None:
    """Put the answers for the removed parts of a request into its response dict."""
    for field, row in denied:
        data.setdefault(field, []).append(row)


def _every(topics: Any, key: int, version: int) -> bool:
    """Whether a request's topic list asks for every topic."""
    return topics is None or (key == 3 and version == 0 and not topics)


def filter_response(users: Users, user: str | None, key: int, data: dict[str, Any], body: Any,
                    version: int) -> None:
    """Leave out of an answer to a request for everything (Metadata or OffsetFetch without
    topics, ListGroups) what ``user`` may not see; a topic the request named is answered
    TOPIC_AUTHORIZATION_FAILED with no partitions (Metadata) or offsets (OffsetFetch)."""
    if user is None:
        return
    if key == 3:
        every = _every(body.topics, key, version)
        kept = []
        for t in data.get("topics", []):
            if t["name"] is not None and not users.may_describe(user, t["name"]):  # (None: an unknown id)
                if every:
                    continue
                t["error_code"], t["partitions"] = TOPIC_DENIED, []
            kept.append(t)
        data["topics"] = kept
    elif key == 9:
        asked = {g.group_id: g.topics for g in body.groups} if version >= 8 else {None: body.topics}
        for grp in data.get("groups", [data]):
            every = _every(asked.get(grp.get("group_id")), key, version)
            kept = []
            for t in grp.get("topics", []):
                if not users.may_describe(user, t["name"]):
                    if every:
                        continue
                    for p in t["partitions"]:
                        p["committed_offset"], p["error_code"] = -1, TOPIC_DENIED
                kept.append(t)
            grp["topics"] = kept
    elif key == 16:
        data["groups"] = [g for g in data.get("groups", []) if users.may_group(user, g["group_id"], "describe")]
    elif key == 66:  # ListTransactions: the ids the user may use
        data["transaction_states"] = [t for t in data.get("transaction_states", [])
                                      if users.may_transact(user, t["transactional_id"])]
    elif key == 60:  # DescribeCluster: the operations asked for are the user's
        if data.get("cluster_authorized_operations", NOT_ASKED) != NOT_ASKED:
            data["cluster_authorized_operations"] = cluster_operations(users, user)
    elif key == 35:  # DescribeLogDirs: the partitions of the topics the user may see
        for r in data.get("results", []):
            r["topics"] = [t for t in r["topics"] if users.may_describe(user, t["name"])]
