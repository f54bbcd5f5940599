"""Incremental fetch sessions (KIP-227): a consumer of many partitions sends, after a first
full Fetch, only the partitions that changed, and is answered only the partitions that
changed.

A Fetch (v7+) names a session id and epoch:

* epoch -1: a sessionless full fetch (a session id given with it is closed);
* epoch 0: a full fetch that opens a new session (closing the one named, if any); the
  response carries the new session's id, or 0 when the cache has no slot for it (the client
  goes on with full fetches);
* epoch N > 0: an incremental fetch of session ``id``, whose next epoch must be N: the
  request's partitions are added to the session or update its fetch offset and limit, its
  forgotten topics' partitions leave it, and every partition of the session is read. The
  response holds only the partitions with records, an error, or a high watermark, last
  stable offset or log start offset other than the last one answered (Kafka's rule); a
  partition that answered records moves to the end of the session's order, so that a
  response cut by ``max_bytes`` serves the others first next time. An unknown id is
  FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH (no partitions).

Bounds (docs/serve.md): at most ``slots`` sessions (Kafka's
``max.incremental.fetch.session.cache.slots``, 1000) and ``max_partitions`` partitions over
all of them (100,000: about 180 bytes each, measured with tracemalloc: 18 MB in all); a
full fetch that does not fit gets no session, unless the least recently used session has been idle for
:data:`EVICT_AFTER` seconds (Kafka's 120 s), which it then replaces. A session is used only
by the user that opened it (with SASL; its id is otherwise a random 31-bit number).
"""
from __future__ import annotations

import dataclasses
import secrets
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog.serve import security

if TYPE_CHECKING:
    from pylog.serve.broker import Broker

__all__ = ["FetchSessions", "SLOTS", "MAX_PARTITIONS", "EVICT_AFTER"]

#: Sessions kept at once (Kafka's max.incremental.fetch.session.cache.slots).
SLOTS = 1000
#: Partitions kept over all sessions.
MAX_PARTITIONS = 100_000
#: Seconds a session must have been idle before a new one may replace it.
EVICT_AFTER = 120.0
FINAL_EPOCH, INITIAL_EPOCH = -1, 0
#: The first request version with sessions.
SESSION_VERSION = 7

# a session partition: [fetch offset, partition max bytes, last answered high watermark,
# last stable offset, log start offset]
_OFFSET, _MAX, _HW, _LSO, _START = range(5)


@dataclasses.dataclass(eq=False)
class _Session:
    id: int
    user: str | None
    epoch: int  # the epoch the next request must carry
    used: float
    parts: dict[tuple[str, int], list[int]]


@dataclasses.dataclass(frozen=True)
class _Partition:
    partition: int
    fetch_offset: int
    partition_max_bytes: int


@dataclasses.dataclass(frozen=True)
class _Topic:
    topic: str
    partitions: list[_Partition]


@dataclasses.dataclass(frozen=True)
class _Request:
    """What :meth:`.Broker.fetch` reads of a request: a session's partitions in its order."""

    topics: list[_Topic]
    max_wait: Any
    min_bytes: int
    max_bytes: int
    isolation_level: int


def _next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class FetchSessions:
    """The fetch session cache of one broker (see the module docstring); used on the
    event loop only."""

    def __init__(self, slots: int = SLOTS, max_partitions: int = MAX_PARTITIONS) -> None:
        self.slots = slots
        self.max_partitions = max_partitions
        self._sessions: OrderedDict[int, _Session] = OrderedDict()  # least recently used first
        self._partitions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def partitions(self) -> int:
        """Partitions kept over all sessions."""
        return self._partitions

    def _remove(self, sid: int) -> None:
        s = self._sessions.pop(sid, None)
        if s is not None:
            self._partitions -= len(s.parts)

    def _new_id(self) -> int:
        while True:
            sid = secrets.randbits(31)
            if sid and sid not in self._sessions:
                return sid

    def _open(self, user: str | None, parts: dict[tuple[str, int], list[int]], now: float) -> _Session | None:
        """A new session for ``parts``, or None when the bounds leave no room for it."""
        if len(parts) > self.max_partitions or not self.slots:
            return None
        while self._sessions and (len(self._sessions) >= self.slots
                                  or self._partitions + len(parts) > self.max_partitions):
            oldest = next(iter(self._sessions.values()))
            if now - oldest.used < EVICT_AFTER:
                return None
            self._remove(oldest.id)
        s = _Session(self._new_id(), user, _next_epoch(INITIAL_EPOCH), now, parts)
        self._sessions[s.id] = s
        self._partitions += len(parts)
        return s

    @staticmethod
    def _wanted(req: Any) -> dict[tuple[str, int], list[int]]:
        out: dict[tuple[str, int], list[int]] = {}
        for t in req.topics:
            for p in t.partitions:
                out[(t.topic, p.partition)] = [p.fetch_offset, p.partition_max_bytes, -1, -1, -1]
        return out

    async def fetch(self, broker: Broker, req: Any, version: int) -> dict[str, Any]:
        """Fetch through the session cache (requests before v7 have no session)."""
        if version < SESSION_VERSION:
            return await broker.fetch(req, version)
        sid, epoch = req.session_id, req.session_epoch
        sess = security.SESSION.get(None)
        user = sess.user if sess is not None else None
        now = time.monotonic()
        full = epoch in (FINAL_EPOCH, INITIAL_EPOCH)
        # on the event loop only: no lock (a request that changes the session while this one
        # waits for its read is seen by _answer, which skips partitions forgotten meanwhile)
        if full:
            if sid:
                self._remove(sid)
            if epoch == FINAL_EPOCH:
                return await self._sessionless(broker, req, version)
            session = self._open(user, self._wanted(req), now)
            if session is None:
                return await self._sessionless(broker, req, version)
        else:
            found = self._sessions.get(sid)
            if found is None or found.user != user:
                return {"error_code": E.fetch_session_id_not_found, "session_id": 0, "responses": []}
            if epoch != found.epoch:
                return {"error_code": E.invalid_fetch_session_epoch, "session_id": 0, "responses": []}
            session = found
            session.epoch = _next_epoch(epoch)
            self._update(session, req)
        session.used = now
        self._sessions.move_to_end(session.id)
        data = await broker.fetch(self._request(session, req), version)
        data["responses"] = self._answer(session, data["responses"], full)
        data["session_id"] = session.id
        return data

    async def _sessionless(self, broker: Broker, req: Any, version: int) -> dict[str, Any]:
        data = await broker.fetch(req, version)
        data["session_id"] = 0
        return data

    def _update(self, session: _Session, req: Any) -> None:
        """An incremental request's changes: partitions added or updated, topics forgotten."""
        parts = session.parts
        before = len(parts)
        for t in req.forgotten_topics_data:
            for i in t.partitions:
                parts.pop((t.topic, i), None)
        for key, new in self._wanted(req).items():
            old = parts.get(key)
            if old is None:
                parts[key] = new
            else:
                old[_OFFSET], old[_MAX] = new[_OFFSET], new[_MAX]
        self._partitions += len(parts) - before

    @staticmethod
    def _request(session: _Session, req: Any) -> _Request:
        topics: list[_Topic] = []
        for (topic, i), p in session.parts.items():
            if not topics or topics[-1].topic != topic:
                topics.append(_Topic(topic, []))
            topics[-1].partitions.append(_Partition(i, p[_OFFSET], p[_MAX]))
        return _Request(topics, req.max_wait, req.min_bytes, getattr(req, "max_bytes", 2**31 - 1),
                        getattr(req, "isolation_level", 0))

    @staticmethod
    def _answer(session: _Session, responses: list[dict[str, Any]], full: bool) -> list[dict[str, Any]]:
        """Record what each partition answered; of an incremental fetch keep only the changed."""
        out: list[dict[str, Any]] = []
        served: list[tuple[str, int]] = []
        for t in responses:
            keep = []
            for r in t["partitions"]:
                key = (t["topic"], r["partition_index"])
                p = session.parts.get(key)
                if p is None:  # forgotten meanwhile by a later request
                    continue
                last = (r["high_watermark"], r["last_stable_offset"], r["log_start_offset"])
                changed = (p[_HW], p[_LSO], p[_START]) != last
                p[_HW], p[_LSO], p[_START] = last
                if r.get("records"):
                    served.append(key)
                if full or changed or r.get("records") or r["error_code"]:
                    keep.append(r)
            if keep:
                out.append({**t, "partitions": keep})
        for key in served:  # to the end of the order: the others first in the next response
            p = session.parts.pop(key, None)
            if p is not None:
                session.parts[key] = p
        return out
