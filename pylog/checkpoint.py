"""The recovery checkpoint and the clean-shutdown marker of a partition directory.

``recovery-point`` (28 bytes): ``8s magic b"PYLOGCKP" | u16 version | u16 0 | u32 0 |
u64 recovery_point | u32 crc32c(bytes 0..23)``. Every offset below ``recovery_point`` is
durable; recovery after an unclean shutdown verifies only what follows it.

``clean-shutdown`` (60 bytes): ``8s magic b"PYLOGCLN" | u16 version (2) | u16 0 | u32 0 |
u64 next_offset | u64 active_base | u64 active_size | i64 max_timestamp |
i64 active_mtime_ns | u32 crc32c(0..55)``. Written by ``close()`` after everything is
fsynced; deleted as the log opens, so a crash while open (or while opening) counts as
unclean. ``recovery-report.json``: what recovery cut or found at an open (see :func:`add_report`),
kept until the operator clears it. Either file, if damaged or inconsistent with the segment files, is ignored: full
recovery. ``active_mtime_ns`` (the active store's modification time at close) ties the
marker to the store as it was then: a stale marker (left over or restored while the log
moved on) whose size happens to match again is not trusted.

``truncate-point`` (28 bytes, the layout of ``recovery-point`` with magic ``b"PYLOGTRP"``):
the offset a ``truncate()`` drops from, written durably before it changes any file and
removed when it is done. Its presence at open means a truncate was interrupted: the
opening writer finishes it.

``log-start-offset`` (28 bytes, the same layout with magic ``b"PYLOGLSO"``): the log start
offset :meth:`pylog.Log.delete_records` set; no offset below it is served. Written durably
(replaced atomically, fsynced) before the call returns; a missing or damaged file means none
(the first segment's base offset is the start).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from pylog import fileutil, vfs
from pylog import format as fmt
from pylog._backend import impl

_CKP = struct.Struct("<8sHHIQ")
_CLN = struct.Struct("<8sHHIQQQqq")
_CKP_VERSION = 1
_CLN_VERSION = 2
_CRC = struct.Struct("<I")
CKP_MAGIC = b"PYLOGCKP"
CLN_MAGIC = b"PYLOGCLN"
TRP_MAGIC = b"PYLOGTRP"
LSO_MAGIC = b"PYLOGLSO"
_NO_TS = -(1 << 63)


@dataclass(frozen=True)
class CleanState:
    next_offset: int
    active_base: int
    active_size: int
    max_timestamp: int | None
    active_mtime_ns: int = -1


def _seal(body: bytes) -> bytes:
    return body + _CRC.pack(impl.crc32c(body))


def _open(data: bytes, st: struct.Struct, magic: bytes, version: int) -> tuple[Any, ...] | None:
    if len(data) != st.size + 4 or _CRC.unpack(data[st.size:])[0] != impl.crc32c(data[: st.size]):
        return None
    fields = st.unpack(data[: st.size])
    if fields[0] != magic or fields[1] != version:
        return None
    return fields


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(256)
    except (FileNotFoundError, IsADirectoryError):
        return None


def write_recovery_point(dirpath: str, offset: int, *, truncated: bool = False) -> None:
    """Replace the recovery point (atomically, fsynced). Bytes 12..15 count the log's
    truncates (mod 2**32): kept from the file there, one more with ``truncated`` (a
    truncate's last step), so a reader in another process that compares the file's bytes
    before and after it looks at the segments sees every truncate that ended meanwhile,
    even one that put the recovery point back where it was (pylog.loader)."""
    path = os.path.join(dirpath, fmt.CHECKPOINT_FILE)
    data = _read(path)
    fields = _open(data, _CKP, CKP_MAGIC, _CKP_VERSION) if data is not None else None
    count = (fields[3] if fields else 0) + (1 if truncated else 0)
    body = _seal(_CKP.pack(CKP_MAGIC, _CKP_VERSION, 0, count & 0xFFFFFFFF, offset))
    fileutil.atomic_write(path, body)


def read_recovery_point(dirpath: str) -> int | None:
    """The recovery point, or None when the file is missing or damaged."""
    data = _read(os.path.join(dirpath, fmt.CHECKPOINT_FILE))
    fields = _open(data, _CKP, CKP_MAGIC, _CKP_VERSION) if data is not None else None
    return fields[4] if fields else None


def write_truncate_point(dirpath: str, offset: int) -> None:
    """Record durably that a truncate to ``offset`` is under way."""
    body = _seal(_CKP.pack(TRP_MAGIC, _CKP_VERSION, 0, 0, offset))
    fileutil.atomic_write(os.path.join(dirpath, fmt.TRUNCATE_FILE), body)


def read_truncate_point(dirpath: str) -> int | None:
    """The offset of an interrupted truncate; None when there is none. A damaged file is
    one the crash cut before its rename committed it, so it counts as none."""
    return truncate_point_of(_read(os.path.join(dirpath, fmt.TRUNCATE_FILE)))


def truncate_point_of(data: bytes | None) -> int | None:
    """The offset in ``truncate-point`` bytes ``data`` (None: no file, or a damaged one)."""
    fields = _open(data, _CKP, TRP_MAGIC, _CKP_VERSION) if data is not None else None
    return fields[4] if fields else None


def clear_truncate_point(dirpath: str) -> None:
    """Remove the truncate point durably (a no-op when there is none)."""
    try:
        vfs.unlink(os.path.join(dirpath, fmt.TRUNCATE_FILE))
    except FileNotFoundError:
        return
    fileutil.fsync_dir(dirpath)


def write_log_start(dirpath: str, offset: int) -> None:
    """Make ``offset`` the log start offset of the log in ``dirpath``, durably."""
    body = _seal(_CKP.pack(LSO_MAGIC, _CKP_VERSION, 0, 0, offset))
    fileutil.atomic_write(os.path.join(dirpath, fmt.LOG_START_FILE), body)


def read_log_start(dirpath: str) -> int:
    """The log start offset :meth:`pylog.Log.delete_records` set; 0 when there is none (or
    the file is damaged: it is replaced atomically, so only a hand-made one can be)."""
    data = _read(os.path.join(dirpath, fmt.LOG_START_FILE))
    fields = _open(data, _CKP, LSO_MAGIC, _CKP_VERSION) if data is not None else None
    return int(fields[4]) if fields else 0


def write_clean(dirpath: str, state: CleanState) -> None:
    body = _CLN.pack(CLN_MAGIC, _CLN_VERSION, 0, 0, state.next_offset, state.active_base, state.active_size,
                     _NO_TS if state.max_timestamp is None else state.max_timestamp, state.active_mtime_ns)
    fileutil.atomic_write(os.path.join(dirpath, fmt.CLEAN_SHUTDOWN_FILE), _seal(body))


def take_clean(dirpath: str, *, remove: bool = True) -> CleanState | None:
    """Read the clean-shutdown marker and (unless ``remove`` is False) delete it durably."""
    path = os.path.join(dirpath, fmt.CLEAN_SHUTDOWN_FILE)
    data = _read(path)
    if data is None:
        return None
    if remove:
        vfs.unlink(path)
        fileutil.fsync_dir(dirpath)
    fields = _open(data, _CLN, CLN_MAGIC, _CLN_VERSION)
    if not fields:
        return None
    ts = fields[7]
    return CleanState(fields[4], fields[5], fields[6], None if ts == _NO_TS else ts, fields[8])


# -- the durable point -----------------------------------------------------------------------
_DUR = struct.Struct("<8sHHIQQQ")
DUR_MAGIC = b"PYLOGDUR"
_NO_UNIT = (1 << 64) - 1


def write_durable_point(dirpath: str, base: int, durable: int, *, open_unit: int | None = None,
                        sync: bool = False) -> None:
    """Record that every offset below ``durable`` is durable, for the active segment of base
    ``base`` (``durable-point``, 44 bytes: ``8s magic b"PYLOGDUR" | u16 version (1) | u16 0 |
    u32 0 | u64 base | u64 durable | u64 open_unit | u32 crc32c(0..39)``). ``open_unit``: the
    first offset of a write unit (an ``append_batch``) that a roll split, its first records
    in the segments before ``base`` (2^64 - 1: none). Rewritten in place with one ``pwrite``
    (it fits in one sector), after an fsync made it true: whichever version a crash keeps
    is a lower bound of what was durable. With ``sync`` the record itself is made durable
    (fdatasync, and the directory when the file is new)."""
    path = os.path.join(dirpath, fmt.DURABLE_FILE)
    new = sync and not os.path.exists(path)
    unit = _NO_UNIT if open_unit is None else open_unit
    fd = vfs.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fileutil.pwrite_all(fd, _seal(_DUR.pack(DUR_MAGIC, 1, 0, 0, base, durable, unit)), 0)
        if sync:
            vfs.fdatasync(fd)
    finally:
        vfs.close(fd)
    if new:
        fileutil.fsync_dir(dirpath)


def read_durable_point(dirpath: str) -> tuple[int, int, int | None] | None:
    """``(base, durable, open_unit)`` as ``durable-point`` records them; None when the file
    is missing or damaged."""
    data = _read(os.path.join(dirpath, fmt.DURABLE_FILE))
    fields = _open(data, _DUR, DUR_MAGIC, 1) if data is not None else None
    if not fields:
        return None
    return fields[4], fields[5], None if fields[6] == _NO_UNIT else fields[6]


# -- the recovery report ---------------------------------------------------------------------
_REPORT_VERSION = 1


def read_report(dirpath: str) -> list[dict[str, Any]]:
    """The entries of the partition's recovery report (``[]`` when there is none). A report
    that cannot be parsed is itself reported, as one entry, rather than dropped."""
    path = os.path.join(dirpath, fmt.REPORT_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, IsADirectoryError):
        return []
    try:
        doc = json.loads(data)
        entries = doc["entries"]
        if doc.get("version") != _REPORT_VERSION or not isinstance(entries, list):
            raise ValueError(doc.get("version"))
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("reason"), str):
                raise ValueError(e)
        return entries
    except (ValueError, KeyError, TypeError, AttributeError):
        return [{"segment": fmt.REPORT_FILE, "position": 0, "offset": None, "action": "found",
                 "reason": "the recovery report itself cannot be read"}]


def add_report(dirpath: str, entries: list[dict[str, Any]]) -> None:
    """Append ``entries`` to the partition's recovery report, atomically and durably. Each
    entry: ``segment`` (store file name), ``position``, ``offset`` (first offset concerned, or
    None), ``end_offset`` (None, or the end of the range concerned), ``action`` ("kept": the
    damage stays in place, "cut": recovery cut it), ``saved`` (the file the cut bytes were
    saved to, or None), ``reason``, ``time_ms``."""
    if not entries:
        return
    old = read_report(dirpath)
    doc = {"version": _REPORT_VERSION, "entries": old + entries}
    fileutil.atomic_write(os.path.join(dirpath, fmt.REPORT_FILE),
                          json.dumps(doc, indent=1).encode() + b"\n")


def clear_report(dirpath: str) -> int:
    """Delete the partition's recovery report durably; returns how many entries it held."""
    n = len(read_report(dirpath))
    try:
        vfs.unlink(os.path.join(dirpath, fmt.REPORT_FILE))
    except FileNotFoundError:
        return n
    fileutil.fsync_dir(dirpath)
    return n
