"""Finishing what crashed transactions left (:mod:`pylog.transactions`): the roll forward a
partition's writer runs when it opens on a marker, and :func:`recover`, which a writable
:class:`~pylog.LogStore` runs when it opens.

A decided transaction is shown only once every partition it writes holds its records
(``pylog.transactions._publish``); until then each partition's marker ``txn.stable``
stays, and readers in every process stop there. A writer that rolls a partition forward
applies the staged records again from the decision's start offset and then marks the
marker *applied* (``{"txn": id, "start": offset, "applied": true}``): it goes on appending
after the transaction's records, and a later roll forward never cuts those appends. Whoever
finds every partition applied publishes the transaction.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from pylog import fileutil, transactions
from pylog.errors import LogLockedError
from pylog.loader import STABLE_FILE, STABLE_HOOKS, drop_stable_file, read_stable_file
from pylog.log import Log
from pylog.transactions import (
    _DONE_PREFIX,
    _NEW_PREFIX,
    ABANDON_SECONDS,
    DECISION_FILE,
    EXTERNAL_FILE,
    OWNER_LOCK,
    _publish,
    _read_json,
    _record_sinks,
    _remove_txn_dir,
    _txn_root,
)

__all__ = ["recover"]


def _marker(dirpath: str) -> tuple[str, int, bool] | None:
    """``(transaction id, start offset, applied)`` of partition ``dirpath``'s marker, or
    None (no marker, or no partition directory)."""
    try:
        mark = read_stable_file(dirpath)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if mark is None:
        return None
    data = fileutil.read_if_exists(os.path.join(dirpath, STABLE_FILE))
    try:
        applied = data is not None and json.loads(data).get("applied") is True
    except ValueError:
        applied = False
    return mark[0], mark[1], applied


def _partition_dir(root: str, entry: dict[str, Any]) -> str:
    return os.path.join(root, entry["topic"], f"partition-{entry['partition']}")


def _all_applied(root: str, txn: str, decision: dict[str, Any]) -> bool:
    """Whether every partition of decided transaction ``txn`` holds its records: none
    still has an unapplied marker of it (a marker is written before the decision, so no
    marker means one removed after its apply)."""
    for entry in decision["partitions"]:
        m = _marker(_partition_dir(root, entry))
        if m is not None and m[0] == txn and not m[2]:
            return False
    return True


def _finish_decided(root: str, txn_dir: str, decision: dict[str, Any]) -> bool:
    """Publish decided transaction ``txn_dir`` if every partition holds its records: its
    sink batch ids recorded, then ``pylog.transactions._publish``'s rename. True if it
    is finished (by this call or before)."""
    if not os.path.isdir(txn_dir):
        return True
    if not _all_applied(root, os.path.basename(txn_dir), decision):
        return False
    _record_sinks(root, {k: int(v) for k, v in decision.get("sinks", {}).items()})
    done = _publish(txn_dir)
    if done is not None:
        shutil.rmtree(done, ignore_errors=True)
    return True


def _roll_forward(log: Log) -> None:
    """:data:`pylog.log.STABLE_HOOKS` entry: a writer opened a partition with a marker."""
    m = _marker(log.path)
    if m is None:
        return
    txn, start, applied = m
    pdir = os.path.abspath(log.path)
    topic_dir = os.path.dirname(pdir)
    root = os.path.dirname(topic_dir)
    txn_dir = os.path.join(_txn_root(root), txn)
    decision = _read_json(os.path.join(txn_dir, DECISION_FILE))
    if decision is None:
        # never decided (the committer held this partition's writer lock until it died):
        # nothing after the marker belongs to the transaction; or finished (published)
        drop_stable_file(log)
        return
    topic = os.path.basename(topic_dir)
    part = os.path.basename(pdir)
    for entry in decision["partitions"]:
        if entry["topic"] == topic and f"partition-{entry['partition']}" == part:
            break
    else:
        drop_stable_file(log)  # not a partition of this transaction: a stray marker
        return
    if not applied:
        transactions._apply(log, txn_dir, entry)
        fileutil.atomic_write(os.path.join(log.path, STABLE_FILE),
                              json.dumps({"txn": txn, "start": start, "applied": True}).encode())
    # this writer goes on after the transaction's records; readers elsewhere still stop at
    # the marker until the transaction is published
    log._cap = None
    if _finish_decided(root, txn_dir, decision):
        drop_stable_file(log)


STABLE_HOOKS.append(_roll_forward)


def _owner_gone(d: str) -> bool:
    """Whether an undecided transaction directory belongs to nobody any more."""
    held = fileutil.flock_held(os.path.join(d, OWNER_LOCK))
    if held is None:
        if os.path.exists(os.path.join(d, EXTERNAL_FILE)):
            try:
                return time.time() - _newest_mtime(d) > ABANDON_SECONDS
            except FileNotFoundError:
                return False
        return not os.path.exists(d)
    return not held


def _newest_mtime(d: str) -> float:
    newest = os.stat(d).st_mtime
    for dirpath, dirnames, files in os.walk(d):
        for n in dirnames + files:
            try:
                newest = max(newest, os.stat(os.path.join(dirpath, n)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def recover(root: str) -> list[str]:
    """Finish or discard what crashed transactions left under ``root`` (a writable
    :class:`~pylog.LogStore` calls this when it opens): a decided transaction is rolled
    forward in every partition that still holds its marker (opening the partition's writer
    does it), its sink batch ids recorded and its directory removed; an undecided one whose
    owner is gone is discarded. Returns the ids it finished or discarded."""
    base = _txn_root(os.fspath(root))
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    done = []
    for name in names:
        d = os.path.join(base, name)
        if name.startswith(_DONE_PREFIX):
            shutil.rmtree(d, ignore_errors=True)  # finished; its deletion was cut short
            continue
        if name.startswith(_NEW_PREFIX):
            if _owner_gone(d) or not os.path.exists(os.path.join(d, OWNER_LOCK)) and not os.path.exists(
                    os.path.join(d, EXTERNAL_FILE)) and time.time() - os.stat(d).st_mtime > 60:
                shutil.rmtree(d, ignore_errors=True)
            continue
        if len(name) != 32 or not os.path.isdir(d):
            continue
        decision = _read_json(os.path.join(d, DECISION_FILE))
        if decision is None:
            if _owner_gone(d):
                _remove_txn_dir(d)
                done.append(name)
            continue
        pending = False
        for entry in decision["partitions"]:
            pdir = _partition_dir(os.fspath(root), entry)
            m = _marker(pdir)
            if m is None or m[0] != name or m[2]:
                continue
            try:
                Log(pdir).close()  # the writer's open rolls the apply forward
            except LogLockedError:
                pending = True  # its writer elsewhere rolled it forward when it opened
        if pending or not _finish_decided(os.fspath(root), d, decision):
            continue
        for entry in decision["partitions"]:  # the markers left: their open removes them
            pdir = _partition_dir(os.fspath(root), entry)
            m = _marker(pdir)
            if m is not None and m[0] == name:
                try:
                    Log(pdir).close()
                except LogLockedError:
                    pass  # harmless: the transaction is published; its next open removes it
        done.append(name)
    return done
