"""A Jepsen-style run against `pylog serve`: real Kafka clients record a history
(tests/history.py) while a nemesis kills, stops and restarts the broker.

* :class:`Broker` runs ``pylog serve`` over one data root and restarts it on the same port;
  after a start it may attach ``strace -e inject=fdatasync:signal=SIGKILL:when=N`` to it, so
  that it dies at an fdatasync (records in the file, not yet durable).
* :class:`ConfluentProducer` and :class:`KafkaPythonProducer` send unique values
  (``p<n>-<seq>``) with acks=all, idempotent or not, and record each send, ack and error.
* :class:`GroupConsumer` is a confluent-kafka consumer in a group; it records assignments,
  revocations, every polled record and every commit.
* :func:`run` drives all of them through ``faults`` faults (SIGKILL and restart, SIGSTOP past
  the clients' timeouts then SIGCONT, SIGKILL at an fdatasync and restart), stops the clients,
  lets the consumers catch up, stops the broker, reads the final log and checks the history.

Every process and client runs on loopback; the broker's stdout and stderr go to files in the
run's directory, beside the history (``history.jsonl``), for a post-mortem.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from conftest import ROOT, py_env, strace_path
from history import History, Report, check, read_log

TOPIC = "h"
GROUP = "g"
#: client timeouts (ms) the SIGSTOP fault outlasts
CLIENT_TIMEOUT_MS = 1000
SESSION_TIMEOUT_MS = 2000
#: an fdatasync kill fires at the N-th fdatasync of one broker thread after strace attached (it
#: counts per thread; each appending thread makes one per Produce): N in this range
KILL_AT = (1, 30)


class Broker:
    """``pylog serve`` over ``root``, restartable on the port of its first start."""

    def __init__(self, root: str, workdir: str, history: History) -> None:
        self.root = root
        self.workdir = workdir
        self.history = history
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.traced = False  # the current process runs under strace's fdatasync injection
        self.strace: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        """host:port of the broker."""
        return f"127.0.0.1:{self.port}"

    def start(self, kill_at_fdatasync: int | None = None) -> None:
        """Start the broker (on the same port after the first start); with
        ``kill_at_fdatasync`` N, attach strace to it once it listens, so that it dies at the
        N-th fdatasync of one of its threads (strace counts per thread)."""
        cmd = [sys.executable, "-m", "pylog.cli", "--root", self.root, "serve", "--host", "127.0.0.1",
               "--port", str(self.port)]
        self.starts += 1
        out = os.path.join(self.workdir, f"broker-{self.starts}.out")
        for attempt in range(50):  # the port of a killed broker may take a moment to free
            with open(out, "wb") as o, open(os.path.join(self.workdir, "broker.err"), "ab") as e:
                self.proc = subprocess.Popen(cmd, cwd=ROOT, env=py_env(), stdout=o, stderr=e,
                                             start_new_session=True)
            line = self._wait_listening(out)
            if line:
                break
            if "in use" not in self._tail_err():
                raise RuntimeError(f"pylog serve did not start: {self._tail_err()}")
            time.sleep(0.1)
        else:
            raise RuntimeError("pylog serve could not take its port again")
        m = re.search(r"listening on [\d.]+:(\d+)", line)
        assert m is not None
        self.port = int(m.group(1))
        self.traced = kill_at_fdatasync is not None
        if kill_at_fdatasync is not None:
            self._attach(kill_at_fdatasync)
        self.history.note("broker start", port=self.port, kill_at_fdatasync=kill_at_fdatasync)

    def _attach(self, when: int) -> None:
        """Attach strace to every thread of the broker, set to SIGKILL it at the ``when``-th
        fdatasync of a thread. Attaching after the start keeps the start untraced (fast) and
        leaves the start's own fdatasyncs out of the count."""
        assert self.proc is not None
        strace = strace_path()
        assert strace is not None
        self.strace = subprocess.Popen([strace, "-f", "-qq", "-o", os.devnull, "-e", "trace=fdatasync",
                                        "-e", f"inject=fdatasync:signal=SIGKILL:when={when}",
                                        "-p", str(self.proc.pid)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + 20
        while time.monotonic() < end and self.proc.poll() is None:
            with open(f"/proc/{self.proc.pid}/status") as f:
                if re.search(r"^TracerPid:\s*[1-9]", f.read(), re.M):
                    return
            time.sleep(0.01)

    def _wait_listening(self, out: str) -> str:
        assert self.proc is not None
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with open(out) as f:
                line = f.readline()
            if "listening on" in line:
                return line
            if self.proc.poll() is not None:
                return ""
            time.sleep(0.02)
        raise RuntimeError("pylog serve did not start within 60 s")

    def _tail_err(self) -> str:
        with open(os.path.join(self.workdir, "broker.err"), errors="replace") as f:
            return f.read()[-2000:]

    def alive(self) -> bool:
        """The broker process (or strace around it) still runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the broker and wait for it (and for strace, if it was traced)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self._reap_group()
        if self.strace is not None:
            try:
                self.strace.wait(30)
            except subprocess.TimeoutExpired:
                self.strace.kill()
                self.strace.wait(10)
            self.strace = None

    def _reap_group(self) -> None:
        """Wait until no process of the broker's group is left (strace's child dies after it)."""
        assert self.proc is not None
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def pause(self, seconds: float) -> None:
        """SIGSTOP the broker for ``seconds``, then SIGCONT it."""
        assert self.proc is not None and not self.traced
        self.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def terminate(self) -> int:
        """SIGTERM the broker; returns its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


def _note_epoch(w: _Worker, pid: int, epoch: int) -> None:
    if pid >= 0 and (pid, epoch) != getattr(w, "_epoch", None):
        w._epoch = (pid, epoch)  # type: ignore[attr-defined]
        w.history.note("producer id", producer=w.name, id=pid, epoch=epoch)


class _Worker(threading.Thread):
    """A client thread that runs :meth:`body` until :attr:`stopping` is set."""

    def __init__(self, name: str, history: History) -> None:
        super().__init__(name=name, daemon=True)
        self.history = history
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.body()
        except BaseException as e:  # the test reports it
            self.failure = e
            self.history.note("worker failed", worker=self.name, error=repr(e))

    def body(self) -> None:
        """The client's work."""
        raise NotImplementedError


class ConfluentProducer(_Worker):
    """A confluent-kafka producer (acks=all, idempotent or not) of ``<name>-<seq>`` values."""

    def __init__(self, name: str, history: History, bootstrap: str, partitions: int, idempotent: bool,
                 pace: float) -> None:
        super().__init__(name, history)
        self.bootstrap, self.partitions, self.idempotent, self.pace = bootstrap, partitions, idempotent, pace
        self.unresolved = 0

    def body(self) -> None:
        import confluent_kafka as ck

        h = self.history
        h.producer(self.name, "confluent-kafka", self.idempotent)
        p = ck.Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": self.idempotent,
                         "linger.ms": 5, "message.timeout.ms": 120000, "socket.timeout.ms": CLIENT_TIMEOUT_MS,
                         "request.timeout.ms": CLIENT_TIMEOUT_MS, "retry.backoff.ms": 100,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "max.in.flight": 5,
                         "statistics.interval.ms": 500, "stats_cb": self._stats})

        def done(err: Any, msg: Any) -> None:
            value = msg.value().decode()
            if err is not None:
                h.error(self.name, value, str(err))
            else:
                h.ack(self.name, msg.topic(), msg.partition(), msg.offset(), value)

        seq = 0
        while not self.stopping.is_set():
            value = f"{self.name}-{seq}"
            part = seq % self.partitions
            h.send(self.name, TOPIC, part, value)
            while True:
                try:
                    p.produce(TOPIC, value=value.encode(), partition=part, on_delivery=done)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
            seq += 1
            time.sleep(self.pace)
        self.unresolved = p.flush(90)

    def _stats(self, text: str) -> None:
        """librdkafka's statistics: note each new producer id or epoch (an epoch bump re-sequences)."""
        eos = json.loads(text).get("eos") or {}
        _note_epoch(self, eos.get("producer_id", -1), eos.get("producer_epoch", -1))


class KafkaPythonProducer(_Worker):
    """A kafka-python producer (acks=all, idempotent or not) of ``<name>-<seq>`` values."""

    def __init__(self, name: str, history: History, bootstrap: str, partitions: int, idempotent: bool,
                 pace: float) -> None:
        super().__init__(name, history)
        self.bootstrap, self.partitions, self.idempotent, self.pace = bootstrap, partitions, idempotent, pace
        self.unresolved = 0

    def body(self) -> None:
        import kafka

        h = self.history
        h.producer(self.name, "kafka-python", self.idempotent)
        p = kafka.KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=self.idempotent,
                                linger_ms=5, request_timeout_ms=CLIENT_TIMEOUT_MS, delivery_timeout_ms=120000,
                                retry_backoff_ms=100, reconnect_backoff_ms=50, reconnect_backoff_max_ms=500,
                                max_in_flight_requests_per_connection=5)
        futures = []
        seq = 0
        while not self.stopping.is_set():
            value = f"{self.name}-{seq}"
            part = seq % self.partitions
            h.send(self.name, TOPIC, part, value)
            fut = p.send(TOPIC, value=value.encode(), partition=part)
            fut.add_callback(lambda md, v=value: h.ack(self.name, md.topic, md.partition, md.offset, v))
            fut.add_errback(lambda e, v=value: h.error(self.name, v, repr(e)))
            futures.append(fut)
            tm = getattr(p, "_transaction_manager", None)
            if tm is not None:
                _note_epoch(self, tm.producer_id_and_epoch.producer_id, tm.producer_id_and_epoch.epoch)
            seq += 1
            time.sleep(self.pace)
        try:
            p.flush(90)
        except Exception as e:  # a timeout: what is unresolved is counted below
            h.note("flush failed", producer=self.name, error=repr(e))
        self.unresolved = sum(not f.is_done for f in futures)
        p.close(10)


class GroupConsumer(_Worker):
    """A confluent-kafka consumer of ``GROUP`` that records every poll and commit."""

    def __init__(self, name: str, history: History, bootstrap: str, commit_every: float = 0.3) -> None:
        super().__init__(name, history)
        self.bootstrap, self.commit_every = bootstrap, commit_every
        self.errors = 0

    def body(self) -> None:
        import confluent_kafka as ck

        h = self.history
        c = ck.Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP, "client.id": self.name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 300,
                         "socket.timeout.ms": CLIENT_TIMEOUT_MS, "reconnect.backoff.ms": 50,
                         "reconnect.backoff.max.ms": 500, "fetch.wait.max.ms": 100})

        def tps(parts: list[Any]) -> list[tuple[str, int]]:
            return [(tp.topic, tp.partition) for tp in parts]

        def on_assign(cons: Any, parts: list[Any]) -> None:
            h.assign(self.name, GROUP, tps(parts))

        def on_revoke(cons: Any, parts: list[Any]) -> None:
            self._commit(cons)
            h.revoke(self.name, GROUP, tps(parts))

        def on_lost(cons: Any, parts: list[Any]) -> None:
            h.revoke(self.name, GROUP, tps(parts), lost=True)

        c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        last_commit = time.monotonic()
        dirty = False
        while not self.stopping.is_set():
            m = c.poll(0.1)
            if m is not None:
                if m.error() is not None:
                    self.errors += 1
                    h.note("consumer error", consumer=self.name, error=str(m.error()))
                else:
                    h.poll(self.name, GROUP, m.topic(), m.partition(), m.offset(), m.value().decode())
                    dirty = True
            if dirty and time.monotonic() - last_commit > self.commit_every:
                self._commit(c)
                last_commit, dirty = time.monotonic(), False
        self._commit(c)
        c.close()

    def _commit(self, c: Any) -> None:
        import confluent_kafka as ck

        try:
            done = c.commit(asynchronous=False)
        except ck.KafkaException as e:
            self.history.note("commit failed", consumer=self.name, error=str(e))
            return
        for tp in done or []:
            if tp.error is None and tp.offset >= 0:
                self.history.commit(self.name, GROUP, tp.topic, tp.partition, tp.offset)


@dataclass
class Outcome:
    """What :func:`run` did and what the checker found."""

    report: Report
    faults: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    unresolved: int = 0
    consumer_errors: int = 0
    failures: list[str] = field(default_factory=list)
    caught_up: bool = False
    history_file: str = ""
    explained: list[str] = field(default_factory=list)


def _create_topic(bootstrap: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(TOPIC, partitions, 1, config={"flush.messages": "1"})])[TOPIC]
    fut.result(30)


def _log_end(bootstrap: str, partitions: int) -> dict[int, int]:
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {p: c.get_watermark_offsets(ck.TopicPartition(TOPIC, p), timeout=30)[1] for p in range(partitions)}
    finally:
        c.close()


def run(workdir: str, faults: int, seed: int, partitions: int = 3, consumers: int = 3,
        pace: float = 0.015, interval: tuple[float, float] = (0.3, 0.8), pause_s: float = 2.5) -> Outcome:
    """Run the workload through ``faults`` faults and check the history; see the module doc."""
    rnd = random.Random(seed)
    t0 = time.monotonic()
    quiet = logging.getLogger("kafka")  # kafka-python logs every refused reconnect at ERROR
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return _run(workdir, faults, seed, rnd, t0, partitions, consumers, pace, interval, pause_s)
    finally:
        quiet.setLevel(level)


def _run(workdir: str, faults: int, seed: int, rnd: random.Random, t0: float, partitions: int, consumers: int,
         pace: float, interval: tuple[float, float], pause_s: float) -> Outcome:
    root = os.path.join(workdir, "root")
    h = History()
    h.note("run", seed=seed, faults=faults)
    kinds = ["kill", "pause"] + (["fsync-kill"] if strace_path() else [])
    plan = [kinds[i % len(kinds)] for i in range(faults)]
    rnd.shuffle(plan)
    broker = Broker(root, workdir, h)
    broker.start(kill_at_fdatasync=rnd.randint(*KILL_AT) if plan and plan[0] == "fsync-kill" else None)
    out = Outcome(report=Report(), history_file=os.path.join(workdir, "history.jsonl"))
    try:
        _create_topic(broker.bootstrap, partitions)
        producers: list[ConfluentProducer | KafkaPythonProducer] = [
            ConfluentProducer("p0", h, broker.bootstrap, partitions, True, pace),
            ConfluentProducer("p1", h, broker.bootstrap, partitions, False, pace),
            KafkaPythonProducer("p2", h, broker.bootstrap, partitions, True, pace),
            KafkaPythonProducer("p3", h, broker.bootstrap, partitions, False, pace)]
        group = [GroupConsumer(f"c{i}", h, broker.bootstrap) for i in range(consumers)]
        for w in [*producers, *group]:
            w.start()
        for i, kind in enumerate(plan):
            nxt = plan[i + 1] if i + 1 < len(plan) else None
            time.sleep(rnd.uniform(*interval))
            if kind == "fsync-kill" and broker.traced:
                died = _wait_dead(broker, 5.0)
                if not died:
                    kind = "kill"  # the injection did not fire in time: count it as a plain kill
                h.note("fault", kind=kind)
                broker.kill()
            elif kind == "pause" and not broker.traced:
                h.note("fault", kind="pause", seconds=pause_s)
                broker.pause(pause_s)
                out.faults[kind] = out.faults.get(kind, 0) + 1
                if nxt == "fsync-kill":  # the next fault needs a broker under strace
                    broker.kill()
                    broker.start(kill_at_fdatasync=rnd.randint(*KILL_AT))
                continue
            else:
                kind = "kill"
                h.note("fault", kind=kind)
                broker.kill()
            out.faults[kind] = out.faults.get(kind, 0) + 1
            time.sleep(rnd.uniform(0, 0.3))
            broker.start(kill_at_fdatasync=rnd.randint(*KILL_AT) if nxt == "fsync-kill" else None)
        if broker.traced:  # the last run must not die at an fdatasync
            broker.kill()
            broker.start()
        h.note("faults over")
        time.sleep(1.0)
        for w in producers:
            w.stopping.set()
        for w in producers:
            w.join(120)
        out.unresolved = sum(w.unresolved for w in producers)
        # the consumers catch up with the log end, then stop
        end = _log_end(broker.bootstrap, partitions)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            polled = {(ev["partition"], ev["offset"]) for ev in list(h.events) if ev["type"] == "poll"}
            if all((p, o) in polled for p, e in end.items() for o in range(e)):
                out.caught_up = True
                break
            time.sleep(0.2)
        for w in group:
            w.stopping.set()
        for w in group:
            w.join(60)
        out.consumer_errors = sum(w.errors for w in group)
        out.failures = [f"{w.name}: {w.failure!r}" for w in [*producers, *group] if w.failure is not None]
        out.failures += [f"{w.name}: still running" for w in [*producers, *group] if w.is_alive()]
    finally:
        if broker.alive():
            status = broker.terminate()
            h.note("broker stopped", status=status)
        h.dump(out.history_file)
    out.report = check(h.events, read_log(root, TOPIC))
    out.explained = explain(h.events, out.report)
    out.seconds = time.monotonic() - t0
    return out


def explain(events: list[dict[str, Any]], report: Report, kind: str = "duplicate") -> list[str]:
    """For each anomaly of ``kind`` about a value: what happened between the value's send and
    its ack (faults, broker starts, the producer's id and epoch changes), for a post-mortem."""
    by_value = {}
    for ev in events:
        if ev["type"] in ("send", "ack") and "value" in ev:
            by_value.setdefault(ev["value"], {})[ev["type"]] = ev
    out = []
    for a in report.anomalies[kind]:
        got = by_value.get(a.where, {})
        send, ack = got.get("send"), got.get("ack")
        if send is None:
            out.append(f"{a}: never sent")
            continue
        lo, hi = send["i"], ack["i"] if ack else len(events)
        during = [f"{ev['what']}{'' if ev.get('kind') is None else ' ' + ev['kind']}"
                  f"{' id {} epoch {}'.format(ev['id'], ev['epoch']) if ev['what'] == 'producer id' else ''}"
                  f" @{ev['t']}" for ev in events[lo:hi] if ev["type"] == "note"
                  and ev["what"] in ("fault", "broker start", "producer id")
                  and ev.get("producer", send["producer"]) == send["producer"]]
        out.append(f"{a} | sent @{send['t']}, acked @{ack['t'] if ack else '-'}; between: {'; '.join(during)}")
    return out


def _wait_dead(broker: Broker, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not broker.alive():
            return True
        time.sleep(0.02)
    return False
