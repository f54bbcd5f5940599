"""A history checker for the broker, in the spirit of Jepsen's Kafka workload.

Clients record every operation into a :class:`History` as they run (producers: each value
sent, then its ack with partition and offset or its error; consumers: each assignment and
revocation, each polled record, each commit). After the broker is stopped, :func:`read_log`
reads what the data root holds through the library, and :func:`check` compares the two. Every
value is unique (``p<producer>-<seq>``), so each record is attributed to one send.

Anomaly classes (the keys of :attr:`Report.anomalies`):

``lost_write``
    a value acknowledged to its producer, or read by a consumer, that the final log does not hold.
``duplicate``
    one value at two or more positions of the final log, written by an idempotent producer (or
    by no producer the history knows): a violation.
``duplicate_tolerated``
    the same for a producer without idempotence, whose retries may append a batch again: reported,
    not a violation.
``inconsistent_offset``
    one position (topic, partition, offset) holding two values across the final log, the acks and
    the consumers' polls (an ack's offset holding another value; two readers disagreeing).
``poll_skip``
    a consumer of a group jumping over offsets (from its previous poll of the partition within the
    assignment, or from the group's committed offset at its first poll) that the final log holds
    and that no member of the group ever polled.
``nonmonotonic_poll``
    a consumer polling an offset at or below the one it polled before in the same partition,
    within one assignment (no assign, revoke or seek between).

Transactions (a transactional producer records :meth:`History.txn_begin`, sends with
``txn=``, then :meth:`History.txn_commit_start` and :meth:`History.txn_commit` or
:meth:`History.txn_abort`):

``aborted_read``
    a value of an aborted transaction polled by a consumer, or held by the final log.
``partial_commit``
    a transaction seen in part: some of its values in the final log and others not (a torn
    transaction), or a committed one missing values it sent.
``read_before_commit``
    a value of a transaction polled before its producer asked for the commit (the poll is
    recorded before :meth:`History.txn_commit_start`): an uncommitted read.

Positions are (topic, partition, offset); values are text. A history is a list of dicts, one per
event, in the order they were recorded; :meth:`History.dump` and :func:`load` keep it as JSON
lines, so a failed run can be checked again from its file.
"""
from __future__ import annotations

import bisect
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

#: every anomaly class :func:`check` reports, in report order
CLASSES = ("lost_write", "duplicate", "duplicate_tolerated", "inconsistent_offset", "poll_skip",
           "nonmonotonic_poll", "aborted_read", "partial_commit", "read_before_commit")
#: the classes that break a promise of the broker (``duplicate_tolerated`` does not)
VIOLATIONS = tuple(c for c in CLASSES if c != "duplicate_tolerated")

Event = dict[str, Any]
Position = tuple[str, int, int]
#: the final log: (topic, partition) -> [(offset, value)] in offset order
FinalLog = dict[tuple[str, int], list[tuple[int, str]]]


class History:
    """A thread-safe recorder of client operations; each event gets an index ``i`` and the
    monotonic time ``t`` (seconds) of its recording."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def record(self, type: str, **fields: Any) -> Event:
        """Append one event of ``type`` with ``fields``; returns it."""
        with self._lock:
            ev = {"i": len(self.events), "t": round(time.monotonic() - self._t0, 4), "type": type, **fields}
            self.events.append(ev)
            return ev

    # -- producers ------------------------------------------------------------------------
    def producer(self, producer: str, client: str, idempotent: bool) -> None:
        """A producer starts: its name (the ``p<n>`` of its values), client and idempotence."""
        self.record("producer", producer=producer, client=client, idempotent=idempotent)

    def send(self, producer: str, topic: str, partition: int, value: str, txn: str | None = None) -> None:
        """``producer`` hands ``value`` to its client for ``partition`` of ``topic`` (in
        transaction ``txn``, a name unique in the history, when given)."""
        self.record("send", producer=producer, topic=topic, partition=partition, value=value, txn=txn)

    def txn_begin(self, producer: str, txn: str) -> None:
        """``producer`` begins transaction ``txn``."""
        self.record("txn_begin", producer=producer, txn=txn)

    def txn_commit_start(self, producer: str, txn: str) -> None:
        """``producer`` is about to ask for the commit of ``txn`` (recorded before the call)."""
        self.record("txn_commit_start", producer=producer, txn=txn)

    def txn_commit(self, producer: str, txn: str) -> None:
        """The commit of ``txn`` succeeded."""
        self.record("txn_commit", producer=producer, txn=txn)

    def txn_abort(self, producer: str, txn: str) -> None:
        """``txn`` was aborted (its abort succeeded, or the broker aborted it)."""
        self.record("txn_abort", producer=producer, txn=txn)

    def ack(self, producer: str, topic: str, partition: int, offset: int, value: str) -> None:
        """The broker acknowledged ``value`` at ``offset``."""
        self.record("ack", producer=producer, topic=topic, partition=partition, offset=offset, value=value)

    def error(self, producer: str, value: str, error: str) -> None:
        """The client gave up on ``value`` with ``error`` (it may still be in the log)."""
        self.record("error", producer=producer, value=value, error=error)

    # -- consumers ------------------------------------------------------------------------
    def assign(self, consumer: str, group: str, partitions: list[tuple[str, int]]) -> None:
        """``consumer`` of ``group`` was assigned ``partitions`` (a new assignment begins)."""
        self.record("assign", consumer=consumer, group=group, partitions=[list(p) for p in partitions])

    def revoke(self, consumer: str, group: str, partitions: list[tuple[str, int]], lost: bool = False) -> None:
        """``consumer`` lost its assignment of ``partitions`` (revoked, or ``lost``)."""
        self.record("revoke", consumer=consumer, group=group, partitions=[list(p) for p in partitions], lost=lost)

    def seek(self, consumer: str, group: str, topic: str, partition: int, offset: int) -> None:
        """``consumer`` moved its position in a partition to ``offset``."""
        self.record("seek", consumer=consumer, group=group, topic=topic, partition=partition, offset=offset)

    def poll(self, consumer: str, group: str, topic: str, partition: int, offset: int, value: str) -> None:
        """``consumer`` polled the record ``value`` at ``offset``."""
        self.record("poll", consumer=consumer, group=group, topic=topic, partition=partition, offset=offset,
                    value=value)

    def commit(self, consumer: str, group: str, topic: str, partition: int, offset: int) -> None:
        """A commit of ``offset`` (the next offset to read) for the group succeeded."""
        self.record("commit", consumer=consumer, group=group, topic=topic, partition=partition, offset=offset)

    def note(self, what: str, **fields: Any) -> None:
        """Anything else worth keeping in the history (a fault, a restart); the checker ignores it."""
        self.record("note", what=what, **fields)

    def dump(self, path: str) -> None:
        """Write the history as JSON lines."""
        with self._lock, open(path, "w") as f:
            for ev in self.events:
                f.write(json.dumps(ev) + "\n")


def load(path: str) -> list[Event]:
    """A history written by :meth:`History.dump`."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_log(root: str, topic: str) -> FinalLog:
    """Every record of ``topic`` under the data root ``root``, read through the library
    (read-only; the broker must be stopped or the reads may race its writes)."""
    import pylog

    store = pylog.LogStore(root, readonly=True)
    try:
        t = store.topic(topic)
        out: FinalLog = {}
        for p in range(t.partitions):
            log = t.reader(p)
            out[(topic, p)] = [(r.offset, bytes(r.value).decode()) for r in log.scan()]
        return out
    finally:
        store.close()


@dataclass
class Anomaly:
    """One anomaly: its class, the value or position concerned, and what was seen."""

    kind: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.where}: {self.detail}"


@dataclass
class Report:
    """What :func:`check` found: anomalies by class, and counts of what the history holds."""

    anomalies: dict[str, list[Anomaly]] = field(default_factory=lambda: {c: [] for c in CLASSES})
    stats: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """The number of anomalies of each class."""
        return {c: len(v) for c, v in self.anomalies.items()}

    def found(self) -> set[str]:
        """The classes with at least one anomaly."""
        return {c for c, v in self.anomalies.items() if v}

    def violations(self) -> list[Anomaly]:
        """The anomalies that break a promise (all but ``duplicate_tolerated``)."""
        return [a for c in VIOLATIONS for a in self.anomalies[c]]

    def summary(self, limit: int = 10) -> str:
        """Counts, stats and the first ``limit`` anomalies of each class, as text."""
        lines = ["anomalies: " + ", ".join(f"{c}={n}" for c, n in self.counts().items()),
                 "stats: " + ", ".join(f"{k}={v}" for k, v in self.stats.items())]
        for c in CLASSES:
            lines += [f"  {a}" for a in self.anomalies[c][:limit]]
        return "\n".join(lines)

    def add(self, kind: str, where: str, detail: str) -> None:
        """Record one anomaly of class ``kind``."""
        self.anomalies[kind].append(Anomaly(kind, where, detail))


def _pos(p: Position) -> str:
    return f"{p[0]}/{p[1]}@{p[2]}"


def check(events: list[Event], final: FinalLog) -> Report:
    """Compare a recorded history with the final log; returns every anomaly found."""
    rep = Report()
    idempotent: dict[str, bool] = {}
    sender: dict[str, str] = {}
    for ev in events:
        if ev["type"] == "producer":
            idempotent[ev["producer"]] = ev["idempotent"]
        elif ev["type"] == "send":
            sender[ev["value"]] = ev["producer"]

    # where the final log holds each value, and what it holds at each position
    log_at: dict[Position, str] = {}
    log_where: dict[str, list[Position]] = defaultdict(list)
    for (topic, part), records in final.items():
        for off, value in records:
            log_at[(topic, part, off)] = value
            log_where[value].append((topic, part, off))

    _lost_writes(rep, events, log_where)
    _duplicates(rep, log_where, sender, idempotent)
    _inconsistent(rep, events, log_at)
    _polls(rep, events, final)
    _transactions(rep, events, log_where)

    acked = {ev["value"] for ev in events if ev["type"] == "ack"}
    polled = {ev["value"] for ev in events if ev["type"] == "poll"}
    rep.stats = {
        "sent": sum(ev["type"] == "send" for ev in events),
        "acked": len(acked),
        "errors": sum(ev["type"] == "error" for ev in events),
        "polls": sum(ev["type"] == "poll" for ev in events),
        "polled_values": len(polled),
        "commits": sum(ev["type"] == "commit" for ev in events),
        "assignments": sum(ev["type"] == "assign" for ev in events),
        "log_records": len(log_at),
        # in the log though never acknowledged (an error, or no answer before the end): allowed
        "unacked_in_log": sum(1 for v in log_where if v not in acked),
        # in the log, never polled by any consumer: not an anomaly (consumers may lag)
        "unpolled_in_log": sum(1 for v in log_where if v not in polled),
    }
    return rep


def _lost_writes(rep: Report, events: list[Event], log_where: dict[str, list[Position]]) -> None:
    seen: set[str] = set()
    for ev in events:
        if ev["type"] not in ("ack", "poll") or ev["value"] in log_where or ev["value"] in seen:
            continue
        seen.add(ev["value"])
        who = f"acknowledged to {ev['producer']}" if ev["type"] == "ack" else f"polled by {ev['consumer']}"
        rep.add("lost_write", ev["value"],
                f"{who} at {_pos((ev['topic'], ev['partition'], ev['offset']))}; not in the final log")


def _duplicates(rep: Report, log_where: dict[str, list[Position]], sender: dict[str, str],
                idempotent: dict[str, bool]) -> None:
    for value, where in log_where.items():
        if len(where) < 2:
            continue
        producer = sender.get(value)
        tolerated = producer is not None and idempotent.get(producer) is False
        who = f"producer {producer}" if producer else "no known producer"
        rep.add("duplicate_tolerated" if tolerated else "duplicate", value,
                f"at {len(where)} positions {', '.join(map(_pos, where))} ({who}"
                f"{', not idempotent' if tolerated else ', idempotent' if producer else ''})")


def _inconsistent(rep: Report, events: list[Event], log_at: dict[Position, str]) -> None:
    views: dict[Position, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for pos, value in log_at.items():
        views[pos][value].append("final log")
    for ev in events:
        if ev["type"] == "ack":
            views[(ev["topic"], ev["partition"], ev["offset"])][ev["value"]].append(f"ack to {ev['producer']}")
        elif ev["type"] == "poll":
            views[(ev["topic"], ev["partition"], ev["offset"])][ev["value"]].append(f"poll by {ev['consumer']}")
    for pos in sorted(views):
        seen = views[pos]
        if len(seen) > 1:
            rep.add("inconsistent_offset", _pos(pos),
                    "; ".join(f"{v!r} ({', '.join(sorted(set(who)))})" for v, who in seen.items()))


def _polls(rep: Report, events: list[Event], final: FinalLog) -> None:
    """Poll skips and non-monotonic polls, per consumer and assignment."""
    offsets = {tp: [off for off, _ in recs] for tp, recs in final.items()}
    first = {tp: (offs[0] if offs else 0) for tp, offs in offsets.items()}
    group_seen: dict[str, set[Position]] = defaultdict(set)
    for ev in events:
        if ev["type"] == "poll":
            group_seen[ev["group"]].add((ev["topic"], ev["partition"], ev["offset"]))

    committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> highest commit so far
    last: dict[tuple[str, str, int], int] = {}  # (consumer, topic, partition) -> last polled this assignment
    for ev in events:
        kind = ev["type"]
        if kind == "commit":
            key = (ev["group"], ev["topic"], ev["partition"])
            committed[key] = max(committed.get(key, -1), ev["offset"])
        elif kind in ("assign", "revoke"):
            for k in [k for k in last if k[0] == ev["consumer"]]:
                del last[k]
        elif kind == "seek":
            last.pop((ev["consumer"], ev["topic"], ev["partition"]), None)
        elif kind == "poll":
            tp = (ev["topic"], ev["partition"])
            key = (ev["consumer"], *tp)
            off = ev["offset"]
            prev = last.get(key)
            if prev is not None and off <= prev:
                rep.add("nonmonotonic_poll", _pos((*tp, off)),
                        f"{ev['consumer']} polled offset {off} after {prev} in the same assignment")
            else:
                if prev is not None:
                    lo, why = prev + 1, f"after offset {prev}"
                else:
                    lo = committed.get((ev["group"], *tp), first.get(tp, 0))
                    why = f"at its first poll of the assignment (group position {lo})"
                offs = offsets.get(tp, [])
                between = offs[bisect.bisect_left(offs, lo):bisect.bisect_left(offs, off)]
                skipped = [o for o in between if (*tp, o) not in group_seen[ev["group"]]]
                if skipped:
                    rep.add("poll_skip", _pos((*tp, off)),
                            f"{ev['consumer']} polled offset {off} {why}; offsets "
                            f"{_ranges(skipped)} were never polled by group {ev['group']!r}")
            last[key] = off


def _transactions(rep: Report, events: list[Event], log_where: dict[str, list[Position]]) -> None:
    """Aborted reads, transactions seen in part, reads before the commit."""
    values: dict[str, list[str]] = defaultdict(list)  # txn -> its values
    of: dict[str, str] = {}  # value -> its txn
    outcome: dict[str, str] = {}
    commit_start: dict[str, int] = {}
    for ev in events:
        kind = ev["type"]
        if kind == "send" and ev.get("txn"):
            values[ev["txn"]].append(ev["value"])
            of[ev["value"]] = ev["txn"]
        elif kind == "txn_commit":
            outcome[ev["txn"]] = "committed"
        elif kind == "txn_abort":
            outcome.setdefault(ev["txn"], "aborted")  # (a commit that succeeded stands)
        elif kind == "txn_commit_start":
            commit_start.setdefault(ev["txn"], ev["i"])
    reported: set[str] = set()
    for ev in events:
        if ev["type"] != "poll" or ev["value"] not in of:
            continue
        txn = of[ev["value"]]
        where = _pos((ev["topic"], ev["partition"], ev["offset"]))
        if outcome.get(txn) == "aborted":
            if ev["value"] not in reported:
                reported.add(ev["value"])
                rep.add("aborted_read", ev["value"],
                        f"of aborted transaction {txn}, polled by {ev['consumer']} at {where}")
        elif ev["i"] < commit_start.get(txn, 1 << 62):
            rep.add("read_before_commit", ev["value"],
                    f"of transaction {txn}, polled by {ev['consumer']} at {where} before its commit was asked for")
    for txn, vals in values.items():
        present = [v for v in vals if v in log_where]
        if outcome.get(txn) == "aborted":
            for v in present:
                if v not in reported:
                    rep.add("aborted_read", v, f"of aborted transaction {txn}, in the final log")
        if present and len(present) < len(vals) or outcome.get(txn) == "committed" and len(present) < len(vals):
            missing = sorted(set(vals) - set(present))
            rep.add("partial_commit", txn, f"{outcome.get(txn, 'undecided')}; {len(present)} of its {len(vals)} "
                                           f"values in the final log, missing {missing[:5]}")


def _ranges(offs: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1-3, 7``."""
    out: list[str] = []
    start = prev = offs[0]
    for o in offs[1:] + [None]:  # type: ignore[list-item]
        if o is not None and o == prev + 1:
            prev = o
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if o is not None:
            start = prev = o
    return ", ".join(out)
