"""The JVM connector on a standalone cluster and on a Spark Connect server (issue 27).

    python scripts/spark-cluster-check.py [--dir DIR]

The pyspark wheel ships no ``start-master.sh``/``start-worker.sh`` (its ``sbin`` has only
``start-connect-server.sh`` and the history server's), so the master and two workers are
started with its ``bin/spark-class`` (the classes those scripts start), all on 127.0.0.1
with free ports. Then, each in a driver process of its own:

* ``jars``: a session on the cluster with the jar on ``spark.jars``: a batch read (same rows
  as the library) and a stream run twice on one checkpoint (records appended between: each
  record once);
* ``addjar``: a session on the cluster, the jar added by SQL ``ADD JAR``: the same read and stream;
* ``connect``: a Spark Connect server (``sbin/start-connect-server.sh --wait``, master the
  cluster) and a client that ships the jar with ``addArtifacts``: a batch read and the
  stream restart.

The Spark Connect client needs pyspark's ``connect`` extra (pandas, grpcio, grpcio-status,
googleapis-common-protos, zstandard); a folder holding them (``pip install --target DIR``)
can be given in ``PYLOG_CONNECT_PYTHONPATH``, added for the client process only.
``--only KIND`` runs one check. Prints one line per check (``ok`` or the error's first line) and exits 1 if any failed.
Run by tests/test_spark_jvm.py only with PYLOG_LONG=1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

HOST = "127.0.0.1"


def free_port() -> int:
    """A free TCP port on the loopback."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    """Wait until ``port`` accepts connections (or ``proc`` died)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc`` and its process group (a JVM started by a script): SIGTERM, then SIGKILL
    if a process of the group is left after 30 s."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + 30
        while time.monotonic() < end:
            proc.poll()  # reap the leader
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)
    proc.poll()


def make_data(root: str, records: int) -> None:
    """Topic ``ev``: 2 partitions of ``records`` records ``v{p}-{i}``."""
    import pylog

    with pylog.LogStore(root) as store:
        t = store.topic("ev") if "ev" in store.topics() else store.create_topic(
            "ev", partitions=2, config=pylog.LogConfig(segment_bytes=4096))
        for p in range(2):
            log = t.partition(p)
            start = log.next_offset
            log.append_batch([b"v%d-%d" % (p, i) for i in range(start, start + records)])


def check_session(spark: Any, root: str, work: str, stream: bool) -> str:
    """A batch read and (``stream``) a stream restarted on its checkpoint, in ``spark``."""
    df = spark.read.format("pylog").option("path", root).option("topic", "ev").load()
    got = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in df.collect())
    n = len(got) // 2
    assert got == [(p, o, b"v%d-%d" % (p, o)) for p in range(2) for o in range(n)], got[:5]
    plan = ""
    if hasattr(df, "_jdf"):  # which reader: the connector's scan names "pylog ROOT TOPICS"
        text = df._jdf.queryExecution().executedPlan().toString()
        plan = "JVM connector" if f"pylog {root} ev" in text else "Python source"
    else:  # Spark Connect: the plan's text
        text = df._explain_string() if hasattr(df, "_explain_string") else ""
        plan = "JVM connector" if f"pylog {root} ev" in text else f"reader unknown: {text[:200]!r}"
    if not stream:
        return f"read {len(got)} rows ({plan})"
    ck, out = os.path.join(work, "ck"), os.path.join(work, "out")
    for more in (30, 0):
        q = (spark.readStream.format("pylog").option("path", root).option("topic", "ev")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "25").load()
             .select("partition", "offset", "value").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination()
        if more:
            make_data(root, more)
    rows = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in spark.read.parquet(out).collect())
    m = n + 30
    assert rows == [(p, o, b"v%d-%d" % (p, o)) for p in range(2) for o in range(m)], (len(rows), m)
    return f"read {len(got)} rows, stream {len(rows)} rows once each ({plan})"


def driver(kind: str, master: str, root: str, work: str, jar: str) -> None:
    """One check, in this (driver) process."""
    from pyspark.sql import SparkSession

    import pylog.spark as ps

    env = os.environ.get("PYTHONPATH", "")
    if kind == "connect":
        spark = SparkSession.builder.remote(master).getOrCreate()
        spark.addArtifacts(jar)
        ps.register(spark)
        print(json.dumps({kind: check_session(spark, root, work, True)}), flush=True)
        spark.stop()
        return
    b = (SparkSession.builder.master(master).appName(f"pylog-{kind}")
         .config("spark.ui.enabled", "false").config("spark.executorEnv.PYTHONPATH", env)
         .config("spark.executor.memory", "512m").config("spark.sql.shuffle.partitions", "2"))
    if kind == "jars":
        b = b.config("spark.jars", jar)
    spark = b.getOrCreate()
    try:
        if kind == "addjar":
            spark.sql(f"ADD JAR '{jar}'")
        ps.register(spark)
        print(json.dumps({kind: check_session(spark, root, work, True)}), flush=True)
    finally:
        spark.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--only", choices=("jars", "addjar", "connect"), default=None)
    ap.add_argument("--driver", nargs=5, metavar=("KIND", "MASTER", "ROOT", "WORK", "JAR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        driver(*args.driver)
        return 0

    import pyspark

    from pylog.spark import jar_path

    jar = jar_path()
    if jar is None:
        print("no connector jar (built without javac): nothing to check")
        return 1
    home = os.path.dirname(os.path.abspath(pyspark.__file__))
    work = args.dir or tempfile.mkdtemp(prefix="pylog-cluster-")
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP=HOST, PYSPARK_PYTHON=sys.executable,
               SPARK_LOG_DIR=os.path.join(work, "logs"), SPARK_PID_DIR=os.path.join(work, "pids"),
               SPARK_NO_DAEMONIZE="1")
    procs: list[subprocess.Popen[bytes]] = []
    failed = 0

    def start(cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        os.makedirs(os.path.join(work, "logs"), exist_ok=True)
        log = open(os.path.join(work, "logs", name + ".out"), "wb")  # noqa: SIM115
        # a session of its own: the scripts exec spark-submit, which starts the JVM as a child;
        # stopping ends the whole group (start_new_session makes the group id the child's pid)
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p

    try:
        mport = free_port()
        m = start([os.path.join(home, "bin", "spark-class"), "org.apache.spark.deploy.master.Master",
                   "--host", HOST, "--port", str(mport), "--webui-port", str(free_port())], "master")
        wait_port(mport, m)
        master = f"spark://{HOST}:{mport}"
        for i in range(2):
            start([os.path.join(home, "bin", "spark-class"), "org.apache.spark.deploy.worker.Worker", master,
                   "--host", HOST, "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                   "--work-dir", os.path.join(work, f"worker{i}")], f"worker{i}")
        time.sleep(5)
        for kind in (args.only,) if args.only else ("jars", "addjar", "connect"):
            root, kwork = os.path.join(work, kind, "root"), os.path.join(work, kind)
            make_data(root, 50)
            target = master
            server = None
            if kind == "connect":
                cport = free_port()
                server = start([os.path.join(home, "sbin", "start-connect-server.sh"), "--wait", "--master", master,
                                "--conf", f"spark.connect.grpc.binding.port={cport}",
                                "--conf", "spark.ui.enabled=false",
                                "--conf", f"spark.executorEnv.PYTHONPATH={env.get('PYTHONPATH', '')}",
                                "--conf", "spark.executor.memory=512m"], "connect")
                wait_port(cport, server)
                target = f"sc://{HOST}:{cport}"
            t = time.perf_counter()
            denv = dict(env)
            if kind == "connect" and os.environ.get("PYLOG_CONNECT_PYTHONPATH"):
                denv["PYTHONPATH"] = os.pathsep.join(
                    x for x in (env.get("PYTHONPATH"), os.environ["PYLOG_CONNECT_PYTHONPATH"]) if x)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--driver", kind, target, root, kwork, jar],
                               env=denv, capture_output=True, text=True, timeout=900)
            took = time.perf_counter() - t
            lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
            if r.returncode == 0 and lines:
                print(f"{kind}: ok in {took:.0f} s: {json.loads(lines[-1])[kind]}")
            else:
                failed += 1
                err = [x for x in r.stderr.splitlines() if "Error" in x or "Exception" in x]
                first = (err or r.stderr.splitlines()[-1:] or [""])[0]
                print(f"{kind}: FAILED ({r.returncode}) in {took:.0f} s: {first}")
            if server is not None:
                stop(server)
    finally:
        for p in reversed(procs):
            stop(p)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
