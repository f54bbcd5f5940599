"""The members of the broker's consumer groups, in memory and on disk.

:mod:`.coordinator` runs the rebalance protocol over the classes here. A group's membership
(generation, protocol, leader, and each member's id, instance id, client, session and
rebalance timeouts, protocols and assignment) is kept durably, as Kafka keeps it in
``__consumer_offsets``: each time a group becomes Stable it is written to
``ROOT/.serve.groups/GROUP.members`` (JSON, replaced atomically and fsynced before the
members' SyncGroups are answered), and the file is removed when the group has no members
left. At start the broker loads these files: the members keep their ids and the group its
generation, so after a restart (a kill -9 too) a member's heartbeats and commits go on being
accepted without a rebalance, and a member that does not come back is dropped one session
timeout after the start.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import struct
import threading
import time
from typing import Any

from pylog import fileutil

__all__ = ["MembershipFiles", "decode_assignment", "GROUPS_DIR"]

#: The directory of the groups' membership files, under the data root.
GROUPS_DIR = ".serve.groups"
_SUFFIX = ".members"
_log = logging.getLogger("pylog.serve")

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"


class _Member:
    __slots__ = ("id", "instance_id", "client_id", "host", "session_ms", "rebalance_ms", "protocols",
                 "assignment", "last_seen", "join", "sync", "locks")

    def __init__(self, member_id: str, client_id: str, host: str) -> None:
        self.id = member_id
        self.instance_id: str | None = None
        self.client_id = client_id
        self.host = host
        self.session_ms = 10000
        self.rebalance_ms = 10000
        self.protocols: list[tuple[str, bytes]] = []
        self.assignment = b""
        self.last_seen = time.monotonic()
        self.join: asyncio.Future[dict[str, Any]] | None = None
        self.sync: asyncio.Future[dict[str, Any]] | None = None
        self.locks: list[int] = []


class _Group:
    def __init__(self, group_id: str) -> None:
        self.id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, _Member] = {}
        self.pending: dict[str, float] = {}  # member ids handed out by MEMBER_ID_REQUIRED -> deadline
        self.deadline = 0.0


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """The ``{topic: [partitions]}`` of a consumer protocol assignment (any version);
    empty when the bytes are not one."""
    out: dict[str, list[int]] = {}
    try:
        pos = 2  # i16 version
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(max(n, 0)):
            (ln,) = struct.unpack_from(">h", data, pos)
            pos += 2
            topic = bytes(data[pos:pos + ln]).decode()
            pos += ln
            (m,) = struct.unpack_from(">i", data, pos)
            pos += 4
            parts = list(struct.unpack_from(f">{max(m, 0)}i", data, pos))
            pos += 4 * max(m, 0)
            out.setdefault(topic, []).extend(parts)
    except (struct.error, UnicodeDecodeError, ValueError):
        return {}
    return out



def _snapshot(g: _Group) -> bytes:
    """The membership file of a Stable group."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return json.dumps({
        "version": 1, "group": g.id, "generation": g.generation, "protocol_type": g.protocol_type,
        "protocol": g.protocol, "leader": g.leader,
        "members": [{"id": m.id, "instance_id": m.instance_id, "client_id": m.client_id, "host": m.host,
                     "session_ms": m.session_ms, "rebalance_ms": m.rebalance_ms,
                     "protocols": [[n, b64(meta)] for n, meta in m.protocols],
                     "assignment": b64(m.assignment)} for m in g.members.values()]},
        separators=(",", ":")).encode()


def _restore(data: bytes, name: str) -> _Group:
    """The Stable group of a membership file (its members' sessions start now)."""
    d = json.loads(data)
    if d.get("version") != 1 or d.get("group") != name or not d.get("members"):
        raise ValueError("not a membership file of this group")
    g = _Group(name)
    g.state, g.generation = STABLE, int(d["generation"])
    g.protocol_type, g.protocol, g.leader = d["protocol_type"], d["protocol"], d["leader"]
    now = time.monotonic()
    for x in d["members"]:
        m = _Member(str(x["id"]), str(x["client_id"]), str(x["host"]))
        m.instance_id = x["instance_id"]
        m.session_ms, m.rebalance_ms = int(x["session_ms"]), int(x["rebalance_ms"])
        m.protocols = [(str(n), base64.b64decode(meta)) for n, meta in x["protocols"]]
        m.assignment = base64.b64decode(x["assignment"])
        m.last_seen = now
        g.members[m.id] = m
    if g.leader not in g.members:
        raise ValueError("its leader is not a member")
    return g


class MembershipFiles:
    """The membership files of a data root (see the module docstring). :meth:`save` runs in
    the loop and hands the write to a thread; writes of one group land in the order they
    were asked for (a late thread never overwrites a newer state)."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, GROUPS_DIR)
        self._lock = threading.Lock()
        self._asked = 0
        self._written: dict[str, int] = {}

    def _path(self, group: str) -> str:
        return os.path.join(self.dir, group + _SUFFIX)

    def save(self, g: _Group) -> asyncio.Future[None]:
        """Write ``g``'s membership (Stable with members) or remove its file (otherwise), in
        a thread; the future is done once it is durable. A failure is logged, not raised:
        the group goes on in memory (only a restart would forget its members)."""
        self._asked += 1
        data = _snapshot(g) if g.state == STABLE and g.members else None
        return asyncio.get_running_loop().run_in_executor(None, self._write, g.id, self._asked, data)

    def _write(self, group: str, ticket: int, data: bytes | None) -> None:
        with self._lock:
            if self._written.get(group, 0) > ticket:
                return
            self._written[group] = ticket
            path = self._path(group)
            try:
                if data is None:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        return
                    fileutil.fsync_dir(self.dir)
                else:
                    os.makedirs(self.dir, exist_ok=True)
                    fileutil.atomic_write(path, data)
            except OSError as e:
                _log.warning("group %s: its membership file could not be written (%s); a restart would "
                             "forget its members (they rejoin)", group, e)

    def load(self) -> list[_Group]:
        """The groups of the membership files (at start, before any request is served); an
        unreadable file is logged and removed (its members rejoin as after a restart
        without one)."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        except OSError as e:  # the broker serves on; the members rejoin
            _log.warning("group membership files in %s cannot be listed (%s): none loaded", self.dir, e)
            return []
        out = []
        for fname in names:
            if not fname.endswith(_SUFFIX):
                continue
            path = os.path.join(self.dir, fname)
            try:
                with open(path, "rb") as f:
                    out.append(_restore(f.read(), fname[: -len(_SUFFIX)]))
            except (OSError, ValueError, KeyError, TypeError) as e:
                _log.warning("group membership file %s is unreadable (%s): ignored", path, e)
                try:
                    os.unlink(path)
                except OSError:
                    pass
        return out
