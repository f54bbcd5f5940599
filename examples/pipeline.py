"""A data pipeline on Spark over pylog topics, checked end to end.

    python examples/pipeline.py [--root DIR] [--events N]

1. Produce: N JSON events (``{"user": ..., "action": ..., "amount": ...}``, keyed by user)
   into the topic ``events`` (4 partitions) with pylog's own producer API.
2. Batch job: Spark reads ``events``, totals the amounts per user and action, and appends
   one JSON record per user to the topic ``user-totals`` (transactional: all or nothing).
3. Streaming job (``availableNow``): Spark streams the purchases out of ``events`` into the
   topic ``purchases``; more events arrive and the same query runs again from its
   checkpoint, taking only the new ones.
4. Check: the totals are recomputed in plain Python from the events and compared; every
   purchase must be in ``purchases`` exactly once. Prints a short summary and exits non-zero
   if anything disagrees.

Needs pyspark, pyarrow and a Java runtime (``pip install "pylog-commitlog[spark]"``).

On a busy machine: the streaming source's Python process is one Spark starts on its own,
and the JVM gives it a fixed 10 s to connect back ("Python worker failed to connect back");
pyspark's imports alone take about 0.9 s of CPU before it does. Unless ``PYSPARK_PYTHON`` is
set, the job's workers run ``spark_python.py`` (next to this file), which connects first and
imports after. A stage that fails to connect back all the same is run again (``with_retry``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pylog


def produce(store: pylog.LogStore, n: int, seed: int) -> list[dict]:
    """Append ``n`` events to topic ``events``; returns them."""
    rng = random.Random(seed)
    actions = ["view", "view", "view", "cart", "purchase"]
    events = [{"user": f"user-{rng.randrange(40):02d}", "action": rng.choice(actions),
               "amount": rng.randrange(1, 500), "seq": seed * 1_000_000 + i} for i in range(n)]
    topic = store.topic("events")
    topic.append_batch([json.dumps(e, sort_keys=True).encode() for e in events],
                       keys=[e["user"].encode() for e in events])
    store.flush()
    return events


def connect_back_failed(e: BaseException) -> bool:
    """Whether ``e`` is Spark's "Python worker failed to connect back": the JVM waits a fixed
    10 s for a Python worker it started, which a starved machine can miss. Nothing was
    written then (the batch write is one transaction; the stream resumes from its checkpoint,
    and its sink skips a batch id it committed already), so the stage can run again."""
    return "failed to connect back" in str(e)


#: runs of a stage whose Python worker failed to connect back (before spark_python.py, a load
#: average of 20 on two cores made two runs in a row miss the JVM's 10 s)
ATTEMPTS = 3


class ConnectBackError(RuntimeError):
    """Every run of a stage failed: Spark's Python worker did not connect back in time."""


def with_retry(stage: Callable[[], None], name: str, pause: float = 5.0) -> None:
    """Run ``stage``; run it again (up to ATTEMPTS runs in all, ``pause`` seconds apart) while
    Spark's Python worker fails to connect back, then raise ConnectBackError. Any other
    failure is raised at once."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            stage()
            return
        except Exception as e:
            if not connect_back_failed(e):
                raise
            if attempt == ATTEMPTS:
                load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
                raise ConnectBackError(
                    f"{name}: Spark's Python worker did not connect back within the JVM's 10 s in {ATTEMPTS} runs: "
                    f"the machine is too busy (load average {load}); run the job on a quieter one") from e
        print(f"{name}: Spark's Python worker did not connect back in time (a busy machine?); "
              f"running the stage again ({attempt + 1} of {ATTEMPTS})", file=sys.stderr)
        time.sleep(pause)


def main() -> int:
    ap = argparse.ArgumentParser(description="pylog + Spark example pipeline")
    ap.add_argument("--root", help="data root (default: a temporary directory, removed after)")
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # SIGTERM (a CI timeout, kill) exits through the finally below too, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    root = args.root or tempfile.mkdtemp(prefix="pylog-pipeline-")
    bindir = tempfile.mkdtemp(prefix="pylog-pipeline-bin-")
    if "PYSPARK_PYTHON" not in os.environ:  # Spark's workers run this interpreter (they import pylog)
        os.environ["PYSPARK_PYTHON"] = worker_python(bindir)
    try:
        return run(root, args.events)
    except ConnectBackError as e:  # one line, not Spark's 100-line traceback
        print(f"pipeline: {e}", file=sys.stderr)
        return 1
    finally:  # on every exit: success, a failure, Ctrl-C
        shutil.rmtree(bindir, ignore_errors=True)
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)


def worker_python(bindir: str) -> str:
    """Write ``bindir/python``, the ``$PYSPARK_PYTHON`` of the job: this interpreter running
    spark_python.py (next to this file), which connects back to the JVM before importing
    pyspark, so that the streaming source's Python process meets the JVM's fixed 10 s on a
    busy machine; returns its path."""
    launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_python.py")
    path = os.path.join(bindir, "python")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(launcher)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def run(root: str, n_events: int) -> int:
    """The pipeline on the data root ``root``; returns the exit status."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import pylog.spark

    t0 = time.perf_counter()
    with pylog.LogStore(root) as store:
        if "events" not in store:
            store.create_topic("events", partitions=4)
        events = produce(store, n_events, seed=1)

    spark = (SparkSession.builder.master("local[2]").appName("pylog-pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ok = True
    try:
        pylog.spark.register(spark)  # also automatic when pylog is installed (non-editable)
        schema = "user string, action string, amount long, seq long"

        # ---- batch: events -> per-user totals -------------------------------------------
        def batch_totals() -> None:
            ev = (spark.read.format("pylog").option("path", root).option("topic", "events").load()
                  .select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*"))
            totals = ev.groupBy("user").agg(
                F.count("*").alias("events"),
                F.sum(F.when(F.col("action") == "purchase", F.col("amount")).otherwise(0)).alias("revenue"),
            )
            (totals.select(F.col("user").cast("binary").alias("key"),
                           F.to_json(F.struct("user", "events", "revenue")).cast("binary").alias("value"))
             .write.format("pylog").mode("append").option("path", root).option("topic", "user-totals")
             .option("partitions", "2").save())

        with_retry(batch_totals, "batch")

        # ---- streaming: purchases, availableNow, twice -----------------------------------
        ckpt = os.path.join(root, "_checkpoints", "purchases")

        def stream_purchases() -> None:
            src = (spark.readStream.format("pylog").option("path", root).option("topic", "events")
                   .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20000").load())
            parsed = src.select("key", "value", F.from_json(F.col("value").cast("string"), schema).alias("e"))
            q = (parsed.where(F.col("e.action") == "purchase").select("key", "value")
                 .writeStream.format("pylog").option("path", root).option("topic", "purchases")
                 .option("partitions", "2").option("checkpointLocation", ckpt)
                 .trigger(availableNow=True).start())
            q.awaitTermination()

        with_retry(stream_purchases, "stream")
        with pylog.LogStore(root) as store:
            events += produce(store, n_events // 4, seed=2)
        with_retry(stream_purchases, "stream")
    finally:
        spark.stop()

    # ---- check, with pylog's own reader -------------------------------------------------
    with pylog.LogStore(root) as store:
        def values(topic: str) -> list[bytes]:
            t = store.topic(topic)
            return [bytes(r.value) for i in range(t.partitions) for r in t.reader(i).scan()]

        got_totals = {d["user"]: d for d in map(json.loads, values("user-totals"))}
        purchases = Counter(json.loads(v)["seq"] for v in values("purchases"))
    first = events[: n_events]
    want = defaultdict(lambda: {"events": 0, "revenue": 0})
    for e in first:
        want[e["user"]]["events"] += 1
        if e["action"] == "purchase":
            want[e["user"]]["revenue"] += e["amount"]
    totals_ok = got_totals.keys() == want.keys() and all(
        got_totals[u]["events"] == w["events"] and got_totals[u]["revenue"] == w["revenue"] for u, w in want.items())
    want_purchases = {e["seq"] for e in events if e["action"] == "purchase"}
    stream_ok = set(purchases) == want_purchases and max(purchases.values(), default=1) == 1
    ok = totals_ok and stream_ok
    print(f"batch:  {len(first):,} events -> {len(got_totals)} user totals, revenue "
          f"{sum(t['revenue'] for t in got_totals.values()):,} ({'verified' if totals_ok else 'MISMATCH'})")
    print(f"stream: 2 availableNow runs, {len(events):,} events -> {sum(purchases.values()):,} purchases "
          f"({'each exactly once' if stream_ok else 'MISMATCH'})")
    print(f"{'OK' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
