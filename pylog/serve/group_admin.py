"""OffsetDelete (API 47) for the group coordinator of ``pylog serve``.

Kafka's rules: a group the broker does not know (not in memory, no offsets on disk) is
GROUP_ID_NOT_FOUND; a partition of a topic the group's live members subscribe to is refused
with GROUP_SUBSCRIBED_TO_TOPIC (the Kafka members' subscriptions, and pylog consumers that
hold a member or partition lock of the group in that topic); the others' committed offsets
are deleted (the ``partition-N.offset`` file, with the directory fsynced before the answer),
under the partition's lock so that a pylog consumer starting meanwhile waits and then finds
no offset. A deleted offset makes the group's next consumer start per its
``auto.offset.reset``.
"""
from __future__ import annotations

import asyncio
import os
import struct
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from pylog import fileutil
from pylog.consumer import _try_lock
from pylog.errors import InvalidNameError, PylogError, UnknownTopicError
from pylog.serve.membership import decode_assignment
from pylog.topics import CONSUMERS_DIR, check_name

if TYPE_CHECKING:
    from pylog.serve.coordinator import GroupCoordinator

__all__ = ["offset_delete", "subscribed_topics"]


def subscribed_topics(metadata: bytes) -> set[str]:
    """The topics of a consumer protocol subscription (any version); empty when the bytes
    are not one."""
    out: set[str] = set()
    try:
        (n,) = struct.unpack_from(">i", metadata, 2)  # after the i16 version
        pos = 6
        for _ in range(max(n, 0)):
            (ln,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if ln < 0 or pos + ln > len(metadata):
                return set()
            out.add(bytes(metadata[pos:pos + ln]).decode())
            pos += ln
    except (struct.error, UnicodeDecodeError):
        return set()
    return out


def _pylog_members(gdir: str, partitions: list[int]) -> bool:
    """Whether a live consumer (pylog's, or the broker's locks for a Kafka member) holds a
    member lock of the group directory or the lock of one of ``partitions``."""
    try:
        names = os.listdir(gdir)
    except FileNotFoundError:
        return False
    locks = [n for n in names if n.startswith("member-") and n.endswith(".lock")]
    locks += [f"partition-{p}.lock" for p in partitions if f"partition-{p}.lock" in names]
    for name in locks:
        fd = _try_lock(os.path.join(gdir, name))
        if fd < 0:
            return True
        os.close(fd)
    return False


def _delete(coord: GroupCoordinator, group: str, wanted: list[tuple[str, list[int]]],
            subscribed: set[str]) -> list[dict[str, Any]]:
    """The per-topic results of OffsetDelete (in a thread)."""
    out = []
    for name, parts in wanted:
        rows = []
        try:
            t = coord.broker.topic(name)
        except (UnknownTopicError, InvalidNameError):
            out.append({"name": name, "partitions": [{"partition_index": p, "error_code": E.unknown_topic_or_partition}
                                                     for p in parts]})
            continue
        gdir = os.path.join(t.path, CONSUMERS_DIR, group)
        busy = name in subscribed or _pylog_members(gdir, [p for p in parts if 0 <= p < t.partitions])
        removed = False
        for p in parts:
            code = 0
            if not 0 <= p < t.partitions:
                code = E.unknown_topic_or_partition
            elif busy:
                code = E.group_subscribed_to_topic
            else:
                fd = _try_lock(os.path.join(gdir, f"partition-{p}.lock")) if os.path.isdir(gdir) else -2
                if fd == -1:
                    code = E.group_subscribed_to_topic
                elif fd >= 0:
                    try:
                        os.unlink(os.path.join(gdir, f"partition-{p}.offset"))
                        removed = True
                    except FileNotFoundError:
                        pass
                    except OSError:
                        code = E.kafka_storage_error
                    finally:
                        os.close(fd)
            rows.append({"partition_index": p, "error_code": code})
        if removed:
            try:
                fileutil.fsync_dir(gdir)
            except OSError:
                for r in rows:
                    r["error_code"] = r["error_code"] or E.kafka_storage_error
        out.append({"name": name, "partitions": rows})
    return out


async def offset_delete(coord: GroupCoordinator, req: Any, version: int) -> dict[str, Any]:
    """OffsetDelete: a group's committed offsets of some partitions (see the module docstring)."""
    try:
        check_name(req.group_id, "group")
    except InvalidNameError:
        return {"error_code": E.invalid_group_id, "topics": []}
    loop = asyncio.get_running_loop()
    g = coord.groups.get(req.group_id)
    if g is None or not g.members:
        disk = await loop.run_in_executor(None, coord._on_disk)
        if req.group_id not in disk:
            return {"error_code": E.group_id_not_found, "topics": []}
    subscribed: set[str] = set()
    if g is not None and g.members:
        if g.protocol_type != "consumer":
            return {"error_code": E.non_empty_group, "topics": []}
        for m in g.members.values():
            meta = dict(m.protocols).get(g.protocol or "", b"")
            subscribed |= subscribed_topics(meta) or set(decode_assignment(m.assignment))
    wanted = [(t.name, [p.partition_index for p in t.partitions]) for t in req.topics]
    try:
        topics = await loop.run_in_executor(None, _delete, coord, req.group_id, wanted, subscribed)
    except (OSError, PylogError):
        return {"error_code": E.kafka_storage_error, "topics": []}
    return {"error_code": 0, "topics": topics}
