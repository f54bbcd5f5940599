"""pylog serve under faults, checked as Jepsen checks Kafka (issue 25).

Four producers (confluent-kafka and kafka-python, each idempotent and not, acks=all) and
three confluent-kafka consumers of one group run against a ``pylog serve`` whose topic
fsyncs every Produce (``flush.messages=1``), while the broker is SIGKILLed and restarted on
the same port and root, SIGSTOPped for longer than the clients' timeouts, and killed by
strace at an fdatasync (records in the file, not yet durable, producer state not written).
tests/history.py checks the recorded history against the final log: no acknowledged write
lost, no position holding two values, no duplicate from an idempotent producer, no consumer
skipping or going back. 20 faults here (65-90 s on a loaded 2-core machine);
``PYLOG_LONG=1`` runs 300. ``PYLOG_HISTORY_SEED`` replays a seed's fault plan (the timing of the faults
varies), ``PYLOG_HISTORY_DIR`` keeps the run's files (``history.jsonl``, the broker's logs, the
data root) in an empty directory of your choice.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("kio")
pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

from conftest import scaled  # noqa: E402
from history_run import run  # noqa: E402


@pytest.mark.crash
def test_history_under_kills_pauses_and_fdatasync_kills(tmp_path):
    faults = scaled(20, 300)
    seed = int(os.environ.get("PYLOG_HISTORY_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    workdir = os.environ.get("PYLOG_HISTORY_DIR") or str(tmp_path)  # keep the history and broker logs
    os.makedirs(workdir, exist_ok=True)
    out = run(workdir, faults=faults, seed=seed)
    rep = out.report
    print(f"seed={seed} seconds={out.seconds:.1f} faults={out.faults} unresolved={out.unresolved} "
          f"consumer_errors={out.consumer_errors} caught_up={out.caught_up}\n{rep.summary()}")
    print("idempotent duplicates by the first fault after the send (values, faults with any, faults): "
          + ", ".join(f"{k}: {v}" for k, v in out.blamed.items()))
    print("\n".join(out.explained[:40]))
    assert not out.failures, out.failures
    assert not out.crashes and not out.broker_tracebacks, (out.crashes, out.broker_tracebacks)
    assert sum(out.faults.values()) == faults and out.faults.get("kill") and out.faults.get("pause")
    assert rep.stats["acked"] > 100 * faults and rep.stats["polled_values"] > 100 * faults
    assert rep.stats["assignments"] > 3 and rep.stats["commits"] > 3  # the group rebalanced and committed
    assert rep.violations() == [], f"seed {seed}, history in {out.history_file}\n{rep.summary()}"
    assert out.unresolved == 0 and out.caught_up and rep.stats["unpolled_in_log"] == 0
    assert out.stop_status == 0  # SIGTERM after all that: a clean stop
