"""DescribeUserScramCredentials (API 50) and AlterUserScramCredentials (API 51) over the
users file (:mod:`.security`).

* Who may: with a users file (SASL on), only a user whose entry has ``"admin": true``
  (Kafka's DESCRIBE and ALTER on the cluster); anyone else gets
  CLUSTER_AUTHORIZATION_FAILED (31) for the whole request. Without one (SASL off, every
  client is trusted as Kafka trusts every client without an authorizer), the credentials
  are kept in the data root's :data:`ROOT_USERS_FILE`, ready for a broker started with
  ``--users`` naming it.
* Only ``SCRAM-SHA-256`` (mechanism 1) is served; SCRAM-SHA-512 (2) is refused with
  UNSUPPORTED_SASL_MECHANISM (33). Iterations must be 4096 to 16384 (Kafka's bounds), the
  salt and salted password non-empty, else UNACCEPTABLE_CREDENTIAL (93).
* An upsertion keeps the user's rights; a new user gets empty rights lists (it may use
  nothing until rights are given). A deletion removes the user's keys and keeps its rights:
  it cannot log in until it gets a credential again. A user named twice in one request is
  answered DUPLICATE_RESOURCE (92), deleting or describing a user without a credential
  RESOURCE_NOT_FOUND (91).
* A change is written atomically and durably (the whole file replaced, then its folder
  synced) before it is answered, and holds for the next login: the broker reloads the file.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.serve.security import Users

__all__ = ["ROOT_USERS_FILE", "SHA_256", "LOCK", "load", "save", "describe", "alter"]

#: The users file kept in the data root when the broker runs without ``--users``.
ROOT_USERS_FILE = "users.json"
#: Kafka's ScramMechanism code of SCRAM-SHA-256 (SCRAM-SHA-512 is 2, not served).
SHA_256 = 1
_MIN_ITERATIONS, _MAX_ITERATIONS = 4096, 16384
_KEYS = ("salt", "iterations", "stored_key", "server_key")
#: One change of a users file at a time (read it, change it, replace it): SCRAM and ACLs.
LOCK = threading.Lock()


def load(path: str) -> dict[str, Any]:
    """The users file ``path`` as JSON (a missing file: no users)."""
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        data = {"users": {}}
    data.setdefault("users", {})
    return data


def save(path: str, data: dict[str, Any]) -> None:
    """Replace the users file ``path`` with ``data``, atomically and durably, mode 0600."""
    old = os.umask(0o077)  # never readable by others, not even for a moment
    try:
        fileutil.atomic_write(path, json.dumps(data, indent=1).encode())
    finally:
        os.umask(old)


def _denied(users: Users | None, principal: str | None) -> bool:
    return users is not None and not users.is_admin(principal)


def describe(path: str, users: Users | None, principal: str | None, req: Any) -> dict[str, Any]:
    """DescribeUserScramCredentials: each named user's mechanism and iterations (no names
    or an empty list: every user with a credential)."""
    names = [u.name for u in req.users or ()]
    if _denied(users, principal):
        # Kafka refuses at the request level; librdkafka (2.15) aborts on any request-level
        # error of this API (it frees a string it does not own), so named users are refused
        # each in its row, and only a request for every user at the request level
        msg = "describing SCRAM credentials needs an admin user"
        return {"error_code": 0 if names else E.cluster_authorization_failed,
                "error_message": None if names else msg, "results": [
            {"user": n, "error_code": E.cluster_authorization_failed, "error_message": msg, "credential_infos": []}
            for n in dict.fromkeys(names)]}
    entries = load(path)["users"]
    if not names:
        names = sorted(n for n, u in entries.items() if "salt" in u)
    results = []
    for name in dict.fromkeys(names):
        r: dict[str, Any] = {"user": name, "error_code": 0, "error_message": None, "credential_infos": []}
        u = entries.get(name, {})
        if names.count(name) > 1:
            r["error_code"], r["error_message"] = E.duplicate_resource, f"user {name!r} is named twice"
        elif "salt" not in u:
            r["error_code"], r["error_message"] = E.resource_not_found, f"user {name!r} has no SCRAM credential"
        else:
            r["credential_infos"] = [{"mechanism": SHA_256, "iterations": int(u["iterations"])}]
        results.append(r)
    return {"error_code": 0, "error_message": None, "results": results}


def _check_upsertion(up: Any) -> tuple[int, str] | None:
    if up.mechanism != SHA_256:
        return E.unsupported_sasl_mechanism, f"SCRAM mechanism {up.mechanism}: only SCRAM-SHA-256 (1) is served"
    if not _MIN_ITERATIONS <= up.iterations <= _MAX_ITERATIONS:
        return (E.unacceptable_credential,
                f"iterations {up.iterations}: must be {_MIN_ITERATIONS} to {_MAX_ITERATIONS}")
    if not up.salt or not up.salted_password:
        return E.unacceptable_credential, "an empty salt or salted password"
    if "," in up.name or "=" in up.name:
        return E.unacceptable_credential, f"user name {up.name!r} has ',' or '='"
    return None


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def alter(path: str, users: Users | None, principal: str | None, req: Any) -> tuple[dict[str, Any], bool]:
    """AlterUserScramCredentials: (the response, whether the file changed: the caller
    reloads it for the next logins)."""
    named = [d.name for d in req.deletions] + [u.name for u in req.upsertions]
    if _denied(users, principal):
        return {"results": [{"user": n, "error_code": E.cluster_authorization_failed,
                             "error_message": "altering SCRAM credentials needs an admin user"}
                            for n in dict.fromkeys(named)]}, False
    out: dict[str, dict[str, Any]] = {}
    with LOCK:
        data = load(path)
        entries = data["users"]
        changed = False
        for d in req.deletions:
            r = out.setdefault(d.name, {"user": d.name, "error_code": 0, "error_message": None})
            if named.count(d.name) > 1:
                r["error_code"], r["error_message"] = E.duplicate_resource, f"user {d.name!r} is altered twice"
            elif not d.name:
                r["error_code"], r["error_message"] = E.unacceptable_credential, "an empty user name"
            elif d.mechanism != SHA_256:
                r["error_code"] = E.unsupported_sasl_mechanism
                r["error_message"] = f"SCRAM mechanism {d.mechanism}: only SCRAM-SHA-256 (1) is served"
            elif "salt" not in entries.get(d.name, {}):
                r["error_code"] = E.resource_not_found
                r["error_message"] = f"user {d.name!r} has no SCRAM-SHA-256 credential"
            else:
                for k in _KEYS:
                    entries[d.name].pop(k, None)
                changed = True
        for up in req.upsertions:
            r = out.setdefault(up.name, {"user": up.name, "error_code": 0, "error_message": None})
            bad = ((E.duplicate_resource, f"user {up.name!r} is altered twice") if named.count(up.name) > 1
                   else (E.unacceptable_credential, "an empty user name") if not up.name
                   else _check_upsertion(up))
            if bad is not None:
                r["error_code"], r["error_message"] = bad
                continue
            salted = bytes(up.salted_password)
            client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
            server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
            entry = entries.setdefault(up.name, {"read": [], "write": [], "groups": []})
            entry.update({"salt": _b64(bytes(up.salt)), "iterations": int(up.iterations),
                          "stored_key": _b64(hashlib.sha256(client_key).digest()), "server_key": _b64(server_key)})
            changed = True
        if changed:
            save(path, data)
    return {"results": list(out.values())}, changed
