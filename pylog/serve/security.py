"""Who may connect to ``pylog serve``: loopback by default, else TLS and SASL, and per-topic
read/write permissions.

* :func:`check_listen` refuses, at start-up, to listen on an address that is not loopback
  unless TLS (a certificate and key) and a users file are both given.
* TLS is the standard library's :mod:`ssl` (:func:`tls_context`); a client that does not
  speak TLS fails the handshake and its connection is closed before any request is read.
* SASL (SaslHandshake v1 + SaslAuthenticate): ``PLAIN`` (only over TLS: it sends the
  password) and ``SCRAM-SHA-256`` (RFC 5802/7677). A wrong password or an unknown user gets
  SASL_AUTHENTICATION_FAILED and the connection is closed; any request other than
  ApiVersions and SASL before authentication closes the connection (as Kafka does).
* The users file (JSON, written by :func:`add_user` or ``python -m pylog.serve.security
  FILE USER`` with the password on stdin) keeps no password, only SCRAM's salted keys::

      {"users": {"alice": {"salt": "...", "iterations": 4096, "stored_key": "...",
                           "server_key": "...", "read": ["orders"], "write": ["orders"]}}}

  ``read`` and ``write`` are optional lists of topic names (``"*"``: every topic); a user
  without them may read and write every topic. Reading is Fetch, ListOffsets, OffsetFetch
  and seeing the topic in Metadata; writing is Produce, OffsetCommit (a commit moves the
  group) and creating, deleting or growing the topic. An unauthorised topic gets
  TOPIC_AUTHORIZATION_FAILED (29) and no data.
"""
from __future__ import annotations

import base64
import contextvars
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import ssl
import sys
from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.errors import ConfigError, InvalidArgumentError

__all__ = ["Users", "Session", "SESSION", "add_user", "check_listen", "is_loopback", "tls_context", "MECHANISMS"]

#: The SASL mechanisms served.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256")
_ITERATIONS = 4096


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_listen(host: str, tls: bool, users: bool) -> None:
    """Refuse (InvalidArgumentError naming the address) to listen on a non-loopback address
    without both TLS and a users file."""
    if not is_loopback(host) and not (tls and users):
        missing = " and ".join(x for x, ok in (("TLS (--tls-cert, --tls-key)", tls), ("SASL users (--users)", users))
                               if not ok)
        raise InvalidArgumentError(f"listening on {host!r}, which is not loopback, needs {missing}")


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) from a PEM certificate chain and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS certificate {cert!r} / key {key!r}: {e}") from None
    return ctx


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def add_user(path: str, user: str, password: str, read: list[str] | None = None,
             write: list[str] | None = None) -> None:
    """Add (or replace) ``user`` in the users file ``path`` (created if missing), with its
    SCRAM-SHA-256 keys and optional topic permissions; the password itself is not kept."""
    if not user or "," in user or "=" in user:
        raise InvalidArgumentError(f"user name {user!r} must be non-empty, without ',' or '='")
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"users": {}}
    salt = secrets.token_bytes(16)
    stored, server = _keys(password, salt, _ITERATIONS)
    entry: dict[str, Any] = {"salt": _b64(salt), "iterations": _ITERATIONS, "stored_key": _b64(stored),
                             "server_key": _b64(server)}
    if read is not None:
        entry["read"] = list(read)
    if write is not None:
        entry["write"] = list(write)
    data.setdefault("users", {})[user] = entry
    fileutil.atomic_write(path, json.dumps(data, indent=1).encode())
    os.chmod(path, 0o600)


@dataclasses.dataclass
class _User:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    read: frozenset[str] | None
    write: frozenset[str] | None


class Users:
    """The users file: credentials and topic permissions (see the module docstring)."""

    def __init__(self, path: str) -> None:
        try:
            with open(path) as f:
                raw = json.load(f)
            self.users: dict[str, _User] = {}
            for name, u in raw["users"].items():
                self.users[name] = _User(base64.b64decode(u["salt"]), int(u["iterations"]),
                                         base64.b64decode(u["stored_key"]), base64.b64decode(u["server_key"]),
                                         frozenset(u["read"]) if "read" in u else None,
                                         frozenset(u["write"]) if "write" in u else None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"users file {path!r} is not usable: {e}") from None

    def check_plain(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s (constant time for known users)."""
        u = self.users.get(user)
        if u is None:
            return False
        stored, _ = _keys(password, u.salt, u.iterations)
        return hmac.compare_digest(stored, u.stored_key)

    def may(self, user: str | None, topic: str, write: bool) -> bool:
        """Whether ``user`` may read (or write) ``topic``."""
        if user is None:
            return True
        u = self.users.get(user)
        if u is None:
            return False
        allowed = u.write if write else u.read
        return allowed is None or "*" in allowed or topic in allowed


class Session:
    """One connection's authentication state."""

    def __init__(self, tls: bool) -> None:
        self.tls = tls
        self.close_after = False  # a failed authentication: answer, then close
        self.user: str | None = None
        self.mechanism: str | None = None
        self._scram: tuple[str, str, str] | None = None  # user, client-first-bare, server-first

    def handshake(self, req: Any) -> dict[str, Any]:
        """SaslHandshake: pick the mechanism (PLAIN only over TLS)."""
        offered = [m for m in MECHANISMS if self.tls or m != "PLAIN"]
        if req.mechanism not in offered:
            return {"error_code": E.unsupported_sasl_mechanism, "mechanisms": offered}
        self.mechanism = req.mechanism
        return {"error_code": 0, "mechanisms": offered}

    def authenticate(self, users: Users, req: Any) -> tuple[dict[str, Any], bool]:
        """SaslAuthenticate: (response, close the connection after it)."""
        fail = {"error_code": E.sasl_authentication_failed, "auth_bytes": b"", "session_lifetime": 0}
        data = bytes(req.auth_bytes)
        if self.mechanism is None or self.user is not None:
            return {**fail, "error_code": E.illegal_sasl_state, "error_message": "SaslHandshake first"}, True
        if self.mechanism == "PLAIN":
            parts = data.split(b"\0")
            if len(parts) != 3:
                return {**fail, "error_message": "malformed PLAIN message"}, True
            user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
            if not users.check_plain(user, password):
                return {**fail, "error_message": "Authentication failed: invalid user name or password"}, True
            self.user = user
            return {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime": 0}, False
        return self._scram_step(users, data, fail)

    def _scram_step(self, users: Users, data: bytes, fail: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        bad = {**fail, "error_message": "Authentication failed during authentication due to invalid credentials "
                                        "with SASL mechanism SCRAM-SHA-256"}
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return bad, True
        if self._scram is None:  # client-first: gs2 header, n=user,r=nonce
            head, _, bare = text.partition(",,") if text.startswith("n,") else ("", "", "")
            attrs = dict(a.split("=", 1) for a in bare.split(",") if "=" in a)
            user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
            u = users.users.get(user)
            if not head or "r" not in attrs or u is None:
                return bad, True
            first = f"r={attrs['r']}{secrets.token_urlsafe(18)},s={_b64(u.salt)},i={u.iterations}"
            self._scram = (user, bare, first)
            return {"error_code": 0, "error_message": None, "auth_bytes": first.encode(), "session_lifetime": 0}, False
        user, client_first, server_first = self._scram
        attrs = dict(a.split("=", 1) for a in text.split(",") if "=" in a)
        without_proof = text.rsplit(",p=", 1)[0]
        nonce = dict(a.split("=", 1) for a in server_first.split(","))["r"]
        u = users.users[user]
        if attrs.get("r") != nonce or "p" not in attrs:
            return bad, True
        auth = f"{client_first},{server_first},{without_proof}".encode()
        signature = hmac.new(u.stored_key, auth, hashlib.sha256).digest()
        try:
            proof = base64.b64decode(attrs["p"])
        except ValueError:
            return bad, True
        if len(proof) != len(signature):
            return bad, True
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), u.stored_key):
            return bad, True
        self.user = user
        final = "v=" + _b64(hmac.new(u.server_key, auth, hashlib.sha256).digest())
        return {"error_code": 0, "error_message": None, "auth_bytes": final.encode(), "session_lifetime": 0}, False


#: The :class:`Session` of the connection whose request is being handled.
SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar("pylog_serve_session", default=None)


# -- per-topic permissions over the requests ----------------------------------------------
#: key -> (the request's topic list field, the topic's name field, the response's list
#: field, its name field, its partition list field, the partition index field, write?)
_TOPICS: dict[int, tuple[str, str, str, str, str, str, bool]] = {
    0: ("topic_data", "name", "responses", "name", "partition_responses", "index", True),
    1: ("topics", "topic", "responses", "topic", "partitions", "partition_index", False),
    2: ("topics", "name", "topics", "name", "partitions", "partition_index", False),
    8: ("topics", "name", "topics", "name", "partitions", "partition_index", True),
}


def _partitions_of(key: int, t: Any) -> list[int]:
    if key == 0:
        return [p.index for p in t.partition_data]
    if key == 1:
        return [p.partition for p in t.partitions]
    return [p.partition_index for p in t.partitions]


def filter_request(users: Users, user: str | None, key: int, body: Any) -> tuple[Any, list[tuple[str, list[int]]]]:
    """The request without the topics ``user`` may not touch, and those topics with their
    partitions (answered TOPIC_AUTHORIZATION_FAILED by :func:`add_denied`)."""
    spec = _TOPICS.get(key)
    if spec is None or user is None:
        return body, []
    field, name, *_rest, write = spec
    keep, denied = [], []
    for t in getattr(body, field):
        if users.may(user, getattr(t, name), write):
            keep.append(t)
        else:
            denied.append((getattr(t, name), _partitions_of(key, t)))
    if denied:
        body = dataclasses.replace(body, **{field: tuple(keep)})
    return body, denied


def add_denied(key: int, data: dict[str, Any], denied: list[tuple[str, list[int]]]) -> None:
    """Put the denied topics into a response dict, every partition TOPIC_AUTHORIZATION_FAILED."""
    if not denied:
        return
    _f, _n, out_field, out_name, parts_field, index, _w = _TOPICS[key]
    rows = data.setdefault(out_field, [])
    for topic, parts in denied:
        rows.append({out_name: topic, parts_field: [
            {index: p, "error_code": E.topic_authorization_failed, "base_offset": -1, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "offset": -1, "timestamp": -1, "records": b""}
            for p in parts]})


def filter_response(users: Users, user: str | None, key: int, data: dict[str, Any]) -> None:
    """Hide what ``user`` may not read from the answers that list topics by themselves
    (Metadata, OffsetFetch), and refuse topic admin it may not do."""
    if user is None:
        return
    if key == 3:  # Metadata: an unreadable topic is TOPIC_AUTHORIZATION_FAILED, no partitions
        for t in data.get("topics", []):
            if not users.may(user, t["name"], False):
                t["error_code"], t["partitions"] = E.topic_authorization_failed, []
    elif key == 9:
        for grp in data.get("groups", [data]):
            for t in grp.get("topics", []):
                if not users.may(user, t["name"], False):
                    for p in t["partitions"]:
                        p["committed_offset"], p["error_code"] = -1, E.topic_authorization_failed


def filter_admin(users: Users, user: str | None, key: int, body: Any) -> tuple[Any, list[str]]:
    """A CreateTopics (19), DeleteTopics (20) or CreatePartitions (37) without the topics
    ``user`` may not write, and their names (see :func:`add_admin_denied`)."""
    if user is None:
        return body, []
    # Metadata's auto-creation is checked per topic by handlers.metadata (may_create)
    if key not in (19, 20, 37):
        return body, []
    if key == 20:
        denied = [n for n in body.topic_names if not users.may(user, n, True)]
        if denied:
            body = dataclasses.replace(body, topic_names=tuple(n for n in body.topic_names if n not in denied))
        return body, denied
    denied = [t.name for t in body.topics if not users.may(user, t.name, True)]
    if denied:
        body = dataclasses.replace(body, topics=tuple(t for t in body.topics if t.name not in denied))
    return body, denied


def add_admin_denied(key: int, data: dict[str, Any], denied: list[str]) -> None:
    """The denied topics of an admin request, answered TOPIC_AUTHORIZATION_FAILED."""
    field = {19: "topics", 20: "responses", 37: "results"}.get(key)
    if field is None:
        return
    for n in denied:
        data.setdefault(field, []).append({"name": n, "error_code": E.topic_authorization_failed,
                                           "error_message": f"not authorised to write topic {n!r}",
                                           "num_partitions": -1, "replication_factor": -1})


def _main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: python -m pylog.serve.security USERS_FILE USER [--read T,..] [--write T,..]"
                         " (password on stdin)\n")
        return 2
    path, user, rest = argv[0], argv[1], argv[2:]
    opts: dict[str, list[str]] = {}
    for flag, value in zip(rest[::2], rest[1::2]):
        opts[flag.lstrip("-")] = [x for x in value.split(",") if x]
    password = sys.stdin.readline().rstrip("\n")
    if not password:
        sys.stderr.write("pylog: error: an empty password (give it on stdin)\n")
        return 2
    add_user(path, user, password, opts.get("read"), opts.get("write"))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main(sys.argv[1:]))
