"""Kafka ACL bindings kept in the users file (its ``"acls"`` list, written by
CreateAcls/DeleteAcls: :mod:`.acl_admin`) and how they decide on top of the users' rights
lists (:mod:`.security`).

A binding is what Kafka's is: principal ``User:NAME`` (``User:*``: every user, and the
unauthenticated clients of a broker without a users file, Kafka's ``User:ANONYMOUS``),
resource type and name, pattern LITERAL (the name ``*``: every resource) or PREFIXED,
operation, ALLOW or DENY, host. Only what pylog enforces is stored (:func:`check`):

============================  ================================================
resource type                 operations
============================  ================================================
TOPIC (2)                     READ, WRITE, DESCRIBE, ALL
GROUP (3)                     READ, DESCRIBE, DELETE, ALL
TRANSACTIONAL_ID (5)          WRITE, DESCRIBE, ALL
CLUSTER (4) ``kafka-cluster`` ALTER, DESCRIBE, ALL (an admin: SCRAM credentials
                              and ACLs)
============================  ================================================

and the host ``*`` only (rights do not depend on the client's address here). A DENY that
matches refuses, whatever allows it (as in Kafka); else an ALLOW that matches grants; else
the users file's lists decide. DESCRIBE is granted by an ALLOW of READ, WRITE, DELETE or
ALTER too, and refused only by a DENY of DESCRIBE or ALL, as Kafka implies it.
"""
from __future__ import annotations

from typing import Any

__all__ = ["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID", "ANY", "MATCH", "LITERAL", "PREFIXED", "ALL",
           "READ", "WRITE", "DELETE", "ALTER", "DESCRIBE", "DENY", "ALLOW", "CLUSTER_NAME", "FIELDS", "Rules",
           "check", "matches_filter"]

ANY, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 2, 3, 4, 5
ALL, READ, WRITE, DELETE, ALTER, DESCRIBE = 2, 3, 4, 6, 7, 8
DENY, ALLOW = 2, 3
#: Kafka's name of the cluster resource.
CLUSTER_NAME = "kafka-cluster"
#: A stored binding's fields (Kafka's names in CreateAcls).
FIELDS = ("resource_type", "resource_name", "resource_pattern_type", "principal", "host", "operation",
          "permission_type")
_OPERATIONS = {TOPIC: {ALL, READ, WRITE, DESCRIBE}, GROUP: {ALL, READ, DESCRIBE, DELETE},
               TRANSACTIONAL_ID: {ALL, WRITE, DESCRIBE}, CLUSTER: {ALL, ALTER, DESCRIBE}}
_NAMES = {TOPIC: "TOPIC", GROUP: "GROUP", CLUSTER: "CLUSTER", TRANSACTIONAL_ID: "TRANSACTIONAL_ID"}


def check(b: dict[str, Any]) -> str | None:
    """Why the binding ``b`` cannot be stored (None: it can)."""
    rt, op = b["resource_type"], b["operation"]
    if rt not in _OPERATIONS:
        return f"resource type {rt}: pylog's rights cover TOPIC, GROUP, TRANSACTIONAL_ID and CLUSTER"
    if b["resource_pattern_type"] not in (LITERAL, PREFIXED):
        return f"pattern type {b['resource_pattern_type']}: a binding is LITERAL (3) or PREFIXED (4)"
    if not b["resource_name"]:
        return "an empty resource name"
    if rt == CLUSTER and b["resource_name"] != CLUSTER_NAME:
        return f"cluster resource {b['resource_name']!r}: the cluster is {CLUSTER_NAME!r}"
    if op not in _OPERATIONS[rt]:
        return (f"operation {op} on {_NAMES[rt]}: pylog's rights there are "
                f"{', '.join(str(o) for o in sorted(_OPERATIONS[rt]))} (ALL 2, READ 3, WRITE 4, DELETE 6, "
                "ALTER 7, DESCRIBE 8)")
    if b["permission_type"] not in (ALLOW, DENY):
        return f"permission type {b['permission_type']}: ALLOW (3) or DENY (2)"
    principal = b["principal"] or ""
    if not principal.startswith("User:") or len(principal) == 5:
        return f"principal {principal!r}: write User:NAME or User:*"
    if b["host"] != "*":
        return f"host {b['host']!r}: rights do not depend on the client's address here, use '*'"
    return None


def _resource_matches(b: dict[str, Any], rtype: int, name: str) -> bool:
    if b["resource_type"] != rtype:
        return False
    if b["resource_pattern_type"] == PREFIXED:
        return name.startswith(b["resource_name"])
    return b["resource_name"] in ("*", name)


def matches_filter(b: dict[str, Any], f: Any) -> bool:
    """Whether the binding ``b`` matches a DescribeAcls request or a DeleteAcls filter ``f``."""
    if f.resource_type_filter != ANY and b["resource_type"] != f.resource_type_filter:
        return False
    pattern, name = f.pattern_type_filter, f.resource_name_filter
    if pattern == MATCH:
        if name is not None and not _resource_matches(b, b["resource_type"], name):
            return False
    else:
        if pattern != ANY and b["resource_pattern_type"] != pattern:
            return False
        if name is not None and b["resource_name"] != name:
            return False
    return bool((f.principal_filter is None or b["principal"] == f.principal_filter)
            and (f.host_filter is None or b["host"] == f.host_filter)
            and (f.operation == ANY or b["operation"] == f.operation)
            and (f.permission_type == ANY or b["permission_type"] == f.permission_type))


class Rules:
    """The stored bindings, and their verdict on one access (see the module docstring)."""

    def __init__(self, bindings: list[dict[str, Any]]) -> None:
        self.bindings = bindings

    def __bool__(self) -> bool:
        return bool(self.bindings)

    def verdict(self, user: str, rtype: int, name: str, op: int) -> bool | None:
        """False: a DENY matches; True: an ALLOW matches (and no DENY); None: no binding
        decides (the users file's lists do)."""
        allowed = False
        for b in self.bindings:
            if b["principal"] not in ("User:*", "User:" + user) or not _resource_matches(b, rtype, name):
                continue
            bop = b["operation"]
            if b["permission_type"] == DENY:
                if bop in (op, ALL):
                    return False
            elif bop in (op, ALL) or (op == DESCRIBE and bop in (READ, WRITE, DELETE, ALTER)):
                allowed = True
        return True if allowed else None
