"""Consumer groups over Kafka's protocol: the group coordinator of ``pylog serve``.

FindCoordinator (this broker is every group's coordinator), JoinGroup, SyncGroup,
Heartbeat and LeaveGroup run Kafka's *classic* rebalance protocol in memory; a Stable
group's membership is also kept on disk and loaded at start (:mod:`.membership`), so
members keep their ids across a broker restart:

* A join moves the group to PreparingRebalance; the coordinator waits until every known
  member has rejoined, or until the longest rebalance timeout of the members passes (a
  member that has not rejoined by then is removed). Then the generation goes up by one,
  the first member that joined leads, the protocol (assignor) chosen is the one every
  member supports that most members name first, and each waiting join is answered (the
  leader gets every member's subscription). A JoinGroup v4+ without a member id is
  answered MEMBER_ID_REQUIRED with a new id first, as Kafka does (KIP-394).
* The leader's SyncGroup carries the assignment (computed by the client's assignor:
  range, roundrobin, cooperative-sticky, ...; the coordinator does not read it except to
  show it); every member's SyncGroup is answered with its part, and the group is Stable.
* A member that sends nothing for its session timeout is removed and the group
  rebalances: its partitions go to the others.

Committed offsets (OffsetCommit, OffsetFetch; with their metadata and leader epoch) are
pylog's own durable group offsets:
``TOPIC/~consumers/GROUP/partition-N.offset`` (:mod:`pylog.consumer`), written atomically
and fsynced before the answer, so ``pylog group describe``, ``pylog consume --group`` and
:class:`~pylog.Consumer` see the same group as Kafka clients do. While a group is Stable
the broker holds, for each member, a member lock in every topic it is assigned and the
lock of each assigned partition (owner text ``kafka member ID client CLIENT``), so
``pylog group describe`` shows the Kafka members and who owns each partition, reset and
delete refuse a live group, and a pylog Consumer of the same group never takes a
partition a Kafka member owns.

ListGroups, DescribeGroups and DeleteGroups see both: the groups in memory and those only
on disk (state ``Empty``). OffsetDelete is in :mod:`.group_admin`.

The group state lives on the event loop (no lock needed); everything that touches the disk
(offset files, the member and partition locks, the listing of groups on disk, opening a
partition) runs in threads (the loop's default executor; partitions in the broker's
admin threads), so a slow disk or an admin storm never delays a heartbeat.
"""
from __future__ import annotations

import asyncio
import contextvars
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.consumer import _mark_owner, _try_lock, encode_offset, read_commit
from pylog.errors import GroupActiveError, InvalidNameError, PylogError, UnknownGroupError, UnknownTopicError
from pylog.serve import group_admin
from pylog.serve.membership import (
    COMPLETING,
    DEAD,
    EMPTY,
    PREPARING,
    STABLE,
    MembershipFiles,
    _Group,
    _Member,
    decode_assignment,
)
from pylog.topics import CONSUMERS_DIR, check_name

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["GroupCoordinator", "PEER", "API_KEYS"]

#: The (host, port) of the connection whose request is being handled (set per connection).
PEER: contextvars.ContextVar[Any] = contextvars.ContextVar("pylog_serve_peer", default=None)

#: API keys the coordinator answers.
API_KEYS = frozenset({8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47})

def _ms(value: Any, default: int) -> int:
    if value is None:
        return default
    if hasattr(value, "total_seconds"):
        return int(value.total_seconds() * 1000)
    return int(value)


class GroupCoordinator:
    """The group coordinator of one broker (see the module docstring).

    Parameters
    ----------
    broker
        The broker whose store holds the groups' offsets.
    min_session_ms, max_session_ms
        The session timeouts a member may ask for (Kafka's ``group.min.session.timeout.ms``
        and ``group.max.session.timeout.ms``; the minimum is lower than Kafka's 6 s).
    """

    def __init__(self, broker: Broker, min_session_ms: int = 1000, max_session_ms: int = 1800000) -> None:
        self.broker = broker
        self.min_session_ms = min_session_ms
        self.max_session_ms = max_session_ms
        self.groups: dict[str, _Group] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.membership = MembershipFiles(broker.store.root)

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Load the groups whose membership was kept (:mod:`.membership`; at start, before any
        request is served, so no member is told it is unknown meanwhile) and take their locks;
        start the timer that expires sessions and ends rebalances (on the running loop)."""
        for g in self.membership.load():
            self.groups[g.id] = g
            plan = [(m.id, f"kafka member {m.id} client {m.client_id}", decode_assignment(m.assignment))
                    for m in g.members.values()]
            for mid, fds in self._take_locks(g.id, plan).items():
                g.members[mid].locks.extend(fds)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def close(self) -> None:
        """Answer every waiting join and sync (COORDINATOR_NOT_AVAILABLE, so clients look for
        the coordinator again), release the locks, stop the timer."""
        if self._ticker is not None:
            self._ticker.cancel()
            try:
                await self._ticker
            except asyncio.CancelledError:
                pass
            self._ticker = None
        for g in self.groups.values():
            for m in g.members.values():
                for fut in (m.join, m.sync):
                    if fut is not None and not fut.done():
                        fut.set_result({"error_code": E.coordinator_not_available, "member_id": m.id,
                                        "generation_id": -1, "leader": "", "members": []})
                self._unlock(m)
        self.groups.clear()

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                self.tick()
            except Exception:  # pragma: no cover - a timer must never die
                import logging

                logging.getLogger("pylog.serve").exception("group coordinator timer")

    def tick(self) -> None:
        """Expire members whose session ran out; end rebalances whose time ran out."""
        now = time.monotonic()
        for g in list(self.groups.values()):
            for mid, until in list(g.pending.items()):
                if until < now:
                    del g.pending[mid]
            for m in list(g.members.values()):
                waiting = m.join is not None and not m.join.done()
                if not waiting and now - m.last_seen >= m.session_ms / 1000:
                    self._remove(g, m, E.unknown_member_id)
            if g.state == PREPARING and now >= g.deadline:
                for m in list(g.members.values()):
                    if m.join is None or m.join.done():
                        self._remove(g, m, E.unknown_member_id, rebalance=False)
                self._complete_join(g)
            if g.state == EMPTY and not g.members and not g.pending:
                del self.groups[g.id]

    # -- dispatch --------------------------------------------------------------------------
    async def handle(self, key: int, body: Any, version: int, client_id: str | None) -> dict[str, Any]:
        """The response dict of group API ``key``."""
        peer = PEER.get()
        host = "/" + (peer[0] if peer else "127.0.0.1")
        if key in (15, 16, 42, 47):
            # the sessions that ran out by now end first, not at the timer's next tick (up to
            # 0.1 s later): a group whose last member's session just ended is Empty, and
            # deletable, at once (librdkafka 0081 deletes its groups right when the session
            # of their static members, whose close commits and sends no LeaveGroup, ends)
            self.tick()
        if key == 10:
            return self.find_coordinator(body, version)
        if key == 11:
            return await self.join_group(body, version, client_id or "", host)
        if key == 14:
            return await self.sync_group(body, version)
        if key == 12:
            return self.heartbeat(body, version)
        if key == 13:
            return self.leave_group(body, version)
        if key == 8:
            return await self.offset_commit(body, version)
        if key == 9:
            return await self.offset_fetch(body, version)
        if key in (15, 16):  # the groups on disk: listed in a thread
            disk = await asyncio.get_running_loop().run_in_executor(None, self._on_disk)
            return self.list_groups(body, version, disk) if key == 16 else self.describe_groups(body, version, disk)
        if key == 42:
            return await self.delete_groups(body, version)
        if key == 47:  # OffsetDelete
            return await group_admin.offset_delete(self, body, version)
        raise ValueError(f"API key {key} is not a group API")

    # -- FindCoordinator -------------------------------------------------------------------
    def find_coordinator(self, req: Any, version: int) -> dict[str, Any]:
        """FindCoordinator: this broker coordinates every group (and transactional id)."""
        me = {"node_id": 0, "host": self.broker.advertised_host, "port": self.broker.port,
              "error_code": 0, "error_message": None}
        if version >= 4:
            return {"coordinators": [{"key": k, **me} for k in req.coordinator_keys]}
        return me

    # -- the rebalance ---------------------------------------------------------------------
    def _group(self, group_id: str) -> _Group:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = _Group(group_id)
        return g

    def _prepare(self, g: _Group) -> None:
        """Start a rebalance: pending syncs are told REBALANCE_IN_PROGRESS."""
        if g.state != PREPARING:
            g.state = PREPARING
            longest = max((m.rebalance_ms for m in g.members.values()), default=0)
            g.deadline = time.monotonic() + longest / 1000
        for m in g.members.values():
            if m.sync is not None and not m.sync.done():
                m.sync.set_result({"error_code": E.rebalance_in_progress})
            m.sync = None
        self._maybe_complete(g)

    def _maybe_complete(self, g: _Group) -> None:
        if g.state == PREPARING and g.members and all(m.join is not None and not m.join.done()
                                                       for m in g.members.values()):
            self._complete_join(g)

    def _remove(self, g: _Group, m: _Member, error: int, rebalance: bool = True) -> None:
        g.members.pop(m.id, None)
        self._unlock(m)
        for fut in (m.join, m.sync):
            if fut is not None and not fut.done():
                fut.set_result({"error_code": error, "member_id": m.id, "generation_id": -1, "leader": "",
                                "members": []})
        if g.leader == m.id:
            g.leader = None
        if not g.members:
            if g.state != EMPTY:
                self._release_group(g)
            g.state = EMPTY
            self.membership.save(g)  # its membership file goes
            g.protocol = None
            if not g.pending:
                g.protocol_type = None
        elif rebalance:
            self._prepare(g)

    def _choose_protocol(self, g: _Group) -> str | None:
        common = None
        for m in g.members.values():
            names = {n for n, _ in m.protocols}
            common = names if common is None else common & names
        if not common:
            return None
        votes: dict[str, int] = {}
        for m in g.members.values():
            first = next(n for n, _ in m.protocols if n in common)
            votes[first] = votes.get(first, 0) + 1
        leader = g.members.get(g.leader or "") or next(iter(g.members.values()))
        order = [n for n, _ in leader.protocols if n in common]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    def _complete_join(self, g: _Group) -> None:
        if not g.members:
            g.state = EMPTY
            return
        g.generation += 1
        g.protocol = self._choose_protocol(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        now = time.monotonic()
        everyone = [{"member_id": m.id, "group_instance_id": m.instance_id,
                     "metadata": dict(m.protocols).get(g.protocol or "", b"")} for m in g.members.values()]
        for m in g.members.values():
            m.last_seen = now
            m.assignment = b""
            if m.join is not None and not m.join.done():
                m.join.set_result({"error_code": 0, "generation_id": g.generation,
                                   "protocol_type": g.protocol_type or "", "protocol_name": g.protocol or "",
                                   "leader": g.leader, "skip_assignment": False,
                                   "member_id": m.id, "members": everyone if m.id == g.leader else []})
            m.join = None

    async def join_group(self, req: Any, version: int, client_id: str, host: str) -> dict[str, Any]:
        """JoinGroup (classic protocol): answered when the rebalance completes."""
        fail = {"generation_id": -1, "protocol_name": "", "protocol_type": "", "leader": "",
                "member_id": req.member_id, "members": []}
        try:
            check_name(req.group_id, "group")
        except InvalidNameError:
            return {**fail, "error_code": E.invalid_group_id}
        session = _ms(req.session_timeout, 10000)
        if not self.min_session_ms <= session <= self.max_session_ms:
            return {**fail, "error_code": E.invalid_session_timeout}
        rebalance = _ms(getattr(req, "rebalance_timeout", None), session)
        rebalance = session if rebalance < 0 else rebalance
        protocols = [(p.name, bytes(p.metadata)) for p in req.protocols]
        if not req.protocol_type or not protocols:
            return {**fail, "error_code": E.inconsistent_group_protocol}
        g = self._group(req.group_id)
        if g.members and (g.protocol_type != req.protocol_type or not any(
                all(n in dict(m.protocols) for m in g.members.values() if m.id != req.member_id)
                for n, _ in protocols)):
            return {**fail, "error_code": E.inconsistent_group_protocol}
        member_id = req.member_id
        instance = getattr(req, "group_instance_id", None)
        if instance is not None:  # static membership (KIP-345)
            owner = next((x for x in g.members.values() if x.instance_id == instance), None)
            if member_id and owner is not None and owner.id != member_id:
                return {**fail, "error_code": E.fenced_instance_id}
            if not member_id and owner is not None:
                done = self._replace_static(g, owner, client_id, host, session, rebalance, protocols)
                if done is not None:
                    await self.membership.save(g)  # its new member id, durable before the answer
                    return done
                member_id = owner.id
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4 and instance is None:  # a static member needs no second round
                g.pending[member_id] = time.monotonic() + session / 1000
                if g.protocol_type is None:
                    g.protocol_type = req.protocol_type
                return {**fail, "member_id": member_id, "error_code": E.member_id_required}
        elif member_id not in g.members and member_id not in g.pending:
            return {**fail, "error_code": E.unknown_member_id}
        g.pending.pop(member_id, None)
        m = g.members.get(member_id)
        if m is None:
            m = g.members[member_id] = _Member(member_id, client_id, host)
        m.instance_id = getattr(req, "group_instance_id", None)
        m.session_ms, m.rebalance_ms, m.protocols = session, rebalance, protocols
        m.last_seen = time.monotonic()
        g.protocol_type = req.protocol_type
        if m.join is not None and not m.join.done():  # a retried join: the old one is superseded
            m.join.set_result({**fail, "error_code": E.unknown_member_id})
        m.join = asyncio.get_running_loop().create_future()
        fut = m.join
        if g.state == PREPARING:
            self._maybe_complete(g)
        else:
            self._prepare(g)
        return await fut

    def _replace_static(self, g: _Group, m: _Member, client_id: str, host: str, session: int, rebalance: int,
                        protocols: list[tuple[str, bytes]]) -> dict[str, Any] | None:
        """A static member rejoining without its member id (restarted): it takes a new member
        id, the old one is gone (its pending calls get FENCED_INSTANCE_ID). In a stable group
        whose protocol it still supports it keeps its assignment and the group its generation
        (the answer, returned here, needs no rebalance); otherwise None: it joins a rebalance."""
        for fut in (m.join, m.sync):
            if fut is not None and not fut.done():
                fut.set_result({"error_code": E.fenced_instance_id, "member_id": m.id, "generation_id": -1,
                                "leader": "", "members": []})
        m.join = m.sync = None
        old = m.id
        del g.members[old]
        m.id = f"{client_id or 'member'}-{uuid.uuid4()}"
        g.members[m.id] = m
        if g.leader == old:
            g.leader = m.id
        m.client_id, m.host, m.session_ms, m.rebalance_ms = client_id, host, session, rebalance
        m.protocols, m.last_seen = protocols, time.monotonic()
        if g.state != STABLE or self._choose_protocol(g) != g.protocol:
            return None
        leader = m.id == g.leader
        everyone = [{"member_id": x.id, "group_instance_id": x.instance_id,
                     "metadata": dict(x.protocols).get(g.protocol or "", b"")} for x in g.members.values()]
        return {"error_code": 0, "generation_id": g.generation, "protocol_type": g.protocol_type or "",
                "protocol_name": g.protocol or "", "leader": g.leader, "skip_assignment": leader,
                "member_id": m.id, "members": everyone if leader else []}

    def _check_member(self, group_id: str, member_id: str, generation: int) -> tuple[_Group | None, int]:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return None, E.unknown_member_id
        g.members[member_id].last_seen = time.monotonic()
        if generation != g.generation:
            return g, E.illegal_generation
        return g, 0

    async def sync_group(self, req: Any, version: int) -> dict[str, Any]:
        """SyncGroup: the leader hands in the assignment, every member gets its part."""
        g, err = self._check_member(req.group_id, req.member_id, req.generation_id)
        if g is None or err:
            return {"error_code": err, "assignment": b""}
        base = {"protocol_type": g.protocol_type, "protocol_name": g.protocol}
        if g.state == PREPARING:
            return {**base, "error_code": E.rebalance_in_progress, "assignment": b""}
        m = g.members[req.member_id]
        if g.state == STABLE:
            return {**base, "error_code": 0, "assignment": m.assignment}
        if m.sync is not None and not m.sync.done():
            m.sync.set_result({"error_code": E.rebalance_in_progress})
        m.sync = asyncio.get_running_loop().create_future()
        fut = m.sync
        if req.member_id == g.leader:
            given = {a.member_id: bytes(a.assignment) for a in req.assignments}
            for x in g.members.values():
                x.assignment = given.get(x.id, b"")
            gen = g.generation
            # the locks first (in a thread; the others' syncs wait meanwhile), then Stable
            await self._lock_group(g)
            if g.generation == gen and g.state == COMPLETING:  # else a rebalance answered the syncs
                g.state = STABLE
                await self.membership.save(g)  # durable before the answers, as Kafka does
            if g.generation == gen and g.state == STABLE:
                for x in g.members.values():
                    if x.sync is not None and not x.sync.done():
                        x.sync.set_result({"error_code": 0, "assignment": x.assignment})
                    x.sync = None
        out = await fut
        return {**base, "assignment": b"", **out}

    def heartbeat(self, req: Any, version: int) -> dict[str, Any]:
        """Heartbeat: keeps the session; REBALANCE_IN_PROGRESS tells the member to rejoin."""
        g, err = self._check_member(req.group_id, req.member_id, req.generation_id)
        if g is None or err:
            return {"error_code": err}
        if g.state == PREPARING:
            return {"error_code": E.rebalance_in_progress}
        return {"error_code": 0}

    def leave_group(self, req: Any, version: int) -> dict[str, Any]:
        """LeaveGroup: the members go at once and the others rebalance."""
        g = self.groups.get(req.group_id)
        ids = [req.member_id] if version < 3 else [x.member_id for x in req.members]
        results = []
        for mid in ids:
            if g is None or mid not in g.members:
                results.append({"member_id": mid, "group_instance_id": None, "error_code": E.unknown_member_id})
                continue
            self._remove(g, g.members[mid], E.unknown_member_id)
            results.append({"member_id": mid, "group_instance_id": None, "error_code": 0})
        if version < 3:
            return {"error_code": results[0]["error_code"]}
        return {"error_code": 0, "members": results}

    # -- locks: what pylog's tools see of a Kafka group ------------------------------------
    async def _lock_group(self, g: _Group) -> None:
        """Hold, for each member, its member lock in every topic it is assigned and its
        partitions' locks (released at the next rebalance or when it goes). The files are
        locked in a thread; locks of a generation that ended (or became Stable through
        another call) meanwhile are let go."""
        for m in g.members.values():
            self._unlock(m)
        gen = g.generation
        plan = [(m.id, f"kafka member {m.id} client {m.client_id}", decode_assignment(m.assignment))
                for m in g.members.values()]
        taken = await asyncio.get_running_loop().run_in_executor(None, self._take_locks, g.id, plan)
        for mid, fds in taken.items():
            member = g.members.get(mid)
            if g.generation == gen and g.state == COMPLETING and member is not None:
                member.locks.extend(fds)
            else:
                self._unlock_fds(fds)

    def _take_locks(self, group: str, plan: list[tuple[str, str, dict[str, list[int]]]]) -> dict[str, list[int]]:
        """The lock files of :meth:`_lock_group` (in a thread): member id -> descriptors."""
        out: dict[str, list[int]] = {}
        for mid, who, assigned in plan:
            locks = out.setdefault(mid, [])
            for topic, parts in assigned.items():
                try:
                    t = self.broker.topic(topic)
                    gdir = os.path.join(t.path, CONSUMERS_DIR, group)
                    os.makedirs(gdir, exist_ok=True)
                except (PylogError, OSError):
                    continue
                for k in range(1 << 16):  # a free member slot (bounded)
                    fd = _try_lock(os.path.join(gdir, f"member-{k}.lock"))
                    if fd >= 0:
                        _mark_owner(fd, who)
                        locks.append(fd)
                        break
                for p in parts:
                    if 0 <= p < t.partitions:
                        fd = _try_lock(os.path.join(gdir, f"partition-{p}.lock"))
                        if fd >= 0:
                            _mark_owner(fd, who)
                            locks.append(fd)
        return out

    @staticmethod
    def _unlock_fds(fds: list[int]) -> None:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    @classmethod
    def _unlock(cls, m: _Member) -> None:
        cls._unlock_fds(m.locks)
        m.locks = []

    def _release_group(self, g: _Group) -> None:
        for m in g.members.values():
            self._unlock(m)

    # -- offsets ---------------------------------------------------------------------------
    def _offset_path(self, topic: str, group: str, p: int) -> str:
        # broker.topic: a known topic without the store's lock, which a topic creation holds
        return os.path.join(self.broker.topic(topic).path, CONSUMERS_DIR, group, f"partition-{p}.offset")

    async def offset_commit(self, req: Any, version: int) -> dict[str, Any]:
        """OffsetCommit: durable in pylog's group offset files before the answer."""
        generation = getattr(req, "generation_id_or_member_epoch", getattr(req, "generation_id", -1))
        err = 0
        try:
            check_name(req.group_id, "group")
        except InvalidNameError:
            err = E.invalid_group_id
        g = self.groups.get(req.group_id)
        if not err and (req.member_id or generation >= 0):
            # a commit keeps the member's session, as Kafka's coordinator reschedules its
            # heartbeat on a commit (Stable or PreparingRebalance; refused while Completing)
            g, err = self._check_member(req.group_id, req.member_id, generation)
            if not err and g is not None and g.state == COMPLETING:
                err = E.rebalance_in_progress
        elif not err and g is not None and g.members:
            err = E.unknown_member_id  # a live group takes commits from its members only
        jobs: list[tuple[str, int, int, str, int]] = []
        out = []
        # the partitions named, opened (if not yet) in an admin thread
        opened = await self.broker.partitions((t.name, p.partition_index) for t in req.topics
                                              for p in t.partitions) if not err else {}
        for t in req.topics:
            parts = []
            for p in t.partitions:
                code = err
                if not code:
                    log, code = opened[(t.name, p.partition_index)]
                    if not code and p.committed_offset < 0:
                        code = E.invalid_request
                    if not code and p.committed_metadata is not None and len(p.committed_metadata) > 4096:
                        code = E.offset_metadata_too_large
                if not code:
                    jobs.append((t.name, p.partition_index, p.committed_offset, p.committed_metadata or "",
                                 getattr(p, "committed_leader_epoch", -1)))
                parts.append({"partition_index": p.partition_index, "error_code": code})
            out.append({"name": t.name, "partitions": parts})

        def write() -> int:
            now = time.time_ns() // 1_000_000
            try:
                for name, p, off, meta, epoch in jobs:
                    path = self._offset_path(name, req.group_id, p)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    fileutil.atomic_write(path, encode_offset(off, now, meta, epoch))
            except (OSError, PylogError):
                return E.kafka_storage_error
            return 0

        if jobs:
            failed = await asyncio.get_running_loop().run_in_executor(None, write)
            if failed:
                for t in out:
                    for p in t["partitions"]:
                        p["error_code"] = p["error_code"] or failed
        return {"topics": out}

    def _committed(self, topic: str, group: str, p: int) -> int:
        return self._commit_of(topic, group, p)[0]

    def _commit_of(self, topic: str, group: str, p: int) -> tuple[int, int, str]:
        """(offset, leader epoch, metadata) committed; (-1, -1, "") when none."""
        try:
            found = read_commit(self._offset_path(topic, group, p))
        except PylogError:
            found = None
        return (-1, -1, "") if found is None else found

    def _fetch_group(self, group: str, topics: Any) -> tuple[int, list[dict[str, Any]]]:
        try:
            check_name(group, "group")
        except InvalidNameError:
            return E.invalid_group_id, []
        store = self.broker.store
        if topics is None:  # every partition with a committed offset
            wanted: list[tuple[str, list[int] | None]] = [(n, None) for n in store.topics()]
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in topics]
        out = []
        for name, parts in wanted:
            try:
                t = self.broker.topic(name)
            except (UnknownTopicError, InvalidNameError):
                if parts is not None:
                    out.append({"name": name, "partitions": [
                        {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                         "metadata": "", "error_code": 0} for p in parts]})
                continue
            rows = []
            for p in (range(t.partitions) if parts is None else parts):
                off, epoch, meta = self._commit_of(name, group, p) if 0 <= p < t.partitions else (-1, -1, "")
                if parts is None and off < 0:
                    continue
                rows.append({"partition_index": p, "committed_offset": off, "committed_leader_epoch": epoch,
                             "metadata": meta, "error_code": 0})
            if rows or parts is not None:
                out.append({"name": name, "partitions": rows})
        return 0, out

    async def offset_fetch(self, req: Any, version: int) -> dict[str, Any]:
        """OffsetFetch: pylog's committed offsets of the group (-1: none)."""
        loop = asyncio.get_running_loop()
        if version >= 8:
            groups = []
            for g in req.groups:
                err, topics = await loop.run_in_executor(None, self._fetch_group, g.group_id, g.topics)
                groups.append({"group_id": g.group_id, "error_code": err, "topics": topics})
            return {"groups": groups}
        err, topics = await loop.run_in_executor(None, self._fetch_group, req.group_id, req.topics)
        return {"error_code": err, "topics": topics}

    # -- listing, describing, deleting -----------------------------------------------------
    def _on_disk(self) -> set[str]:
        from pylog import groups as _groups

        try:
            return set(_groups.groups(self.broker.store))
        except PylogError:
            return set()

    def list_groups(self, req: Any, version: int, disk: set[str] | None = None) -> dict[str, Any]:
        """ListGroups: the groups in memory and the groups with offsets on disk (``disk``:
        listed already, in a thread)."""
        states: dict[str, str] = {n: EMPTY for n in (self._on_disk() if disk is None else disk)}
        for g in self.groups.values():
            if g.members:
                states[g.id] = g.state
        # v4+ filter by state, v5+ by type (each case-insensitive, as Kafka 4): every group
        # here is a "classic" one (the rebalance protocol of JoinGroup/SyncGroup)
        wanted = {x.lower() for x in getattr(req, "states_filter", None) or ()}
        types = {x.lower() for x in getattr(req, "types_filter", None) or ()}
        if types and "classic" not in types:
            return {"error_code": 0, "groups": []}
        return {"error_code": 0, "groups": [
            {"group_id": n, "protocol_type": "consumer", "group_state": s, "group_type": "classic"}
            for n, s in sorted(states.items()) if not wanted or s.lower() in wanted]}

    def describe_groups(self, req: Any, version: int, disk: set[str] | None = None) -> dict[str, Any]:
        """DescribeGroups: state, protocol, members and their assignments (``disk``: the
        groups on disk, listed already, in a thread)."""
        disk = self._on_disk() if disk is None else disk
        out = []
        for name in req.groups:
            r: dict[str, Any] = {"error_code": 0, "group_id": name, "group_state": DEAD, "protocol_type": "",
                                 "protocol_data": "", "members": [], "authorized_operations": -2147483648}
            try:
                check_name(name, "group")
            except InvalidNameError:
                r["error_code"] = E.invalid_group_id
                out.append(r)
                continue
            g = self.groups.get(name)
            if g is not None and g.members:
                r.update(group_state=g.state, protocol_type=g.protocol_type or "", protocol_data=g.protocol or "")
                r["members"] = [{"member_id": m.id, "group_instance_id": m.instance_id, "client_id": m.client_id,
                                 "client_host": m.host,
                                 "member_metadata": dict(m.protocols).get(g.protocol or "", b""),
                                 "member_assignment": m.assignment} for m in g.members.values()]
            elif name in disk:
                r.update(group_state=EMPTY, protocol_type="consumer")
            out.append(r)
        return {"groups": out}

    async def delete_groups(self, req: Any, version: int) -> dict[str, Any]:
        """DeleteGroups: an empty group's offsets (``pylog group delete``); NON_EMPTY_GROUP
        while it has members (Kafka clients or pylog consumers)."""
        from pylog import groups as _groups

        out = []
        for name in req.groups_names:
            code = 0
            g = self.groups.get(name)
            if g is not None and g.members:
                code = E.non_empty_group
            else:
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        None, _groups.delete_group, self.broker.store, name)
                except InvalidNameError:
                    code = E.invalid_group_id
                except UnknownGroupError:
                    code = E.group_id_not_found
                except GroupActiveError:
                    code = E.non_empty_group
                except (PylogError, OSError):
                    code = E.kafka_storage_error
            if not code:
                self.groups.pop(name, None)
            out.append({"group_id": name, "error_code": code})
        return {"results": out}
