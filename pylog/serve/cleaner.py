"""When the broker compacts a ``cleanup.policy=compact`` partition: Kafka's log cleaner rules
over pylog's :func:`~pylog.compaction.compact` (docs/serve.md, "Topic configs").

Per partition, the cleaner remembers the offset up to which it last compacted (in memory:
after a restart every sealed segment counts as dirty once). A sealed segment is cleanable
when its newest record is at least ``min.compaction.lag.ms`` old. A partition is compacted
when the dirty share of its cleanable bytes reaches ``min.cleanable.dirty.ratio``, or when
its oldest dirty record is ``max.compaction.lag.ms`` old; an active segment whose first
record is that old is rolled first, so that its records become compactable (Kafka rolls it
the same way). :meth:`Cleaner.run` runs in an admin thread (the server calls it every
``log.cleaner.backoff.ms``).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from pylog.errors import PylogError

if TYPE_CHECKING:
    from pylog.log import Log
    from pylog.serve.broker import Broker

__all__ = ["Cleaner"]

_log = logging.getLogger("pylog.serve")
_LONG_MAX = (1 << 63) - 1


def _first_ts(log: Log, start: int, end: int) -> int | None:
    """The timestamp of the first record at or after ``start`` (below ``end``), or None."""
    if start >= end:
        return None
    try:
        recs = log.read_batch(start, max_bytes=1)
    except (PylogError, OSError):
        return None
    return recs[0].timestamp if recs and recs[0].offset < end else None


def _last_ts(log: Log, seg: dict[str, Any]) -> int | None:
    """The timestamp of a segment's last record (pylog's timestamps do not decrease)."""
    try:
        return log.read(seg["next_offset"] - 1).timestamp
    except (PylogError, OSError):
        return None


class Cleaner:
    """Decides which compacted partitions are due and compacts them (see the module)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        #: (topic, partition) -> the offset the last compaction covered up to
        self.clean_upto: dict[tuple[str, int], int] = {}
        self._running = threading.Lock()  # the 15 s looks and the 5 min cleanup: one at a time

    def _settings(self, name: str) -> tuple[float, int, int]:
        s = self.broker.settings
        return (float(s.value(name, "min.cleanable.dirty.ratio")), int(s.value(name, "min.compaction.lag.ms")),
                int(s.value(name, "max.compaction.lag.ms")))

    def due(self, key: tuple[str, int], log: Log, now: int) -> tuple[bool, int, int]:
        """(whether ``log`` is due for compaction, ``min.compaction.lag.ms``, the offset the
        cleanable segments end at)."""
        ratio, min_lag, max_lag = self._settings(key[0])
        segs = log.segments()
        active = segs[-1]
        if max_lag < _LONG_MAX and active["next_offset"] > active["base_offset"]:
            first = _first_ts(log, active["base_offset"], active["next_offset"])
            if first is not None and now - first >= max_lag:
                log.roll()
                segs = log.segments()
        cleanable = []
        for s in segs:
            if not s["sealed"]:
                break
            last = _last_ts(log, s)
            if min_lag > 0 and (last is None or last > now - min_lag):
                break
            cleanable.append(s)
        if not cleanable:
            return False, min_lag, 0
        upto = self.clean_upto.get(key, 0)
        end = cleanable[-1]["next_offset"]
        dirty = [s for s in cleanable if s["next_offset"] > upto]
        if not dirty:
            return False, min_lag, end
        dirty_bytes = sum(s["size_bytes"] for s in dirty)
        total = sum(s["size_bytes"] for s in cleanable)
        if total and dirty_bytes / total >= ratio:
            return True, min_lag, end
        first = _first_ts(log, max(upto, dirty[0]["base_offset"]), end)
        return first is not None and now - first >= max_lag, min_lag, end

    def run(self) -> dict[tuple[str, int], Any]:
        """Compact every compacted partition that is due; ``{(topic, partition): report}``
        ({} at once while another run is under way). A fenced partition, or one that could
        not be opened for writing, is left to a later run."""
        if not self._running.acquire(blocking=False):
            return {}
        try:
            return self._run()
        finally:
            self._running.release()

    def _run(self) -> dict[tuple[str, int], Any]:
        from pylog.compaction import compact

        broker = self.broker
        now = time.time_ns() // 1_000_000
        done: dict[tuple[str, int], Any] = {}
        for name in broker.store.topics():
            try:
                t = broker.topic(name)
                if "compact" not in t.config.cleanup_policy.split(","):
                    continue
                for i in range(t.partitions):
                    key = (name, i)
                    log, err = broker.partition(name, i)
                    if log is None or broker.fenced(key):
                        continue
                    go, min_lag, end = self.due(key, log, now)
                    if go:
                        done[key] = compact(log, now_ms=now, min_lag_ms=min_lag)
                        self.clean_upto[key] = end
            except (PylogError, OSError) as e:  # deleted meanwhile, a failing disk: the next run
                _log.warning("compaction of %s: %s", name, e)
        return done
