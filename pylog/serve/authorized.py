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
cluster (any user)        DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE (what every
                          authenticated user may do: Metadata, DescribeConfigs of the
                          broker, InitProducerId without a transactional id); pylog has no
                          cluster rights to grant the others
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
_USER_CLUSTER_OPS = (DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE)


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
    """The operations ``user`` may perform on the cluster, as a bitfield."""
    return bits(CLUSTER_OPS if users is None else _USER_CLUSTER_OPS)


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
