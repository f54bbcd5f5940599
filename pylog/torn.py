"""Torn writes versus damage: how far recovery keeps the part of the active segment that is
not known durable (docs/format.md "Write units" and "durable-point", docs/durability.md
"Torn writes versus damage").

A power cut may persist the sectors of an unsynced write in any order, so past the last
point known durable a bad frame is a torn write, even with whole frames after it: the store
is cut there. Below it, a bad frame is damage to data that was on disk: it is stepped over,
kept and reported (:func:`pylog.segment.walk`). Whatever is kept past the durable point ends
at the end of a write unit: a frame with ``ATTR_UNIT_CONTINUES`` clear (every frame of an
``append_batch`` but its last has it set), so a batch survives whole or not at all.

The durable point is an offset: the larger of the recovery point and the ``durable-point``
mark (:mod:`pylog.checkpoint`), both lower bounds of what was fsynced.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pylog import format as fmt
from pylog._backend import impl

_U64_MAX = (1 << 64) - 1
_CHUNK = 4096


def unit_end(buf: Any, start: int, expected: int, stop: int) -> tuple[int, int] | None:
    """``(position, offset)`` just after the last frame of ``buf[start:stop]`` that ends a
    write unit, walking valid frames from ``start`` (which holds offset ``expected``); None
    when none there does. The walk stops at ``stop`` or at the first bad frame."""
    pos, exp = start, expected
    found = None
    while pos < stop:
        rc, frames, end = impl.scan(buf, stop, pos, exp, _CHUNK, _U64_MAX, False)
        if len(frames):
            ends = np.flatnonzero((frames["attributes"] & fmt.ATTR_UNIT_CONTINUES) == 0)
            if len(ends):
                f = frames[int(ends[-1])]
                found = (int(f["position"]) + int(f["frame_size"]), int(f["offset"]) + 1)
            exp = int(frames[-1]["offset"]) + 1
        pos = int(end)
        if rc != impl.OK or not len(frames):
            break
    return found


def keep_until(buf: Any, walked_to: int, walked_next: int, damage: Sequence[Any], durable: int,
               position_of: Callable[[int], tuple[int, int]]) -> tuple[int, list[Any]]:
    """Where recovery cuts the active store, and the damage it keeps.

    ``damage`` and ``walked_to``/``walked_next`` are what the damage-stepping walk found
    (the position and offset where it stopped); ``durable``: every offset below it is known
    durable. ``position_of(offset)`` is the ``(position, offset)`` of a valid frame at or
    before ``offset`` to walk from. Returns ``(cut position, damage kept)``: the cut is at or
    after the end of the durable records, never after the first bad frame that is not
    durable (a torn write: what follows it is cut, however whole), and at the end of a write
    unit."""
    kept = [d for d in damage if d.offset < durable]
    torn = next((d for d in damage if d.offset >= durable), None)
    limit = torn.position if torn is not None else walked_to
    if walked_next <= durable and torn is None:
        return walked_to, kept  # nothing past the durable point: the walk stands
    # where the durable records end: walk from an indexed frame up to offset `durable`,
    # stepping over the damage kept below it
    pos, exp = position_of(durable)
    while exp < durable and pos < limit:
        rc, frames, end = impl.scan(buf, limit, pos, exp, min(_CHUNK, durable - exp), _U64_MAX, False)
        if len(frames):
            pos, exp = int(end), int(frames[-1]["offset"]) + 1
        if exp < durable and (rc != impl.OK or not len(frames)):
            d = next((d for d in kept if d.position == pos), None)
            if d is None:
                break
            pos, exp = d.end, d.end_offset
    durable_end = min(pos, limit)
    u = unit_end(buf, durable_end, exp, limit)
    return (u[0] if u is not None else durable_end), kept


def walk_active(new_app: Callable[[], Any], walk: Callable[..., tuple[int, list[Any]]], buf: Any, length: int,
                base: int, durable: int | None, search_end: int | None) -> tuple[Any, list[Any]]:
    """Recovery's walk of an active store: ``walk(new_app(), ...)`` (pylog.segment.walk),
    then, with ``durable`` (every offset below it known durable), cut as :func:`keep_until`
    says: the walk is done again over the kept bytes only. Returns ``(appender, damage)``;
    the appender's position is where the store is to end."""
    app = new_app()
    _rc, damage = walk(app, buf, length, base, search_end=search_end)
    if durable is None:
        return app, damage

    def position_of(offset: int) -> tuple[int, int]:
        n = app.index_count
        if n and offset >= base:
            ibuf = app.index_view()
            slot = impl.index_lookup(ibuf, n, min(offset - base, 0xFFFFFFFF))
            if slot >= 0:
                rel, pos = impl.index_entry(ibuf, slot)
                return pos, base + rel
        return fmt.FILE_HEADER_SIZE, base

    cut, _kept = keep_until(buf, app.position, app.next_offset, damage, durable, position_of)
    if cut >= app.position:
        return app, damage
    app = new_app()
    _rc, damage = walk(app, buf, cut, base, search_end=None if search_end is None else min(search_end, cut))
    return app, damage


def readable_end(buf: Any, start: int, expected: int, stop: int, durable: Callable[[], int]) -> int:
    """Where a reader of a store another process writes stops among the whole, valid frames
    of ``buf[start:stop]`` (the first holding ``expected``): after the last one that ends a
    write unit, or after the last known durable one (offsets below ``durable()``, asked only
    when the frames end inside a unit), whichever is later. So a batch still being written
    out shows none of its records, and records that were durable (a unit a truncate split,
    a batch with damage in it) all show."""
    u = unit_end(buf, start, expected, stop)
    if u is not None and u[0] == stop:
        return stop
    keep = u[0] if u is not None else start
    d = durable()
    pos, exp = start, expected
    while exp < d and pos < stop:
        rc, frames, end = impl.scan(buf, stop, pos, exp, min(_CHUNK, d - exp), _U64_MAX, False)
        if not len(frames):
            break
        pos, exp = int(end), int(frames[-1]["offset"]) + 1
        if rc != impl.OK:
            break
    return max(keep, pos)
