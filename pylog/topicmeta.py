"""A topic's description on disk: the name rule, ``topic.json`` (partition count, config,
topic id) read and written, the stamp that tells a handle it changed, and the record count
:meth:`~pylog.Topic.describe` reports, the store's metadata lock (:class:`_FileLock`).
:mod:`pylog.topics` builds LogStore and Topic on it.
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import re
from typing import Any

from pylog import fileutil
from pylog import format as fmt
from pylog._backend import impl
from pylog.config import LogConfig
from pylog.errors import (
    ArgumentTypeError,
    ConfigError,
    InvalidArgumentError,
    InvalidNameError,
    UnknownTopicError,
)

TOPIC_FILE = "topic.json"
PARTITION_PREFIX = "partition-"
MAX_PARTITIONS = 1 << 16

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


def check_name(name: Any, what: str = "topic") -> str:
    """``name`` if it is a valid topic (or group) name, else :class:`InvalidNameError`.

    Valid: 1 to 249 of ``A-Z a-z 0-9 . _ -``, and not ``.`` or ``..`` (Kafka's rule), so a
    name can never reach outside the data root.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} name must be a str, got {type(name).__name__}")
    if not _NAME_RE.match(name) or name in (".", ".."):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise InvalidNameError(
            f"invalid {what} name {shown!r}: use 1-249 of A-Z a-z 0-9 . _ - (and not '.' or '..')")
    return name



def _partition_dir(topic_dir: str, i: int) -> str:
    return os.path.join(topic_dir, f"{PARTITION_PREFIX}{i}")


def check_store_root(root: Any) -> str:
    """The data root ``root`` of a LogStore as a str: ArgumentTypeError if it is not a path,
    InvalidArgumentError if it is empty, or a directory of a Log or of a topic (a store
    would write its files into it)."""
    if not isinstance(root, (str, os.PathLike)):
        raise ArgumentTypeError(f"root must be a str or os.PathLike, got {type(root).__name__}")
    path = os.fspath(root)
    if not path:
        raise InvalidArgumentError("root must not be empty")
    kind = fileutil.dir_kind(path)
    if kind == "log":
        raise InvalidArgumentError(f"{path!r} is the directory of a Log, not a data root (open it with pylog.Log)")
    if kind == "topic":
        raise InvalidArgumentError(f"{path!r} is the directory of a topic, not a data root (its data root is "
                                   f"{os.path.dirname(os.path.abspath(path))!r})")
    return path


def topic_contains(topic: Any, item: object) -> bool:
    """``item in topic`` for a :class:`~pylog.Topic`: whether the Log ``item`` is one of its
    partitions. An offset is per partition: ``offset in topic`` raises ArgumentTypeError
    (ask one partition: ``offset in topic.reader(p)``), as does anything else."""
    from pylog.log import Log

    if isinstance(item, Log):
        return any(os.path.abspath(item.path) == os.path.abspath(_partition_dir(topic.path, i))
                   for i in range(topic.partitions))
    if isinstance(item, int) and not isinstance(item, bool):
        raise ArgumentTypeError(f"`{item} in topic` is ambiguous: a topic holds partitions, and an offset is "
                                "per partition (ask one: `offset in topic.reader(p)`)")
    raise ArgumentTypeError(f"`in` on a topic takes a Log (one of its partitions), got {type(item).__name__}")


def _read_topic_file(topic_dir: str, name: str) -> tuple[int, LogConfig]:
    n, cfg, _id = _read_topic_meta(topic_dir, name)
    return n, cfg


def _read_topic_meta(topic_dir: str, name: str) -> tuple[int, LogConfig, str | None]:
    """``(partitions, config, id)`` from ``topic.json`` (id None: a topic written before
    topic ids)."""
    path = os.path.join(topic_dir, TOPIC_FILE)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise UnknownTopicError(f"unknown topic {name!r}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"topic file of {name!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ConfigError(f"topic file of {name!r} has an unknown layout or version")
    n = data.get("partitions")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise ConfigError(f"topic file of {name!r} names a bad partition count {n!r}")
    cfg = data.get("config")
    if not isinstance(cfg, dict):
        raise ConfigError(f"topic file of {name!r} holds no config object")
    tid = data.get("id")
    if tid is not None and not isinstance(tid, str):
        raise ConfigError(f"topic file of {name!r} names a bad topic id {tid!r}")
    return n, LogConfig.from_dict(cfg), tid


def _write_topic_file(topic_dir: str, partitions: int, config: LogConfig, topic_id: str | None = None) -> None:
    meta: dict[str, Any] = {"version": 1, "partitions": partitions, "config": config.to_dict()}
    if topic_id is not None:
        meta["id"] = topic_id
    body = json.dumps(meta, indent=1, sort_keys=True).encode()
    fileutil.atomic_write(os.path.join(topic_dir, TOPIC_FILE), body)


def _check_partitions(partitions: Any) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ArgumentTypeError(f"partitions must be an int, got {type(partitions).__name__}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgumentError(f"partitions={partitions} must be between 1 and {MAX_PARTITIONS}")
    return partitions


def _count_records(segments: list[dict[str, Any]]) -> int:
    """How many records the segments hold: ``next - base`` for each, except in a compacted
    segment (offsets with gaps), whose frames are counted."""
    total = 0
    for s in segments:
        n = s["next_offset"] - s["base_offset"]
        if not s["sealed"] or n == 0:
            total += n
            continue
        try:
            f = open(s["path"], "rb")
        except FileNotFoundError:  # removed meanwhile (retention, compaction)
            continue
        with f:
            size = os.fstat(f.fileno()).st_size
            rc, _base, flags = impl.header_check(f.read(fmt.FILE_HEADER_SIZE), fmt.STORE_MAGIC)
            if rc != impl.OK or not flags & fmt.HEADER_COMPACTED:
                total += n
                continue
            if size <= fmt.FILE_HEADER_SIZE:
                continue
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
            try:
                buf = impl.Buffer(mm)
                pos, expected = fmt.FILE_HEADER_SIZE, s["base_offset"]
                while pos < size:
                    rc, frames, end = impl.scan(buf, size, pos, expected, 1 << 16, (1 << 64) - 1, True)
                    if not len(frames):
                        break
                    total += len(frames)
                    expected = int(frames[-1]["offset"]) + 1
                    pos = int(end)
                    if rc != impl.OK:
                        break
                del buf
            finally:
                try:
                    mm.close()
                except BufferError:
                    pass
    return total


def _stamp(topic_dir: str) -> tuple[int, int, int] | None:
    """What identifies one version of ``topic.json`` (it is replaced by rename, so a change
    is a new inode): ``(inode, mtime_ns, size)``, or None when it is gone."""
    try:
        st = os.stat(os.path.join(topic_dir, TOPIC_FILE))
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class _FileLock:
    """An exclusive flock on a file, held for a ``with`` block (blocking)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> _FileLock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        self.fd = -1
