"""The micro-batch reader: a stream of a topic's records, with Kafka's admission control.

Offsets are ``{topic: {partition: next_offset}}`` (string keys, sorted: Spark compares
offsets as JSON text). Each micro-batch is planned as a batch read is
(:mod:`pylog.spark.reading`): segment slices, one consistent snapshot of every partition's
end. ``maxOffsetsPerTrigger`` caps a batch (shared among partitions by backlog);
``minOffsetsPerTrigger`` holds a batch back until that many records are there or
``maxTriggerDelay`` has passed since the last batch (Python sources get one ReadLimit from
Spark, so the wait is done here); ``groupId`` copies the finished batches' ends into a
pylog consumer group (:mod:`pylog.spark.progress`).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pylog.errors import PylogError
from pylog.spark.options import _EARLIEST, _bool_opt, _duration_ms_opt, _int_opt, _pattern_opt, _root_opt
from pylog.spark.progress import GroupProgress
from pylog.spark.reading import (
    _bounds,
    _plan,
    _planning,
    _Positions,
    _read_slice,
    _reader,
    _selection,
    _Slice,
)

#: ``maxTriggerDelay``'s default, as Kafka's source has it (15 minutes).
MAX_TRIGGER_DELAY_MS = 15 * 60_000


def _canonical(offsets: Mapping[str, Mapping[Any, int]]) -> dict[str, dict[str, int]]:
    """{topic: {partition: next_offset}} with string keys in sorted order (Spark compares
    offsets as JSON text, so the key order must never change)."""
    return {t: {str(p): int(offsets[t][p]) for p in sorted(offsets[t], key=int)} for t in sorted(offsets)}


def _split_limit(backlog: dict[tuple[str, str], int], limit: int) -> dict[tuple[str, str], int]:
    """Share ``limit`` records among partitions in proportion to their backlog."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    take = {k: (v * limit) // total for k, v in backlog.items()}
    left = limit - sum(take.values())
    for k in sorted(backlog, key=lambda k: (-(backlog[k] - take[k]), k)):
        if left <= 0:
            break
        if take[k] < backlog[k]:
            take[k] += 1
            left -= 1
    return take


class PylogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets: ``{topic: {partition: next_offset}}``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.root = _root_opt(options)
        self.options = options
        self.fail = _bool_opt(options, "failondataloss", True)
        self.max_per_trigger = _int_opt(options, "maxoffsetspertrigger", None, lo=1)
        self.min_per_trigger = _int_opt(options, "minoffsetspertrigger", None, lo=1)
        self.max_delay_ms = _duration_ms_opt(options, "maxtriggerdelay", MAX_TRIGGER_DELAY_MS)
        self.min_partitions = _int_opt(options, "minpartitions", None, lo=1)
        self.max_records = _int_opt(options, "maxrecordsperpartition", None, lo=1)
        self.headers = _bool_opt(options, "includeheaders", False)
        self.positions = _Positions(options, stream=True)
        self.dynamic = _pattern_opt(options) is not None  # subscribePattern: topics come and go
        self.parts = _selection(options, self.root)  # fails at once on a missing topic or partition
        group = options.get("groupid")
        self.progress = GroupProgress(self.root, str(group)) if group is not None else None
        self.frozen: dict[str, dict[str, int]] | None = None
        self.last_trigger_ms: float | None = None  # when the last batch was let through (None: none yet)

    def _selected(self) -> dict[str, list[int]]:
        """The partitions read now: a pattern's topics are looked up again each time."""
        if self.dynamic:
            self.parts = _selection(self.options, self.root, strict=False)
        return self.parts

    def _bounds(self) -> dict[str, dict[int, tuple[int, int]]]:
        parts = self._selected()
        return _bounds(self.root, sorted(parts), parts)

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts (``startingOffsets`` and the timestamp options)."""
        bounds = self._bounds()
        pos = self.positions
        return _canonical(pos.starts(self.root, bounds, pos.start_spec, pos.start_by_ts, _EARLIEST))

    def _latest(self) -> dict[str, dict[str, int]]:
        bounds = self._bounds()
        return _canonical({t: {p: hi for p, (_lo, hi) in parts.items()} for t, parts in bounds.items()})

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the offsets an ``availableNow`` query reads up to."""
        self.frozen = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as Spark's ReadMaxRows, else everything."""
        if self.max_per_trigger is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The latest offsets, for the query's progress."""
        return self._latest()

    def _earliest(self, topic: str, p: str) -> int:
        """Where a partition first seen now starts: its earliest offset."""
        with _reader(self.root, topic, int(p)) as log:
            return 0 if log is None else log.start_offset

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next batch. ``start`` is the end of the last batch Spark finished
        (or the initial offset): with ``groupId``, committed into the group here too, as
        Spark calls :meth:`commit` for a batch only once it plans the next one."""
        if self.progress is not None:
            self.progress.commit(start)
        with _planning():
            return self._latest_offset(start, limit)

    def _latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        latest = self.frozen if self.frozen is not None else self._latest()
        begin: dict[tuple[str, str], int] = {}  # (topic, partition as in Spark's JSON offsets)
        backlog: dict[tuple[str, str], int] = {}
        for t, parts in latest.items():
            for p, hi in parts.items():
                s = start.get(t, {}).get(p)
                if s is None:
                    s = min(self._earliest(t, p), int(hi))  # a new partition
                elif int(hi) < int(s) and self.fail:  # truncated below what was read
                    raise _data_loss_end(t, p, int(s), int(hi))
                begin[(t, p)] = int(s)
                backlog[(t, p)] = max(0, int(hi) - int(s))
        if self._hold_back(sum(backlog.values())):
            return _canonical({t: dict(ps) for t, ps in start.items()})
        if isinstance(limit, ReadMaxRows):
            take = _split_limit(backlog, int(limit.max_rows))
        else:
            take = backlog
        end: dict[str, dict[str, int]] = {}
        for (t, p), s in begin.items():
            end.setdefault(t, {})[p] = s + take[(t, p)]
        for t, parts in start.items():  # never move backwards, never drop a partition
            for p, s in parts.items():
                e = end.setdefault(t, {})
                e[p] = max(int(e.get(p, s)), int(s))
        return _canonical(end)

    def _hold_back(self, available: int) -> bool:
        """Whether ``minOffsetsPerTrigger`` holds this trigger back: fewer records than it
        are there, and ``maxTriggerDelay`` has not passed since the last batch (never for
        an ``availableNow`` query, which stops at the first trigger with nothing to read)."""
        if self.min_per_trigger is None or self.frozen is not None or available == 0:
            return False
        now = time.monotonic() * 1000
        within_delay = self.last_trigger_ms is not None and now - self.last_trigger_ms < self.max_delay_ms
        if available < self.min_per_trigger and within_delay:
            return True
        self.last_trigger_ms = now
        return False

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The slices of the records in ``[start, end)``."""
        with _planning():
            return self._partitions(start, end)

    def _partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[_Slice]:
        starts: dict[str, dict[int, int]] = {}
        ends: dict[str, dict[int, int]] = {}
        for t, parts in end.items():
            for p, e in parts.items():
                s = start.get(t, {}).get(p)
                if s is None:  # a partition first seen in this batch: from its earliest offset
                    s = min(self._earliest(t, p), int(e))
                if int(e) > int(s):
                    starts.setdefault(t, {})[int(p)] = int(s)
                    ends.setdefault(t, {})[int(p)] = int(e)
        if not ends:
            return []
        return _plan(self.root, starts, ends, self.fail, self.min_partitions, self.max_records, self.headers)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one slice, as Arrow record batches."""
        return _read_slice(partition)  # type: ignore[arg-type]

    def commit(self, end: dict[str, Any]) -> None:
        """A batch ending at ``end`` is finished: with ``groupId``, commit ``end`` into the
        group (Spark's checkpoint stays what the query resumes from)."""
        if self.progress is not None:
            self.progress.commit(end)

    def stop(self) -> None:
        """Nothing to release (the planning logs are kept per process)."""


def _data_loss_end(topic: str, p: str, offset: int, end: int) -> PylogError:
    return PylogError(f"pylog: topic {topic!r} partition {p} ends at offset {end}, before offset {offset} the "
                     "query already read up to: the log was truncated (records were lost or replaced). "
                     "Set option failOnDataLoss=false to go on from the new records")
