"""Who may connect to ``pylog serve``: loopback by default, else TLS and SASL, and rights on
topics and groups.

* :func:`check_listen` refuses, at start-up, to listen on an address that is not loopback
  unless TLS (a certificate and key) and a users file are both given.
* TLS is the standard library's :mod:`ssl` (:func:`tls_context`); a client that does not
  speak TLS fails the handshake and its connection is closed before any request is read.
* SASL (SaslHandshake v1 + SaslAuthenticate): ``PLAIN`` (only over TLS: it sends the
  password) and ``SCRAM-SHA-256`` (RFC 5802/7677), in :mod:`.sasl`.
* The users file (JSON, written by :func:`add_user` or ``python -m pylog.serve.security
  FILE USER`` with the password on stdin) keeps no password, only SCRAM's salted keys::

      {"users": {"alice": {"salt": "...", "iterations": 4096, "stored_key": "...",
                           "server_key": "...", "read": ["orders"], "write": ["orders"],
                           "groups": ["billing", "app-*"], "delete_groups": ["app-*"],
                           "transactional_ids": ["billing-*"]}}}

  An entry may also say ``"admin": true`` (it may change SCRAM credentials and ACLs over
  the Admin API: :mod:`.scram_admin`, :mod:`.acl_admin`), and the file may hold Kafka ACL
  bindings in an ``"acls"`` list, which decide before the lists (:mod:`.acl_rules`).
  Each list is optional; a name ending in ``*`` is a prefix (``"*"``: every name). Topics:
  ``read`` and ``write`` (no list: every topic). Groups: ``groups`` may use (Kafka's READ:
  join, sync, heartbeat, leave, commit and fetch offsets) and see (DESCRIBE) a group, no
  list: every group; ``delete_groups`` may delete a group (DELETE: DeleteGroups) and see it,
  no list: every group for a user with none of ``read``, ``write``, ``groups``, else none.
  Transactional ids: ``transactional_ids`` (WRITE and DESCRIBE; no list: as
  ``delete_groups``), checked by FindCoordinator and InitProducerId.
* Reading a topic is Fetch and OffsetCommit; seeing it (Kafka's DESCRIBE, given by either
  right) is Metadata, ListOffsets, OffsetFetch and DescribeConfigs; writing is Produce
  and creating, deleting or growing it. A refused topic gets TOPIC_AUTHORIZATION_FAILED
  (29) and no data, a refused group GROUP_AUTHORIZATION_FAILED (30); a request for every
  topic (Metadata, OffsetFetch) or every group (ListGroups) leaves out what the user may
  not see, as Kafka does.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import contextvars
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import ssl
import stat
import sys
import time
from typing import Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.errors import ConfigError, InvalidArgumentError
from pylog.serve import acl_rules

__all__ = ["Users", "Session", "SESSION", "Logins", "client_address", "add_user", "protect_root", "DATA_MODES",
           "check_listen", "is_loopback", "tls_context", "MECHANISMS"]

#: The SASL mechanisms served.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256")
log = logging.getLogger("pylog.serve")
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


#: ``--data-mode`` -> the umask the broker runs with: files 0600 and directories 0700
#: ("private"), or 0640 and 0750 ("group": the root's group may read).
DATA_MODES = {"private": 0o077, "group": 0o027}


def protect_root(root: str, data_mode: str = "private") -> int:
    """Make what the broker creates under ``root`` unreadable by other local users: set the
    process umask of ``data_mode`` (returned: the umask to restore) and tighten the root
    directory itself when it is more open than the mode (a root made 0755 before): files
    made before keep their modes, but no other user reaches them through the root. A root
    that cannot be tightened (not the broker user's) is logged as a warning."""
    mask = DATA_MODES.get(data_mode)
    if mask is None:
        raise InvalidArgumentError(f"data mode {data_mode!r}: use one of {', '.join(DATA_MODES)}")
    old = os.umask(mask)
    try:
        os.makedirs(root, exist_ok=True)
        mode = stat.S_IMODE(os.stat(root).st_mode)
    except OSError:  # the store reports it when it opens the root
        return old
    if mode & mask:
        try:
            os.chmod(root, mode & ~mask)
        except OSError as e:
            log.warning("data root %s is %04o and cannot be made %04o (%s): other local users may read it",
                        root, mode, mode & ~mask, e.strerror)
        else:
            log.warning("data root %s was %04o, now %04o: other local users cannot reach what it holds",
                        root, mode, mode & ~mask)
    return old


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def add_user(path: str, user: str, password: str, read: list[str] | None = None,
             write: list[str] | None = None, groups: list[str] | None = None,
             delete_groups: list[str] | None = None, transactional_ids: list[str] | None = None) -> None:
    """Add (or replace) ``user`` in the users file ``path`` (created if missing, mode 0600),
    with its SCRAM-SHA-256 keys and optional rights (lists of names or prefixes ending in
    ``*``: see the module docstring); the password itself is not kept."""
    if not user or "," in user or "=" in user:
        raise InvalidArgumentError(f"user name {user!r} must be non-empty, without ',' or '='")
    lists = (("read", read), ("write", write), ("groups", groups), ("delete_groups", delete_groups),
             ("transactional_ids", transactional_ids))
    for what, names in lists:
        for n in names or ():
            if not isinstance(n, str) or not n or "*" in n[:-1]:
                raise InvalidArgumentError(f"{what}: {n!r} is not a name or a prefix ending in '*'")
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"users": {}}
    salt = secrets.token_bytes(16)
    stored, server = _keys(password, salt, _ITERATIONS)
    entry: dict[str, Any] = {"salt": _b64(salt), "iterations": _ITERATIONS, "stored_key": _b64(stored),
                             "server_key": _b64(server)}
    for field, names in lists:
        if names is not None:
            entry[field] = list(names)
    data.setdefault("users", {})[user] = entry
    old = os.umask(0o077)  # never readable by others, not even for a moment
    try:
        fileutil.atomic_write(path, json.dumps(data, indent=1).encode())
    finally:
        os.umask(old)
    os.chmod(path, 0o600)


def _rights(u: dict[str, Any], field: str) -> frozenset[str] | None:
    if field not in u:
        return None
    names = u[field]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{field!r} must be a list of names")
    return frozenset(names)


def _match(allowed: frozenset[str] | None, name: str) -> bool:
    """Whether ``name`` is in ``allowed`` (None: everything; ``x*``: a prefix)."""
    if allowed is None or name in allowed:
        return True
    return any(a.endswith("*") and name.startswith(a[:-1]) for a in allowed)


_GROUP_OPS = {"read": acl_rules.READ, "describe": acl_rules.DESCRIBE, "delete": acl_rules.DELETE}


@dataclasses.dataclass
class _User:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    read: frozenset[str] | None
    write: frozenset[str] | None
    groups: frozenset[str] | None = None
    delete_groups: frozenset[str] | None = frozenset()
    transactional_ids: frozenset[str] | None = frozenset()
    admin: bool = False


class Users:
    """The users file: credentials and rights (see the module docstring), and the ACL
    bindings of its ``"acls"`` list (:mod:`.acl_rules`), which decide first.

    ``anonymous``: the file of a broker without ``--users`` (SASL off), where every client
    is ``ANONYMOUS`` and may do everything that no DENY binding refuses; a missing file
    has no users and no bindings.
    """

    def __init__(self, path: str, anonymous: bool = False) -> None:
        self.anonymous = anonymous
        try:
            try:
                with open(path) as f:
                    raw = json.load(f)
            except FileNotFoundError:
                if not anonymous:
                    raise
                raw = {"users": {}}
            self.rules = acl_rules.Rules([{k: b[k] for k in acl_rules.FIELDS} for b in raw.get("acls", [])])
            self.users: dict[str, _User] = {}
            for name, u in raw["users"].items():
                if "salt" not in u:  # its credential deleted (AlterUserScramCredentials): no login
                    continue
                read, write, groups = _rights(u, "read"), _rights(u, "write"), _rights(u, "groups")
                delete, txn = _rights(u, "delete_groups"), _rights(u, "transactional_ids")
                if read is not None or write is not None or groups is not None:
                    # a restricted user deletes groups, or takes transactional ids (fencing
                    # their producers), only as listed
                    delete = frozenset() if delete is None else delete
                    txn = frozenset() if txn is None else txn
                self.users[name] = _User(base64.b64decode(u["salt"]), int(u["iterations"]),
                                         base64.b64decode(u["stored_key"]), base64.b64decode(u["server_key"]),
                                         read, write, groups, delete, txn, u.get("admin") is True)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"users file {path!r} is not usable: {e}") from None
        # made-up SCRAM parameters for unknown users (RFC 5802 5.1): derived from a secret
        # only the file's holder knows, so they are the same at every probe of a name
        self._secret = hashlib.sha256(b"pylog fake users\0" + b"".join(
            u.server_key + u.stored_key for _, u in sorted(self.users.items()))).digest()
        counts: dict[int, int] = {}
        for u in self.users.values():
            counts[u.iterations] = counts.get(u.iterations, 0) + 1
        self._iterations = max(counts, key=lambda i: counts[i]) if counts else _ITERATIONS

    def credentials(self, user: str) -> tuple[_User, bool]:
        """(``user``'s salt, iterations and keys, True), or for an unknown user made-up ones
        that no password matches, the same at every call for the same name (False)."""
        u = self.users.get(user)
        if u is not None:
            return u, True

        def derive(what: bytes) -> bytes:
            return hmac.new(self._secret, what + b"\0" + user.encode(), hashlib.sha256).digest()

        return _User(derive(b"salt")[:16], self._iterations, derive(b"stored"), derive(b"server"),
                     frozenset(), frozenset(), frozenset(), frozenset(), frozenset()), False

    def check_plain(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s; an unknown user costs the same key derivation
        and comparison as a known one (no timing tells them apart)."""
        u, known = self.credentials(user)
        stored, _ = _keys(password, u.salt, u.iterations)
        return hmac.compare_digest(stored, u.stored_key) and known

    def may(self, user: str | None, topic: str, write: bool) -> bool:
        """Whether ``user`` may read (or write) ``topic``."""
        if user is None:
            return True
        v = self.rules.verdict(user, acl_rules.TOPIC, topic, acl_rules.WRITE if write else acl_rules.READ)
        if v is not None:
            return v
        u = self.users.get(user)
        if u is None:
            return self.anonymous
        return _match(u.write if write else u.read, topic)

    def may_describe(self, user: str | None, topic: str) -> bool:
        """Whether ``user`` may see ``topic`` (Kafka's DESCRIBE, which READ and WRITE imply)."""
        v = None if user is None else self.rules.verdict(user, acl_rules.TOPIC, topic, acl_rules.DESCRIBE)
        if v is not None:
            return v
        return self.may(user, topic, False) or self.may(user, topic, True)

    def may_group(self, user: str | None, group: str, op: str) -> bool:
        """Whether ``user`` may ``"read"`` (use), ``"describe"`` or ``"delete"`` ``group``."""
        if user is None:
            return True
        v = self.rules.verdict(user, acl_rules.GROUP, group, _GROUP_OPS[op])
        if v is not None:
            return v
        u = self.users.get(user)
        if u is None:
            return self.anonymous
        if op == "read":
            return _match(u.groups, group)
        if op == "delete":
            return _match(u.delete_groups, group)
        return _match(u.groups, group) or _match(u.delete_groups, group)

    def is_admin(self, user: str | None) -> bool:
        """Whether ``user`` is an admin (Kafka's DESCRIBE and ALTER on the cluster: SCRAM
        credentials, ACLs): ``"admin": true`` in its entry, or an ALLOW binding of ALTER on
        the cluster (a DENY one refuses); every client of a broker without users is."""
        if user is None or self.anonymous:
            return True
        if self.rules.verdict(user, acl_rules.CLUSTER, acl_rules.CLUSTER_NAME, acl_rules.ALTER) is not None:
            return bool(self.rules.verdict(user, acl_rules.CLUSTER, acl_rules.CLUSTER_NAME, acl_rules.ALTER))
        u = self.users.get(user)
        return u is not None and u.admin

    def may_transact(self, user: str | None, transactional_id: str) -> bool:
        """Whether ``user`` may use (WRITE, DESCRIBE) ``transactional_id``."""
        if user is None:
            return True
        v = self.rules.verdict(user, acl_rules.TRANSACTIONAL_ID, transactional_id, acl_rules.WRITE)
        if v is not None:
            return v
        u = self.users.get(user)
        return self.anonymous if u is None else _match(u.transactional_ids, transactional_id)


def client_address(ip: str) -> str:
    """The address failed logins are counted against: every loopback address is one
    (a local client may bind any of 127.0.0.0/8), an IPv6 address counts by its /64."""
    try:
        a = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    if a.is_loopback:
        return "loopback"
    if isinstance(a, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((a, 64), strict=False))
    return str(a)


class Logins:
    """Failed logins: the delay before a failure is answered (Kafka's
    ``connection.failed.authentication.delay.ms``) and a limit per client address.

    Parameters
    ----------
    delay
        Seconds a failed authentication waits before it is answered and its connection
        closed (the event loop serves other clients meanwhile).
    max_failures
        Failed logins an address may have within ``window`` seconds; past it, every login
        from the address fails without its credentials being checked until the oldest
        failure is ``window`` old (0: no limit).
    """

    def __init__(self, delay: float = 0.1, max_failures: int = 20, window: float = 60.0) -> None:
        self.delay = delay
        self.max_failures = max_failures
        self.window = window
        self._failures: dict[str, collections.deque[float]] = {}
        self._warned: dict[str, float] = {}
        self._checking: dict[str, int] = {}

    def checking(self, host: str, n: int) -> None:
        """Count (``n=1``) or uncount (-1) a login of ``host`` being checked: it counts as a
        failure for :meth:`blocked` until it is decided."""
        k = self._checking.get(host, 0) + n
        if k > 0:
            self._checking[host] = k
        else:
            self._checking.pop(host, None)

    def _recent(self, host: str, now: float) -> collections.deque[float]:
        q = self._failures.setdefault(host, collections.deque())
        while q and q[0] <= now - self.window:
            q.popleft()
        return q

    def blocked(self, host: str) -> float:
        """Seconds until ``host`` may try again (0: it may now)."""
        if self.max_failures <= 0:
            return 0.0
        now = time.monotonic()
        q = self._recent(host, now)
        over = len(q) + self._checking.get(host, 0) - self.max_failures
        if over < 0:
            return 0.0
        if over >= len(q):  # logins being checked fill the allowance: wait for them
            return self.delay or 0.001
        return q[over] + self.window - now

    def failed(self, host: str) -> None:
        """Count a failed login from ``host`` (logged once per window when over the limit)."""
        now = time.monotonic()
        q = self._recent(host, now)
        q.append(now)
        if len(self._failures) > 100_000:  # forget addresses that stopped failing
            for h in [h for h, x in self._failures.items() if not x or x[-1] <= now - self.window]:
                del self._failures[h]
                self._warned.pop(h, None)
        if 0 < self.max_failures <= len(q) and self._warned.get(host, -1e18) <= now - self.window:
            self._warned[host] = now
            log.warning("%d failed logins from %s within %g s: its logins fail unchecked for a while",
                        len(q), host, self.window)


class Session:
    """One connection's authentication state."""

    def __init__(self, tls: bool, logins: Logins | None = None, peer: Any = None) -> None:
        self.tls = tls
        self.logins = logins if logins is not None else Logins()
        self.host = client_address(peer[0]) if peer else "?"
        self.close_after = False  # a failed authentication: answer, then close
        self.locked_out = False  # refused unchecked: too many failed logins from the address
        self.user: str | None = None
        self.mechanism: str | None = None
        self._scram: tuple[str, _User, str, str] | None = None  # user, keys, client-first-bare, server-first

    def handshake(self, req: Any) -> dict[str, Any]:
        """SaslHandshake: pick the mechanism (PLAIN only over TLS)."""
        offered = [m for m in MECHANISMS if self.tls or m != "PLAIN"]
        if req.mechanism not in offered:
            return {"error_code": E.unsupported_sasl_mechanism, "mechanisms": offered}
        self.mechanism = req.mechanism
        return {"error_code": 0, "mechanisms": offered}

    async def authenticate(self, users: Users, req: Any) -> tuple[dict[str, Any], bool]:
        """SaslAuthenticate: (response, close the connection after it). A failure is
        counted against the client's address and answered after :attr:`Logins.delay`."""
        fail = {"error_code": E.sasl_authentication_failed, "auth_bytes": b"", "session_lifetime": 0}
        wait = self.logins.blocked(self.host)
        if wait > 0:
            self.locked_out = True
            out, close = {**fail, "error_message": f"too many failed logins from {self.host}: "
                                                   f"try again in {wait:.0f} s"}, True
        else:
            self.logins.checking(self.host, 1)  # counted while checked: a burst cannot pass the limit
            try:
                out, close = await self._authenticate(users, bytes(req.auth_bytes), fail)
            finally:
                self.logins.checking(self.host, -1)
        if close:
            self.logins.failed(self.host)
            await asyncio.sleep(self.logins.delay)
        return out, close

    async def _authenticate(self, users: Users, data: bytes, fail: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if self.mechanism is None or self.user is not None:
            return {**fail, "error_code": E.illegal_sasl_state, "error_message": "SaslHandshake first"}, True
        if self.mechanism == "PLAIN":
            parts = data.split(b"\0")
            if len(parts) != 3:
                return {**fail, "error_message": "malformed PLAIN message"}, True
            user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
            # the key derivation (milliseconds) runs off the event loop
            ok = await asyncio.get_running_loop().run_in_executor(None, users.check_plain, user, password)
            if not ok:
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
            if not head or "r" not in attrs:
                return bad, True
            # an unknown user gets a made-up salt and count and fails at the proof, as a
            # wrong password does (RFC 5802 5.1)
            u, _known = users.credentials(user)
            first = f"r={attrs['r']}{secrets.token_urlsafe(18)},s={_b64(u.salt)},i={u.iterations}"
            self._scram = (user, u, bare, first)
            return {"error_code": 0, "error_message": None, "auth_bytes": first.encode(), "session_lifetime": 0}, False
        user, u, client_first, server_first = self._scram
        attrs = dict(a.split("=", 1) for a in text.split(",") if "=" in a)
        without_proof = text.rsplit(",p=", 1)[0]
        nonce = dict(a.split("=", 1) for a in server_first.split(","))["r"]
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
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), u.stored_key) or user not in users.users:
            return bad, True
        self.user = user
        final = "v=" + _b64(hmac.new(u.server_key, auth, hashlib.sha256).digest())
        return {"error_code": 0, "error_message": None, "auth_bytes": final.encode(), "session_lifetime": 0}, False


#: The :class:`Session` of the connection whose request is being handled.
SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar("pylog_serve_session", default=None)


_USAGE = ("usage: python -m pylog.serve.security USERS_FILE USER [--read T,..] [--write T,..]"
          " [--groups G,..] [--delete-groups G,..] [--transactional-ids X,..] (password on stdin)\n")


def _main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        sys.stderr.write(_USAGE)
        return 2
    path, user, rest = argv[0], argv[1], argv[2:]
    opts: dict[str, list[str]] = {}
    for flag, value in zip(rest[::2], rest[1::2]):
        name = flag.lstrip("-").replace("-", "_")
        if name not in ("read", "write", "groups", "delete_groups", "transactional_ids"):
            sys.stderr.write(f"pylog: error: unknown option {flag!r}\n" + _USAGE)
            return 2
        opts[name] = [x for x in value.split(",") if x]
    password = sys.stdin.readline().rstrip("\n")
    if not password:
        sys.stderr.write("pylog: error: an empty password (give it on stdin)\n")
        return 2
    try:
        add_user(path, user, password, opts.get("read"), opts.get("write"), opts.get("groups"),
                 opts.get("delete_groups"), opts.get("transactional_ids"))
    except InvalidArgumentError as e:
        sys.stderr.write(f"pylog: error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main(sys.argv[1:]))
