"""CreateAcls (API 30), DescribeAcls (29) and DeleteAcls (31): Kafka ACL bindings kept in
the users file's ``"acls"`` list (:mod:`.acl_rules` says what they mean and which can be
stored), or in the data root's users file without ``--users`` (:mod:`.scram_admin`).

Only an admin (:meth:`.security.Users.is_admin`) may describe or change them: anyone else
gets CLUSTER_AUTHORIZATION_FAILED (31). A binding pylog cannot enforce is refused with
INVALID_REQUEST (42) and a message naming what is wrong; the others of the request are
stored. A change is written atomically and durably before it is answered and holds for
the next request (the broker reloads the file).
"""
from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog.serve import acl_rules, scram_admin
from pylog.serve.security import Users

__all__ = ["create_acls", "describe_acls", "delete_acls"]

_DENIED = "ACLs are an admin's (an ALLOW binding of ALTER on the cluster, or \"admin\": true)"


def create_acls(path: str, users: Users | None, principal: str | None, req: Any) -> tuple[dict[str, Any], bool]:
    """CreateAcls: (the response, whether the file changed)."""
    if users is not None and not users.is_admin(principal):
        return {"results": [{"error_code": E.cluster_authorization_failed, "error_message": _DENIED}
                            for _ in req.creations]}, False
    results = []
    with scram_admin.LOCK:
        data = scram_admin.load(path)
        acls = data.setdefault("acls", [])
        changed = False
        for c in req.creations:
            b = {k: getattr(c, k) for k in acl_rules.FIELDS}
            why = acl_rules.check(b)
            if why is not None:
                results.append({"error_code": E.invalid_request, "error_message": why})
                continue
            if b not in acls:
                acls.append(b)
                changed = True
            results.append({"error_code": 0, "error_message": None})
        if changed:
            scram_admin.save(path, data)
    return {"results": results}, changed


def describe_acls(path: str, users: Users | None, principal: str | None, req: Any) -> dict[str, Any]:
    """DescribeAcls: the stored bindings matching the request's filter, by resource."""
    if users is not None and not users.is_admin(principal):
        return {"error_code": E.cluster_authorization_failed, "error_message": _DENIED, "resources": []}
    out: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for b in scram_admin.load(path).get("acls", []):
        if acl_rules.matches_filter(b, req):
            out.setdefault((b["resource_type"], b["resource_name"], b["resource_pattern_type"]), []).append(
                {"principal": b["principal"], "host": b["host"], "operation": b["operation"],
                 "permission_type": b["permission_type"]})
    return {"error_code": 0, "error_message": None, "resources": [
        {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
        for (t, n, p), acls in out.items()]}


def delete_acls(path: str, users: Users | None, principal: str | None, req: Any) -> tuple[dict[str, Any], bool]:
    """DeleteAcls: each filter's matching bindings removed (and listed); (the response,
    whether the file changed)."""
    if users is not None and not users.is_admin(principal):
        return {"filter_results": [{"error_code": E.cluster_authorization_failed, "error_message": _DENIED,
                                    "matching_acls": []} for _ in req.filters]}, False
    results = []
    with scram_admin.LOCK:
        data = scram_admin.load(path)
        acls = data.get("acls", [])
        for f in req.filters:
            gone = [b for b in acls if acl_rules.matches_filter(b, f)]
            acls = [b for b in acls if b not in gone]
            results.append({"error_code": 0, "error_message": None, "matching_acls": [
                {"error_code": 0, "error_message": None, "pattern_type": b["resource_pattern_type"],
                 **{k: b[k] for k in acl_rules.FIELDS if k != "resource_pattern_type"}} for b in gone]})
        changed = len(acls) != len(data.get("acls", []))
        if changed:
            data["acls"] = acls
            scram_admin.save(path, data)
    return {"filter_results": results}, changed
