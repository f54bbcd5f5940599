"""Where a pylog data root keeps its topics: ``ROOT/TOPIC/partition-N/``."""
from __future__ import annotations

import os
import re

from pylog import topicmeta
from pylog.errors import UnknownTopicError

_PARTITION_RE = re.compile(r"^partition-(0|[1-9][0-9]*)$")


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

