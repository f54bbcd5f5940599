"""Byte pools: the memory the broker holds for its clients, shared by every connection.

One :class:`Pool` bounds the bytes of large request frames being read or handled (Kafka's
``queued.max.request.bytes``), another the bytes of Fetch responses being built and written
(twice ``fetch.max.bytes``). A connection that finds its pool short waits, holding nothing
of it, and nothing more is read from its socket meanwhile (back-pressure).
:data:`RESPONSE_HOLD` carries, per connection, the response bytes its current request
holds, for the server to give back once the response is written. Needs nothing else of
the package (docs/serve.md, "Limits and defaults").
"""
from __future__ import annotations

import asyncio
import collections
import contextvars

__all__ = ["Pool", "RESPONSE_HOLD"]

#: Per connection: ``[bytes]`` of Fetch response the current request took from the
#: response pool (set by the server for each connection, read and added to by the broker).
RESPONSE_HOLD: contextvars.ContextVar[list[int]] = contextvars.ContextVar("pylog_serve_response_hold")


class Pool:
    """``capacity`` bytes shared by the connections; a waiter is served first come, first
    served, once what it needs at least is free."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiting: collections.deque[tuple[int, int, asyncio.Future[int]]] = collections.deque()

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes (at most the capacity) are free, and take them."""
        await self.take_upto(n, n)

    async def take_upto(self, most: int, least: int) -> int:
        """Wait until at least ``least`` bytes are free, then take up to ``most``; returns
        how many were taken."""
        if not self._waiting and self.used + least <= self.capacity:
            n = min(most, max(self.capacity - self.used, least))
            self.used += n
            return n
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (most, least, fut)
        self._waiting.append(entry)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted as it was cancelled
                self.give(fut.result())
            else:
                self._waiting.remove(entry)
                self._grant()
            raise

    def give(self, n: int) -> None:
        """Return ``n`` bytes taken before."""
        self.used -= n
        self._grant()

    def settle(self, taken: int, used: int) -> None:
        """Keep ``used`` of the ``taken`` bytes: the rest goes back, or what ``used`` is
        over (a Fetch's first record may be larger than its limits, KIP-74) is taken
        without waiting."""
        self.used += used - taken
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self.used + self._waiting[0][1] <= self.capacity:
            most, least, fut = self._waiting.popleft()
            n = min(most, max(self.capacity - self.used, least))
            self.used += n
            fut.set_result(n)
