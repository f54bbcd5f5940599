"""Consumer-group tools, as ``kafka-consumer-groups`` offers them: list the groups, describe a
group's committed offsets and lag, reset its offsets, delete it.

The same operations are methods of :class:`~pylog.LogStore` (:meth:`~pylog.LogStore.groups`,
:meth:`~pylog.LogStore.describe_group`, :meth:`~pylog.LogStore.reset_group`,
:meth:`~pylog.LogStore.delete_group`) and verbs of the command (``pylog group ...``).

A group lives per topic, in ``TOPIC/~consumers/GROUP/`` (:mod:`pylog.consumer`); one group
name may consume several topics. A member is *live* while its process holds the flock of a
``member-K.lock`` (or, for a consumer with manual assignment, of a ``partition-N.lock``).
Resetting or deleting a group is refused while it has live members
(:class:`~pylog.GroupActiveError`): it holds every partition lock of the group while it
writes, so a consumer that starts meanwhile waits for its partitions and then starts from
the new offsets.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

from pylog import fileutil
from pylog.consumer import OFFSET_FILE_MAX, _try_lock, decode_offset, encode_offset
from pylog.errors import GroupActiveError, InvalidArgumentError, UnknownGroupError
from pylog.topics import CONSUMERS_DIR, check_name

if TYPE_CHECKING:
    from pylog.topics import LogStore, Topic

__all__ = ["groups", "describe_group", "reset_group", "delete_group", "parse_datetime"]


def _group_dir(topic: Topic, group: str) -> str:
    return os.path.join(topic.path, CONSUMERS_DIR, group)


def _lock_state(path: str) -> str | None:
    """None when nobody holds the flock of ``path``; else the owner text the holder wrote
    into the file (or ``"live"``)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            return text or "live"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_offset(path: str) -> tuple[int | None, bool]:
    """(committed offset or None, whether the file is damaged)."""
    try:
        with open(path, "rb") as f:
            data = f.read(OFFSET_FILE_MAX + 1)
    except FileNotFoundError:
        return None, False
    off = decode_offset(data)
    return off, off is None


def _topics_of(store: LogStore, group: str, topic: str | None) -> list[Topic]:
    check_name(group, "group")
    if topic is not None:
        t = store.topic(topic)
        if not os.path.isdir(_group_dir(t, group)):
            raise UnknownGroupError(f"group {group!r} has never consumed topic {topic!r}")
        return [t]
    out = [store.topic(n) for n in store.topics() if os.path.isdir(_group_dir(store.topic(n), group))]
    if not out:
        raise UnknownGroupError(f"unknown group {group!r}")
    return out


def groups(store: LogStore, topic: str | None = None) -> list[str]:
    """The names of the consumer groups of ``topic`` (default: of every topic), sorted."""
    names = [topic] if topic is not None else store.topics()
    out: set[str] = set()
    for n in names:
        d = os.path.join(store.topic(n).path, CONSUMERS_DIR)
        if os.path.isdir(d):
            out.update(g for g in os.listdir(d) if "~" not in g and os.path.isdir(os.path.join(d, g)))
    return sorted(out)


def _members(gdir: str) -> list[str]:
    """The live members of a group directory, as the owner texts of their member locks."""
    live = []
    for name in sorted(os.listdir(gdir)):
        if name.startswith("member-") and name.endswith(".lock"):
            state = _lock_state(os.path.join(gdir, name))
            if state is not None:
                live.append(name[:-5] if state == "live" else state)
    return live


def describe_group(store: LogStore, group: str, topic: str | None = None) -> dict[str, Any]:
    """The state of consumer group ``group`` in ``topic`` (default: every topic it consumes).

    Returns ``{"group", "members": [owner texts of live members], "partitions": [...]}``,
    one partition entry per partition of each topic: ``topic``, ``partition``,
    ``committed`` (None: nothing committed), ``start_offset``, ``log_end`` (the next
    offset), ``lag`` (the records the group's next consumer has to read: ``log_end -
    committed``; None when nothing is committed), ``out_of_range`` (the committed offset is
    outside ``[start_offset, log_end]``, e.g. after retention or a truncation: the next
    consumer starts per its ``auto_offset_reset``, and ``lag`` is counted from
    ``start_offset``, as the default ``"earliest"`` does), ``owner``
    (who consumes it now, e.g. ``"member-0 pid 4242 host h"``; None when no live consumer
    owns it) and ``damaged`` (the committed-offset file is unreadable: the consumer starts
    per ``auto_offset_reset``). UnknownGroupError if the group never consumed the topic.
    """
    rows = []
    members: list[str] = []
    for t in _topics_of(store, group, topic):
        gdir = _group_dir(t, group)
        members += [m for m in _members(gdir) if m not in members]
        for p in range(t.partitions):
            log = t.reader(p)
            if log.readonly:
                log.refresh()
            committed, damaged = _read_offset(os.path.join(gdir, f"partition-{p}.offset"))
            end, start = log.next_offset, log.start_offset
            out = committed is not None and not start <= committed <= end
            rows.append({
                "topic": t.name, "partition": p, "committed": committed, "start_offset": start,
                "log_end": end, "lag": None if committed is None else end - (start if out else committed),
                "out_of_range": out,
                "owner": _lock_state(os.path.join(gdir, f"partition-{p}.lock")), "damaged": damaged,
            })
    return {"group": group, "members": members, "partitions": rows}


def parse_datetime(value: Any) -> int:
    """Milliseconds since the epoch of ``value``: a :class:`datetime.datetime` or an ISO 8601
    string (``2026-11-23T10:00:00``, ``...Z``, ``...+01:00``, or a date alone). A time without
    a zone is UTC, as record timestamps are."""
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            value = _dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgumentError(f"{value!r} is not an ISO 8601 date/time "
                                       f"(e.g. 2026-11-23T10:00:00 or 2026-11-23T10:00:00+01:00)") from None
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, _dt.datetime):
        raise InvalidArgumentError(f"to_datetime={value!r} must be a datetime or an ISO 8601 string")
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return int(value.timestamp() * 1000)


def _hold_partitions(gdir: str, partitions: int, group: str, topic: str) -> list[int]:
    """Every partition lock of the group, for as long as offsets are rewritten; refused
    (GroupActiveError, nothing held) while any member is live."""
    fds: list[int] = []
    try:
        live = _members(gdir)
        for p in range(partitions):
            fd = _try_lock(os.path.join(gdir, f"partition-{p}.lock"))
            if fd < 0:
                live.append(f"the consumer of partition {p}")
                break
            fds.append(fd)
        if live:
            raise GroupActiveError(f"group {group!r} has live members on topic {topic!r} "
                                   f"({'; '.join(live)}): stop them first")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def reset_group(store: LogStore, group: str, topic: str, *, to_earliest: bool = False,
                to_latest: bool = False, to_offset: int | None = None, to_datetime: Any = None,
                shift_by: int | None = None, partitions: Any = None,
                dry_run: bool = False) -> list[dict[str, Any]]:
    """Set the committed offsets of ``group`` on ``topic``; exactly one of:

    ``to_earliest`` (each partition's start_offset), ``to_latest`` (its log end: its last
    stable offset, short of a transaction still being applied),
    ``to_offset=N``, ``to_datetime`` (the first offset whose timestamp is >= it, else the log
    end; a datetime or an ISO 8601 string, UTC unless it names a zone), ``shift_by=N``
    (the committed offset plus N, which may be negative; from the start_offset when nothing
    is committed). A target outside ``[start_offset, log_end]`` is clamped into it, as Kafka
    does. ``partitions`` limits it to some partitions (default: all).

    Returns one ``{"topic", "partition", "old", "new"}`` per partition; with
    ``dry_run=True`` nothing is written. Refused with GroupActiveError while the group has
    live members; the group need not exist yet (resetting creates its offsets).
    """
    check_name(group, "group")
    t = store.topic(topic)
    chosen = [name for name, v in (("to_earliest", to_earliest), ("to_latest", to_latest),
                                   ("to_offset", to_offset), ("to_datetime", to_datetime),
                                   ("shift_by", shift_by)) if v is not None and v is not False]
    if len(chosen) != 1:
        raise InvalidArgumentError("give exactly one of to_earliest, to_latest, to_offset, to_datetime, "
                                   f"shift_by (got {', '.join(chosen) or 'none'})")
    for name, v in (("to_offset", to_offset), ("shift_by", shift_by)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InvalidArgumentError(f"{name}={v!r} must be an int")
    if to_offset is not None and to_offset < 0:
        raise InvalidArgumentError(f"to_offset={to_offset} must be >= 0")
    when = parse_datetime(to_datetime) if to_datetime is not None else None
    parts = list(range(t.partitions)) if partitions is None else sorted({t._check_partition(p) for p in partitions})
    gdir = _group_dir(t, group)
    if not dry_run:
        os.makedirs(gdir, exist_ok=True)
    fds = _hold_partitions(gdir, t.partitions, group, topic) if os.path.isdir(gdir) else []
    try:
        plan: list[dict[str, Any]] = []
        for p in parts:
            log = t.reader(p)
            if log.readonly:
                log.refresh()
            # the log end a reset may reach is the last stable offset: past it are the
            # records of a transaction still being applied, which a group must not skip
            start, end = log.start_offset, log.stable_offset
            old, _damaged = _read_offset(os.path.join(gdir, f"partition-{p}.offset"))
            if to_earliest:
                new = start
            elif to_latest:
                new = end
            elif to_offset is not None:
                new = to_offset
            elif when is not None:
                found = log.offset_for_time(when)
                new = end if found is None else found
            else:
                assert shift_by is not None
                new = (start if old is None else old) + shift_by
            new = min(max(new, start), end)
            plan.append({"topic": t.name, "partition": p, "old": old, "new": new})
        if not dry_run:
            now = time.time_ns() // 1_000_000
            for row in plan:
                fileutil.atomic_write(os.path.join(gdir, f"partition-{row['partition']}.offset"),
                                      encode_offset(row["new"], now))
        return plan
    finally:
        for fd in fds:
            os.close(fd)


def delete_group(store: LogStore, group: str, topic: str | None = None) -> list[str]:
    """Delete consumer group ``group`` (its committed offsets) from ``topic`` (default: from
    every topic it consumes); returns the topics it was deleted from. Refused with
    GroupActiveError while it has live members; UnknownGroupError if there is no such group."""
    topics = _topics_of(store, group, topic)
    held: list[tuple[Topic, list[int]]] = []
    try:
        for t in topics:  # every topic checked before anything is deleted
            held.append((t, _hold_partitions(_group_dir(t, group), t.partitions, group, t.name)))
        for t, _fds in held:
            gdir = _group_dir(t, group)
            gone = gdir + "~deleted"
            os.rename(gdir, gone)
            fileutil.fsync_dir(os.path.dirname(gdir))
            shutil.rmtree(gone, ignore_errors=True)
    finally:
        for _t, fds in held:
            for fd in fds:
                os.close(fd)
    return [t.name for t in topics]
