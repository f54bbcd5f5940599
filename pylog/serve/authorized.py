"""Authorized operations (KIP-430): the bitfields Metadata answers when a client asks for
them (``include_topic_authorized_operations``, and v8-10's
``include_cluster_authorized_operations``), computed as Kafka's broker does: bit ``1 <<
code`` of every operation the resource type supports that the principal may perform.

Without a users file every client may do everything, as a Kafka broker without an
authorizer answers: every supported operation. With one, the rights of
:class:`.security.Users` map to Kafka's operations as :mod:`.acl` enforces them:

========================  =================================================================
topic READ right          READ, DESCRIBE, DESCRIBE_CONFIGS
topic WRITE right         WRITE, CREATE, DELETE, ALTER, ALTER_CONFIGS, DESCRIBE,
                          DESCRIBE_CONFIGS (CreateTopics, DeleteTopics, CreatePartitions,
                          DeleteRecords and config changes need WRITE here)
cluster                   every operation for a user whose entry restricts nothing; else
                          DESCRIBE, DESCRIBE_CONFIGS (Metadata, DescribeConfigs of the
                          broker), IDEMPOTENT_WRITE when it may write some topic, CREATE
                          when it may write every one (:func:`cluster_operations`)
========================  =================================================================

A field the client did not ask for is Kafka's "not asked" value, INT32_MIN.
"""
from __future__ import annotations

from typing import Any

from pylog.serve.security import Users

__all__ = ["NOT_ASKED", "TOPIC_OPS", "CLUSTER_OPS", "bits", "topic_operations", "cluster_operations",
           "fill_metadata"]

#: Kafka's AclOperation codes.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
#: The value of an authorized operations field not asked for.
NOT_ASKED = -2147483648
#: The operations Kafka supports on a topic and on the cluster (its AclEntry).
TOPIC_OPS = (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS)
CLUSTER_OPS = (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE)
_READ_OPS = (READ, DESCRIBE, DESCRIBE_CONFIGS)
_WRITE_OPS = (WRITE, CREATE, DELETE, ALTER, ALTER_CONFIGS, DESCRIBE, DESCRIBE_CONFIGS)


def bits(ops: tuple[int, ...] | set[int]) -> int:
    """The 32-bit field of a set of operation codes (Kafka's ``Utils.to32BitField``)."""
    out = 0
    for op in ops:
        out |= 1 << op
    return out


def topic_operations(users: Users | None, user: str | None, topic: str) -> int:
    """The operations ``user`` may perform on ``topic``, as a bitfield."""
    if users is None:
        return bits(TOPIC_OPS)
    ops: set[int] = set()
    if users.may(user, topic, False):
        ops.update(_READ_OPS)
    if users.may(user, topic, True):
        ops.update(_WRITE_OPS)
    return bits(ops)


def cluster_operations(users: Users | None, user: str | None) -> int:
    """The operations ``user`` may perform on the cluster, as a bitfield.

    Without a users file, or for a user whose entry restricts nothing (no ``read``,
    ``write`` or ``groups`` list), every one. A restricted user may DESCRIBE and
    DESCRIBE_CONFIGS the cluster (Metadata and the broker's DescribeConfigs answer every
    user), IDEMPOTENT_WRITE when it may write some topic, and CREATE when it may write
    every topic (Kafka's CREATE on the cluster creates any topic; a user with a ``write``
    list creates only the topics it names). ALTER, ALTER_CONFIGS and CLUSTER_ACTION stay
    with the unrestricted users; an unknown user gets none."""
    if users is None or user is None:
        return bits(CLUSTER_OPS)
    u = users.users.get(user)
    if u is None:  # (a broker without users, with ACL bindings: ANONYMOUS, unrestricted)
        return bits(CLUSTER_OPS) if users.anonymous else 0
    if u.read is None and u.write is None and u.groups is None:
        return bits(CLUSTER_OPS)
    ops = {DESCRIBE, DESCRIBE_CONFIGS}
    if u.write is None or u.write:
        ops.add(IDEMPOTENT_WRITE)
    if u.write is None:
        ops.add(CREATE)
    return bits(ops)


def fill_metadata(data: dict[str, Any], body: Any, version: int, users: Users | None, user: str | None) -> None:
    """Set the authorized operations of a Metadata response ``data`` that the request asked
    for: each topic answered without error, and the cluster's in v8-10."""
    if getattr(body, "include_topic_authorized_operations", False):
        for t in data.get("topics", []):
            if t.get("error_code"):
                continue
            ops = topic_operations(users, user, t["name"])
            if ops:  # (no right at all: refused, as Kafka answers it)
                t["topic_authorized_operations"] = ops
    if 8 <= version <= 10 and getattr(body, "include_cluster_authorized_operations", False):
        data["cluster_authorized_operations"] = cluster_operations(users, user)
