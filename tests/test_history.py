"""The history checker (tests/history.py) on synthetic histories: a clean history reports
nothing, and each history built to hold one anomaly reports exactly that anomaly, so a broker
test that runs the checker cannot pass because the checker looks away."""
from __future__ import annotations

import pytest
from history import CLASSES, VIOLATIONS, History, check, load, read_log

import pylog

T = "t"


def _clean() -> tuple[History, dict]:  # type: ignore[type-arg]
    """Two producers (p1 idempotent, p2 not) write 4 values each into 2 partitions; consumer
    c1 of group g reads everything in order and commits; the final log holds it all."""
    h = History()
    h.producer("p1", "confluent-kafka", True)
    h.producer("p2", "kafka-python", False)
    final: dict = {(T, 0): [], (T, 1): []}  # type: ignore[type-arg]
    for seq in range(4):
        for prod in ("p1", "p2"):
            v = f"{prod}-{seq}"
            part = seq % 2
            h.send(prod, T, part, v)
            off = len(final[(T, part)])
            final[(T, part)].append((off, v))
            h.ack(prod, T, part, off, v)
    h.assign("c1", "g", [(T, 0), (T, 1)])
    for part in (0, 1):
        for off, v in final[(T, part)]:
            h.poll("c1", "g", T, part, off, v)
        h.commit("c1", "g", T, part, len(final[(T, part)]))
    return h, final


def _found(h: History, final: dict) -> dict[str, int]:  # type: ignore[type-arg]
    rep = check(h.events, final)
    return {c: n for c, n in rep.counts().items() if n}


def test_clean_history_reports_nothing():
    h, final = _clean()
    rep = check(h.events, final)
    assert rep.found() == set() and rep.violations() == []
    assert rep.stats["sent"] == rep.stats["acked"] == rep.stats["log_records"] == rep.stats["polled_values"] == 8
    assert rep.stats["unacked_in_log"] == rep.stats["unpolled_in_log"] == 0


def test_lost_write_acknowledged_value_missing_from_the_log():
    h, final = _clean()
    lost = final[(T, 1)].pop()  # the log lost its tail record, which was acknowledged (and polled)
    rep = check(h.events, final)
    assert _found(h, final) == {"lost_write": 1}
    assert rep.anomalies["lost_write"][0].where == lost[1]
    assert "acknowledged to p2 at t/1@3" in rep.anomalies["lost_write"][0].detail


def test_lost_write_polled_value_missing_from_the_log():
    h = History()
    h.producer("p1", "confluent-kafka", True)
    h.send("p1", T, 0, "p1-0")  # never acknowledged (an error), but a consumer read it
    h.error("p1", "p1-0", "timed out")
    h.assign("c1", "g", [(T, 0)])
    h.poll("c1", "g", T, 0, 0, "p1-0")
    assert _found(h, {(T, 0): []}) == {"lost_write": 1}


def test_an_unacknowledged_value_in_the_log_is_no_anomaly():
    h, final = _clean()
    h.send("p1", T, 0, "p1-9")
    h.error("p1", "p1-9", "message timed out")
    final[(T, 0)].append((4, "p1-9"))  # it was written after all
    rep = check(h.events, final)
    assert rep.found() == set()
    assert rep.stats["unacked_in_log"] == 1 and rep.stats["unpolled_in_log"] == 1


@pytest.mark.parametrize("producer, kind", [("p1", "duplicate"), ("p2", "duplicate_tolerated")])
def test_duplicate_idempotent_or_tolerated(producer, kind):
    h, final = _clean()
    v = f"{producer}-2"
    final[(T, 0)].append((4, v))  # a retry appended again
    rep = check(h.events, final)
    assert _found(h, final) == {kind: 1}
    first = {"p1": 2, "p2": 3}[producer]  # partition 0 holds p1-0 p2-0 p1-2 p2-2
    assert rep.anomalies[kind][0].where == v and f"t/0@{first}, t/0@4" in rep.anomalies[kind][0].detail
    assert (rep.violations() != []) == (kind == "duplicate")


def test_duplicate_of_a_value_no_producer_sent_is_a_violation():
    h, final = _clean()
    final[(T, 0)] += [(4, "x"), (5, "x")]
    assert _found(h, final) == {"duplicate": 1}


def test_inconsistent_offset_ack_names_a_position_holding_another_value():
    h, final = _clean()
    for ev in h.events:
        if ev["type"] == "ack" and ev["value"] == "p2-1":
            ev["offset"] = 0  # told offset 0, which holds p1-1; p2-1 is at offset 1
    rep = check(h.events, final)
    assert _found(h, final) == {"inconsistent_offset": 1}
    a = rep.anomalies["inconsistent_offset"][0]
    assert a.where == "t/1@0" and "'p2-1' (ack to p2)" in a.detail
    assert "'p1-1' (ack to p1, final log, poll by c1)" in a.detail


def test_inconsistent_offset_two_readers_disagree():
    h, final = _clean()
    h.assign("c9", "other", [(T, 0)])
    h.poll("c9", "other", T, 0, 0, "p1-0")
    h.poll("c9", "other", T, 0, 1, "p1-0")  # offset 1 holds p2-0 for everyone else
    rep = check(h.events, final)
    assert _found(h, final) == {"inconsistent_offset": 1}
    assert rep.anomalies["inconsistent_offset"][0].where == "t/0@1"


def _skip_history(seen_by_other: bool) -> tuple[History, dict]:  # type: ignore[type-arg]
    h = History()
    h.producer("p1", "confluent-kafka", True)
    final = {(T, 0): [(o, f"p1-{o}") for o in range(6)]}
    for o, v in final[(T, 0)]:
        h.send("p1", T, 0, v)
        h.ack("p1", T, 0, o, v)
    h.assign("c1", "g", [(T, 0)])
    if seen_by_other:
        h.assign("c2", "g", [(T, 0)])
        h.poll("c2", "g", T, 0, 2, "p1-2")
        h.poll("c2", "g", T, 0, 3, "p1-3")
    for o in (0, 1, 4, 5):  # jumps over 2 and 3
        h.poll("c1", "g", T, 0, o, f"p1-{o}")
    return h, final


def test_poll_skip_within_an_assignment():
    h, final = _skip_history(seen_by_other=False)
    rep = check(h.events, final)
    assert _found(h, final) == {"poll_skip": 1}
    assert "offsets 2-3 were never polled by group 'g'" in rep.anomalies["poll_skip"][0].detail
    h, final = _skip_history(seen_by_other=True)  # another member of the group saw them: no skip
    assert _found(h, final) == {}


def test_poll_skip_past_the_committed_offset_after_a_rebalance():
    h, final = _skip_history(seen_by_other=False)
    h.events = [ev for ev in h.events if ev["type"] != "poll"]
    for o in (0, 1):
        h.poll("c1", "g", T, 0, o, f"p1-{o}")
    h.commit("c1", "g", T, 0, 2)
    h.revoke("c1", "g", [(T, 0)])
    h.assign("c2", "g", [(T, 0)])
    h.poll("c2", "g", T, 0, 4, "p1-4")  # the group's position was 2
    h.poll("c2", "g", T, 0, 5, "p1-5")
    rep = check(h.events, final)
    assert _found(h, final) == {"poll_skip": 1}
    assert "group position 2" in rep.anomalies["poll_skip"][0].detail
    # a group that never committed starts at the log's first offset: 0 and 1 skipped
    h.events = [ev for ev in h.events if ev.get("consumer") != "c1" and ev["type"] != "commit"]
    rep = check(h.events, final)
    assert _found(h, final) == {"poll_skip": 1}
    assert "offsets 0-3 were never polled" in rep.anomalies["poll_skip"][0].detail


def test_a_rebalance_replaying_committed_records_is_no_anomaly():
    h, final = _skip_history(seen_by_other=False)
    h.events = [ev for ev in h.events if ev["type"] != "poll"]
    for o in range(4):
        h.poll("c1", "g", T, 0, o, f"p1-{o}")
    h.commit("c1", "g", T, 0, 2)  # 2 and 3 polled but not committed: the next owner polls them again
    h.revoke("c1", "g", [(T, 0)])
    h.assign("c2", "g", [(T, 0)])
    for o in range(2, 6):
        h.poll("c2", "g", T, 0, o, f"p1-{o}")
    assert _found(h, final) == {}


def _backwards(between: str | None) -> tuple[History, dict]:  # type: ignore[type-arg]
    h, final = _clean()
    if between == "assign":
        h.revoke("c1", "g", [(T, 0), (T, 1)])
        h.assign("c1", "g", [(T, 0)])
    elif between == "seek":
        h.seek("c1", "g", T, 0, 1)
    h.poll("c1", "g", T, 0, 1, "p2-0")  # again, after offset 3
    h.poll("c1", "g", T, 0, 2, "p1-2")
    return h, final


def test_nonmonotonic_poll_within_an_assignment():
    h, final = _backwards(None)
    rep = check(h.events, final)
    assert _found(h, final) == {"nonmonotonic_poll": 1}  # reported once, at the jump back
    assert "c1 polled offset 1 after 3" in rep.anomalies["nonmonotonic_poll"][0].detail
    for between in ("assign", "seek"):  # a new assignment, or a seek: allowed
        h, final = _backwards(between)
        assert _found(h, final) == {}, between


def test_nonmonotonic_poll_the_same_offset_twice():
    h, final = _clean()
    h.poll("c1", "g", T, 1, 3, "p2-3")  # offset 3 of partition 1 again, in the same assignment
    rep = check(h.events, final)
    assert _found(h, final) == {"nonmonotonic_poll": 1}
    assert "c1 polled offset 3 after 3" in rep.anomalies["nonmonotonic_poll"][0].detail


# -- transactions ---------------------------------------------------------------------------
def _txns() -> tuple[History, dict]:  # type: ignore[type-arg]
    """Transactional producer p3: x1 (2 values, committed, in the log), x2 (aborted, not in
    the log); consumer c2 reads x1 after its commit."""
    h = History()
    h.producer("p3", "confluent-kafka", True)
    final: dict = {(T, 0): [(0, "p3-0"), (1, "p3-1")]}  # type: ignore[type-arg]
    h.txn_begin("p3", "x1")
    h.send("p3", T, 0, "p3-0", txn="x1")
    h.send("p3", T, 0, "p3-1", txn="x1")
    h.txn_commit_start("p3", "x1")
    h.txn_commit("p3", "x1")
    h.txn_begin("p3", "x2")
    h.send("p3", T, 0, "p3-2", txn="x2")
    h.txn_abort("p3", "x2")
    h.assign("c2", "g2", [(T, 0)])
    h.poll("c2", "g2", T, 0, 0, "p3-0")
    h.poll("c2", "g2", T, 0, 1, "p3-1")
    return h, final


def test_clean_transactions_report_nothing():
    h, final = _txns()
    assert _found(h, final) == {}


def test_aborted_read_polled_or_in_the_log():
    h, final = _txns()
    final[(T, 0)].append((2, "p3-2"))
    h.poll("c2", "g2", T, 0, 2, "p3-2")
    rep = check(h.events, final)
    assert rep.counts()["aborted_read"] == 1 and "aborted transaction x2" in str(rep.anomalies["aborted_read"][0])
    assert _found(h, final) == {"aborted_read": 1}
    h2, final2 = _txns()
    final2[(T, 0)].append((2, "p3-2"))  # in the log, polled by nobody
    assert _found(h2, final2) == {"aborted_read": 1}


def test_partial_commit_a_transaction_seen_in_part():
    h, final = _txns()
    final[(T, 0)].pop()  # p3-1 of the committed x1 is missing
    found = _found(h, final)
    assert found["partial_commit"] == 1 and "1 of its 2 values" in str(check(h.events, final).anomalies[
        "partial_commit"][0])
    # an undecided transaction (its producer died) half in the log is torn too
    h2, final2 = _txns()
    h2.txn_begin("p3", "x3")
    h2.send("p3", T, 0, "p3-3", txn="x3")
    h2.send("p3", T, 0, "p3-4", txn="x3")
    final2[(T, 0)].append((2, "p3-3"))
    assert _found(h2, final2) == {"partial_commit": 1}


def test_read_before_commit():
    h = History()
    h.producer("p3", "confluent-kafka", True)
    final: dict = {(T, 0): [(0, "p3-0")]}  # type: ignore[type-arg]
    h.txn_begin("p3", "x1")
    h.send("p3", T, 0, "p3-0", txn="x1")
    h.assign("c2", "g2", [(T, 0)])
    h.poll("c2", "g2", T, 0, 0, "p3-0")  # before the producer asked for the commit
    h.txn_commit_start("p3", "x1")
    h.txn_commit("p3", "x1")
    assert _found(h, final) == {"read_before_commit": 1}


def test_each_class_has_a_test_and_violations_exclude_tolerated_duplicates():
    assert set(VIOLATIONS) == set(CLASSES) - {"duplicate_tolerated"}
    src = open(__file__).read()
    for c in CLASSES:
        assert f'"{c}"' in src.split("def test_each_class")[0], c


def test_dump_load_and_read_log_through_the_library(tmp_path):
    h, final = _clean()
    h.dump(str(tmp_path / "h.jsonl"))
    assert load(str(tmp_path / "h.jsonl")) == h.events
    store = pylog.LogStore(str(tmp_path / "root"))
    t = store.create_topic(T, partitions=2)
    for (_, part), recs in final.items():
        for _, v in recs:
            t.append(v.encode(), partition=part)
    store.close()
    assert read_log(str(tmp_path / "root"), T) == final
    assert check(h.events, read_log(str(tmp_path / "root"), T)).found() == set()

