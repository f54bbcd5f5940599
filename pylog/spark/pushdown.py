"""Filter pushdown: Spark's pushed filters on ``topic``, ``partition``, ``offset`` and
``timestamp`` turned into what a read plans (topics and partitions kept, offset ranges).

Spark (>= 4.1, with ``spark.sql.python.filterPushdown.enabled``) hands the reader the
conjuncts of a query's ``WHERE`` that it can express as filter objects (``EqualTo``,
``GreaterThan``, ``In``, ``Not(...)``, ...; ``OR`` is never pushed). A filter the reader keeps
is **trusted**: Spark never evaluates it again. So a filter is kept only when the plan
applies it exactly:

* ``topic`` and ``partition`` filters are evaluated here, once per topic and partition of
  the read (their values are known when the query is planned): exact.
* ``offset`` filters become a set of offset ranges, intersected with the read's own
  ``[start, end)``: exact. An ``IN`` (or a ``NOT``) with more than :data:`MAX_RANGES` ranges
  is planned as the range that covers them all and handed back to Spark.
* ``timestamp`` filters become a range of milliseconds, then per partition a range of
  offsets through the log's time index (:meth:`pylog.Log.offset_for_time`). A log whose
  timestamps never decrease (the default) holds a time range's records in one offset range,
  and the pruning is exact; one that keeps them as given (``timestamps="as-given"``) is cut
  only before the range's first record. Spark re-applies these filters anyway (they are
  handed back), so no matching record is ever dropped.

Anything else (another column, a null or non-integer value, a nested column) goes back to
Spark unchanged.
"""
from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

#: A pushed offset filter with more ranges than this (a long ``IN`` list) is planned as the
#: one range covering them and handed back to Spark: one task per range would cost more.
MAX_RANGES = 64

_INF = 1 << 80  # beyond every offset and every timestamp in microseconds
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)

Ranges = list[tuple[int, int]]  # sorted, disjoint, non-adjacent half-open [a, b)
ALL: Ranges = [(-_INF, _INF)]


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, merged ranges with the empty ones dropped."""
    out: Ranges = []
    for a, b in sorted(r for r in ranges if r[0] < r[1]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def intersect(x: Ranges, y: Ranges) -> Ranges:
    """The ranges in both ``x`` and ``y`` (both normalized)."""
    out: Ranges = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def complement(x: Ranges) -> Ranges:
    """Every integer in (-inf, inf) not in ``x`` (normalized)."""
    out: Ranges = []
    prev = -_INF
    for a, b in x:
        if prev < a:
            out.append((prev, a))
        prev = b
    if prev < _INF:
        out.append((prev, _INF))
    return out


def _column(f: Filter) -> str | None:
    if isinstance(f, Not):
        return _column(f.child)
    attr = getattr(f, "attribute", None)
    if isinstance(attr, tuple) and len(attr) == 1 and isinstance(attr[0], str):
        return attr[0]
    return None


def _ranges(f: Filter, conv: Callable[[Any], int | None]) -> Ranges | None:
    """The integers (after ``conv``) for which ``f`` is true, or None if ``f`` cannot be
    expressed so (then it is left to Spark). The columns are never null, so ``IS NULL`` is
    false and ``IS NOT NULL`` true; a comparison with a null literal is left to Spark
    (SQL's three-valued logic would make its ``NOT`` wrong here)."""
    if isinstance(f, Not):
        inner = _ranges(f.child, conv)
        return None if inner is None else complement(inner)
    if isinstance(f, IsNull):
        return []
    if isinstance(f, IsNotNull):
        return list(ALL)
    if isinstance(f, EqualNullSafe) and f.value is None:
        return []
    if isinstance(f, In):
        if not isinstance(f.value, (tuple, list)):
            return None
        points: list[int] = []
        for item in f.value:
            p = conv(item)
            if p is None:
                return None
            points.append(p)
        return normalize((p, p + 1) for p in points)
    if not isinstance(f, (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
        return None
    v = conv(f.value)
    if v is None:
        return None
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return [(v, v + 1)]
    if isinstance(f, GreaterThan):
        return [(v + 1, _INF)]
    if isinstance(f, GreaterThanOrEqual):
        return [(v, _INF)]
    if isinstance(f, LessThan):
        return [(-_INF, v)]
    return [(-_INF, v + 1)]  # LessThanOrEqual


def _int_value(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _micros(v: Any) -> int | None:
    """A timestamp literal in microseconds since the epoch (an aware datetime, as Spark
    pushes a TIMESTAMP column's literals), else None."""
    if isinstance(v, _dt.datetime) and v.tzinfo is not None:
        return (v - _EPOCH) // _dt.timedelta(microseconds=1)
    return None


def micros_to_millis(x: Ranges) -> Ranges:
    """Microsecond ranges as the millisecond ranges of the same records: a record at
    ``m`` ms is at ``m * 1000`` us, inside ``[a, b)`` iff ``ceil(a/1000) <= m < ceil(b/1000)``."""
    return normalize((-(-a // 1000), -(-b // 1000)) for a, b in x)


def _matches(f: Filter, value: Any) -> bool | None:
    """``f`` evaluated on a known non-null value of its column (a topic name or a
    partition number), or None if it is not a filter this can evaluate exactly."""
    if isinstance(f, Not):
        inner = _matches(f.child, value)
        return None if inner is None else not inner
    if isinstance(f, IsNull):
        return False
    if isinstance(f, IsNotNull):
        return True
    lit = getattr(f, "value", None)
    same = isinstance(value, str)
    if isinstance(f, In):
        if not isinstance(lit, (tuple, list)) or any(v is None or not _comparable(v, same) for v in lit):
            return None
        return value in lit
    if isinstance(f, EqualNullSafe) and lit is None:
        return False
    if lit is None or not _comparable(lit, same):
        return None
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return bool(value == lit)
    if isinstance(f, GreaterThan):
        return bool(value > lit)
    if isinstance(f, GreaterThanOrEqual):
        return bool(value >= lit)
    if isinstance(f, LessThan):
        return bool(value < lit)
    if isinstance(f, LessThanOrEqual):
        return bool(value <= lit)
    if same and isinstance(f, StringStartsWith):
        return bool(value.startswith(lit))
    if same and isinstance(f, StringEndsWith):
        return bool(value.endswith(lit))
    if same and isinstance(f, StringContains):
        return lit in value
    return None


def _comparable(lit: Any, string: bool) -> bool:
    if string:
        return isinstance(lit, str)
    return isinstance(lit, int) and not isinstance(lit, bool)


class Pushed:
    """The filters a read accepted, in a form its planning applies: picklable (it is part of
    the reader Spark ships to its tasks), no pyspark object kept."""

    def __init__(self) -> None:
        #: (topic, partition) pairs the topic/partition filters drop
        self.dropped: set[tuple[str, int]] = set()
        #: offsets kept by the offset filters
        self.offsets: Ranges = list(ALL)
        #: milliseconds kept by the timestamp filters
        self.millis: Ranges = list(ALL)
        #: how many filters were applied (for tests and ``explain``-like checks)
        self.count = 0

    def push(self, filters: list[Filter], parts: dict[str, list[int]]) -> list[Filter]:
        """Apply ``filters`` (Spark's conjuncts) to the plan of a read of ``parts``
        ({topic: [partition, ...]}); return those Spark must still evaluate."""
        unhandled: list[Filter] = []
        for f in filters:
            col = _column(f)
            if col == "topic" or col == "partition":
                verdicts = {}
                for t, ps in parts.items():
                    for p in ps:
                        verdicts[(t, p)] = _matches(f, t if col == "topic" else p)
                if any(v is None for v in verdicts.values()):
                    unhandled.append(f)
                    continue
                self.dropped.update(k for k, v in verdicts.items() if not v)
                self.count += 1
            elif col == "offset":
                r = _ranges(f, _int_value)
                if r is None:
                    unhandled.append(f)
                    continue
                if len(r) > MAX_RANGES:  # plan the hull, let Spark apply the filter
                    self.offsets = intersect(self.offsets, [(r[0][0], r[-1][1])])
                    unhandled.append(f)
                    continue
                self.offsets = intersect(self.offsets, r)
                self.count += 1
            elif col == "timestamp":
                r = _ranges(f, _micros)
                if r is not None:
                    ms = micros_to_millis(r)
                    if len(ms) > MAX_RANGES:
                        ms = [(ms[0][0], ms[-1][1])] if ms else []
                    self.millis = intersect(self.millis, ms)
                unhandled.append(f)  # pruned here, re-applied by Spark (see the module doc)
            else:
                unhandled.append(f)
        return unhandled
