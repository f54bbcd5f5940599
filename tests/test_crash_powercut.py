"""Power cuts and I/O errors through the fault-injecting storage layer (pylog.testing.CrashFS).

A workload runs on a log with ``fsync="always"`` while CrashFS records what each fsync made
durable; at a random operation the power goes. The image a machine would find after reboot
(files as of their last fsync, directories as of their last directory fsync, and any subset
of the 512-byte sectors written since, later ones without earlier ones: CrashFS.tear) is
opened, and:

* every acknowledged record survives (an append that returned; truncation and retention
  that returned count too: what they removed stays removed);
* no garbage appears: every record in the recovered log is the one the model holds at that
  offset (the recovered log is a prefix of the model, from its start offset on);
* a batch in flight survives whole or not at all, and nothing is reported (a torn write is
  cut silently);
* sealed segments pass their CRC check and appends resume.

Scenarios: appends with rolls, explicit rolls, retention (``retention_bytes`` +
``enforce_retention``), truncation, close/reopen (checkpoint and clean-shutdown marker), and
appends, rolls and reopens of a ``preallocate=True`` log (cuts also land on its
``posix_fallocate`` and trimming ``ftruncate``).
A directory-entry test shows that a new segment survives the cut only once its directory was
fsynced. Then injected ENOSPC and EIO on ``pwrite`` and on ``fdatasync``: no partial record
visible, the log is fenced (``LogFencedError``) until reopened, and the reopened log holds
every acknowledged record.

fsync and fdatasync themselves are replaced by no-ops while CrashFS runs: durability here is
what CrashFS records, not what the disk does, and the suite stays fast.
"""
from __future__ import annotations

import errno
import os
import random

import pytest
from conftest import scaled

import pylog
from pylog import format as fmt
from pylog.testing import CrashFS, PowerCut, simulate_crash


@pytest.fixture(autouse=True)
def no_real_fsync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


OPTS = dict(fsync="always", segment_bytes=4096, index_interval_bytes=128)
WEIGHTS = {
    # scenario: {op: weight}
    "append": {"append": 5, "batch": 3},
    "roll": {"append": 3, "batch": 2, "roll": 2},
    "retention": {"append": 2, "batch": 4, "retention": 2},
    "truncate": {"append": 3, "batch": 3, "truncate": 2},
    "checkpoint": {"append": 3, "batch": 2, "reopen": 2, "roll": 1},
    # preallocate=True: store files reserved up front, trimmed at roll and close
    "preallocated": {"append": 4, "batch": 2, "roll": 1, "reopen": 1},
}
STEPS = 24


class Model:
    def __init__(self) -> None:
        self.values: dict[int, bytes] = {}   # offset -> value, [start, next)
        self.start = 0
        self.next = 0
        self.inflight: tuple | None = None   # the operation the power cut may have hit


def workload(path: str, scenario: str, seed: int, model: Model, box: dict) -> None:
    """Deterministic for a seed (so a dry run counts its operations)."""
    rng = random.Random(seed)
    opts = dict(OPTS)
    if scenario == "retention":
        opts["retention_bytes"] = 3 * 4096
    if scenario == "preallocated":
        opts["preallocate"] = True
    log = box["log"] = pylog.Log(path, **opts)
    ops, weights = zip(*WEIGHTS[scenario].items())
    for _ in range(STEPS * 2 if scenario == "retention" else STEPS):
        op = rng.choices(ops, weights)[0]
        if op == "append":
            v = rng.randbytes(rng.randint(0, 300))
            model.inflight = ("append", model.next, [v])
            off = log.append(v, key=b"k" if rng.random() < 0.3 else None)
            assert off == model.next
            model.values[off] = v
            model.next += 1
        elif op == "batch":
            vs = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 12))]
            model.inflight = ("append", model.next, vs)
            first = log.append_batch(vs)
            assert first == model.next
            for i, v in enumerate(vs):
                model.values[first + i] = v
            model.next += len(vs)
        elif op == "roll":
            model.inflight = ("roll",)
            log.roll()
        elif op == "retention":
            model.inflight = ("retention",)
            log.enforce_retention()
            for o in range(model.start, log.start_offset):
                del model.values[o]
            model.start = log.start_offset
        elif op == "truncate":
            if model.next == model.start:
                continue
            o = rng.randint(max(model.start, model.next - 30), model.next)
            model.inflight = ("truncate", o)
            log.truncate(o)
            for x in range(o, model.next):
                del model.values[x]
            model.next = o
        elif op == "reopen":
            model.inflight = ("reopen",)
            log.close()
            log = box["log"] = pylog.Log(path, **opts)
            assert log.next_offset == model.next
        model.inflight = None
    model.inflight = ("close",)
    log.close()
    model.inflight = None


def check_image(img: str, model: Model, tag: str) -> None:
    """The recovered image against the model (see the module docstring)."""
    inflight = model.inflight or ("none",)
    must = model.next           # every offset below it is acknowledged
    candidate = dict(model.values)
    cand_next = model.next
    if inflight[0] == "append":
        _, first, vs = inflight
        for i, v in enumerate(vs):
            candidate[first + i] = v
        cand_next = first + len(vs)
    elif inflight[0] == "truncate":
        must = min(must, inflight[1])
    with pylog.Log(img, **OPTS) as log:
        assert log.recovery_report == [], (tag, log.recovery_report)
        start, nxt = log.start_offset, log.next_offset
        assert must <= nxt <= cand_next, (tag, must, nxt, cand_next)
        if inflight[0] == "append":  # a write unit: whole or not at all
            assert nxt in (inflight[1], inflight[1] + len(inflight[2])), (tag, "part of a batch", nxt, inflight[1])
        if inflight[0] == "retention":
            assert model.start <= start <= nxt, (tag, model.start, start)
        else:
            assert start == model.start, (tag, start, model.start)
        got = [(r.offset, bytes(r.value)) for r in log.scan()]
        assert [o for o, _ in got] == list(range(start, nxt)), tag
        for o, v in got:
            assert v == candidate[o], f"{tag}: offset {o} holds bytes the model never had there"
        assert log.verify() == [], tag
        # appends resume, and read back after another reopen
        extra = log.append(b"after-" + tag.encode())
        assert extra == nxt
    with pylog.Log(img) as log:
        assert log.next_offset == nxt + 1
        assert bytes(log.read(nxt).value) == b"after-" + tag.encode()


def run_cut(tmp_path, scenario: str, seed: int, cut: int | None, tear_seed: int) -> tuple[Model, CrashFS]:
    root = tmp_path / f"root-{scenario}-{seed}-{cut}-{tear_seed}"
    root.mkdir()
    path = str(root / "log")
    model = Model()
    box: dict = {}
    fs = CrashFS(str(root), cut_after=cut, seed=tear_seed)
    cut_hit = False
    with fs:
        try:
            workload(path, scenario, seed, model, box)
        except PowerCut:
            cut_hit = True
    if "log" in box:
        try:
            simulate_crash(box["log"])
        except Exception:
            pass
    assert cut_hit == (cut is not None and cut <= fs.ops), (cut, fs.ops)
    return model, fs


@pytest.mark.parametrize("scenario", sorted(WEIGHTS))
def test_power_cut_at_random_points(tmp_path, scenario):
    trials = scaled(100, 1000)
    rng = random.Random(f"powercut-{scenario}")
    seeds = [rng.randrange(1 << 30) for _ in range(4)]
    total = {s: run_cut(tmp_path, scenario, s, None, 0)[1].ops for s in seeds}  # dry runs
    hit_ops: dict[str, int] = {}
    for t in range(trials):
        seed = seeds[t % len(seeds)]
        cut = rng.randint(1, total[seed])
        model, fs = run_cut(tmp_path, scenario, seed, cut, tear_seed=t)
        op = fs.log[-1][0]
        hit_ops[op] = hit_ops.get(op, 0) + 1
        img = fs.materialize(str(tmp_path / f"img-{scenario}-{t}"))
        check_image(os.path.join(img, "log"), model, f"{scenario} seed {seed} cut {cut}/{total[seed]}")
    print(f"power cuts [{scenario}]: {trials} trials, cut before {dict(sorted(hit_ops.items()))}")
    # the cuts landed on writes, fsyncs and directory operations alike
    assert {"pwrite", "fdatasync"} <= set(hit_ops) or trials < 20


def test_every_cut_point_of_one_short_run(tmp_path):
    """Exhaustive over one short run: a cut before each operation in turn."""
    seed = 1234
    _, dry = run_cut(tmp_path, "roll", seed, None, 0)
    for cut in range(1, dry.ops + 1):
        model, fs = run_cut(tmp_path, "roll", seed, cut, tear_seed=cut)
        img = fs.materialize(str(tmp_path / f"every-{cut}"))
        check_image(os.path.join(img, "log"), model, f"every cut {cut}/{dry.ops}")


def test_new_segment_survives_only_once_its_directory_is_fsynced(tmp_path):
    """A roll creates the next segment's files; until the directory is fsynced, a power cut
    loses their directory entries (ALICE, CrashMonkey). The acknowledged records, all in the
    sealed segment, survive either way."""
    root = tmp_path / "dry"
    root.mkdir()
    path = str(root / "log")
    values = [bytes([i]) * 200 for i in range(30)]

    def run(fs: CrashFS, p: str) -> list[int]:
        acked = []
        with fs:
            try:
                log = pylog.Log(p, **OPTS)
                for v in values:
                    acked.append(log.append(v))
                log.close()
            except PowerCut:
                pass
        return acked

    dry = CrashFS(str(root))
    run(dry, path)
    # the first roll: the next segment's store is created, then the directory is fsynced
    rolls = [i for i, (op, p) in enumerate(dry.log) if op == "open" and p.endswith(fmt.STORE_SUFFIX)
             and p != os.path.join(os.path.realpath(path), fmt.segment_name(0, fmt.STORE_SUFFIX))]
    assert rolls, dry.log
    create = rolls[0]
    new_name = os.path.basename(dry.log[create][1])
    dir_sync = next(i for i in range(create, len(dry.log))
                    if dry.log[i][0] == "fsync" and dry.log[i][1] == os.path.realpath(path))
    for cut, present in ((create + 1, False), (dir_sync + 1, False), (dir_sync + 2, True)):
        r = tmp_path / f"cut-{cut}"
        r.mkdir()
        p = str(r / "log")
        fs = CrashFS(str(r), cut_after=cut)  # the op numbered `cut` (1-based) never happens
        acked = run(fs, p)
        img = fs.materialize(str(tmp_path / f"img-{cut}"))
        names = os.listdir(os.path.join(img, "log"))
        assert (new_name in names) == present, (cut, new_name, names)
        with pylog.Log(os.path.join(img, "log")) as log:
            assert log.next_offset >= len(acked)
            for o in acked:
                assert bytes(log.read(o).value) == values[o]
            assert log.verify() == []


def test_crashfs_directory_entries_need_a_directory_fsync(tmp_path):
    """The harness itself: a file created and fsynced, but whose directory was not, is gone
    after the cut; with the directory fsynced it is there with its fsynced bytes."""
    from pylog import fileutil, vfs

    for sync_dir in (False, True):
        root = tmp_path / f"r{sync_dir}"
        root.mkdir()
        fs = CrashFS(str(root))
        with fs:
            fd = vfs.open(str(root / "f"), os.O_RDWR | os.O_CREAT, 0o644)
            vfs.pwrite(fd, b"durable", 0)
            vfs.fsync(fd)
            vfs.pwrite(fd, b"-not", 7)
            vfs.close(fd)
            if sync_dir:
                fileutil.fsync_dir(str(root))
        img = fs.materialize(str(tmp_path / f"i{sync_dir}"), tear=False)
        assert os.path.exists(os.path.join(img, "f")) == sync_dir
        if sync_dir:
            assert open(os.path.join(img, "f"), "rb").read() == b"durable"


# -- injected I/O errors ------------------------------------------------------------------------
def _nth(op_names: tuple[str, ...], n: int, err: int, suffix: str = fmt.STORE_SUFFIX):
    """A CrashFS fail hook: ``err`` on the n-th (1-based) of ``op_names`` on a store file, and
    on every later one (a full disk stays full)."""
    count = [0]

    def fail(op: str, path: str) -> int | None:
        if op in op_names and path.endswith(suffix):
            count[0] += 1
            if count[0] >= n:
                return err
        return None

    return fail


@pytest.mark.parametrize("op,err", [("pwrite", errno.ENOSPC), ("pwrite", errno.EIO), ("pwrite", errno.EFBIG),
                                    ("fdatasync", errno.EIO), ("fdatasync", errno.ENOSPC)])
@pytest.mark.parametrize("batch", [False, True, "in place"])
def test_io_error_fences_the_log(tmp_path, monkeypatch, op, err, batch):
    if batch == "in place":  # every batch framed where it lies and written past the buffer
        import pylog.log as log_mod

        monkeypatch.setattr(log_mod, "IN_PLACE_MIN_BYTES", 0)
    trials = scaled(6, 40)
    rng = random.Random(f"{op}{err}{batch}")
    for t in range(trials):
        root = tmp_path / f"t{t}"
        root.mkdir()
        path = str(root / "log")
        n_fail = rng.randint(2, 40)  # the 1st pwrite is the store header, at open
        fs = CrashFS(str(root), fail=_nth((op,), n_fail, err), seed=t)
        acked: dict[int, bytes] = {}
        failed_values: list[bytes] = []
        with fs:
            log = pylog.Log(path, **OPTS)
            try:
                for i in range(200):
                    vs = [rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(1, 5) if batch else 1)]
                    nxt = log.next_offset
                    try:
                        if batch:
                            first = log.append_batch(vs)
                        else:
                            first = log.append(vs[0])
                    except OSError as e:
                        assert e.errno == err
                        failed_values = vs
                        break
                    except pylog.LogFencedError:
                        failed_values = vs
                        break
                    assert first == nxt
                    for j, v in enumerate(vs):
                        acked[first + j] = v
                else:
                    pytest.fail(f"no {op} failed in 200 appends")
                # fenced: every write refuses until the log is reopened
                for call in (lambda: log.append(b"x"), lambda: log.append_batch([b"y"]),  # noqa: B023
                             log.flush, log.roll, lambda: log.truncate(log.start_offset)):  # noqa: B023
                    with pytest.raises(pylog.LogFencedError):
                        call()
                # readers in this process see whole records only: the acknowledged ones, and at
                # most the failed append's own (whole) records after them
                seen = [(r.offset, bytes(r.value)) for r in log.scan()]
                for o, v in seen:
                    if o in acked:
                        assert v == acked[o]
                    else:
                        assert v == failed_values[o - max(acked, default=-1) - 1], (t, o)
                assert all(o in dict(seen) for o in acked)
            finally:
                log.close()  # close after a failure works, and twice is harmless
                log.close()
        assert log.closed
        # reopen (the failing disk is gone): recovery keeps every acknowledged record
        with pylog.Log(path) as log2:
            assert log2.next_offset >= len(acked)
            for o, v in acked.items():
                assert bytes(log2.read(o).value) == v
            tail = [bytes(r.value) for r in log2.scan(len(acked))]
            assert tail == failed_values[: len(tail)]
            assert log2.verify() == []
            o = log2.append(b"resumed")
            assert bytes(log2.read(o).value) == b"resumed"


def test_io_error_during_roll_fences(tmp_path):
    """ENOSPC creating the next segment (the roll) fences the log; nothing acknowledged is lost."""
    root = tmp_path / "r"
    root.mkdir()
    path = str(root / "log")

    def fail(op: str, p: str) -> int | None:
        if op == "open" and p.endswith(fmt.segment_name(0, fmt.STORE_SUFFIX)) is False and p.endswith(fmt.STORE_SUFFIX):
            return errno.ENOSPC
        return None

    acked = {}
    with CrashFS(str(root), fail=fail):
        log = pylog.Log(path, **OPTS)
        with pytest.raises(OSError) as e:
            for i in range(1000):
                v = bytes([i % 256]) * 100
                acked[log.append(v)] = v
        assert e.value.errno == errno.ENOSPC
        with pytest.raises(pylog.LogFencedError):
            log.append(b"z")
        log.close()
    with pylog.Log(path) as log:
        for o, v in acked.items():
            assert bytes(log.read(o).value) == v
        log.append(b"after")
