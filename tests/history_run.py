"""A Jepsen-style run against `pylog serve`: real Kafka clients record a history
(tests/history.py) while a nemesis kills, stops and restarts the broker.

* :class:`Broker` runs ``pylog serve`` over one data root and restarts it on the same port
  (each start a new process, forked from a launcher that imported the broker once); it can
  attach ``strace -e inject=fdatasync:signal=SIGKILL:when=N`` to the running broker, so that
  the broker dies at an fdatasync (records in the file, not yet durable).
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

import bisect
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
KILL_AT = (1, 20)


#: the broker's launcher: imports the broker once, then forks a ``pylog serve`` per line on its
#: stdin (``OUT<tab>ERR<tab>ARGS...``; the child in its own session, stdout and stderr to the
#: files named), and reports ``pid PID`` per start and ``exit PID STATUS`` per child that ends
_ZYGOTE = """
import os, select, sys
import pylog.cli, pylog.serve.server, pylog.serve.handlers

def say(*words):
    os.write(1, (" ".join(map(str, words)) + "\\n").encode())

say("ready")
buf = b""
while True:
    readable = select.select([0], [], [], 0.02)[0]
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        say("exit", pid, os.waitstatus_to_exitcode(status))
    if not readable:
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    buf += chunk
    while b"\\n" in buf:
        line, buf = buf.split(b"\\n", 1)
        out, err, *argv = line.decode().split("\\t")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()
                for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                        (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                        (2, err, os.O_WRONLY | os.O_CREAT | os.O_APPEND)):
                    new = os.open(path, flags, 0o644)
                    os.dup2(new, fd)
                    os.close(new)
                pylog.cli.main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        say("pid", pid)
"""


class Broker:
    """``pylog serve`` over ``root``, restartable on the port of its first start.

    Each start is a new process, forked from a launcher that imported the broker's modules
    once: a restart costs the broker's own start (opening the root, recovery, listening), not
    the 1-2 s of CPU its imports take, which on a loaded machine was most of each fault's time.
    """

    def __init__(self, root: str, workdir: str, history: History) -> None:
        self.root = root
        self.workdir = workdir
        self.history = history
        self.port = 0
        self.pid = 0  # the running broker's process id
        self.traced = False  # the current process runs under strace's fdatasync injection
        self.strace: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._exits: dict[int, int] = {}
        self._pids: list[int] = []
        self._said = threading.Condition()
        with open(os.path.join(workdir, "launcher.err"), "wb") as err:
            self.zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE], cwd=ROOT, env=py_env(),
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        threading.Thread(target=self._listen, daemon=True).start()
        with self._said:
            if not self._said.wait_for(lambda: self._ready or self.zygote.poll() is not None, 120):
                raise RuntimeError("the broker's launcher did not start within 120 s")
        if not self._ready:
            raise RuntimeError("the broker's launcher failed (launcher.err)")

    _ready = False

    def _listen(self) -> None:
        assert self.zygote.stdout is not None
        for raw in self.zygote.stdout:
            word, *rest = raw.decode().split()
            with self._said:
                if word == "ready":
                    self._ready = True
                elif word == "pid":
                    self._pids.append(int(rest[0]))
                elif word == "exit":
                    self._exits[int(rest[0])] = int(rest[1])
                self._said.notify_all()
        with self._said:
            self._said.notify_all()

    @property
    def bootstrap(self) -> str:
        """host:port of the broker."""
        return f"127.0.0.1:{self.port}"

    def start(self, kill_at_fdatasync: int | None = None) -> None:
        """Start the broker (on the same port after the first start); with
        ``kill_at_fdatasync`` N, attach strace to it once it listens, so that it dies at the
        N-th fdatasync of one of its threads (strace counts per thread)."""
        for attempt in range(50):  # the port of a killed broker may take a moment to free
            self.starts += 1
            out = os.path.join(self.workdir, f"broker-{self.starts}.out")
            args = ["--root", self.root, "serve", "--host", "127.0.0.1", "--port", str(self.port)]
            assert self.zygote.stdin is not None
            with self._said:
                known = len(self._pids)
                self.zygote.stdin.write(("\t".join([out, os.path.join(self.workdir, "broker.err"), *args])
                                         + "\n").encode())
                self.zygote.stdin.flush()
                if not self._said.wait_for(lambda k=known: len(self._pids) > k, 30):  # type: ignore[misc]
                    raise RuntimeError("the broker's launcher did not fork")
                self.pid = self._pids[known]
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
        self.traced = False
        self.history.note("broker start", port=self.port, pid=self.pid)
        if kill_at_fdatasync is not None:
            self.arm(kill_at_fdatasync)

    def arm(self, when: int) -> None:
        """Attach strace to every thread of the running broker, set to SIGKILL it at the
        ``when``-th fdatasync of a thread. Attaching after the start leaves the start's own
        fdatasyncs out of the count (and strace 6.1 with --seccomp-bpf injects at when=1 only)."""
        self.traced = True
        self.history.note("armed", pid=self.pid, kill_at_fdatasync=when)
        strace = strace_path()
        assert strace is not None
        self.strace = subprocess.Popen([strace, "-f", "-qq", "-o", os.devnull, "-e", "trace=fdatasync",
                                        "-e", f"inject=fdatasync:signal=SIGKILL:when={when}",
                                        "-p", str(self.pid)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + 20
        while time.monotonic() < end and self.alive():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    if re.search(r"^TracerPid:\s*[1-9]", f.read(), re.M):
                        return
            except FileNotFoundError:
                return
            time.sleep(0.01)

    def _wait_listening(self, out: str) -> str:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                with open(out) as f:
                    for line in f:
                        if "listening on" in line:
                            return line
            except FileNotFoundError:  # the child has not opened it yet
                pass
            if not self.alive():
                return ""
            time.sleep(0.01)
        raise RuntimeError("pylog serve did not start within 60 s")

    def _tail_err(self) -> str:
        with open(os.path.join(self.workdir, "broker.err"), errors="replace") as f:
            return f.read()[-2000:]

    def alive(self) -> bool:
        """The broker process still runs (its launcher has not reported its exit)."""
        with self._said:
            return self.pid > 0 and self.pid not in self._exits

    def wait(self, timeout: float) -> int | None:
        """The broker's exit status once it ended, or None after ``timeout`` seconds."""
        with self._said:
            self._said.wait_for(lambda: self.pid in self._exits, timeout)
            return self._exits.get(self.pid)

    def kill(self) -> None:
        """SIGKILL the broker and wait for it (and for strace, if it was traced)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.wait(30) is None:
            raise RuntimeError(f"broker {self.pid} did not die of SIGKILL")
        if self.strace is not None:
            try:
                self.strace.wait(30)
            except subprocess.TimeoutExpired:
                self.strace.kill()
                self.strace.wait(10)
            self.strace = None

    def pause(self, seconds: float) -> None:
        """SIGSTOP the broker for ``seconds``, then SIGCONT it."""
        assert not self.traced
        os.kill(self.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def terminate(self) -> int | None:
        """SIGTERM the broker; returns its exit status."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        status = self.wait(60)
        if status is None:
            self.kill()
        return status

    def close(self) -> None:
        """Stop the launcher (the broker must be stopped first)."""
        assert self.zygote.stdin is not None
        self.zygote.stdin.close()
        try:
            self.zygote.wait(30)
        except subprocess.TimeoutExpired:
            self.zygote.kill()
            self.zygote.wait(10)


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


class _Producer(_Worker):
    """A producer client of ``<name>-<seq>`` values to ``partitions`` partitions."""

    def __init__(self, name: str, history: History, bootstrap: str, partitions: int, idempotent: bool,
                 pace: float) -> None:
        super().__init__(name, history)
        self.bootstrap, self.partitions, self.idempotent, self.pace = bootstrap, partitions, idempotent, pace
        self.unresolved = 0


class ConfluentProducer(_Producer):
    """A confluent-kafka producer (acks=all, idempotent or not) of ``<name>-<seq>`` values."""

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


class KafkaPythonProducer(_Producer):
    """A kafka-python producer (acks=all, idempotent or not) of ``<name>-<seq>`` values."""

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
    stop_status: int | None = None
    crashes: list[str] = field(default_factory=list)
    broker_tracebacks: int = 0
    #: idempotent duplicates by the fault that followed their send: kind -> (values, faults, of faults)
    blamed: dict[str, tuple[int, int, int]] = field(default_factory=dict)


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
        pace: float = 0.02, interval: tuple[float, float] = (0.5, 2.0), pause_s: float = 2.5) -> Outcome:
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
    broker.start()
    out = Outcome(report=Report(), history_file=os.path.join(workdir, "history.jsonl"))
    workers: list[_Worker] = []
    try:
        _create_topic(broker.bootstrap, partitions)
        if plan and plan[0] == "fsync-kill":  # armed once the topic exists (its creation fdatasyncs)
            broker.arm(rnd.randint(*KILL_AT))
        producers: list[ConfluentProducer | KafkaPythonProducer] = [
            ConfluentProducer("p0", h, broker.bootstrap, partitions, True, pace),
            ConfluentProducer("p1", h, broker.bootstrap, partitions, False, pace),
            KafkaPythonProducer("p2", h, broker.bootstrap, partitions, True, pace),
            KafkaPythonProducer("p3", h, broker.bootstrap, partitions, False, pace)]
        group = [GroupConsumer(f"c{i}", h, broker.bootstrap) for i in range(consumers)]
        workers += [*producers, *group]
        for w in workers:
            w.start()
        for i, kind in enumerate(plan):
            nxt = plan[i + 1] if i + 1 < len(plan) else None
            time.sleep(rnd.uniform(*interval))
            if not broker.traced and not broker.alive():  # no fault of ours: a crash
                out.crashes.append(f"broker {broker.pid} exited with {broker.wait(0)} before fault {i}")
                h.note("crash", pid=broker.pid, status=broker.wait(0))
                broker.start()
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
                    broker.arm(rnd.randint(*KILL_AT))
                continue
            else:
                kind = "kill"
                h.note("fault", kind=kind)
                broker.kill()
            out.faults[kind] = out.faults.get(kind, 0) + 1
            time.sleep(rnd.uniform(0, 1.0))  # an outage of random length
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
        for w in workers:  # on an error above: no client outlives the run
            w.stopping.set()
        if broker.alive():
            status = broker.terminate()
            h.note("broker stopped", status=status)
            out.stop_status = status
        broker.close()
        with open(os.path.join(workdir, "broker.err"), errors="replace") as f:
            out.broker_tracebacks = f.read().count("Traceback")
        h.dump(out.history_file)
    out.report = check(h.events, read_log(root, TOPIC))
    out.explained = explain(h.events, out.report)
    out.blamed = blame(h.events, out.report)
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
                  and ev["what"] in ("fault", "broker start", "armed", "crash", "producer id")
                  and ev.get("producer", send["producer"]) == send["producer"]]
        out.append(f"{a} | sent @{send['t']}, acked @{ack['t'] if ack else '-'}; between: {'; '.join(during)}")
    return out


def blame(events: list[dict[str, Any]], report: Report, kind: str = "duplicate") -> dict[str, tuple[int, int, int]]:
    """The anomalies of ``kind`` by the first fault after their value was sent: for each
    fault kind, (anomalies, faults followed by at least one of them, faults injected)."""
    sent = {ev["value"]: ev["i"] for ev in events if ev["type"] == "send"}
    faults = [ev for ev in events if ev["type"] == "note" and ev["what"] == "fault"]
    starts = [ev["i"] for ev in faults]
    hit: dict[int, int] = {}
    for a in report.anomalies[kind]:
        at = bisect.bisect_left(starts, sent.get(a.where, -1))
        key = faults[at]["i"] if at < len(faults) else -1
        hit[key] = hit.get(key, 0) + 1
    out: dict[str, tuple[int, int, int]] = {}
    for ev in faults + [{"i": -1, "kind": "none (no fault after the send)"}]:
        n, f, total = out.get(ev["kind"], (0, 0, 0))
        out[ev["kind"]] = (n + hit.get(ev["i"], 0), f + (ev["i"] in hit), total + (ev["i"] != -1))
    return {k: v for k, v in out.items() if v != (0, 0, 0)}


def _wait_dead(broker: Broker, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not broker.alive():
            return True
        time.sleep(0.02)
    return False
