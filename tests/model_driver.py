"""A seeded multi-process driver for the store-level model test (issue 14, "the proof").

Several real OS processes work on one data root at once: producers (plain and, where the
store has transactions, transactional), consumers in groups that commit, tail readers, and
an admin process (create/delete topics, add partitions, alter config, retention,
compaction). The orchestrator SIGKILLs them at random points and restarts them. Every
process incarnation writes its history to its own journal file, one JSON object a line,
each line one ``write(2)`` on an ``O_APPEND`` descriptor, so a line that was written
survives the SIGKILL of its writer (the only fault injected here; the page cache keeps it).
A line cut short by a kill is ignored. :func:`check` then replays every journal against the
data root's final state and returns the violations of the store's guarantees.

Every value is traceable: ``value_of(id)`` is the exact bytes the producer appended for the
record ``id`` (a unique ``proc:seq`` string and a padding derived from it), so a reader can
tell a damaged or foreign value from the right one.

Run one role: ``python -m model_driver ROLE ROOT JOURNAL SEED DEADLINE [ARGS...]``
(``tests`` on the path); the test calls :func:`run` and :func:`check`.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(HERE)

#: Errors after which the record was certainly not written (the producer must not see it).
NOT_WRITTEN = ("LogLockedError", "UnknownTopicError", "UnknownPartitionError", "InvalidNameError",
               "RecordTooLargeError", "LogClosedError")
#: How long a producer may keep using a topic's old partition count after another process
#: added partitions (issue 14 case 5: "within a bounded time"; LogStore's default
#: metadata_refresh_ms is 100 ms, and the append starts after its journaled attempt time).
PARTITION_REFRESH_S = 0.5
#: fcntl's F_SETPIPE_SZ (Linux).
F_SETPIPE_SZ = 1031
#: The shortest line ``pylog consume --format json`` prints for a record of ours (it is longer).
MIN_JSON_LINE = 100


_STOP = ""


def running() -> bool:
    """Whether the run goes on: until the orchestrator creates the stop file (the run's
    length counts from when every process is up, however slow the machine is)."""
    return not os.path.exists(_STOP)


def now() -> int:
    """A clock comparable across the processes of one machine (CLOCK_MONOTONIC, ns)."""
    return time.monotonic_ns()


def value_of(rid: str) -> bytes:
    """The exact bytes appended for record ``rid``."""
    h = hashlib.blake2b(rid.encode(), digest_size=16).hexdigest().encode()
    return rid.encode() + b"|" + h * (h[0] % 20)


def id_of(value: Any) -> str | None:
    """The record id a value claims (None for a tombstone or junk)."""
    if value is None:
        return None
    b = bytes(value)
    i = b.find(b"|")
    return b[:i].decode("ascii", "replace") if i > 0 else b[:40].decode("ascii", "replace")


class Journal:
    """One process incarnation's history: a JSON object a line, one write(2) each."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, ev: str, **fields: Any) -> None:
        fields["e"] = ev
        fields["t"] = now()
        os.write(self.fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())


def seen(recs: list[Any]) -> list[list[Any]]:
    """What a reader journals of the records it got: ``[offset, id, bytes intact]`` each."""
    return [[r.offset, id_of(r.value), value_of(id_of(r.value) or "") == bytes(r.value or b"")]
            for r in recs]


def _err(e: BaseException) -> dict[str, str]:
    return {"err": type(e).__name__, "msg": str(e)[:200]}


def _expected(e: BaseException) -> bool:
    from pylog.errors import PylogError

    return isinstance(e, (PylogError, OSError))


# ----------------------------------------------------------------------------------------
# roles
def producer(root: str, j: Journal, rng: random.Random, stop: str, name: str) -> None:
    """Plain appends (single and batch, keyed and unkeyed) to random topics; flushes."""
    import pylog

    seq = 0
    store = pylog.LogStore(root)
    j("start", role="producer")
    ops = 0
    work: list[str] = []
    held: dict[str, Any] = {}  # topic -> a Topic handle kept across appends, even after a delete
    while running():
        ops += 1
        if ops % rng.randint(15, 40) == 0:  # let go of the partitions now and then
            store.close()
            store = pylog.LogStore(root)
            j("reopen")
            work = []
            held = {}
        topics = store.topics()
        if not topics:
            time.sleep(0.05)
            continue
        # a working set of a few topics, renewed at each reopen, so producers and the admin
        # do not all want the same partitions (each partition has one writer at a time)
        work = [t for t in work if t in topics] or rng.sample(topics, min(len(topics), rng.randint(1, 3)))
        tname = rng.choice(work)
        r = rng.random()
        if r < 0.05:  # take a handle of some topic and keep it (issue 14 case 4)
            tname = rng.choice(topics)
            held[tname] = None
            j("hold", topic=tname)
        elif r < 0.1 and held:  # append through a handle held for a while
            tname = rng.choice(sorted(held))
        try:
            topic = store.topic(tname) if held.get(tname) is None else held[tname]
            if tname in held:
                held[tname] = topic
        except Exception as e:
            j("topic-failed", topic=tname, unexpected=not _expected(e), **_err(e))
            held.pop(tname, None)
            continue
        r = rng.random()
        if r < 0.08:
            j("flush-start")
            try:
                store.flush()
                j("flushed")
            except Exception as e:
                j("flush-failed", unexpected=not _expected(e), **_err(e))
            continue
        n = 1 if r < 0.6 else rng.randint(2, 12)
        keyed = rng.random() < 0.6
        ids, keys = [], []
        for _ in range(n):
            ids.append(f"{name}:{seq}")
            keys.append(f"k{name}-{rng.randint(0, 5)}" if keyed else None)
            seq += 1
        j("attempt", topic=tname, ids=ids, keys=keys, batch=n > 1, fsync=topic.config.fsync,
          parts=topic.partitions)
        try:
            if n == 1:
                k = keys[0].encode() if keys[0] is not None else None
                res = [topic.append(value_of(ids[0]), key=k)]
            else:
                res = topic.append_batch([value_of(i) for i in ids],
                                         keys=[k.encode() for k in keys] if keyed else None)
        except Exception as e:
            j("failed", topic=tname, ids=ids, unexpected=not _expected(e), **_err(e))
            if type(e).__name__ in ("LogLockedError", "UnknownTopicError"):
                work = [t for t in work if t != tname]
                if type(e).__name__ == "UnknownTopicError":
                    held.pop(tname, None)
                time.sleep(rng.random() * 0.02)
            continue
        j("acked" if topic.config.fsync == "always" else "written", topic=tname, ids=ids,
          at=[list(x) for x in res])
        time.sleep(rng.random() * 0.01)
    j("flush-start")
    store.close()
    j("flushed")
    j("end")


def txproducer(root: str, j: Journal, rng: random.Random, stop: str, name: str) -> None:
    """Transactions across topics and partitions, some aborted by raising in the block."""
    import pylog

    class Abort(Exception):
        pass

    store = pylog.LogStore(root)
    j("start", role="txproducer")
    seq = 0
    tx_n = 0
    while running():
        topics = store.topics()
        if not topics:
            time.sleep(0.05)
            continue
        txid = f"{name}:tx{tx_n}"
        tx_n += 1
        abort = rng.random() < 0.3
        j("tx-begin", tx=txid)
        try:
            with store.transaction() as tx:
                for _ in range(rng.randint(1, 6)):
                    tname = rng.choice(topics)
                    n = 1 if rng.random() < 0.7 else rng.randint(2, 6)
                    ids = [f"{name}:{seq + i}" for i in range(n)]
                    seq += n
                    keyed = rng.random() < 0.5
                    keys = [f"k{name}-{rng.randint(0, 5)}" if keyed else None for _ in ids]
                    j("tx-attempt", tx=txid, topic=tname, ids=ids, keys=keys)
                    if n == 1:
                        parts = [tx.append(tname, value_of(ids[0]), key=keys[0].encode() if keyed else None)]
                    else:
                        parts = tx.append_batch(tname, [value_of(i) for i in ids],
                                                keys=[k.encode() for k in keys] if keyed else None)
                    j("tx-appended", tx=txid, ids=ids, at=None, parts=list(parts))
                    time.sleep(rng.random() * 0.005)
                if abort:
                    j("tx-abort-start", tx=txid)
                    raise Abort()
                j("tx-commit-start", tx=txid)
            j("tx-committed", tx=txid)
        except Abort:
            j("tx-aborted", tx=txid)
        except Exception as e:
            j("tx-failed", tx=txid, unexpected=not _expected(e), **_err(e))
        time.sleep(rng.random() * 0.02)
    store.close()
    j("end")


def consumer(root: str, j: Journal, rng: random.Random, stop: str, name: str, topic: str,
             group: str) -> None:
    """A group member: polls, checks every value, commits, sometimes seeks back."""
    import pylog

    store = pylog.LogStore(root)
    try:
        c = store.consumer(topic, group=group)
    except Exception as e:
        j("consumer-failed", topic=topic, group=group, unexpected=not _expected(e), **_err(e))
        return
    j("start", role="consumer", topic=topic, group=group)
    known: set[int] = set()

    def note_assignment(got: dict) -> None:
        # where a newly owned partition started: the first record this poll returned from
        # it (a poll claims partitions and fetches in one call), else its position
        for p in c.assignment():
            if p not in known:
                known.add(p)
                pos = got[p][0].offset if p in got else c.position(p)
                j("resume", topic=topic, group=group, p=p, pos=pos, committed=c.committed(p))

    try:
        note_assignment({})
        while running():
            got = c.poll_partitions(max_records=rng.randint(1, 50), timeout_ms=50)
            note_assignment(got)
            for p, recs in got.items():
                j("read", topic=topic, group=group, p=p, recs=seen(recs))
            r = rng.random()
            if r < 0.5:
                todo = {p: c.position(p) for p in c.assignment()}
                j("commit-start", topic=topic, group=group, offsets=todo)
                c.commit(todo)
                j("committed", topic=topic, group=group, offsets=todo)
            elif r < 0.52 and c.assignment():
                p = rng.choice(c.assignment())
                back = max(0, c.position(p) - rng.randint(1, 20))
                j("seek", topic=topic, group=group, p=p, to=back)
                c.seek(p, back)
    except Exception as e:
        j("consumer-failed", topic=topic, group=group, unexpected=not _expected(e), **_err(e))
    finally:
        store.close()
    j("end")


def reader(root: str, j: Journal, rng: random.Random, stop: str, name: str, topic: str) -> None:
    """Follows a topic's tail: a read-only Log of one partition, or a group-less consumer."""
    import pylog

    j("start", role="reader", topic=topic)
    try:
        if rng.random() < 0.5:
            p = 0
            log = pylog.Log(os.path.join(root, topic, f"partition-{p}"), readonly=True)
            off = log.start_offset
            while running():
                recs = log.read_batch(off, 1 << 16, rng.randint(1, 100))
                if recs:
                    j("read", topic=topic, group=None, p=p, recs=seen(recs))
                    off = recs[-1].offset + 1
                else:
                    time.sleep(0.02)
            log.close()
        else:
            store = pylog.LogStore(root)
            c = store.consumer(topic)
            while running():
                for p, recs in c.poll_partitions(max_records=rng.randint(1, 100), timeout_ms=50).items():
                    j("read", topic=topic, group=None, p=p, recs=seen(recs))
            store.close()
    except Exception as e:
        j("reader-failed", topic=topic, unexpected=not _expected(e), **_err(e))
    j("end")


def _die_with_parent() -> None:
    """In a child: be SIGKILLed when the driver process dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def next_offsets(j: Journal, root: str, topic: str) -> dict[int, int]:
    """Each partition's next_offset now (read-only; {} if the topic is gone)."""
    import pylog
    from pylog.topics import _read_topic_file

    out = {}
    try:
        n, _ = _read_topic_file(os.path.join(root, topic), topic)
        for p in range(n):
            with pylog.Log(os.path.join(root, topic, f"partition-{p}"), readonly=True) as log:
                out[p] = log.next_offset
    except Exception as e:
        j("next-offsets-failed", topic=topic, **_err(e))
    return out


def start_offsets(root: str, topic: str) -> dict[str, int]:
    """Each partition's start_offset now (read-only; {} if the topic is gone): a diagnostic
    for the checker's messages."""
    import pylog
    from pylog.topics import _read_topic_file

    out = {}
    try:
        n, _ = _read_topic_file(os.path.join(root, topic), topic)
        for p in range(n):
            with pylog.Log(os.path.join(root, topic, f"partition-{p}"), readonly=True) as log:
                out[str(p)] = log.start_offset
    except Exception:
        pass
    return out


def group_committed(root: str, topic: str, group: str) -> dict[str, int | None]:
    """The offsets ``group`` has committed on ``topic``, per partition with an offset file
    (None: the file is damaged), read from the files as they are on disk."""
    from pylog.consumer import decode_offset
    from pylog.topics import CONSUMERS_DIR

    out: dict[str, int | None] = {}
    gdir = os.path.join(root, topic, CONSUMERS_DIR, group)
    try:
        names = os.listdir(gdir)
    except OSError:
        return out
    for name in names:
        if name.startswith("partition-") and name.endswith(".offset"):
            try:
                with open(os.path.join(gdir, name), "rb") as f:
                    out[name[len("partition-"):-len(".offset")]] = decode_offset(f.read())
            except OSError:
                pass
    return out


def cliconsumer(root: str, j: Journal, rng: random.Random, stop: str, name: str, topic: str,
                group: str) -> None:
    """Runs ``pylog consume TOPIC -g GROUP --format json`` again and again: to the end of
    the log or ``-n K`` records (a clean exit), or SIGKILLed after K lines; every line it
    printed is journaled, and after it exits each partition's next_offset."""

    j("start", role="cliconsumer", topic=topic, group=group)
    while running():
        if not os.path.isfile(os.path.join(root, topic, "topic.json")):
            break
        if rng.random() < 0.2:  # a new group (Kafka's console consumer commits it on close)
            group = f"{group.split('.')[0]}.{rng.randrange(1 << 20)}"
        mode = rng.choice(["n", "n", "end", "kill", "head"])
        k = rng.randint(1, 40)
        args = [sys.executable, "-m", "pylog", "--root", root, "consume", topic, "-g", group,
                "--format", "json"]
        if mode == "n":
            args += ["-n", str(k)]
        if rng.random() < 0.5:
            args.append("--from-beginning")
        new_group = not os.path.isdir(os.path.join(root, topic, "~consumers", group))
        before = next_offsets(j, root, topic)
        committed_before = group_committed(root, topic, group)
        j("cli-start", topic=topic, group=group, mode=mode, args=args[4:])
        pr = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=_die_with_parent)
        assert pr.stdout is not None and pr.stderr is not None
        lines = []
        pipe = 65536
        if mode == "head":  # as `| head -n K`: read K lines, close the pipe
            try:  # a one-page pipe bounds what it may have written and we did not read
                pipe = fcntl.fcntl(pr.stdout.fileno(), F_SETPIPE_SZ, 4096)
            except OSError:
                pass
            for _ in range(k):
                line = pr.stdout.readline()
                if not line.endswith(b"\n"):
                    break
                lines.append(line)
            pr.stdout.close()
            err = pr.stderr.read()
            pr.wait(timeout=60)
            out = b""
        elif mode == "kill":
            for _ in range(k):
                line = pr.stdout.readline()
                if not line:
                    break
                lines.append(line)
            pr.kill()
            # the rest of what it wrote (read through the same buffered reader), and stderr
            out, err = pr.stdout.read(), pr.stderr.read()
            pr.wait()
            if out and not out.endswith(b"\n"):
                out = out[: out.rfind(b"\n") + 1]  # a line cut short by the kill
        else:
            out, err = pr.communicate(timeout=60)
        lines += out.splitlines()
        by_part: dict[int, list[list[Any]]] = {}
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                if line.strip():
                    by_part.setdefault(-1, []).append([-1, line[:80].decode("ascii", "replace"), False])
                continue
            v = obj.get("value")
            rid = id_of(v.encode()) if isinstance(v, str) else None
            by_part.setdefault(obj["partition"], []).append(
                [obj["offset"], rid, isinstance(v, str) and value_of(rid or "") == v.encode()])
        j("cli-ran", topic=topic, group=group, mode=mode, rc=pr.returncode, next=next_offsets(j, root, topic),
          committed=group_committed(root, topic, group), committed_before=committed_before,
          start_offsets=start_offsets(root, topic), from_beginning="--from-beginning" in args, before=before,
          pipe=pipe, new_group=new_group,
          err=err.decode("utf-8", "replace").strip().splitlines()[-1:] if err.strip() else [],
          traceback=b"Traceback (most recent call last)" in err,
          reads={str(p): recs for p, recs in by_part.items()})
        time.sleep(rng.random() * 0.1)
    j("end")


def topic_config(rng: random.Random) -> dict[str, Any]:
    """A random topic config: fsync policy, small segments, cleanup policy."""
    cfg: dict[str, Any] = {"fsync": rng.choice(["always", "always", "interval", "never"]),
                           "segment_bytes": rng.choice([4096, 16384, 1 << 20])}
    if cfg["fsync"] == "interval":
        cfg["flush_messages"] = rng.choice([None, 5, 10])
        cfg["flush_ms"] = rng.choice([None, 50, 1000])
    if rng.random() < 0.3:
        cfg["cleanup_policy"] = "compact"
    elif rng.random() < 0.3:
        cfg["retention_bytes"] = rng.choice([8192, 32768])
    return cfg


def _in_use(root: str, topic: str) -> bool:
    """Whether a partition of ``topic`` is open for writing, or a group member holds a lock."""
    from pylog.topics import _locked_by_other

    d = os.path.join(root, topic)
    try:
        locks = [os.path.join(d, e, ".lock") for e in os.listdir(d) if e.startswith("partition-")]
        cdir = os.path.join(d, "~consumers")
        if os.path.isdir(cdir):
            for g in os.listdir(cdir):
                locks += [os.path.join(cdir, g, f) for f in os.listdir(os.path.join(cdir, g)) if f.endswith(".lock")]
    except FileNotFoundError:
        return True
    return any(_locked_by_other(p) for p in locks)


def admin(root: str, j: Journal, rng: random.Random, stop: str, name: str) -> None:
    """Creates, deletes, grows and alters topics; runs retention and compaction."""
    import pylog

    store = pylog.LogStore(root)
    j("start", role="admin")
    k = 0
    while running():
        time.sleep(0.1 + rng.random() * 0.4)
        topics = store.topics()
        r = rng.random()
        if r < 0.15 or len(topics) < 2:
            tname = f"{name.replace(':', '_')}_{k}"
            k += 1
            cfg = topic_config(rng)
            op = {"op": "create", "topic": tname, "partitions": rng.randint(1, 3), "config": cfg}
        elif not topics:
            continue
        elif r < 0.35 and len(topics) > 3:
            # a topic nobody writes or consumes now, if there is one (else delete refuses)
            free = [t for t in topics if not _in_use(root, t)]
            op = {"op": "delete", "topic": rng.choice(free or topics)}
        elif r < 0.45:
            op = {"op": "add_partitions", "topic": rng.choice(topics), "count": rng.randint(1, 2)}
        elif r < 0.55:
            op = {"op": "alter", "topic": rng.choice(topics),
                  "changes": {"retention_bytes": rng.choice([None, 8192, 65536])}}
        elif r < 0.8:
            op = {"op": "retention", "topic": rng.choice(topics)}
        else:
            op = {"op": "compact", "topic": rng.choice(topics)}
        j("admin-start", **op)
        try:
            if op["op"] == "create":
                store.create_topic(op["topic"], op["partitions"], **op["config"])
                res: Any = None
            elif op["op"] == "delete":
                store.delete_topic(op["topic"])
                res = None
            elif op["op"] == "add_partitions":
                res = store.add_partitions(op["topic"], op["count"])
            elif op["op"] == "alter":
                res = None
                store.alter_topic(op["topic"], **op["changes"])
            elif op["op"] == "retention":
                res = {f"{t}/{p}": n for (t, p), n in store.enforce_retention(op["topic"]).items()}
            else:
                res = {f"{t}/{p}": rep.removed if hasattr(rep, "removed") else None
                       for (t, p), rep in store.compact(op["topic"]).items()}
            j("admin-done", res=res, **op)
        except Exception as e:
            j("admin-failed", unexpected=not _expected(e), **op, **_err(e))
        # partitions opened for retention/compaction are held for writing: let them go
        store.close()
        store = pylog.LogStore(root)
    store.close()
    j("end")


ROLES = {"producer": producer, "txproducer": txproducer, "consumer": consumer, "reader": reader,
         "admin": admin, "cliconsumer": cliconsumer}


def main(argv: list[str]) -> None:
    global _STOP
    role, root, journal, seed, stop, *args = argv
    rng = random.Random(int(seed))
    j = Journal(journal)
    _STOP = stop
    ROLES[role](root, j, rng, stop, os.path.basename(journal).rsplit(".", 1)[0], *args)


# ----------------------------------------------------------------------------------------
# orchestration
@dataclass
class RunStats:
    """What one run did."""

    processes: int = 0
    kills: int = 0
    events: int = 0
    violations: list[str] = field(default_factory=list)


def has_transactions() -> bool:
    """Whether the store has transactions yet (issue 14 case 7)."""
    import pylog

    return hasattr(pylog.LogStore, "transaction")


def run(root: str, seed: int, seconds: float, kill_every: float = 0.8) -> RunStats:
    """One run: spawn the roles on ``root`` for ``seconds``, SIGKILL and restart some at
    random, then check the journals. Journals go to ``root``'s sibling ``journals``."""
    import pylog

    rng = random.Random(seed)
    jdir = root.rstrip("/") + ".journals"
    os.makedirs(jdir, exist_ok=True)
    os.makedirs(root, exist_ok=True)
    boot = Journal(os.path.join(jdir, "boot.jsonl"))
    with pylog.LogStore(root) as s:
        for i in range(3):
            cfg = topic_config(rng)
            cfg["fsync"] = ["always", "interval", "never"][i]
            op = {"op": "create", "topic": f"t{i}", "partitions": 2, "config": cfg}
            boot("admin-start", **op)
            s.create_topic(f"t{i}", 2, **cfg)
            boot("admin-done", res=None, **op)
    env = {**os.environ, "PYTHONPATH": ROOT_DIR + os.pathsep + HERE}
    stop = root.rstrip("/") + ".stop"
    stats = RunStats()
    slots: dict[str, list[Any]] = {
        "p0": ["producer"], "p1": ["producer"], "a0": ["admin"],
        "c0": ["consumer", "t0", "g0"], "c1": ["consumer", "t1", "g1"], "c2": ["consumer", "t1", "g1"],
        "r0": ["reader", "t0"], "r1": ["reader", "t2"], "k0": ["cliconsumer", "t2", "gk0"],
    }
    if has_transactions():
        slots["x0"] = ["txproducer"]
    incarnation = {s: 0 for s in slots}
    procs: dict[str, subprocess.Popen] = {}

    def spawn(slot: str) -> None:
        role, *args = slots[slot]
        if role in ("consumer", "reader", "cliconsumer") and not os.path.isfile(
                os.path.join(root, args[0], "topic.json")):
            alive = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "topic.json")))
            if not alive:
                return
            args[0] = rng.choice(alive)
            if role in ("consumer", "cliconsumer"):
                args[1] = f"g{slot}-{incarnation[slot]}"
            slots[slot] = [role, *args]
        incarnation[slot] += 1
        journal = os.path.join(jdir, f"{slot}.{incarnation[slot]}.jsonl")
        journals[slot] = journal
        procs[slot] = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "model_driver.py"), role, root, journal,
             str(rng.randrange(1 << 30)), stop, *args], env=env)
        stats.processes += 1

    def ready(slot: str) -> bool:  # it journaled its start (python and pylog are loaded)
        return os.path.exists(journals[slot]) and os.path.getsize(journals[slot]) > 0

    journals: dict[str, str] = {}
    for s in slots:
        spawn(s)
    up_by = time.monotonic() + 120
    while time.monotonic() < up_by and not all(ready(s) or procs[s].poll() is not None for s in procs):
        time.sleep(0.05)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(rng.random() * kill_every * 2)
        for s, pr in list(procs.items()):
            if pr.poll() is not None and time.monotonic() < deadline - 1:
                spawn(s)
        if time.monotonic() >= deadline - 0.5:
            break
        up = [s for s in sorted(procs) if ready(s)]
        if not up:
            continue
        victim = rng.choice(up)
        pr = procs[victim]
        if pr.poll() is None:
            os.kill(pr.pid, signal.SIGKILL)
            pr.wait()
            boot("killed", slot=victim)
            stats.kills += 1
        if time.monotonic() < deadline - 1:
            spawn(victim)
    with open(stop, "w"):
        pass
    for s, pr in procs.items():
        try:
            pr.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(pr.pid, signal.SIGKILL)
            pr.wait()
            boot("hung", slot=s)
            stats.violations.append(f"process {s} did not finish within 60 s of the stop")
    events, violations = check(root, jdir)
    stats.events = events
    stats.violations.extend(violations)
    return stats


# ----------------------------------------------------------------------------------------
# the checker
def load(jdir: str) -> dict[str, list[dict[str, Any]]]:
    """Every journal's events, by journal name; a line cut short by a kill is dropped."""
    out = {}
    for name in sorted(os.listdir(jdir)):
        evs = []
        with open(os.path.join(jdir, name), "rb") as f:
            for line in f:
                try:
                    evs.append(json.loads(line))
                except ValueError:
                    pass
        out[name.rsplit(".", 1)[0]] = evs
    return out


def final_state(root: str, problems: list[str]) -> tuple[dict[tuple[str, int, int], str], dict, dict]:
    """Open the store as a new process would (recovery) and scan every partition:
    ``({(topic, p, offset): id}, {(topic, p): start_offset}, {topic: partitions})``."""
    import pylog
    from pylog.topics import _read_topic_file

    recs: dict[tuple[str, int, int], str] = {}
    starts: dict[tuple[str, int], int] = {}
    nparts: dict[str, int] = {}
    store = pylog.LogStore(root)
    try:
        for name in store.topics():
            n, _ = _read_topic_file(os.path.join(root, name), name)
            nparts[name] = n
            for p in range(n):
                try:  # opened for writing: recovery runs, as for the next user
                    log = pylog.Log(os.path.join(root, name, f"partition-{p}"))
                except Exception as e:
                    problems.append(f"final: {name}/{p} cannot be opened: {type(e).__name__}: {e}")
                    continue
                try:
                    starts[(name, p)] = log.start_offset
                    for r in log.scan():
                        rid = id_of(r.value)
                        if r.value is not None and value_of(rid or "") != bytes(r.value):
                            problems.append(f"final: {name}/{p}@{r.offset} holds bytes that are not any record's")
                        recs[(name, p, r.offset)] = rid or ""
                    if log.recovery_report:
                        problems.append(f"final: {name}/{p} recovery report {log.recovery_report}")
                except Exception as e:
                    problems.append(f"final: scan of {name}/{p} failed: {type(e).__name__}: {e}")
                finally:
                    log.close()
        # leftovers: partition directories of a topic without topic.json
        for entry in os.listdir(root):
            d = os.path.join(root, entry)
            if os.path.isdir(d) and "~" not in entry and not entry.startswith(".") and entry not in nparts:
                problems.append(f"final: directory {entry!r} is not a topic (no topic.json) "
                                f"but holds {sorted(os.listdir(d))}")
    finally:
        store.close()
    return recs, starts, nparts


def check(root: str, jdir: str) -> tuple[int, list[str]]:
    """Replay the journals in ``jdir`` against ``root``; returns (events, violations)."""
    from pylog.topics import partition_for_key

    journals = load(jdir)
    problems: list[str] = []
    nevents = sum(len(v) for v in journals.values())

    attempts: dict[str, dict[str, Any]] = {}  # id -> {topic, key, proc, t, tx}
    placed: dict[str, tuple[str, int, int]] = {}  # id -> (topic, p, offset) as the producer was told
    acked: dict[str, int] = {}  # id -> ack time
    not_written: dict[str, str] = {}
    tx_of: dict[str, str] = {}
    tx_state: dict[str, str] = {}  # tx -> "open" | "commit-start" | "committed" | "aborted" | "failed"
    tx_commit_t: dict[str, int] = {}
    deletes: dict[str, tuple[int, int | None]] = {}  # topic -> (first delete start, first delete done)
    trimmed: set[str] = set()  # topics whose records a user removed (retention, compaction, config)
    compacted: set[str] = set()
    part_history: dict[str, list[tuple[int, int]]] = {}  # topic -> [(time, partitions)]
    reads: list[tuple[str, dict[str, Any]]] = []
    commits: dict[tuple[str, str, int], list[tuple[int, int, str]]] = {}  # (g, topic, p) -> [(t, off, kind)]
    resumes: list[dict[str, Any]] = []
    written_by: dict[str, list[tuple[str, list[str], list[list[int]]]]] = {}
    cli_runs: dict[str, list[dict[str, Any]]] = {}
    tx_part: dict[str, int] = {}  # id of a transactional record -> the partition tx.append named

    for jname, evs in journals.items():
        pending: list[str] = []  # written, not yet flushed
        flush_cover: list[str] = []
        adding: tuple[str, int, int] | None = None  # an add_partitions begun, not yet journaled done
        for ev in evs:
            e = ev["e"]
            if e == "admin-start" and ev["op"] == "add_partitions":
                adding = (ev["topic"], ev["count"], ev["t"])
            elif e in ("admin-done", "admin-failed"):
                adding = None
            if e in ("attempt", "tx-attempt"):
                for rid, key in zip(ev["ids"], ev["keys"]):
                    attempts[rid] = {"topic": ev["topic"], "key": key, "proc": jname, "t": ev["t"],
                                     "tx": ev.get("tx"), "parts": ev.get("parts")}
                    if ev.get("tx"):
                        tx_of[rid] = ev["tx"]
            elif e == "tx-appended" and ev.get("parts"):
                for rid, p in zip(ev["ids"], ev["parts"]):
                    tx_part[rid] = p
            elif e in ("acked", "written", "tx-appended"):
                for rid, at in zip(ev["ids"], ev["at"] or [None] * len(ev["ids"])):
                    if at is not None:
                        placed[rid] = (attempts[rid]["topic"], at[0], at[1])
                    if e == "acked":
                        acked[rid] = ev["t"]
                    elif e == "written":
                        pending.append(rid)
                if e != "tx-appended":
                    written_by.setdefault(jname, []).append((ev["topic"], ev["ids"], ev["at"]))
            elif e == "flush-start":
                flush_cover = list(pending)
            elif e == "flushed":
                for rid in flush_cover:
                    acked.setdefault(rid, ev["t"])
                pending = [r for r in pending if r not in set(flush_cover)]
                flush_cover = []
            elif e == "failed":
                if ev["err"] in NOT_WRITTEN:
                    for rid in ev["ids"]:
                        not_written[rid] = ev["err"]
                if ev.get("unexpected"):
                    problems.append(f"{jname}: append of {ev['ids'][:3]} to {ev['topic']} raised "
                                    f"{ev['err']}: {ev['msg']} (neither PylogError nor OSError)")
            elif e == "tx-begin":
                tx_state[ev["tx"]] = "open"
            elif e == "tx-commit-start":
                tx_state[ev["tx"]] = "commit-start"
                tx_commit_t[ev["tx"]] = ev["t"]
            elif e == "tx-committed":
                tx_state[ev["tx"]] = "committed"
            elif e == "tx-aborted":
                tx_state[ev["tx"]] = "aborted"
            elif e == "tx-failed":
                # failed before its commit, or its commit reported that nothing was written:
                # never visible; an OSError during the commit leaves either outcome possible
                if tx_state.get(ev["tx"]) != "commit-start" or ev["err"] in NOT_WRITTEN:
                    tx_state[ev["tx"]] = "failed"
                if ev.get("unexpected"):
                    problems.append(f"{jname}: transaction {ev['tx']} raised {ev['err']}: {ev['msg']}")
            elif e == "admin-start":
                if ev["op"] == "delete":
                    deletes.setdefault(ev["topic"], (ev["t"], None))
                elif ev["op"] in ("retention", "alter"):
                    trimmed.add(ev["topic"])
                elif ev["op"] == "compact":
                    compacted.add(ev["topic"])
                elif ev["op"] == "create":
                    part_history.setdefault(ev["topic"], []).append((ev["t"], ev["partitions"]))
                    if ev["config"].get("cleanup_policy") == "compact":
                        compacted.add(ev["topic"])
            elif e == "admin-done":
                if ev["op"] == "delete":
                    t0, done = deletes[ev["topic"]]
                    if done is None:
                        deletes[ev["topic"]] = (t0, ev["t"])
                elif ev["op"] == "add_partitions":
                    part_history.setdefault(ev["topic"], []).append((ev["t"], ev["res"]))
            elif e == "admin-failed":
                if ev.get("unexpected"):
                    problems.append(f"{jname}: admin {ev['op']} {ev['topic']} raised {ev['err']}: {ev['msg']}")
            elif e == "read":
                reads.append((jname, ev))
            elif e in ("commit-start", "committed"):
                for p, off in ev["offsets"].items():
                    commits.setdefault((ev["group"], ev["topic"], int(p)), []).append((ev["t"], off, e))
            elif e == "seek":
                commits.setdefault((ev["group"], ev["topic"], ev["p"]), []).append((ev["t"], ev["to"], "seek"))
            elif e == "resume":
                resumes.append({**ev, "j": jname})
            elif e == "cli-ran":
                cli_runs.setdefault(jname, []).append(ev)
                for p, recs in ev["reads"].items():
                    if p == "-1":
                        problems.append(f"{jname}: pylog consume printed a line that is no record: {recs[0][1]!r}")
                    else:
                        reads.append((jname, {"topic": ev["topic"], "p": int(p), "recs": recs, "t": ev["t"]}))
                if ev["traceback"] or (ev["mode"] != "kill" and ev["rc"] not in (0, 1, 2)):
                    problems.append(f"{jname}: pylog consume exited {ev['rc']} with {ev['err']}"
                                    + (" and a traceback" if ev["traceback"] else ""))
            elif e in ("consumer-failed", "reader-failed", "flush-failed", "topic-failed") and ev.get("unexpected"):
                problems.append(f"{jname}: {e} {ev.get('err')}: {ev.get('msg')}")
        if adding is not None:
            # killed between add_partitions and its journal line: the new count may have taken
            # effect from the moment the call began (producers then rightly hash over it)
            topic, count, t0 = adding
            before = [(tn, n) for (tn, n) in part_history.get(topic, []) if tn <= t0]
            if before:
                part_history[topic].append((t0, max(before)[1] + count))

    recs, starts, nparts = final_state(root, problems)
    recs_final = recs

    def excused(topic: str) -> bool:
        return topic in deletes

    # 1. what readers saw: known, committed, consistent, intact
    seen_at: dict[tuple[str, int, int], str] = {}
    for (topic, p, off), rid in recs.items():
        seen_at[(topic, p, off)] = rid
    loc_of: dict[str, tuple[str, int, int]] = {}
    for jname, ev in reads:
        last: dict[int, int] = {}
        for off, rid, ok in ev["recs"]:
            key = (ev["topic"], ev["p"], off)
            where = f"{jname} read {ev['topic']}/{ev['p']}@{off}"
            if not ok:
                problems.append(f"{where}: bytes differ from what was appended for {rid!r}")
            if rid not in attempts:
                problems.append(f"{where}: {rid!r} was never appended")
                continue
            if rid in not_written:
                problems.append(f"{where}: {rid!r} whose append raised {not_written[rid]}")
            tx = tx_of.get(rid)
            if tx is not None:
                st = tx_state.get(tx, "open")
                if st in ("aborted", "failed", "open"):
                    problems.append(f"{where}: {rid!r} of transaction {tx} which is {st}")
                elif ev["t"] < tx_commit_t[tx]:
                    problems.append(f"{where}: {rid!r} before its transaction {tx} began to commit")
            other = seen_at.setdefault(key, rid)
            if other != rid and not excused(ev["topic"]):
                problems.append(f"{where}: {rid!r}, but {other!r} is at that offset elsewhere")
            prev = loc_of.setdefault(rid, key)
            if prev != key and not excused(ev["topic"]):
                problems.append(f"{where}: {rid!r} also at {prev}")
            if rid in placed and placed[rid] != key and not excused(ev["topic"]):
                problems.append(f"{where}: {rid!r} was appended at {placed[rid]}")
            if rid in tx_part and tx_part[rid] != ev["p"]:
                problems.append(f"{where}: {rid!r} was staged for partition {tx_part[rid]}")
            if off <= last.get(ev["p"], -1):
                problems.append(f"{where}: offsets went back within one fetch")
            last[ev["p"]] = off

    # 2. final state: no duplicates, nothing unknown, nothing aborted
    where_final: dict[str, tuple[str, int, int]] = {}
    for key, rid in recs.items():
        if rid not in attempts:
            problems.append(f"final: {key} holds {rid!r}, never appended")
            continue
        if rid in where_final:
            problems.append(f"final: {rid!r} twice, at {where_final[rid]} and {key}")
        where_final[rid] = key
        tx = tx_of.get(rid)
        if tx is not None and tx_state.get(tx, "open") in ("aborted", "failed", "open"):
            problems.append(f"final: {key} holds {rid!r} of transaction {tx} ({tx_state.get(tx, 'open')})")
        if rid in placed and placed[rid] != key:
            problems.append(f"final: {rid!r} at {key}, appended at {placed[rid]}")

    # 3. no acknowledged record lost
    for rid, t_ack in acked.items():
        a = attempts[rid]
        topic = a["topic"]
        if topic in deletes:
            t_del, t_done = deletes[topic]
            if t_done is not None and a["t"] > t_done:
                problems.append(f"ack: {rid!r} appended to {topic} after the topic was deleted")
            continue
        key = placed.get(rid)
        if key is None:
            continue
        if recs.get(key) == rid:
            continue
        if topic not in nparts:
            problems.append(f"ack: {rid!r} at {key} lost: topic {topic} is gone but nobody deleted it")
            continue
        if key[1] >= nparts[topic]:
            problems.append(f"ack: {rid!r} at {key}: the topic has only {nparts[topic]} partitions")
            continue
        if key[2] < starts.get((topic, key[1]), 0) and topic in trimmed | compacted:
            continue  # retention removed it
        if topic in compacted and a["key"] is not None and any(
                r2 != rid and attempts.get(r2, {}).get("key") == a["key"] and k2[:2] == key[:2] and k2[2] > key[2]
                for k2, r2 in recs.items()):
            continue  # a later record of its key superseded it
        problems.append(f"ack: {rid!r} acknowledged at {key} is lost (holds {recs.get(key)!r})")

    # 3b. no record of a committed transaction lost (its commit returned: acknowledged)
    for rid, tx in tx_of.items():
        topic = attempts[rid]["topic"]
        if tx_state.get(tx) != "committed" or topic in deletes or topic in trimmed | compacted:
            continue
        if rid not in where_final:
            problems.append(f"ack: {rid!r} of committed transaction {tx} (for {topic}/{tx_part.get(rid)}) is lost")
        elif rid in tx_part and where_final[rid][1] != tx_part[rid]:
            problems.append(f"final: {rid!r} of transaction {tx} is in {where_final[rid]}, "
                            f"staged for partition {tx_part[rid]}")

    # 4. per-key order within a partition, and keys land where their key hashes
    for jname, batches in written_by.items():
        last_at: dict[tuple[str, str, int], int] = {}
        for topic, ids, ats in batches:
            for rid, (p, off) in zip(ids, ats):
                k = attempts[rid]["key"]
                if k is None:
                    continue
                prev = last_at.get((topic, k, p))
                if prev is not None and off <= prev:
                    problems.append(f"order: {jname} key {k} in {topic}/{p}: {rid!r} at {off} after {prev}")
                last_at[(topic, k, p)] = off
                hist = part_history.get(topic, [])
                t = attempts[rid]["t"]
                ok_counts = {n for (tn, n) in hist if tn <= t}
                current = max((tn, n) for (tn, n) in hist if tn <= t)[1] if ok_counts else None
                # every count that was current at some moment of the last PARTITION_REFRESH_S:
                # the ones that took effect in it, and the one current when it began (a count
                # superseded 50 ms ago may still be the handle's view)
                t_old = t - PARTITION_REFRESH_S * 1e9
                recent = {n for (tn, n) in hist if t_old <= tn <= t}
                older = [(tn, n) for (tn, n) in hist if tn < t_old]
                if older:
                    recent.add(max(older)[1])
                allowed = {c for c in [current, *recent] if c is not None}
                # a count changed after the attempt began may be seen as well
                allowed |= {n for (tn, n) in hist if tn > t}
                if allowed and not any(partition_for_key(k.encode(), n) == p for n in allowed):
                    problems.append(f"partition: {jname} key {k} of {rid!r} went to {topic}/{p}; "
                                    f"counts then {sorted(allowed)} (stale by more than {PARTITION_REFRESH_S} s)")

    # 5. committed offsets never move back unless a user asked; restarts resume there
    for (g, topic, p), hist in commits.items():
        hist.sort()
        high = -1
        for t, off, kind in hist:
            if kind == "seek":
                high = -1
                continue
            if kind == "committed":
                if off < high and not excused(topic):
                    problems.append(f"commit: group {g} {topic}/{p} committed {off} after {high}")
                high = max(high, off)
    for ev in resumes:
        hist = sorted(commits.get((ev["group"], ev["topic"], ev["p"]), []))
        before = [(t, off, kind) for t, off, kind in hist if t < ev["t"]]
        done = [off for t, off, kind in before if kind == "committed"]
        started_after_done = []
        for t, off, kind in reversed(before):
            if kind == "committed":
                break
            if kind == "commit-start":
                started_after_done.append(off)
        where = f"{ev['j']} resume of group {ev['group']} {ev['topic']}/{ev['p']}"
        if ev["committed"] is not None and ev["pos"] != ev["committed"]:
            skipped = sorted(off for (t2, p2, off) in recs if t2 == ev["topic"] and p2 == ev["p"]
                             and ev["committed"] <= off < ev["pos"])
            if ev["pos"] < ev["committed"] or skipped:
                problems.append(f"{where}: started at {ev['pos']}, not at the committed offset "
                                f"{ev['committed']}" + (f" (skipped {skipped[:5]})" if skipped else ""))
        if done and ev["topic"] not in deletes:
            if ev["committed"] is None:
                problems.append(f"{where}: committed offset {done[-1]} was lost")
            elif ev["committed"] != done[-1] and ev["committed"] not in started_after_done:
                problems.append(f"{where}: resumed from {ev['committed']}, last commit was {done[-1]}")

    # 6. pylog consume -g: a run starts where the group's last run stopped printing
    # (a clean exit commits exactly what it printed; a killed one may commit less, never
    # more than it printed); a new group that printed nothing commits where it stood
    for jname, runs in cli_runs.items():
        # (group, topic, p) -> (last printed or passed, exact, how, lowest start allowed,
        # how many records it may have printed that nobody read: a closed pipe's content)
        after: dict[tuple[str, str, int], tuple[int, bool, str, int, int]] = {}
        for ev in runs:
            for p_s, recs in ev["reads"].items():
                p = int(p_s)
                if p < 0 or not recs:
                    continue
                key = (ev["group"], ev["topic"], p)
                first = recs[0][0]
                c0 = (ev.get("committed_before") or {}).get(p_s)
                st = (ev.get("start_offsets") or {}).get(p_s)
                if key in after and c0 is not None and st is not None and c0 < st:
                    # retention removed the group's committed offset from the log (by the run's
                    # end, so perhaps before it resolved it): the run rightly starts as
                    # auto_offset_reset says (the log end, without --from-beginning), as Kafka does
                    after.pop(key)
                if key in after:
                    hi, exact, how, lo, slack = after[key]
                    # records only leave a log from its front (retention) or as superseded
                    # (compaction): one still there at the end was there when this run began
                    skipped = sorted(o for (t2, p2, o) in recs_final
                                     if t2 == ev["topic"] and p2 == p and hi < o < first)
                    if len(skipped) > slack:
                        problems.append(f"{jname}: pylog consume -g {ev['group']} {ev['topic']}/{p} started at "
                                        f"{first}, skipping {skipped[:5]} ({len(skipped)}) after {how}; the group "
                                        f"had committed {ev.get('committed_before', {}).get(p_s)} when it began, "
                                        f"the log then {ev['before'].get(p_s)}, at its end "
                                        f"[{ev.get('start_offsets', {}).get(p_s)}, {ev['next'].get(p_s)}), "
                                        f"mode {ev['mode']}")
                    elif exact and first <= hi:
                        problems.append(f"{jname}: pylog consume -g {ev['group']} {ev['topic']}/{p} started at "
                                        f"{first}, printed again after {how} that printed up to {hi}")
                    elif first < lo:
                        problems.append(f"{jname}: pylog consume -g {ev['group']} {ev['topic']}/{p} started at "
                                        f"{first}, before {lo}, where {how} had its position")
            clean = ev["rc"] == 0  # it exited by itself (a 'kill' run may end before its kill)
            if ev["mode"] == "head" and ev["rc"] != 0:
                clean = False  # a broken pipe: what it printed last may not be whole
            committed = ev.get("committed")  # the group's offset files after the run (newer journals)
            for p_s, nxt in ev["next"].items():
                p = int(p_s)
                key = (ev["group"], ev["topic"], p)
                recs = ev["reads"].get(p_s)
                c = None if committed is None else committed.get(p_s)
                if recs and c is not None and ev["mode"] != "head" and c > recs[-1][0] + 1:
                    # every line it wrote was read (a head run's reader may have taken more
                    # than it journaled): its commit, or an older one below where it began
                    problems.append(f"{jname}: pylog consume -g {ev['group']} {ev['topic']}/{p} committed {c} "
                                    f"after a {ev['mode']} run that printed up to {recs[-1][0]}")
                if (not recs and ev["mode"] == "head" and c is not None and key in after
                        and c - 1 > after[key][0]):
                    # a head run journals only the lines it returned; its buffered reader may
                    # have taken more (a real `head` reads whole blocks too), and pylog commits
                    # what its reader took: records of p may have gone that way with no line
                    # of p journaled, up to one pipe's worth of the shortest lines
                    hi, _exact, how, lo, slack = after[key]
                    passed = sum(1 for (t2, p2, o) in recs_final if t2 == ev["topic"] and p2 == p and hi < o < c)
                    if passed > slack + ev["pipe"] // MIN_JSON_LINE:
                        problems.append(f"{jname}: pylog consume -g {ev['group']} {ev['topic']}/{p} committed {c} "
                                        f"after a head run that printed nothing of it, passing {passed} records "
                                        f"after {how} (more than its reader can have taken)")
                    after[key] = (c - 1, False, f"a head run whose reader may have taken {ev['topic']}/{p} up to "
                                  f"{c - 1} without a journaled line", lo, 0)
                    continue
                if recs and not clean and committed is not None and p_s not in committed:
                    # killed before its first commit of p, and no run of the group committed
                    # p before: the next run starts as a group without an offset does (the log
                    # end without --from-beginning), not where this one stopped printing
                    after.pop(key, None)
                    continue
                if recs:
                    slack = ev["pipe"] // MIN_JSON_LINE if ev["mode"] == "head" else 0
                    after[key] = (recs[-1][0], clean and not slack, f"a {ev['mode']} run", -1, slack)
                elif clean and ev["new_group"] and key not in after:
                    # a new group that printed nothing: its position was at most the end of
                    # the log, and without --from-beginning at least the end when it started
                    lo = -1 if ev["from_beginning"] else ev["before"].get(p_s, -1)
                    after[key] = (nxt - 1, False, f"a {ev['mode']} run of a new group that printed nothing "
                                  f"(log end {ev['before'].get(p_s)}..{nxt})", lo, 0)
    return nevents, problems


if __name__ == "__main__":
    main(sys.argv[1:])
