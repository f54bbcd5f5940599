"""The store-level model test of issue 14: several real processes (producers, consumers in
groups, tail readers, `pylog consume -g` runs, an admin and transactional producers) on
one data root, SIGKILLed at random and restarted, and a checker over their recorded
histories (tests/model_driver.py describes the journals and each rule).

``PYLOG_LONG=1`` runs more and longer runs; ``PYLOG_MODEL_SEED`` picks the first seed.
"""
from __future__ import annotations

import os
import re

import pytest
from conftest import scaled
from model_driver import check, has_transactions, run

#: Violations of cases of issue 14 that other changes are fixing right now: while only
#: these are found the test is an expected failure (it passes once they land). Remove an
#: entry when its fix is on main.
KNOWN_OPEN: dict[str, str] = {}


def known(violation: str) -> str | None:
    """The open case a violation belongs to, or None."""
    for pat, case in KNOWN_OPEN.items():
        if re.search(pat, violation.split(": ", 1)[1] if violation.startswith("seed ") else violation):
            return case
    return None


def test_store_model_multiprocess(tmp_path):
    """No acknowledged record lost, nothing shown that was not appended (or that belongs to
    an open or aborted transaction), bytes as appended, per-key order, keys where their
    key hashes, committed offsets never move back and restarts resume at them, across
    processes killed at random."""
    runs = scaled(2, 12)
    seconds = scaled(10, 40)
    total = {"runs": 0, "processes": 0, "kills": 0, "events": 0}
    failures = []
    for i in range(runs):
        seed = int(os.environ.get("PYLOG_MODEL_SEED", "1400")) + i
        st = run(str(tmp_path / f"run{i}"), seed, seconds)
        total["runs"] += 1
        total["processes"] += st.processes
        total["kills"] += st.kills
        total["events"] += st.events
        failures += [f"seed {seed}: {v}" for v in st.violations]
    print(f"\nstore model: {total['runs']} runs, {total['processes']} processes, {total['kills']} kills, "
          f"{total['events']} history events checked, {len(failures)} violations, "
          f"transactions {'on' if has_transactions() else 'off (not on main yet)'}")
    new = [v for v in failures if known(v) is None]
    assert not new, f"{len(new)} violations:\n" + "\n".join(new[:40])
    if failures:
        cases = sorted({known(v) for v in failures})
        pytest.xfail(f"{len(failures)} violations, all of open cases: {'; '.join(cases)}; first: {failures[0]}")


def _journal(path, *events):
    import json

    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def test_checker_finds_violations(tmp_path):
    """The checker is not vacuous: a lost acknowledged record, a record read that was never
    appended, one of an aborted transaction, damaged bytes, a committed offset moving back,
    a restart that skips records, a `pylog consume -g` run that reads again what its
    group had passed or skips records its group's commit (still in the log) had not passed,
    and a head run that passes more than its reader can have taken are each reported."""
    from model_driver import value_of

    import pylog

    root = tmp_path / "root"
    jdir = tmp_path / "journals"
    jdir.mkdir()
    with pylog.LogStore(str(root)) as s:
        t = s.create_topic("t", 1, fsync="always")
        t.append(value_of("p:0"))  # offset 0
        t.append(value_of("p:2"))  # offset 1: acked below as p:1's place, so p:1 is "lost"
        t.append(value_of("p:3"))  # offset 2
    cfg = {"fsync": "always"}
    _journal(jdir / "boot.jsonl",
             {"e": "admin-start", "op": "create", "topic": "t", "partitions": 1, "config": cfg, "t": 0},
             {"e": "admin-done", "op": "create", "topic": "t", "partitions": 1, "config": cfg, "res": None, "t": 1})
    _journal(jdir / "p.1.jsonl",
             {"e": "attempt", "topic": "t", "ids": ["p:0"], "keys": [None], "t": 2},
             {"e": "acked", "topic": "t", "ids": ["p:0"], "at": [[0, 0]], "t": 3},
             {"e": "attempt", "topic": "t", "ids": ["p:1"], "keys": [None], "t": 4},
             {"e": "acked", "topic": "t", "ids": ["p:1"], "at": [[0, 1]], "t": 5},
             {"e": "attempt", "topic": "t", "ids": ["p:2"], "keys": [None], "t": 6})
    _journal(jdir / "x.1.jsonl",
             {"e": "tx-begin", "tx": "x:tx0", "t": 7},
             {"e": "tx-attempt", "tx": "x:tx0", "topic": "t", "ids": ["x:0"], "keys": [None], "t": 8},
             {"e": "tx-aborted", "tx": "x:tx0", "t": 9})
    _journal(jdir / "c.1.jsonl",
             {"e": "resume", "topic": "t", "group": "g", "p": 0, "pos": 0, "committed": None, "t": 10},
             {"e": "read", "topic": "t", "group": "g", "p": 0, "t": 11,
              "recs": [[0, "p:0", False], [5, "ghost:0", True], [6, "x:0", True]]},
             {"e": "commit-start", "topic": "t", "group": "g", "offsets": {"0": 7}, "t": 12},
             {"e": "committed", "topic": "t", "group": "g", "offsets": {"0": 7}, "t": 13},
             {"e": "commit-start", "topic": "t", "group": "g", "offsets": {"0": 1}, "t": 14},
             {"e": "committed", "topic": "t", "group": "g", "offsets": {"0": 1}, "t": 15})
    _journal(jdir / "c.2.jsonl",
             {"e": "resume", "topic": "t", "group": "g", "p": 0, "pos": 1, "committed": 0, "t": 16})
    run = {"e": "cli-ran", "topic": "t", "group": "k", "rc": 0, "err": [], "traceback": False,
           "from_beginning": False, "pipe": 65536, "new_group": True}
    _journal(jdir / "k.1.jsonl",  # a new group prints nothing at the end, the next run reads from 0
             {**run, "mode": "n", "before": {"0": 2}, "next": {"0": 2}, "reads": {}, "t": 17},
             {**run, "mode": "end", "before": {"0": 2}, "next": {"0": 2}, "t": 18,
              "reads": {"0": [[0, "p:0", True], [1, "p:2", True]]}})
    kill = {**run, "mode": "kill", "rc": -9, "from_beginning": True, "before": {"0": 2}, "next": {"0": 2}}
    _journal(jdir / "k.2.jsonl",  # a killed run commits past what it printed
             {**kill, "group": "k2", "reads": {"0": [[0, "p:0", True]]}, "committed": {"0": 2}, "t": 19})
    _journal(jdir / "k.3.jsonl",  # killed before its first commit: the next run may start at the end
             {**kill, "group": "k3", "reads": {"0": [[0, "p:0", True]]}, "committed": {}, "t": 20},
             {**run, "group": "k3", "new_group": False, "mode": "n", "before": {"0": 3}, "next": {"0": 3},
              "reads": {"0": [[2, "p:3", True]]}, "committed": {"0": 3}, "t": 21})
    head = {**run, "mode": "head", "new_group": False, "before": {"0": 3}, "next": {"0": 3}, "reads": {},
            "committed": {"0": 2}}
    for g, pipe, t in (("k4", 4096, 22), ("k5", 50, 25)):  # a head run's reader took what it did not journal
        _journal(jdir / f"{g}.jsonl",
                 {**run, "group": g, "mode": "n", "before": {"0": 3}, "next": {"0": 3}, "from_beginning": True,
                  "reads": {"0": [[0, "p:0", True]]}, "committed": {"0": 1}, "t": t},
                 {**head, "group": g, "pipe": pipe, "t": t + 1},
                 {**run, "group": g, "mode": "end", "new_group": False, "before": {"0": 3}, "next": {"0": 3},
                  "reads": {"0": [[2, "p:3", True]]}, "committed": {"0": 3}, "t": t + 2})
    for g, start, t in (("k6", 2, 28), ("k7", 0, 30)):  # retention passed the group's commit (k6), or not
        _journal(jdir / f"{g}.jsonl",
                 {**run, "group": g, "mode": "n", "before": {"0": 3}, "next": {"0": 3}, "from_beginning": True,
                  "reads": {"0": [[0, "p:0", True]]}, "committed": {"0": 1}, "t": t},
                 {**run, "group": g, "mode": "n", "new_group": False, "before": {"0": 3}, "next": {"0": 3},
                  "committed_before": {"0": 1}, "start_offsets": {"0": start},
                  "reads": {"0": [[2, "p:3", True]]}, "committed": {"0": 3}, "t": t + 1})
    events, problems = check(str(root), str(jdir))
    assert events == 32
    text = "\n".join(problems)
    for what in ["'p:1' acknowledged at ('t', 0, 1) is lost", "bytes differ from what was appended for 'p:0'",
                 "'ghost:0' was never appended", "'x:0' of transaction x:tx0 which is aborted",
                 "committed 1 after 7", "started at 1, not at the committed offset 0 (skipped [0])",
                 "resumed from 0, last commit was 1", "-g k t/0 started at 0, before 2",
                 "-g k2 t/0 committed 2 after a kill run that printed up to 0"]:
        assert what in text, (what, problems)
    assert "-g k3" not in text, problems
    # one pipe's worth of lines may pass unjournaled (k4); not even one through a 50-byte pipe (k5)
    assert "-g k4" not in text, problems
    assert "-g k5 t/0 committed 2 after a head run that printed nothing of it, passing 1 records" in text, problems
    # a commit that retention removed from the log: the next run starts per auto_offset_reset (k6)
    assert "-g k6" not in text, problems
    assert "-g k7 t/0 started at 2, skipping [1] (1) after a n run; the group had committed 1" in text, problems
