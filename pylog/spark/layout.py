"""Where a pylog data root keeps its topics (``ROOT/TOPIC/partition-N/``), and which of
them a read selects (``topic``/``subscribe``, ``subscribePattern``, ``assign``)."""
from __future__ import annotations

import os
import re

from pylog import topicmeta
from pylog.errors import UnknownTopicError

_PARTITION_RE = re.compile(r"^partition-(0|[1-9][0-9]*)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _topic_dir(root: str, topic: str) -> str:
    return os.path.join(root, topic)


def _partition_dir(root: str, topic: str, p: int) -> str:
    return os.path.join(root, topic, f"partition-{p}")


def _partitions_of(root: str, topic: str) -> list[int]:
    """The partition numbers of a topic (from its topic.json, as LogStore keeps it; for a
    bare directory of ``partition-N`` logs, those found); UnknownTopicError if none."""
    d = _topic_dir(root, topic)
    try:
        n, _cfg = topicmeta._read_topic_file(d, topic)  # noqa: SLF001
        return list(range(n))
    except UnknownTopicError:
        pass
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        raise UnknownTopicError(f"pylog option topic: no topic {topic!r} under {root}") from None
    parts = sorted(int(m.group(1)) for n in names if (m := _PARTITION_RE.match(n)))
    if not parts:
        raise UnknownTopicError(f"pylog option topic: no topic {topic!r} under {root}")
    return parts



def _topics_under(root: str) -> list[str]:
    """The topics of a data root now (sorted): each directory with a valid topic name that
    holds a topic (see :func:`_partitions_of`)."""
    try:
        names = sorted(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for n in names:
        if not _NAME_RE.match(n) or n in (".", "..") or not os.path.isdir(os.path.join(root, n)):
            continue
        try:
            _partitions_of(root, n)
        except UnknownTopicError:
            continue
        out.append(n)
    return out


def _selected(root: str, topics: list[str] | None, pattern: re.Pattern[str] | None,
              assign: dict[str, list[int]] | None, *, strict: bool) -> dict[str, list[int]]:
    """``{topic: [partition, ...]}`` a read selects: the named ``topics`` (each must exist),
    the topics whose whole name matches ``pattern`` (those there now), or the partitions
    ``assign`` names (each must exist). With ``strict=False`` (a stream looking again), a
    topic gone meanwhile is left out instead of failing."""
    out: dict[str, list[int]] = {}
    if assign is not None:
        for t, ps in assign.items():
            have = _partitions_of(root, t)
            missing = [p for p in ps if p not in have]
            if missing:
                raise UnknownTopicError(f"pylog option assign: topic {t!r} has no partition "
                                        f"{', '.join(map(str, missing))} (it has {len(have)})")
            out[t] = list(ps)
        return out
    names = [t for t in _topics_under(root) if pattern.fullmatch(t)] if pattern is not None else topics or []
    for t in names:
        try:
            out[t] = _partitions_of(root, t)
        except UnknownTopicError:
            if strict and pattern is None:
                raise
    return out
