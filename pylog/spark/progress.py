"""A streaming read's progress in a pylog consumer group (option ``groupId``).

Spark's checkpoint is what a query resumes from; the group is a copy of its progress for
the tools that watch consumer groups: ``pylog group describe`` and the broker's
``pylog_group_lag`` metric read the same ``TOPIC/~consumers/GROUP/partition-N.offset``
files a :class:`pylog.Consumer` commits (:mod:`pylog.consumer`), so they show the query's
lag like any consumer's.

What is committed is the end of a finished micro-batch: the offsets Spark hands the
stream's ``commit(end)`` (which it calls for a batch only when it plans the next one), and
the ``start`` of each ``latestOffset(start, limit)`` call (the end of the last batch Spark
finished; the one call that also comes after a stream's last batch, e.g. when an
``availableNow`` query stops). A group with a live member (a :class:`pylog.Consumer`, or a
Kafka client of ``pylog serve``) is another consumer's: committing into it is refused
(:class:`~pylog.GroupActiveError`) rather than moving that consumer's offsets.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from pylog import fileutil
from pylog.consumer import _try_lock, encode_offset
from pylog.errors import GroupActiveError
from pylog.groups import _members
from pylog.topicmeta import check_name
from pylog.topics import CONSUMERS_DIR

__all__ = ["GroupProgress"]

#: How long a commit waits for a partition lock someone holds for a moment (``pylog group
#: describe`` looks at it, a reset rewrites it) before it takes the holder for a consumer.
LOCK_WAIT_S = 5.0


class GroupProgress:
    """Commits a stream's offsets ``{topic: {partition: next_offset}}`` into consumer group
    ``group`` of the topics under ``root``; an offset already committed by this object is
    not written again (a trigger with no new data writes nothing)."""

    def __init__(self, root: str, group: str) -> None:
        self.root = root
        self.group = check_name(group, "pylog option groupId: group")
        self._written: dict[tuple[str, int], int] = {}

    def commit(self, offsets: Mapping[str, Mapping[Any, Any]]) -> None:
        """Commit ``offsets`` durably (each partition's file replaced atomically)."""
        for topic in sorted(offsets):
            tdir = os.path.join(self.root, topic)
            if not os.path.isdir(tdir):  # deleted meanwhile: nothing to show lag of
                continue
            gdir = os.path.join(tdir, CONSUMERS_DIR, self.group)
            for p_key, off in sorted(offsets[topic].items(), key=lambda kv: int(kv[0])):
                p, off = int(p_key), int(off)
                if self._written.get((topic, p)) == off:
                    continue
                os.makedirs(gdir, exist_ok=True)
                self._commit_one(gdir, topic, p, off)
                self._written[(topic, p)] = off

    def _commit_one(self, gdir: str, topic: str, p: int, off: int) -> None:
        live = _members(gdir)
        if live:
            raise self._busy(topic, f"live members {'; '.join(live)}")
        deadline = time.monotonic() + LOCK_WAIT_S
        while (fd := _try_lock(os.path.join(gdir, f"partition-{p}.lock"))) < 0:
            if time.monotonic() > deadline:
                raise self._busy(topic, f"a live consumer of partition {p}")
            time.sleep(0.01)
        try:
            fileutil.atomic_write(os.path.join(gdir, f"partition-{p}.offset"),
                                  encode_offset(off, time.time_ns() // 1_000_000))
        finally:
            os.close(fd)

    def _busy(self, topic: str, who: str) -> GroupActiveError:
        return GroupActiveError(f"pylog option groupId: group {self.group!r} of topic {topic!r} has {who}: it is "
                                "another consumer's; give the query a group of its own")
