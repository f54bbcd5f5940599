"""`pylog bench --compare`'s closing lines: the targets, the count met, and the note that says
how loaded the machine was when a target was missed (a newcomer on a busy host saw a wall of
FAIL lines and no hint that the figures depend on the load)."""
from __future__ import annotations

import argparse
import json

import pytest

from pylog.bench import compare
from pylog.bench.common import Target


def _run(tmp_path, targets, load, quick=True):
    run = compare.Run(argparse.Namespace(quick=quick, tmpdir=str(tmp_path), silent=True))
    run.targets = targets
    run.load = load
    return run


def _targets():
    return [Target("append (each) vs file f.write per record", 0.9, 0.6, ">="),
            Target("scan records/s (memoryview values)", 0.7e6, 3e6, ">=", "rec/s"),
            Target("random read p50", 2.5, 1.5, "<=", "us"),
            Target("scan vs lmdb zero-copy cursor", None, 1.0, ">=", skipped="lmdb: not installed")]


def test_a_miss_on_a_busy_machine_says_so_with_the_load_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(compare.os, "cpu_count", lambda: 2)
    lines = compare.summary(_run(tmp_path, _targets(), [11.43, 15.65]), 85.2)
    assert lines[:4] == [
        "target: append (each) vs file f.write per record: measured 0.90x (goal >= 0.60x) PASS",
        "target: scan records/s (memoryview values): measured 0.70M rec/s (goal >= 3.00M rec/s) FAIL",
        "target: random read p50: measured 2.50 us (goal <= 1.50 us) FAIL",
        "target: scan vs lmdb zero-copy cursor: SKIP (lmdb: not installed)"]
    assert lines[4] == "compare: 1 of 3 targets met, 1 skipped (peer not run) (85 s)"
    assert lines[5] == (
        "note: 2 targets missed on a busy machine: the load average was 11.4 at the start and 15.7 at the end, "
        "on 2 cores, so other work was taking CPU from this run. The targets are set for a quiet machine: rerun "
        "when the load average is below the core count and without --quick (its small sizes are noisier) "
        "before reading a miss as a slowdown")
    assert len(lines) == 6


def test_a_miss_on_a_quiet_machine_is_worth_a_look(tmp_path, monkeypatch):
    monkeypatch.setattr(compare.os, "cpu_count", lambda: 8)
    lines = compare.summary(_run(tmp_path, _targets()[:3], [0.2, 0.4], quick=False), 300)
    assert lines[-1] == ("note: 2 targets missed on a quiet machine (the load average was 0.2 at the start and "
                         "0.4 at the end, on 8 cores): a miss here is worth a look; docs/benchmarks.md has the "
                         "figures of earlier runs")
    # busy at either end counts: the load that took the CPU may have come or gone during the run
    assert "busy machine" in compare.summary(_run(tmp_path, _targets()[:3], [0.2, 9.0]), 1)[-1]


def test_no_note_when_every_target_is_met_or_skipped(tmp_path):
    targets = [_targets()[0], _targets()[3]]
    lines = compare.summary(_run(tmp_path, targets, [14.0, 14.0]), 60)
    assert lines[-1] == "compare: 1 of 1 targets met, 1 skipped (peer not run) (60 s)"
    assert not any(line.startswith("note:") for line in lines)


@pytest.mark.parametrize("load", [[None, None], [None, 3.0]])
def test_the_note_without_a_load_average(load):
    note = compare.load_note(1, load, 2, quick=False)
    if load[1] is None:
        assert note == ("note: 1 target missed; this system reports no load average: speed targets are set for a "
                        "quiet machine, so rerun with nothing else running before reading a miss as a slowdown")
    else:
        assert note.startswith("note: 1 target missed on a busy machine: the load average was 3.0, on 2 cores")


def test_the_conditions_line_records_the_load(tmp_path):
    run = _run(tmp_path, [], [1.5, 2.25])
    assert json.loads(json.dumps(run.conditions()))["load"] == [1.5, 2.25]
    assert compare.load_average() is None or compare.load_average() >= 0
