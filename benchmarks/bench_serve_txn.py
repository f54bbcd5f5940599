"""`pylog serve` with transactional producers: the cost of a transaction (issue 28).

    python -m benchmarks.bench_serve_txn [--records 200000] [--size 100] [--runs 3]

For each run and each mode, a fresh broker process (``pylog serve`` on a free loopback
port, fresh root) and one confluent-kafka producer writing ``--records`` x ``--size`` B
into one partition (acks=all, librdkafka batching, ``linger.ms`` 5):

* ``idempotent``: ``enable.idempotence=true``, no transaction (the baseline);
* ``txn-100`` and ``txn-10000``: a transactional producer committing every 100 and every
  10,000 records.

The time runs from the first produce to the last commit (or the idempotent producer's
flush), and the records are then read back by a read_committed consumer to check that
every one is there. Prints the median records/s of each mode and each transactional
mode's share of the idempotent rate.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import tempfile
import time
from typing import Any

from benchmarks.bench_serve import start_broker

MODES = ("idempotent", "txn-100", "txn-10000")



def _send(p: Any, value: bytes) -> None:
    """Produce ``value`` to t/0, waiting while the client's queue is full."""
    while True:
        try:
            p.produce("t", value, partition=0)
            return
        except BufferError:
            p.poll(0.01)

def run(mode: str, n: int, size: int) -> float:
    """Records/s of one mode, on a fresh broker."""
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient, NewTopic

    root = tempfile.mkdtemp(prefix="pylog-bench-txn-")
    proc, bootstrap = start_broker(root, None)
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("t", 1, 1)])["t"].result(10)
        conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                "queue.buffering.max.messages": 1_000_000}
        value = b"x" * size
        if mode == "idempotent":
            p = ck.Producer({**conf, "enable.idempotence": True})
            t0 = time.perf_counter()
            for _ in range(n):
                _send(p, value)
            assert p.flush(120) == 0
        else:
            per = int(mode.split("-")[1])
            p = ck.Producer({**conf, "transactional.id": "bench"})
            p.init_transactions(30)
            t0 = time.perf_counter()
            done = 0
            while done < n:
                p.begin_transaction()
                for _ in range(min(per, n - done)):
                    _send(p, value)
                p.commit_transaction(120)
                done += min(per, n - done)
        elapsed = time.perf_counter() - t0
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "isolation.level": "read_committed",
                         "queued.min.messages": 1_000_000})
        c.assign([ck.TopicPartition("t", 0, 0)])
        got, end = 0, time.monotonic() + 120
        while got < n and time.monotonic() < end:
            got += sum(1 for m in c.consume(10_000, 0.5) if not m.error())
        c.close()
        if got != n:
            raise AssertionError(f"{mode}: read back {got} of {n} records")
        return n / elapsed
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    """Run the modes and print the medians (and a JSON line of them)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.runs):
        for mode in MODES:
            rates[mode].append(run(mode, args.records, args.size))
            print(f"run {r + 1} {mode:>10}: {rates[mode][-1]:12,.0f} records/s", flush=True)
    med = {m: statistics.median(v) for m, v in rates.items()}
    for mode in MODES:
        print(f"median {mode:>10}: {med[mode]:12,.0f} records/s  ({med[mode] / med['idempotent']:.0%} of idempotent)")
    print(json.dumps({"records": args.records, "size": args.size, "runs": args.runs, "median": med}))


if __name__ == "__main__":
    main()
