"""Opening a log: the lock, loading and recovering segments, the recovery report.

Split out of pylog/log.py; :class:`pylog.log.Log` inherits :class:`LogLoading`. Also holds the
on-disk names opening handles (the compaction swap suffixes, the transaction stable file)
and :func:`finish_swaps`, which compaction uses as well.
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import os
import time
from typing import Any

from pylog import checkpoint, fileutil, vfs
from pylog import format as fmt
from pylog._backend import impl
from pylog.errors import CorruptRecordError, LogLockedError, PylogError
from pylog.logstate import LogState
from pylog.segment import ActiveSegment, SealedSegment, damage_error, paths

#: Compaction's crash-safe swap (pylog.compaction): new files are written as ``.cleaned``,
#: renamed to ``.swap`` (the store's rename commits), then renamed over the originals.
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

#: While a transaction's records are being applied to a partition (pylog.transactions),
#: this file in the partition directory holds the partition's last stable offset (where the
#: apply starts): ``{"txn": id, "start": offset}``. Every reader, in every process, stops
#: there; it is removed once the applied records are durable.
STABLE_FILE = "txn.stable"

#: A store's transactions live in this directory beside its topics (pylog.transactions):
#: ``ROOT/TXN_DIR/ID/`` while transaction ID is open, decided or applying. A marker's
#: transaction whose directory is gone is finished (or was never decided): nothing of it is
#: hidden any more.
TXN_DIR = "~txn"

#: In :data:`TXN_DIR`: a random token the committer rewrites just before a transaction
#: becomes visible (its directory is retired). A reader reads it before and after it looks
#: at the files (seqlock style) and looks again when it changed: see :func:`visible_cap`.
VISIBLE_FILE = "visible"

#: Tests set this to a callable taking the Log: called by a read-only refresh between its
#: walk of the files and its look at the marker (the window a finishing apply races). None
#: in normal use.
refresh_hook: Any = None

#: Called as ``hook(log)`` when a writer opens a partition that holds a :data:`STABLE_FILE`
#: (an apply a crash interrupted): pylog.transactions registers the roll forward here, so
#: this module never imports the layer above it. Without a hook the log keeps the cap.
STABLE_HOOKS: list[Any] = []


def read_stable_file(dirpath: str) -> tuple[str, int] | None:
    """``(transaction id, stable offset)`` from a partition's :data:`STABLE_FILE`, or None
    when there is none. A file that cannot be parsed raises :class:`CorruptRecordError`
    (it is written atomically, so only outside damage does that)."""
    import json

    path = os.path.join(dirpath, STABLE_FILE)
    data = fileutil.read_if_exists(path)
    if data is None:
        return None
    try:
        d = json.loads(data)
        txn, start = d["txn"], d["start"]
        if not isinstance(txn, str) or isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError("bad fields")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptRecordError(path, 0, None, f"unreadable stable-offset marker ({e})") from None
    return txn, start


def txn_dir_of(dirpath: str) -> str:
    """The :data:`TXN_DIR` of the store a partition directory ``ROOT/TOPIC/partition-N``
    belongs to (a Log elsewhere has none: nothing is found there)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(dirpath))), TXN_DIR)


def visibility_token(txn_dir: str) -> tuple[bytes, bool] | None:
    """The store's visibility state, None before any transaction was published: the bytes
    of its :data:`VISIBLE_FILE` (the id of the transaction published last, or being
    published now) and whether that transaction's directory is still there (its publish
    not done yet). Publishes are one at a time (a lock on the file), each writes its id
    and then renames its directory, so every publish changes this pair: two equal reads
    enclose none. (A token written before the rename alone would not do: a look between
    the two recorded the new token with the old state, and later looks, finding the same
    token, kept that state after the publish.)"""
    try:
        fd = os.open(os.path.join(txn_dir, VISIBLE_FILE), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        data = os.read(fd, 64)
    finally:
        os.close(fd)
    name = data.split(b"\n", 1)[0]
    # a read racing the write may mix two ids: not an id (or not a directory), so False
    pending = (len(name) == 32 and all(c in b"0123456789abcdef" for c in name)
               and os.path.isdir(os.path.join(txn_dir, name.decode())))
    return data, pending


def _raw(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


def truncate_state(dirpath: str) -> tuple[bytes | None, bytes | None, bytes | None]:
    """Partition ``dirpath``'s truncate state, as a reader in another process compares it
    before and after it looks (with :func:`visibility_token`): the bytes of its
    ``truncate-point`` (there while a truncate is under way: written before the truncate
    changes any file, removed last), of its ``recovery-point`` (which counts truncates:
    every one that ends changes it), and the segment and open write unit its
    ``durable-point`` names (a roll that splits a unit names it; the flush that completes
    the unit, or a truncate, drops it; the durable offset is left out: flushes move it
    all the time). So two equal reads enclose no part of a truncate and no change of the
    split-unit cap, and while a truncate is under way readers stop at its offset
    (:func:`truncate_cap`): what it drops never shows, even when recovery cuts a write
    unit a roll split (the first records, in a sealed segment, read as durable)."""
    mark = _raw(os.path.join(dirpath, fmt.DURABLE_FILE))
    return (_raw(os.path.join(dirpath, fmt.TRUNCATE_FILE)),
            _raw(os.path.join(dirpath, fmt.CHECKPOINT_FILE)),
            mark[16:24] + mark[32:40] if mark is not None and len(mark) == 44 else mark)


def truncate_cap(state: tuple[bytes | None, bytes | None, bytes | None]) -> int | None:
    """Where reads stop while the truncate ``state`` (:func:`truncate_state`) names is
    under way, else None."""
    return checkpoint.truncate_point_of(state[0])


def _lower(a: int | None, b: int | None) -> int | None:
    """The lower of two read caps (None: no cap)."""
    return b if a is None else a if b is None else min(a, b)


def visible_cap(dirpath: str, txn_dir: str) -> int | None:
    """Where reads of partition ``dirpath`` stop: the start of the transaction its
    :data:`STABLE_FILE` names while that transaction is not finished (its directory in
    ``txn_dir`` is there), else None. Sound only between two equal
    :func:`visibility_token` reads that enclose the look at the records: a transaction
    becomes visible in every partition at once, when the committer retires its directory,
    and the token changes just before that."""
    mark = read_stable_file(dirpath)
    if mark is None or not os.path.isdir(os.path.join(txn_dir, mark[0])):
        return None
    return mark[1]


def finish_swaps(dirpath: str) -> bool:
    """Finish or roll back a compaction swap a crash interrupted; True if files changed.

    ``.cleaned`` files are deleted (the originals are whole). For each ``B.log.swap`` (the
    swap committed) the index ``.swap`` files, then the store, are renamed over the
    originals. Index ``.swap`` files without a store ``.swap`` are deleted (not committed)."""
    names = os.listdir(dirpath)
    changed = False
    for name in names:
        if name.endswith(CLEANED_SUFFIX):
            vfs.unlink(os.path.join(dirpath, name))
            changed = True
    swaps = set(n for n in names if n.endswith(SWAP_SUFFIX))
    for name in sorted(swaps):
        if fmt.parse_segment_name(name[: -len(SWAP_SUFFIX)], fmt.STORE_SUFFIX) is None:
            continue
        stem = name[: -len(SWAP_SUFFIX) - len(fmt.STORE_SUFFIX)]
        for suffix in (fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX, fmt.STORE_SUFFIX):
            swap = stem + suffix + SWAP_SUFFIX
            if swap in swaps:
                vfs.replace(os.path.join(dirpath, swap), os.path.join(dirpath, stem + suffix))
                swaps.discard(swap)
                changed = True
    for name in swaps:  # index swaps of a swap that never committed
        vfs.unlink(os.path.join(dirpath, name))
        changed = True
    if changed:
        fileutil.fsync_dir(dirpath)
    return changed


def _records_end(seg: SealedSegment) -> int | None:
    """One past the last record of sealed segment ``seg``, found by walking from its last
    index entry (at most one index interval is read); None when that cannot be told: a
    compacted segment, or a walk stopped by damage before the end of the store."""
    m = seg.maps()  # learns seg.gaps
    if seg.gaps:
        return None
    ix = m.index
    if ix.n:
        pos = int(ix.array[-1]["position"])
        end = seg.base_offset + int(ix.array[-1]["relative_offset"])
    else:
        pos, end = fmt.FILE_HEADER_SIZE, seg.base_offset
    while True:
        _rc, frames, stop = impl.scan(m.store.buf, m.store.length, pos, None, 4096, (1 << 64) - 1, False)
        if not len(frames):
            break
        end = int(frames[-1]["offset"]) + 1
        pos = int(stop)
    return end if pos == m.store.length else None


def _report_entry(err: CorruptRecordError, action: str, saved: str | None, now_ms: int,
                  end_offset: int | None = None) -> dict[str, Any]:
    """A recovery-report entry (see :func:`pylog.checkpoint.add_report`) for ``err``."""
    return {"segment": os.path.basename(err.path), "position": err.position, "offset": err.offset,
            "end_offset": end_offset, "action": action, "saved": saved, "reason": err.reason,
            "time_ms": now_ms}


class LogLoading(LogState):
    """Opening and recovery of a Log (Kafka's LogLoader).

    The writer lock, stray files, loading segments, recovery from the recovery point, an
    interrupted truncate, read-only loading, the persisted recovery report.

    Mixed into :class:`pylog.log.Log`, which sets up the state. The state it uses, and the
    methods of the other parts it calls, are declared with their types in
    :class:`pylog.logstate.LogState`.
    """

    #: the first offset of an unfinished write unit recovery found across a roll, which the
    #: opening writer cuts (see _finish_truncate)
    _unit_cut: int | None = None

    # ------------------------------------------------------------------------------------
    # opening
    def _open_stable(self) -> None:
        """A writer found a stable-offset marker: a transaction's apply was interrupted.
        The hooks roll it forward (or drop the marker of one never decided); until then
        (no hook) reads stop at the marker."""
        mark = read_stable_file(self.path)
        if mark is None:
            return
        self._cap = mark[1]
        # the roll forward lives in the layer above (it registers itself in STABLE_HOOKS when
        # imported): a process that never imported it must still finish the apply before its
        # own appends, which the roll forward would otherwise cut
        from pylog import txnrecovery  # noqa: F401
        for hook in STABLE_HOOKS:
            hook(self)

    def _take_lock(self) -> None:
        fd = vfs.open(os.path.join(self.path, fmt.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            vfs.close(fd)
            raise LogLockedError(f"{self.path} is locked by another writer") from None
        except BaseException:
            vfs.close(fd)
            raise
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            try:
                vfs.close(self._lock_fd)  # closing the fd drops the flock
            finally:
                self._lock_fd = -1

    def _load_start_mark(self) -> None:
        """Read the log start offset :meth:`delete_records` set (``log-start-offset``), at
        most the log's end: a writer whose crash lost records past a mark (it is set only
        below durable records, so only a file copied in can be) lowers the file to its end; a
        read-only log may read a mark newer than the records it has walked."""
        mark = checkpoint.read_log_start(self.path)
        end = self._active.next_offset
        if mark > end:
            if not self.readonly:
                checkpoint.write_log_start(self.path, end)
            mark = end
        self._start_mark = mark

    def _list_bases(self, names: list[str] | None = None) -> list[int]:
        """The base offsets of the store files in the directory (or in ``names``), sorted.

        A read-only log lists the directory until two listings in a row agree: another
        process's writer may create segments meanwhile, and a listing made while a file is
        created may miss it yet show a later one (POSIX leaves it unspecified; ext4's hashed
        directories do it), which would make the segment before the missed one seem to run
        to the later one's base. Every segment created before a listing starts is in it, so
        when the next listing shows nothing new, no segment below the newest is missing."""
        if names is not None or not self.readonly:
            return self._bases_of(os.listdir(self.path) if names is None else names)
        bases = self._bases_of(os.listdir(self.path))
        if bases == self._listed:  # nothing new seen: nothing can be missing below it
            return bases
        for _ in range(100):
            again = self._bases_of(os.listdir(self.path))
            if again == bases:
                break
            bases = again
        self._listed = bases
        return bases

    @staticmethod
    def _bases_of(names: list[str]) -> list[int]:
        bases = []
        suffix = fmt.STORE_SUFFIX
        for name in names:
            if name.endswith(suffix):
                b = fmt.parse_segment_name(name, suffix)
                if b is not None:
                    bases.append(b)
        return sorted(bases)

    def _clean_stray_files(self, bases: list[int]) -> None:
        """Delete temp files, half-deleted segments and index files with no store; finish
        or roll back an interrupted compaction swap (:func:`finish_swaps`)."""
        names = os.listdir(self.path)
        if any(n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for n in names):
            finish_swaps(self.path)
            names = os.listdir(self.path)
        have = set(bases)
        removed = False
        for name in names:
            p = os.path.join(self.path, name)
            orphan = False
            if name.endswith((fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX)):
                for suffix in (fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX):
                    b = fmt.parse_segment_name(name, suffix)
                    if b is not None and b not in have:
                        orphan = True
            if name.endswith((fmt.TEMP_SUFFIX, fmt.DELETED_SUFFIX)) or orphan:
                try:
                    vfs.unlink(p)
                    removed = True
                except IsADirectoryError:
                    pass
        if removed:
            fileutil.fsync_dir(self.path)

    def _load(self, bases: list[int]) -> None:
        cfg = self.config
        if self.readonly:
            self._load_readonly(bases)
            return
        self._clean_stray_files(bases)
        if not bases:
            self._sealed: list[SealedSegment] = []
            self._sealed_bases: list[int] = []
            self._active = ActiveSegment.create(self.path, cfg.initial_offset, cfg)
            fileutil.fsync_dir(self.path)
            checkpoint.write_recovery_point(self.path, cfg.initial_offset)
            self._gc.advance(cfg.initial_offset)
            return
        clean = checkpoint.take_clean(self.path)
        if clean is None and len(bases) > 1:
            bases = self._set_aside_after_gap(bases)
        sealed = [SealedSegment(self.path, b, bases[i + 1], None, cfg.index_interval_bytes, self._cache)
                  for i, b in enumerate(bases[:-1])]  # sizes are read when first needed
        last = bases[-1]
        active = None
        if clean is not None and clean.active_base == last and clean.next_offset >= last:
            st = os.stat(paths(self.path, last)[0])
            if st.st_size == clean.active_size and st.st_mtime_ns == clean.active_mtime_ns:
                active = ActiveSegment.open_clean(self.path, last, cfg, next_offset=clean.next_offset,
                                                  size=clean.active_size, max_timestamp=clean.max_timestamp)
        if active is None:
            active = self._recover(sealed, last)
        self._sealed = sealed
        self._sealed_bases = [s.base_offset for s in sealed]
        self._active = active
        self._gc.advance(active.next_offset)
        if clean is None:
            checkpoint.write_recovery_point(self.path, active.base_offset)
            # what recovery kept may still be only in the page cache (a killed process's
            # writes): synced, it is the durable point the next recovery starts from. A
            # write unit a roll split, which _finish_truncate cuts next, stays named: until
            # the cut, readers elsewhere stop at its start (and a crash cuts it again)
            active.sync()
            checkpoint.write_durable_point(self.path, active.base_offset, active.next_offset, sync=True,
                                           open_unit=self._unit_cut)

    def _set_aside_after_gap(self, bases: list[int]) -> list[int]:
        """Backstop of an unclean open: where a segment's records end before the next
        segment's base (a hole in the offsets: a file deleted by hand, or a crash of an
        older pylog's truncate), the segments after the hole are renamed ``*.gap`` (kept,
        never deleted), reported in ``recovery_report`` and ``recovery_actions``, and the
        log ends before the hole. Returns the bases still in the log."""
        cfg = self.config
        for i in range(len(bases) - 1):
            seg = SealedSegment(self.path, bases[i], bases[i + 1], None, cfg.index_interval_bytes, self._cache)
            try:
                end = _records_end(seg)
            finally:
                self._cache.discard(seg)
            if end is None or end >= bases[i + 1]:
                continue
            saved = []
            for b in bases[i + 1 :]:
                for p in paths(self.path, b):
                    if os.path.exists(p):
                        vfs.rename(p, p + fmt.GAP_SUFFIX)
                        saved.append(os.path.basename(p) + fmt.GAP_SUFFIX)
            fileutil.fsync_dir(self.path)
            what = (f"offsets [{end}, {bases[i + 1]}) are missing: the segments from {bases[i + 1]} on "
                    f"were set aside as {', '.join(n for n in saved if fmt.STORE_SUFFIX + fmt.GAP_SUFFIX in n)}")
            self.recovery_report.append(CorruptRecordError(paths(self.path, bases[i + 1])[0] + fmt.GAP_SUFFIX,
                                                           0, end, what))
            self.recovery_actions.append(what)
            return bases[: i + 1]
        return bases

    def _finish_truncate(self) -> None:
        """Finish a truncate that a crash interrupted: its point was made durable before it
        changed any file, so the records from it on are dropped now (``recovery_actions``
        says so). First, cut a write unit that recovery found unfinished across a roll (its
        first records in a sealed segment): silently, as a torn write is, its bytes counted
        in ``truncated_bytes``."""
        if self._unit_cut is not None:
            unit, self._unit_cut = self._unit_cut, None
            before = sum(s.size for s in self._sealed) + self._active.size
            try:
                self.truncate(unit)
            except OSError as e:  # a full disk, say: fenced, and the next open cuts it again
                self.recovery_actions.append(f"could not cut an unfinished write unit at offset {unit} ({e})")
                return
            self.truncated_bytes += before - sum(s.size for s in self._sealed) - self._active.size
        if not os.path.exists(os.path.join(self.path, fmt.TRUNCATE_FILE)):
            return
        t = checkpoint.read_truncate_point(self.path)
        if t is None:  # damaged from outside (it is written atomically): nothing to finish
            checkpoint.clear_truncate_point(self.path)
            self.recovery_actions.append("removed a damaged truncate-point")
            return
        start, nxt = self.start_offset, self.next_offset
        if start <= t < nxt:
            try:
                self.truncate(t)
            except OSError as e:  # a full disk, say: the log opens fenced, and readable
                self.recovery_actions.append(f"could not finish an interrupted truncate to offset {t} ({e}); "
                                             f"the log refuses appends until it is reopened")
                return
            self.recovery_actions.append(f"finished an interrupted truncate: offsets [{t}, {nxt}) dropped")
        else:
            checkpoint.clear_truncate_point(self.path)
            self.recovery_actions.append(f"an interrupted truncate to offset {t} had nothing left to drop")

    def _recover(self, sealed: list[SealedSegment], last: int) -> ActiveSegment:
        """Unclean (or untrusted) shutdown: verify what follows the recovery point; in the
        active segment cut only a torn tail. Interior damage there is kept and the segment
        sealed, so it is read, reported and verified like a sealed one, and appends go on
        in a new segment. What was found, and a cut of records the recovery point calls
        durable, go into the persisted recovery report."""
        rp = checkpoint.read_recovery_point(self.path)
        first = sealed[0].base_offset if sealed else last
        if rp is None or rp < first:
            # missing, damaged, or naming segments that are gone: full recovery. (A point
            # past the last base is normal: close() writes next_offset.)
            rp = first
        found: list[CorruptRecordError] = []
        for i, seg in enumerate(sealed):
            if seg.next_offset > rp:
                # Sealed segments were fsynced before the next one was created; a bad frame
                # here is corruption: reported, never truncated.
                found.extend(seg.verify(seg.next_offset))
        # written with preallocate=True (the stored config), reopened with or without it
        reserved = self.config.preallocate or self._stored_preallocate
        # every offset below `durable` is known durable: a bad frame there is damage (kept,
        # reported); past it, a torn write (cut with what follows it), and what is kept past
        # it ends with a whole write unit (pylog.torn)
        mark = checkpoint.read_durable_point(self.path)  # (base, durable, open unit)
        durable = max(rp, mark[1] if mark and mark[0] == last else 0)
        active, cut, damage = ActiveSegment.recover(self.path, last, self.config, reserved=reserved,
                                                    durable=durable)
        self.truncated_bytes = cut
        if mark and mark[2] is not None and mark[0] >= last > mark[2] and active.next_offset == last:
            # a roll to segment mark[0] split a batch, and nothing of it is kept here: its
            # first records, in the segments before, go too (see _finish_truncate). (The
            # roll wrote the mark before that segment could exist: if it is not the last
            # one, the roll never finished, nor did the batch.)
            self._unit_cut = mark[2]
        found.extend(damage_error(active.store_path, d) for d in damage)
        now = int(time.time() * 1000)
        # what the open found before (segments set aside after a hole), then the damage kept
        entries = [_report_entry(e, "set aside", None, now) for e in self.recovery_report]
        entries += [_report_entry(e, "kept", None, now) for e in found]
        self.recovery_report.extend(found)
        if cut and active.next_offset < rp:
            # the cut reaches below the recovery point: records known durable are gone
            saved = paths(self.path, last)[0] + fmt.BROKEN_SUFFIX
            err = CorruptRecordError(
                active.store_path, active.size, active.next_offset,
                f"torn tail cut at open: offsets {active.next_offset}..{rp - 1}, which the recovery "
                f"point counted durable, are gone ({cut} bytes saved to {os.path.basename(saved)})")
            self.recovery_report.append(err)
            entries.append(_report_entry(err, "cut", os.path.basename(saved), now, rp))
        if damage:
            # seal the damaged segment: readers in every process then find the records
            # after the damage through its rebuilt index; appends go on in a new segment
            try:
                done = active.seal(self.config, self._cache)
                new = ActiveSegment.create(self.path, done.next_offset, self.config)
                fileutil.fsync_dir(self.path)
                checkpoint.write_recovery_point(self.path, new.base_offset)
            except BaseException:
                active.close_files()
                raise
            sealed.append(done)
            active = new
        checkpoint.add_report(self.path, entries)
        return active

    def _load_readonly(self, bases: list[int]) -> None:
        from pylog.tail import TailSegment

        if not bases:
            raise FileNotFoundError(errno.ENOENT, "no segments in log directory", self.path)
        cfg = self.config
        self._sealed = [
            SealedSegment(self.path, b, bases[i + 1], None, cfg.index_interval_bytes, self._cache, readonly=True)
            for i, b in enumerate(bases[:-1])
        ]
        self._sealed_bases = [s.base_offset for s in self._sealed]
        txn_dir = txn_dir_of(self.path)
        token = self._token(txn_dir)
        self._active = TailSegment(self.path, bases[-1], cfg)  # type: ignore[assignment]  # read-only: a TailSegment (LogState._active)
        if refresh_hook is not None:
            refresh_hook(self)
        self._cap = self._caps(txn_dir, token)  # after the tail: see refresh()
        self._vis = None
        if self._token(txn_dir) != token:
            self._refresh(txn_dir)  # a transaction or a truncate finished meanwhile: look again
        else:
            self._vis = (token, txn_dir)

    def _token(self, txn_dir: str) -> tuple[Any, ...]:
        """What a read-only log compares before and after it looks at the files: the
        store's :func:`visibility_token` and this partition's :func:`truncate_state`."""
        return visibility_token(txn_dir), truncate_state(self.path)

    def _caps(self, txn_dir: str, token: tuple[Any, ...]) -> int | None:
        """Where reads stop after a look at the files (sound between two equal tokens):
        the start of a transaction being applied, of a write unit a roll split, of a
        truncate under way; None when nothing caps them."""
        return _lower(_lower(visible_cap(self.path, txn_dir), self._split_unit_cap()), truncate_cap(token[1]))

    def refresh(self) -> None:
        """Read-only logs: pick up the writer's new records, segments and deletions.

        A transaction being applied stays hidden (reads stop at its marker's offset) until
        it is finished in every partition it wrote: then it appears in all of them at
        once, never in part (see :func:`visible_cap`)."""
        self._check_open()
        if not self.readonly:
            return
        vis = self._vis
        self._refresh(txn_dir_of(self.path) if vis is None else vis[1])

    def _refresh(self, txn_dir: str) -> None:
        """:meth:`refresh`, seqlock style: the walk and the caps' look are done again while
        :meth:`_token` changes across them (a transaction finished meanwhile: the walk may
        hold part of it, and its marker may be gone; or a truncate began or ended: the walk
        may hold what it drops, and its point may be gone)."""
        with self._lock:
            # other threads read without the lock: until the new cap is known they see no
            # further than before (the walk may show part of a transaction)
            prev, prev_cap = self._vis, self._cap
            self._vis = None  # until this refresh succeeds
            self._cap = self.stable_offset
        for attempt in itertools.count():
            token = self._token(txn_dir)
            with self._lock:
                tail = self._active
                before = (tail.app, tail.next_offset, self._sealed_bases)
                self._walk()
                tail = self._active
                if (attempt == 0 and prev is not None and prev[0] == token and tail.app is before[0]
                        and tail.next_offset == before[1] and self._sealed_bases == before[2]):
                    # nothing new, and no transaction published since the last look: the
                    # cap stands (a marker written since has no records after it yet)
                    self._cap, self._vis = prev_cap, prev
                    return
                if refresh_hook is not None:
                    refresh_hook(self)
                cap = self._caps(txn_dir, token)
                if self._token(txn_dir) == token:
                    self._cap, self._vis = cap, (token, txn_dir)
                    return
            if attempt >= 3:
                time.sleep(min(0.001 * attempt, 0.05))  # transactions finishing back to back

    def _split_unit_cap(self) -> int | None:
        """Read-only logs: the first offset of a write unit that the writer's last roll split
        while no record of the new segment is readable yet, else None. Its first records
        sit in a sealed segment (durable, so shown whole), the rest is not written out yet:
        a crash now would cut them all (:meth:`_recover`), so a reader must not show them
        before the unit's end is there (an ``append_batch`` is seen whole or not at all)."""
        tail = self._active
        if not self._sealed or tail.next_offset != tail.base_offset:
            return None
        mark = checkpoint.read_durable_point(self.path)  # (base, durable, open unit), by the roll
        # as _recover: the roll to segment mark[0] split a unit begun at mark[2]; that segment
        # is the tail, or (a roll under way, or killed) not there yet
        if mark is None or mark[2] is None or not mark[0] >= tail.base_offset > mark[2]:
            return None
        return mark[2]

    def _walk(self) -> None:
        with self._lock:
            bases = self._list_bases()
            tail: TailSegment = self._active  # type: ignore[assignment]  # read-only: a TailSegment (LogState._active)
            if not bases:
                return
            from pylog.tail import TailSegment

            # A truncate in the writer replaces the store it cuts and deletes the later ones;
            # appends then write new records at the same offsets, maybe in segments of the
            # same names. It always replaces the last store: only then are the segments
            # known here checked against the files (their bounds, the inode they map).
            cfg = self.config
            app = tail.app
            if bases[-1] != tail.base_offset:
                tail = TailSegment(self.path, bases[-1], cfg)
                check = True
            else:
                tail.refresh()
                check = tail.app is not app  # the writer replaced the tail's file
            known = {s.base_offset: s for s in self._sealed}
            sealed = []
            for i, b in enumerate(bases[:-1]):
                s = known.get(b)
                if s is not None and check and (s.next_offset != bases[i + 1] or _replaced(s)):
                    self._cache.discard(s)
                    s = None
                if s is None:  # sized when asked: retention elsewhere may delete it meanwhile
                    s = SealedSegment(self.path, b, bases[i + 1], None, cfg.index_interval_bytes, self._cache,
                                      readonly=True)
                sealed.append(s)
            self._sealed = sealed
            self._sealed_bases = [s.base_offset for s in sealed]
            self._active = tail  # type: ignore[assignment]  # read-only: a TailSegment (LogState._active)
            self._load_start_mark()  # after the walk: a mark never passes the records walked
            # The marker is read after this walk (by _refresh): a reader that saw records
            # of an apply in flight also sees its marker (written before them, removed
            # only after the transaction's directory is retired, which changes the token).

    def saved_recovery_report(self) -> list[CorruptRecordError]:
        """What recovery cut or found at this and earlier opens, as persisted in the
        partition directory (``recovery-report.json``, docs/format.md) until
        :meth:`clear_recovery_report`: one CorruptRecordError per entry, whose reason says
        whether the damage was kept in place or cut (and where the cut bytes were saved)."""
        out = []
        for e in checkpoint.read_report(self.path):
            action = e.get("action", "found")
            saved = e.get("saved")
            what = f"recovery at open {action} this" + (f" (saved to {saved})" if saved else "")
            out.append(CorruptRecordError(os.path.join(self.path, str(e.get("segment", "?"))),
                                          int(e.get("position") or 0), e.get("offset"),
                                          f"{e['reason']} [{what}; pylog recover --clear-report forgets it]"))
        return out

    def clear_recovery_report(self) -> int:
        """Forget what recovery cut or found (the persisted report): ``verify()`` and
        ``pylog verify`` then report only the damage still in the files. Returns how many
        entries were cleared. Needs a writable log."""
        with self._lock:
            self._check_writable()
            n = checkpoint.clear_report(self.path)
            self.recovery_report = []
            return n

    def truncate_at_damage(self) -> tuple[int, str] | None:
        """Cut the log at its first damaged record: an explicit operator action, the one
        recovery never takes by itself for damage that has intact records after it.

        Everything cut is first saved, durably, to a new directory ``cut-at-<offset>`` in
        the partition directory: the damaged store's bytes from the damage on (named
        ``<store file>.from-<position>``) and every later segment's store file whole. Then
        :meth:`truncate` drops the damaged offset and everything after it. Returns
        ``(offset, saved directory)``, or None when there is no damage to cut at.
        """
        with self._lock:
            self._check_writable()
            self._write_out(self._active)
            segs: list[Any] = [*self._sealed, self._active]
            for i, sg in enumerate(segs):
                found = sg.damage()
                if found:
                    offset, pos = found[0].offset, found[0].position
                    break
            else:
                return None
            d = os.path.join(self.path, f"{fmt.CUT_DIR_PREFIX}{offset}")
            k = 1
            while os.path.exists(d):
                k += 1
                d = os.path.join(self.path, f"{fmt.CUT_DIR_PREFIX}{offset}-{k}")
            vfs.makedirs(d)
            for j, sg in enumerate(segs[i:]):
                name = os.path.basename(sg.store_path)
                start = pos if j == 0 else 0
                dst = os.path.join(d, f"{name}.from-{pos}" if j == 0 else name)
                with open(sg.store_path, "rb") as src, open(dst, "wb") as out:
                    src.seek(start)
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            fileutil.fsync_dir(d)
            fileutil.fsync_dir(self.path)
            self._cut_hint = {offset: pos}  # where the damage starts (junk may precede offset)
            try:
                self.truncate(offset)
            finally:
                self._cut_hint = {}
            return offset, d


def _replaced(s: SealedSegment) -> bool:
    """Whether the store file of a read-only log's sealed segment is no longer the one it
    maps (or, unmapped, may be another one than it was sized from): another process's
    truncate replaced or deleted it."""
    if s.ino is None:
        return True  # unmapped: a new object costs nothing (it maps on first read)
    try:
        return os.stat(s.store_path).st_ino != s.ino
    except FileNotFoundError:
        return True


def drop_stable_file(log: LogLoading) -> None:
    """Remove ``log``'s stable-offset marker (durably) and lift its cap."""
    path = os.path.join(log.path, STABLE_FILE)
    try:
        vfs.unlink(path)
    except FileNotFoundError:
        pass
    else:
        fileutil.fsync_dir(log.path)
    log._cap = None


def fence_unfinished(log: LogLoading, txn_id: str, e: BaseException) -> None:
    """A decided transaction's apply to ``log`` failed or was interrupted (Ctrl-C, damaged
    staging, an I/O error): its marker stays, and the next writer of the partition cuts it
    back to the decision's start and applies the transaction again. So this Log must take
    no append meanwhile: one it acknowledged would be cut then. Fenced until reopened (the
    reopen finishes the transaction first)."""
    if log._fenced is None:
        log._fence(PylogError(f"transaction {txn_id} did not finish applying here ({e!r}); "
                              "it finishes when the partition is reopened"))
