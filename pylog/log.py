"""Log: one partition, a directory of segments (the seeds' SegmentedLog).

Append path: ``append`` -> the active segment's appender frames the record in C into the
write buffer -> the buffer goes to the OS in one ``pwrite`` (at once under
``fsync="always"``, when full or when the flush policy says otherwise) -> fsync per policy.

Read path: ``read(offset)`` -> bisect over segment base offsets -> C search of that
segment's sparse index -> C walk of at most one index interval -> a Record whose value is
a memoryview of the map.

Durability, recovery and the lock are described in docs/concepts.md.
"""
from __future__ import annotations

import bisect
import errno
import fcntl
import os
import threading
import time
from array import array
from itertools import chain
from typing import Any, Iterable, Iterator

import numpy as np

from pylog import checkpoint, fileutil, flusher
from pylog import format as fmt
from pylog import vfs
from pylog._backend import impl
from pylog.cache import SegmentCache
from pylog.config import LogConfig, merge
from pylog.errors import (
    ArgumentTypeError,
    CorruptRecordError,
    InvalidArgumentError,
    InvalidTimestampError,
    LogClosedError,
    LogFencedError,
    LogLockedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    OffsetRemovedError,
    PylogError,
    ReadOnlyLogError,
    RecordTooLargeError,
)
from pylog.record import Record
from pylog.segment import ActiveSegment, SealedSegment, corrupt_error, damage_error, paths

__all__ = ["Log", "PackedBytes"]

_BYTES_LIKE = (bytes, bytearray, memoryview)
_ALWAYS, _INTERVAL, _NEVER = 0, 1, 2
_POLICIES = {"always": _ALWAYS, "interval": _INTERVAL, "never": _NEVER}
_FRAME_HEADER = fmt.FRAME_HEADER_SIZE
_BATCH_BUFFER = 1 << 20    # write buffer a batch append grows to: 1 MiB keeps the framed bytes in
                           # L2 for the kernel copy (4 MiB measured 2x slower per record)
_time_ns = time.time_ns
_bisect_right = bisect.bisect_right

#: Compaction's crash-safe swap (pylog.compaction): new files are written as ``.cleaned``,
#: renamed to ``.swap`` (the store's rename commits), then renamed over the originals.
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

#: While a transaction's records are being applied to a partition (pylog.transactions),
#: this file in the partition directory holds the partition's last stable offset (where the
#: apply starts): ``{"txn": id, "start": offset}``. Every reader, in every process, stops
#: there; it is removed once the applied records are durable.
STABLE_FILE = "txn.stable"

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
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        d = json.loads(data)
        txn, start = d["txn"], d["start"]
        if not isinstance(txn, str) or isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError("bad fields")
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptRecordError(path, 0, None, f"unreadable stable-offset marker ({e})") from None
    return txn, start


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


#: _segment_batch status: a compacted segment holds nothing at or after the offset asked
#: for; the fetch continues at the segment's next_offset.
_GAP_END = -1000


def _cut_position(seg: Any, offset: int) -> int:
    """Where ``truncate(offset)`` cuts ``seg``'s store: the frame of ``offset``, or, when
    ``offset`` is the first offset of a damaged region, where the damage starts."""
    try:
        return seg.find(offset)[1][0]
    except CorruptRecordError:
        for d in seg.damage():
            if d.offset == offset:
                return d.position
        raise


def _past_last(seg: Any, offset: int) -> bool:
    """Whether ``offset`` lies after the last record kept in compacted segment ``seg``."""
    if not seg.gaps:
        return False
    m, ibuf, n, _ = seg._view(offset)
    rc, _f = impl.find(m.buf, m.length, ibuf, n, seg.base_offset, offset, True)
    return rc == impl.E_NOT_FOUND


def _last_timestamp(seg: SealedSegment) -> int | None:
    """A sealed segment's newest timestamp (None when empty), compacted segments too."""
    seg.maps()  # learns seg.gaps
    if not seg.gaps:
        return seg.last_timestamp()
    m = seg.maps()
    t = m.timeindex
    pos = int(t.array[-1]["position"]) if t.n else fmt.FILE_HEADER_SIZE
    last = None
    while True:
        _rc, frames, end = impl.scan(m.store.buf, m.store.length, pos, None, 4096, (1 << 64) - 1, True)
        if not len(frames):
            return last
        last = int(frames[-1]["timestamp"])
        pos = int(end)


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


def _as_bytes(x: Any, what: str) -> Any:
    """A bytes object or a flat byte memoryview of ``x``; TypeError for anything else."""
    t = type(x)
    if t is bytes:
        return x
    if t is str or t is int or t is bool or t is float or x is None:
        raise ArgumentTypeError(f"{what} must be bytes-like, got {t.__name__}")
    try:
        mv = memoryview(x)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be bytes-like, got {t.__name__}") from None
    if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
        return mv.tobytes() if mv.contiguous else bytes(mv.tobytes())
    return mv if mv.format == "B" else mv.cast("B")


def _check_offset(offset: Any, what: str = "offset") -> int:
    if type(offset) is not int:
        if isinstance(offset, (int, np.integer)) and not isinstance(offset, bool):
            return int(offset)
        raise ArgumentTypeError(f"{what} must be an int, got {type(offset).__name__}")
    return offset


def _check_timestamp(ts: Any) -> int:
    if isinstance(ts, bool) or not isinstance(ts, (int, np.integer)):
        raise ArgumentTypeError(f"timestamp must be an int (milliseconds since the epoch), got {type(ts).__name__}")
    ts = int(ts)
    if not 0 <= ts <= fmt.MAX_TIMESTAMP_MS:
        raise InvalidTimestampError(f"timestamp {ts} is outside [0, {fmt.MAX_TIMESTAMP_MS}] (ms since the epoch)")
    return ts


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class PackedBytes:
    """Items already joined, for :meth:`Log.append_batch` (values, keys or metadata)
    without a Python object per item: item ``i`` is the next ``lengths[i]`` bytes of
    ``data``, or None where ``lengths[i]`` is ``0xFFFFFFFF`` (such items take no bytes).
    ``data`` is any bytes-like (an Arrow buffer, say); ``lengths`` a uint32 numpy array.
    """

    __slots__ = ("data", "lengths")

    def __init__(self, data: Any, lengths: Any) -> None:
        self.lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
        if self.lengths.ndim != 1:
            raise InvalidArgumentError("lengths must be one-dimensional")
        mv = memoryview(data).cast("B")
        need = int(self.lengths[self.lengths != fmt.NULL_LEN].sum(dtype=np.int64))
        if len(mv) != need:
            raise InvalidArgumentError(f"data holds {len(mv)} bytes, lengths add up to {need}")
        self.data = mv

    def __len__(self) -> int:
        return len(self.lengths)


def _report_entry(err: CorruptRecordError, action: str, saved: str | None, now_ms: int,
                  end_offset: int | None = None) -> dict:
    """A recovery-report entry (see :func:`pylog.checkpoint.add_report`) for ``err``."""
    return {"segment": os.path.basename(err.path), "position": err.position, "offset": err.offset,
            "end_offset": end_offset, "action": action, "saved": saved, "reason": err.reason,
            "time_ms": now_ms}


class Log:
    """One partition: an append-only sequence of records with consecutive 64-bit offsets.

    ``len(log)`` is ``next_offset - start_offset``: the offsets the log spans (a compacted
    log holds fewer records than that).

    Parameters
    ----------
    path
        The partition directory (created if missing, unless ``readonly``).
    config
        A :class:`~pylog.LogConfig`; keyword options (the LogConfig field names) replace its
        values. On reopen, the stored config is used and the values passed replace those
        that may change; ``initial_offset`` of a log that holds data cannot change.
    readonly
        Open without the writer lock, for reading (another process may be writing). Follows
        the writer's tail: new records and segments appear on the next read past the end,
        or after :meth:`refresh`.

    Attributes
    ----------
    path : str
        The partition directory.
    config : LogConfig
        The config the log runs with (the stored one, with the values passed applied).
    readonly : bool
        Whether the log was opened with ``readonly=True``.
    recovery_report : list[CorruptRecordError]
        What this open found corrupt: bad frames in sealed segments and interior damage in
        the active one (kept as they are, never returned by reads; see
        docs/durability.md), a cut of records the recovery point counted durable, and holes
        in the offsets (the segments after one are set aside as ``*.gap``). Empty after a
        clean open. Persisted in ``recovery-report.json``, which ``verify()`` reports until
        :meth:`clear_recovery_report`.
    recovery_actions : list[str]
        What opening repaired, one line each: an interrupted truncate it finished (or could
        not finish: the log then opens fenced), segments it set aside after a hole.
    truncated_bytes : int
        Bytes of a torn tail that opening cut from the active segment (0 after a clean
        shutdown).

    Raises
    ------
    LogLockedError
        Another writer holds the directory's lock.
    ConfigError
        A config value is invalid, or cannot change.
    """

    def __init__(self, path: str | os.PathLike[str], config: LogConfig | None = None, *,
                 readonly: bool = False, **options: Any) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        self.path = os.fspath(path)
        if not self.path:
            raise InvalidArgumentError("path must not be empty")
        if config is not None and not isinstance(config, LogConfig):
            raise ArgumentTypeError(f"config must be a LogConfig, got {type(config).__name__}")
        self.readonly = readonly
        self._lock = threading.RLock()
        self._drains = 0  # odd while a drain of the append queue is under way
        self._sync_cv = threading.Condition(threading.Lock())
        self._syncing = False
        self._durable_next = 0
        self._fenced: BaseException | None = None
        self._closed = False
        self._lock_fd = -1
        self._unflushed = 0
        self._last_flush_ms = _now_ms()
        self.recovery_report: list[CorruptRecordError] = []
        self.recovery_actions: list[str] = []
        self.truncated_bytes = 0
        self._cap: int | None = None  # the last stable offset while a transaction applies
        self._cut_hint: dict[int, int] = {}  # truncate_at_damage: offset -> where to cut
        if readonly:
            if not os.path.isdir(self.path):
                raise FileNotFoundError(errno.ENOENT, "no such log directory", self.path)
        else:
            vfs.makedirs(self.path)
            self._take_lock()
        try:
            passed: dict[str, Any] = config.to_dict() if config is not None else {}
            passed.update(options)
            stored = LogConfig.load(os.path.join(self.path, fmt.CONFIG_FILE))
            bases = self._list_bases()
            has_data = len(bases) > 1 or (
                len(bases) == 1 and os.path.getsize(paths(self.path, bases[0])[0]) > fmt.FILE_HEADER_SIZE
            )
            self.config = merge(stored, passed, has_data=has_data)
            if not readonly and (stored is None or self.config != stored):
                self.config.dump(os.path.join(self.path, fmt.CONFIG_FILE))
            self._cache = SegmentCache(self.config.cached_segments)
            self._policy = _POLICIES[self.config.fsync]
            self._max_record = self.config.max_record_bytes
            self._segment_ms = self.config.segment_ms
            self._writable: ActiveSegment | None = None
            self._queueing = False
            self._q: list[bytes] = []
            self._q_ts: list[int] = []
            self._q_bytes = 0
            self._q_start = 0
            self._q_limit = self.config.write_buffer_bytes
            self._flush_n = self.config.flush_messages or (1 << 62)
            self._flush_t = self.config.flush_ms or (1 << 62)
            self._load(bases)
            self._update_writable()
            if not readonly:
                self._finish_truncate()  # a log-level operation that was under way first
            if not readonly and os.path.exists(os.path.join(self.path, STABLE_FILE)):
                self._open_stable()
        except BaseException:
            self._release_lock()
            raise
        if not readonly:
            flusher.register(self)

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

    def _list_bases(self, names: list[str] | None = None) -> list[int]:
        bases = []
        suffix = fmt.STORE_SUFFIX
        for name in os.listdir(self.path) if names is None else names:
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
            self._durable_next = cfg.initial_offset
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
        self._durable_next = active.next_offset
        if clean is None:
            checkpoint.write_recovery_point(self.path, active.base_offset)

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
        says so)."""
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
        active, cut, damage = ActiveSegment.recover(self.path, last, self.config)
        self.truncated_bytes = cut
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
        self._active = TailSegment(self.path, bases[-1], cfg)  # type: ignore[assignment]
        mark = read_stable_file(self.path)  # after the tail: see refresh()
        self._cap = None if mark is None else mark[1]

    # ------------------------------------------------------------------------------------
    # state
    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.path} is closed")

    def _check_writable(self) -> ActiveSegment:
        if self._closed:
            raise LogClosedError(f"log {self.path} is closed")
        if self.readonly:
            raise ReadOnlyLogError(f"log {self.path} was opened read-only")
        if self._fenced is not None:
            raise LogFencedError(
                f"log {self.path} refuses appends after a failed write or fsync ({self._fenced}); reopen it"
            )
        if self._q:
            self._drain_locked()
        return self._active

    def _update_writable(self) -> None:
        """``_writable`` is the active segment while appends may go to it, else None."""
        ok = not (self._closed or self.readonly or self._fenced is not None)
        self._writable = self._active if ok else None
        self._queueing = (ok and self._policy != _ALWAYS and self._segment_ms is None
                          and self.config.write_buffer_bytes > 0)

    @property
    def start_offset(self) -> int:
        """Lowest offset still in the log (inclusive)."""
        self._check_open()
        sealed = self._sealed
        return sealed[0].base_offset if sealed else self._active.base_offset

    @property
    def next_offset(self) -> int:
        """Offset the next append gets (exclusive end of the log)."""
        self._check_open()
        # the drain (maybe the flusher thread's) empties the queue before it frames it: a read
        # between the two would see neither. _drains is odd while a drain is under way: then
        # wait for it on the lock, else read without it (a long holder of the lock, such as a
        # transaction's apply, must not block readers)
        d = self._drains
        if not d & 1:
            n = self._active.next_offset + len(self._q)
            if self._drains == d:
                return n
        with self._lock:
            return self._active.next_offset + len(self._q)

    @property
    def stable_offset(self) -> int:
        """The last stable offset (Kafka's LSO): reads stop here. It is ``next_offset``
        except while a transaction's records are being applied to this partition (by this
        or another process, see :mod:`pylog.transactions`): then it is where they start,
        and no record at or after it is returned until the apply is durable."""
        nxt = self.next_offset
        cap = self._cap
        return nxt if cap is None or cap > nxt else cap

    @property
    def last_stable_offset(self) -> int:
        """Same as :attr:`stable_offset` (Kafka's name)."""
        return self.stable_offset

    def __len__(self) -> int:
        """``next_offset - start_offset``: the offsets the log spans (compaction can leave
        fewer records)."""
        return self.next_offset - self.start_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of store files (headers and frames), all segments."""
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            return sum(s.size for s in self._sealed) + self._active.size

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

    def segments(self) -> list[dict[str, Any]]:
        """One dict per segment: base_offset, next_offset, size_bytes, sealed, path."""
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            segs: list[Any] = [*self._sealed, self._active]
            return [
                {"base_offset": s.base_offset, "next_offset": s.next_offset, "size_bytes": s.size,
                 "sealed": isinstance(s, SealedSegment), "path": s.store_path}
                for s in segs
            ]

    def __repr__(self) -> str:
        if self._closed:
            return f"<pylog.Log {self.path!r} closed>"
        return f"<pylog.Log {self.path!r} [{self.start_offset}, {self.next_offset})>"

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------
    # appending
    def _coerce_value(self, value: Any) -> Any:
        if value is None:
            return None
        t = type(value)
        if t is str:
            raise ArgumentTypeError("value must be bytes-like (or an iterable of bytes-like chunks), got str")
        if isinstance(value, _BYTES_LIKE):
            return _as_bytes(value, "value")
        try:
            memoryview(value)
            return _as_bytes(value, "value")
        except TypeError:
            pass
        try:
            chunks = iter(value)
        except TypeError:
            raise ArgumentTypeError(f"value must be bytes-like (or an iterable of bytes-like chunks), got {t.__name__}") from None
        return self._take_stream(chunks)

    def _take_stream(self, chunks: Iterator[Any]) -> bytes:
        """Join a streaming value, taking at most max_record_bytes (laminarmq's threshold)."""
        limit = self.config.max_record_bytes
        parts = []
        total = 0
        for chunk in chunks:
            c = _as_bytes(chunk, "value chunk")
            total += len(c)
            if total > limit:
                raise RecordTooLargeError(total, limit)
            parts.append(c)
        return b"".join(parts)

    def append(self, value: Any, key: Any = None, metadata: Any = None, timestamp: int | None = None,
               expected_offset: int | None = None) -> int:
        """Append one record; returns its offset.

        Parameters
        ----------
        value
            bytes-like; or an iterable of bytes-like chunks (a streaming append: at most
            ``max_record_bytes`` are taken, and an overflow or an exception from the iterator
            leaves the log unchanged); or None for a tombstone.
        key, metadata
            bytes-like or None.
        timestamp
            Milliseconds since the epoch; default now. Timestamps never decrease within a
            log: a default timestamp is raised to the newest one, an explicit lower one raises.
        expected_offset
            If given, append only if it equals ``next_offset`` (a conditional append).

        Raises
        ------
        TypeError, RecordTooLargeError, InvalidTimestampError, OffsetMismatchError,
        LogClosedError, LogFencedError, ReadOnlyLogError
        """
        if (type(value) is bytes and key is None and metadata is None and timestamp is None
                and expected_offset is None and len(value) <= self._max_record):
            # The common record, in as few steps as possible. Under "interval" and "never"
            # it is only queued, with its offset and timestamp fixed now; the queue is framed
            # in one C call when it fills, and before anything reads or writes out the
            # active segment (it is the first stage of the write buffer).
            # A with-statement, not acquire() then try/finally: that is ~0.15 us faster on
            # CPython 3.11, but a signal handler's exception (Ctrl-C) can land between the
            # acquire and the try and leave the lock held, hanging every other thread.
            with self._lock:
                q = self._q
                if self._queueing:
                    n = len(q)
                    if not n:
                        self._q_start = self._active.app.next_offset
                    off = self._q_start + n
                    now = _time_ns()  # made milliseconds when the queue is framed
                    ts = self._q_ts
                    try:
                        q.append(value)
                        ts.append(now)
                    except BaseException:  # a signal handler's exception between the two
                        del q[n:], ts[n:]  # (the queue and its timestamps stay in step)
                        raise
                    # the queue holds at most a write buffer of frames
                    size = self._q_bytes = self._q_bytes + len(value) + _FRAME_HEADER
                    if size >= self._q_limit:
                        self._drain_locked()
                    if self._policy == _INTERVAL:
                        self._unflushed += 1
                        if (self._unflushed >= self._flush_n
                                or now // 1_000_000 - self._last_flush_ms >= self._flush_t):
                            self._flush_locked()
                    return off
                seg = self._writable
                if seg is not None and self._segment_ms is None and not q:
                    off = seg.app.frame_value(value, _time_ns() // 1_000_000)
                    if off >= 0:
                        self._after_append(seg, 1)
                        if self._policy != _ALWAYS:
                            return off
                    else:
                        seg = None
                else:
                    seg = None
            if seg is not None:
                self._wait_durable(off)
                return off
        return self._append(value, key, metadata, timestamp, expected_offset)

    def _append(self, value: Any, key: Any, metadata: Any, timestamp: int | None,
                expected_offset: int | None) -> int:
        if type(value) is not bytes:
            value = self._coerce_value(value)
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key")
        if metadata is not None and type(metadata) is not bytes:
            metadata = _as_bytes(metadata, "metadata")
        size = (0 if value is None else len(value)) + (0 if key is None else len(key)) + (
            0 if metadata is None else len(metadata))
        cfg = self.config
        if size > cfg.max_record_bytes:
            raise RecordTooLargeError(size, cfg.max_record_bytes)
        attrs = (key is None) | (metadata is None) << 1 | (value is None) << 2
        if timestamp is not None:
            timestamp = _check_timestamp(timestamp)
        if expected_offset is not None:
            expected_offset = _check_offset(expected_offset, "expected_offset")
        with self._lock:
            seg = self._check_writable()
            app = seg.app
            if expected_offset is not None and expected_offset != app.next_offset:
                raise OffsetMismatchError(expected_offset, app.next_offset)
            if timestamp is None:
                ts, clamp = _now_ms(), True
            else:
                ts, clamp = timestamp, False
                mx = app.max_timestamp
                if mx is not None and ts < mx:
                    raise InvalidTimestampError(
                        f"timestamp {ts} is below the log's latest timestamp {mx}: timestamps never decrease")
            if cfg.segment_ms is not None:
                seg = self._maybe_roll_by_time(seg, ts)
                app = seg.app
            offset = app.frame(value, key, metadata, attrs, ts, clamp)
            if offset < 0:
                seg, offset = self._frame_slow(seg, offset, value, key, metadata, attrs, ts, clamp)
            self._after_append(seg, 1)
        if cfg.fsync == "always":
            self._wait_durable(offset)
        return offset

    def _frame_slow(self, seg: ActiveSegment, rc: int, value: Any, key: Any, metadata: Any,
                    attrs: int, ts: int, clamp: bool) -> tuple[ActiveSegment, int]:
        """The append did not fit: make room (write out, roll, grow the index) and retry."""
        for _ in range(4):
            app = seg.app
            if rc == impl.E_SPACE:
                self._write_out(seg)
                size = fmt.FRAME_HEADER_SIZE + sum(len(x) for x in (value, key, metadata) if x is not None)
                if size > app.buffer_capacity:
                    app.reserve(size)
            elif rc == impl.E_SEGMENT_FULL:
                seg = self._roll()
            elif rc == impl.E_INDEX_FULL:
                if app.index_cap < self.config.index_max_entries:
                    app.grow_index(min(app.index_cap * 2, self.config.index_max_entries))
                else:
                    seg = self._roll()
            else:
                raise PylogError(f"append failed: {corrupt_reason(rc)}")
            rc = seg.app.frame(value, key, metadata, attrs, ts, clamp)
            if rc >= 0:
                return seg, rc
        raise PylogError(f"append failed: {corrupt_reason(rc)}")

    def append_batch(self, values: Any, keys: Any = None, timestamps: Any = None,
                     metadata: Any = None) -> int:
        """Append records in one C call per write buffer; returns the first offset.

        ``values``: a sequence of bytes-likes (None = tombstone). ``keys``, ``metadata``:
        None, or sequences of the same length (bytes-like or None each). ``timestamps``:
        None (now), or a sequence of ints that never decreases. All or nothing: a bad
        element raises before anything is written.
        """
        if isinstance(values, (bytes, bytearray, memoryview, str)):
            raise ArgumentTypeError(f"values must be a sequence of bytes-likes, not a single {type(values).__name__}")
        if type(values) is not list and not isinstance(values, PackedBytes):
            try:
                values = list(values)
            except TypeError:
                raise ArgumentTypeError(f"values must be a sequence of bytes-likes, got {type(values).__name__}") from None
        n = len(values)
        if n == 0:
            raise InvalidArgumentError("append_batch needs at least one value")
        cfg = self.config
        lens = _batch_lengths(values, keys, metadata, n)  # taken once, for either path
        laid = None if lens is None else _lay_out(values, keys, metadata, n, lens)
        if laid is not None:  # a big batch of plain bytes-likes: framed where it lies
            vlens, klens, mlens = laid[1:]
            vjoined = kjoined = mjoined = None
        else:
            vl, kl, ml = (None, None, None) if lens is None else lens
            vjoined, vlens = self._join(values, "values", n, nullable=True, lens=vl)
            kjoined, klens = (None, None) if keys is None else self._join(keys, "keys", n, nullable=True, lens=kl)
            mjoined, mlens = ((None, None) if metadata is None
                              else self._join(metadata, "metadata", n, nullable=True, lens=ml))
        # no record can be larger than the whole batch: most batches need no search
        small = laid is not None and len(laid[0]) - n * _FRAME_HEADER <= cfg.max_record_bytes
        big = 0 if small else _largest(vlens, klens, mlens)
        if big > cfg.max_record_bytes:
            raise RecordTooLargeError(big, cfg.max_record_bytes)
        ts_arr = None
        if timestamps is not None:
            if isinstance(timestamps, (bytes, str)):
                raise ArgumentTypeError(f"timestamps must be a sequence of ints, not {type(timestamps).__name__}")
            try:
                ts_arr = np.asarray(timestamps if isinstance(timestamps, np.ndarray) else list(timestamps))
            except TypeError:
                raise ArgumentTypeError(f"timestamps must be a sequence of ints, got {type(timestamps).__name__}") from None
            if ts_arr.dtype.kind not in "iu" or ts_arr.ndim != 1:
                raise ArgumentTypeError(f"timestamps must be a sequence of ints (milliseconds since the epoch), "
                                f"got {ts_arr.ndim}-d {ts_arr.dtype}")
            if len(ts_arr) != n:
                raise InvalidArgumentError(f"timestamps has {len(ts_arr)} items, values has {n}")
            ts_arr = ts_arr.astype(np.int64)
            if int(ts_arr.min()) < 0 or int(ts_arr.max()) > fmt.MAX_TIMESTAMP_MS:
                i = int(np.flatnonzero((ts_arr < 0) | (ts_arr > fmt.MAX_TIMESTAMP_MS))[0])
                raise InvalidTimestampError(
                    f"timestamps[{i}]={int(ts_arr[i])} is outside [0, {fmt.MAX_TIMESTAMP_MS}] (ms since the epoch)")
            if n > 1 and bool((np.diff(ts_arr) < 0).any()):
                i = int(np.flatnonzero(np.diff(ts_arr) < 0)[0]) + 1
                raise InvalidTimestampError(f"timestamps[{i}]={int(ts_arr[i])} is below timestamps[{i - 1}]: timestamps never decrease")
        with self._lock:
            seg = self._check_writable()
            mx = seg.app.max_timestamp
            if ts_arr is not None:
                if mx is not None and int(ts_arr[0]) < mx:
                    raise InvalidTimestampError(f"timestamps[0]={int(ts_arr[0])} is below the log's latest timestamp {mx}")
                default_ts = 0
            else:
                default_ts = _now_ms()
                if mx is not None and default_ts < mx:
                    default_ts = mx
            first = seg.app.next_offset
            seg = self._frame_locked(seg, vjoined, vlens, kjoined, klens, mjoined, mlens, ts_arr, default_ts,
                                     laid[0] if laid is not None else None)
            last = seg.app.next_offset - 1
            self._after_append(seg, n)
        if cfg.fsync == "always":
            self._wait_durable(last)
        return first

    def _frame_locked(self, seg: ActiveSegment, vjoined: Any, vlens: np.ndarray, kjoined: Any,
                      klens: np.ndarray | None, mjoined: Any, mlens: np.ndarray | None,
                      ts_arr: np.ndarray | None, default_ts: int, laid: bytearray | None = None) -> ActiveSegment:
        """Frame a validated batch into the active segment(s), writing out, rolling and
        growing the index as needed. Returns the active segment after it.

        With ``laid`` (see :func:`_lay_out`) the frames are made where they lie and written
        from there, past the write buffer (one copy fewer); else they are copied from the
        joined buffers into the write buffer."""
        cfg = self.config
        n = len(vlens)
        done = 0
        vo = ko = mo = 0  # byte offsets into the joined buffers, or into laid
        while done < n:
            if cfg.segment_ms is not None:
                seg = self._maybe_roll_by_time(seg, int(ts_arr[done]) if ts_arr is not None else default_ts)
            app = seg.app
            sl = slice(done, None)
            if laid is not None:
                if app.used:  # what is pending goes first: the frames follow it
                    self._write_out(seg)
                at = app.position  # the write buffer is empty: the frames go where the store ends
                try:
                    rc, k, w = app.frame_in_place(
                        memoryview(laid)[vo:], vlens[sl], None if klens is None else klens[sl],
                        None if mlens is None else mlens[sl], None if ts_arr is None else ts_arr[sl], default_ts)
                    if k:  # the index entries go out with the next write_pending
                        seg.write_direct(memoryview(laid)[vo : vo + w], at)
                except OSError as e:
                    self._fence(e)
                    raise
                except BaseException:
                    # interrupted (a signal handler's exception) between framing and writing:
                    # the appender already counts the frames made in place, so they are
                    # written, or the store would lack bytes its positions point at
                    gap = app.position - at
                    if gap > 0 and self._fenced is None:
                        seg.write_direct(memoryview(laid)[vo : vo + gap], at)
                    raise
                if k:
                    vo += w
                    done += k
            else:
                rc, k = app.frame_batch(
                    memoryview(vjoined)[vo:], vlens[sl],
                    None if kjoined is None else memoryview(kjoined)[ko:], None if klens is None else klens[sl],
                    None if mjoined is None else memoryview(mjoined)[mo:], None if mlens is None else mlens[sl],
                    None if ts_arr is None else ts_arr[sl], default_ts,
                )
                if k and rc != impl.OK:  # more to frame: move past what was framed
                    vo += int(sizes_of(vlens, done, done + k))
                    if klens is not None:
                        ko += int(sizes_of(klens, done, done + k))
                    if mlens is not None:
                        mo += int(sizes_of(mlens, done, done + k))
                done += k
            if rc == impl.OK:
                break
            if rc == impl.E_SPACE:
                if k == 0 and app.used == 0:
                    # one record larger than the buffer: grow it for good
                    one = _largest(vlens[done : done + 1], None if klens is None else klens[done : done + 1],
                                   None if mlens is None else mlens[done : done + 1]) + fmt.FRAME_HEADER_SIZE
                    app.reserve(max(one, app.buffer_capacity * 2))
                else:
                    self._write_out(seg)
                    if app.buffer_capacity < _BATCH_BUFFER:
                        # batches write whole buffers: grow once to a size that amortizes the
                        # pwrite (a buffer made per batch would page-fault every time)
                        app.reserve(_BATCH_BUFFER)
            elif rc == impl.E_SEGMENT_FULL:
                seg = self._roll()
            elif rc == impl.E_INDEX_FULL:
                if app.index_cap < cfg.index_max_entries:
                    app.grow_index(min(app.index_cap * 2, cfg.index_max_entries))
                else:
                    seg = self._roll()
            elif rc == impl.E_TIMESTAMP:
                raise InvalidTimestampError("timestamps never decrease")  # checked by the callers
            else:
                raise PylogError(f"append failed: {corrupt_reason(rc)}")
        return seg

    def _drain_locked(self) -> None:
        """Frame the queued per-record appends (see ``append``) in one batch."""
        vals = self._q
        if not vals or self._writable is None:
            return
        # everything that can be interrupted (a signal handler's exception) before the queue
        # is emptied, so an interruption here leaves it whole for the next drain
        vlens = _lengths(vals)
        ts_arr = np.maximum.accumulate(np.array(self._q_ts, dtype=np.int64) // 1_000_000)
        seg = self._active
        mx = seg.app.max_timestamp
        if mx is not None and int(ts_arr[0]) < mx:
            np.maximum(ts_arr, mx, out=ts_arr)  # the clock went back: never decrease
        joined = b"".join(vals)
        stamps, start = self._q_ts, self._q_start
        self._drains += 1  # odd: under way (see next_offset)
        self._q = []
        self._q_ts = []
        self._q_bytes = 0
        try:
            self._frame_locked(seg, joined, vlens, None, None, None, None, ts_arr, 0)
        except BaseException:
            # interrupted (or failed) part way: the records framed so far are in the write
            # buffer, the rest goes back to the queue, so the offsets append handed out for
            # them stay theirs (a failure that fenced the log keeps it empty)
            done = self._active.app.next_offset - start
            if self._fenced is None and 0 <= done < len(vals):
                self._q = vals[done:]
                self._q_ts = stamps[done:]
                self._q_start = start + done
                self._q_bytes = int(vlens[done:].sum(dtype=np.int64)) + (len(vals) - done) * _FRAME_HEADER
            raise
        finally:
            self._drains += 1  # even again

    @staticmethod
    def _join(items: Any, what: str, n: int, nullable: bool,
              lens: np.ndarray | None = None) -> tuple[bytes, np.ndarray]:
        """The items joined, and their lengths (NULL_LEN for a None); ``lens``: the lengths
        already taken by :func:`_batch_lengths`."""
        if isinstance(items, (bytes, bytearray, memoryview, str)):
            raise ArgumentTypeError(f"{what} must be a sequence, not a single value")
        if isinstance(items, PackedBytes):
            if len(items) != n:
                raise InvalidArgumentError(f"{what} has {len(items)} items, values has {n}")
            return items.data, items.lengths
        if type(items) is not list:
            items = list(items)
        if len(items) != n:
            raise InvalidArgumentError(f"{what} has {len(items)} items, values has {n}")
        try:  # the common case, bytes-likes only, without a Python-level loop
            joined = b"".join(items)
            if lens is None:
                lens = _lengths(items)
        except (TypeError, OverflowError):  # a None, a str, a non-buffer, a length >= 4 GiB
            pass
        else:
            if int(lens.sum(dtype=np.uint64)) == len(joined):  # else a view with itemsize > 1
                return joined, lens
        try:
            joined = b"".join([b"" if x is None else x for x in items])
            lens = np.fromiter((fmt.NULL_LEN if x is None else len(x) for x in items), dtype=np.uint32, count=n)
        except TypeError:
            joined = None  # type: ignore[assignment]
        if joined is None or any(type(x) is str for x in items):
            norm = [None if x is None else _as_bytes(x, f"{what}[{i}]") for i, x in enumerate(items)]
            joined = b"".join([b"" if x is None else x for x in norm])
            lens = np.fromiter((fmt.NULL_LEN if x is None else len(x) for x in norm), dtype=np.uint32, count=n)
        elif any(type(x) is not bytes and x is not None for x in items):
            # bytes-likes with itemsize > 1 must be counted in bytes
            lens = np.fromiter((fmt.NULL_LEN if x is None else memoryview(x).nbytes for x in items),
                               dtype=np.uint32, count=n)
        return joined, lens

    def _after_append(self, seg: ActiveSegment, count: int) -> None:
        """Apply the fsync policy after ``count`` records went into the write buffer."""
        policy = self._policy
        if policy == _ALWAYS:
            self._write_out(seg)
            return
        if policy == _INTERVAL:  # the count of unflushed records only matters here
            self._unflushed += count
            if self._unflushed >= self._flush_n or _now_ms() - self._last_flush_ms >= self._flush_t:
                self._flush_locked()

    def _write_out(self, seg: ActiveSegment) -> None:
        """Hand queued and buffered bytes to the OS; a failure fences the log."""
        try:
            if self._q:
                self._drain_locked()
                seg = self._active
            seg.write_pending()
        except OSError as e:
            self._fence(e)
            raise

    def _fence(self, e: BaseException) -> None:
        self._fenced = e
        if isinstance(self._active, ActiveSegment):
            self._active.broken = True  # unwritten appends vanish; reads stop writing
        self._writable = None
        self._queueing = False
        self._q = []
        self._q_ts = []
        with self._sync_cv:
            self._sync_cv.notify_all()

    def _wait_durable(self, offset: int) -> None:
        """Group commit: return once ``offset`` is fsynced, sharing fsyncs among threads."""
        cv = self._sync_cv
        with cv:
            while self._durable_next <= offset:
                if self._fenced is not None:
                    raise LogFencedError(f"log {self.path}: fsync failed ({self._fenced}); reopen it")
                if not self._syncing:
                    self._syncing = True
                    break
                cv.wait()
            else:
                return
        ok = False
        goal = 0
        try:
            with self._lock:
                self._write_out(self._check_writable())
                seg = self._active  # after the write-out: it may have rolled (see _flush_locked)
                goal = seg.written_next
                fd = vfs.dup(seg.store_fd)
            try:
                vfs.fdatasync(fd)
            except OSError as e:
                self._fence(e)
                raise
            finally:
                vfs.close(fd)
            ok = True
        finally:
            with cv:
                self._syncing = False
                if ok and goal > self._durable_next:
                    self._durable_next = goal
                cv.notify_all()

    def _flush_locked(self) -> None:
        # The write-out may drain the queue and roll: the segments it sealed were fsynced by
        # the roll (ActiveSegment.seal), so what is left unsynced is in the segment active
        # *after* it, and only that one may be synced (a sealed one's files are closed).
        self._write_out(self._active)
        seg = self._active
        try:
            seg.sync()
        except OSError as e:
            self._fence(e)
            raise
        self._unflushed = 0
        self._last_flush_ms = _now_ms()
        with self._sync_cv:
            self._durable_next = max(self._durable_next, seg.written_next)

    def flush(self) -> None:
        """Write out buffered appends and fsync them: everything appended so far is durable
        (acknowledged) when this returns."""
        with self._lock:
            self._check_writable()
            self._flush_locked()

    def _timer_flush(self, now_ms: int) -> None:
        cfg = self.config
        if self._closed or self._fenced is not None or not self._unflushed:
            return
        if cfg.fsync == "interval" and cfg.flush_ms is not None and now_ms - self._last_flush_ms >= cfg.flush_ms:
            if self._lock.acquire(blocking=False):
                try:
                    if not self._closed and self._fenced is None:
                        try:
                            self._flush_locked()
                        except Exception as e:
                            # the flusher thread drops the exception: a failure of any kind
                            # must still fence the log, so the next append reports it
                            if self._fenced is None:
                                self._fence(e)
                            raise
                finally:
                    self._lock.release()

    def _exit_flush(self) -> None:
        if self._closed or self._fenced is not None:
            return
        with self._lock:
            if not self._closed:
                if self._q:
                    self._drain_locked()
                self._active.write_pending()

    # ------------------------------------------------------------------------------------
    # rolling
    def _maybe_roll_by_time(self, seg: ActiveSegment, ts: int) -> ActiveSegment:
        first = seg.first_timestamp()
        if first is not None and ts - first >= self.config.segment_ms:  # type: ignore[operator]
            return self._roll()
        return seg

    def roll(self) -> None:
        """Seal the active segment now and start a new one (no-op when it is empty)."""
        with self._lock:
            seg = self._check_writable()
            if seg.next_offset > seg.base_offset:
                self._roll()

    def _roll(self) -> ActiveSegment:
        """Seal the active segment (write out, fsync) and create the next one; the recovery
        point moves to the new base once the directory entry is durable."""
        old = self._active
        try:
            sealed = old.seal(self.config, self._cache)
            new = ActiveSegment.create(self.path, sealed.next_offset, self.config)
            fileutil.fsync_dir(self.path)
            checkpoint.write_recovery_point(self.path, new.base_offset)
        except OSError as e:
            self._fence(e)
            raise
        self._sealed = [*self._sealed, sealed]
        self._sealed_bases = [*self._sealed_bases, sealed.base_offset]
        self._active = new
        self._update_writable()
        with self._sync_cv:
            self._durable_next = max(self._durable_next, sealed.next_offset)
        return new

    # ------------------------------------------------------------------------------------
    # reading
    def _out_of_range(self, offset: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(offset, self.start_offset, self.stable_offset)

    def _sealed_for(self, offset: int) -> SealedSegment | None:
        i = bisect.bisect_right(self._sealed_bases, offset) - 1
        return self._sealed[i] if i >= 0 else None

    def read(self, offset: int) -> Record:
        """The record at ``offset``.

        Raises
        ------
        OffsetOutOfRangeError
            ``offset`` is below ``start_offset`` or at/after ``next_offset``.
        CorruptRecordError
            The record's frame fails its CRC (its bytes are never returned).
        """
        if type(offset) is not int:
            offset = _check_offset(offset)
        if self._cap is not None and offset >= self._cap and not self._closed:
            if self.readonly:
                self.refresh()
            if self._cap is not None and offset >= self._cap:
                raise self._out_of_range(offset)
        bases = self._sealed_bases
        if bases and offset < self._active.base_offset and not self._closed:
            i = _bisect_right(bases, offset) - 1
            if i >= 0:
                try:
                    seg = self._sealed[i]
                    # the list may have changed since `bases` was read (retention, truncate)
                    if seg.base_offset <= offset < seg.next_offset:
                        return seg.read(offset)
                except FileNotFoundError:  # retention removed it meanwhile
                    raise self._out_of_range(offset) from None
                except OffsetOutOfRangeError:
                    raise
                except CorruptRecordError:
                    if _past_last(seg, offset):  # compaction removed the segment's last records
                        raise OffsetRemovedError(offset) from None
                    raise
                except IndexError:  # the list shrank under us: take the slow path
                    pass
            if offset < self.start_offset:
                raise self._out_of_range(offset)
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            active = self._active
            if offset >= active.base_offset:
                if offset >= active.next_offset:
                    if self.readonly:
                        self.refresh()
                        if offset < self._active.next_offset and (self._cap is None or offset < self._cap):
                            return self._active.read(offset) if offset >= self._active.base_offset else self.read(offset)
                    raise self._out_of_range(offset)
                return active.read(offset)
        seg = self._sealed_for(offset)
        if seg is None or offset < seg.base_offset:
            raise self._out_of_range(offset)
        try:
            return seg.read(offset)
        except FileNotFoundError:
            raise self._out_of_range(offset) from None
        except CorruptRecordError:
            if _past_last(seg, offset):
                raise OffsetRemovedError(offset) from None
            raise

    def read_batch(self, offset: int, max_bytes: int = 1 << 20, max_records: int | None = None) -> list[Record]:
        """Records from ``offset`` on (a fetch): at least one record when ``offset`` is below
        ``next_offset`` (even if it alone is larger than ``max_bytes``), then as many as fit
        in ``max_bytes`` of frames and ``max_records``. ``[]`` at ``next_offset``.
        """
        offset = _check_offset(offset)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise ArgumentTypeError(f"max_bytes must be an int, got {type(max_bytes).__name__}")
        if max_bytes < 0:
            raise InvalidArgumentError(f"max_bytes={max_bytes} must be >= 0")
        if max_records is not None:
            if isinstance(max_records, bool) or not isinstance(max_records, int):
                raise ArgumentTypeError(f"max_records must be an int or None, got {type(max_records).__name__}")
            if max_records < 1:
                raise InvalidArgumentError(f"max_records={max_records} must be >= 1")
        self._check_open()
        if self.readonly and offset >= self.stable_offset:
            self.refresh()
        end = self._cap  # records at or after the last stable offset are not returned
        if end is not None and offset >= end:
            if offset > self.next_offset:
                raise self._out_of_range(offset)
            return []
        out: list[Record] = []
        left = max_records if max_records is not None else 1 << 62
        if end is not None:
            left = min(left, end - offset)
        budget = max_bytes
        while left > 0:
            recs, rc, bad, used = self._read_segment(offset, budget, left, bool(out))
            if rc == _GAP_END:  # nothing left in a compacted segment: on to the next one
                offset = bad
                if offset >= self._active.next_offset:
                    break
                continue
            if recs:
                out.extend(recs)
                offset = recs[-1][0] + 1  # compacted segments skip offsets
                left -= len(recs)
                budget -= used
            if rc != impl.OK:
                if not out:
                    seg = self._sealed_for(offset)
                    path = seg.store_path if seg is not None and offset < seg.next_offset else self._active.store_path
                    raise corrupt_error(path, bad, offset, rc)
                break
            if not recs or budget <= 0 or offset >= self._active.next_offset:
                break
        if end is not None and out and out[-1][0] >= end:  # compacted segments skip offsets
            out = [r for r in out if r[0] < end]
        return out

    def _read_segment(self, offset: int, budget: int, left: int, have: bool,
                      lazy: bool = False) -> tuple[Any, int, int, int]:
        """One segment's part of a fetch: (records, status, bad position, bytes used).
        With ``lazy``, records is ``(iterator, count, last offset)``."""
        active = self._active
        if offset >= active.base_offset or self._q:
            with self._lock:
                if self._q:
                    self._drain_locked()
                active = self._active
                if offset >= active.base_offset:
                    if offset > active.next_offset or (offset == active.next_offset and not have):
                        if offset == active.next_offset:
                            return ((iter(()), 0, offset - 1) if lazy else []), impl.OK, 0, 0
                        raise self._out_of_range(offset)
                    if offset == active.next_offset:
                        return ((iter(()), 0, offset - 1) if lazy else []), impl.OK, 0, 0
                    return self._segment_batch(active, offset, budget, left, have, lazy)
        seg = self._sealed_for(offset)
        if seg is None or offset < seg.base_offset:
            raise self._out_of_range(offset)
        try:
            return self._segment_batch(seg, offset, budget, left, have, lazy)
        except FileNotFoundError:
            raise self._out_of_range(offset) from None

    @staticmethod
    def _segment_batch(seg: Any, offset: int, budget: int, left: int, have: bool,
                       lazy: bool = False) -> tuple[Any, int, int, int]:
        try:
            m, f = seg.find(offset)
        except CorruptRecordError:
            if _past_last(seg, offset):
                return ((iter(()), 0, offset - 1) if lazy else []), _GAP_END, seg.next_offset, 0
            raise
        n = min(left, seg.next_offset - offset)
        rc, frames, end = impl.scan(m.buf, m.length, f[0], f[1], n, max(budget, 0), seg.gaps)
        if have and len(frames) and int(frames[0]["frame_size"]) > budget:
            return [], impl.OK, 0, 0
        from pylog.segment import build_records

        used = int(frames["frame_size"].sum()) if len(frames) else 0
        if lazy:
            last = int(frames["offset"][-1]) if len(frames) else offset - 1
            return (build_records(m.mv, frames, lazy=True), len(frames), last), rc, int(end), used
        return build_records(m.mv, frames), rc, int(end), used

    def scan(self, start: int | None = None, stop: int | None = None) -> Iterator[Record]:
        """Iterate records from ``start`` (default ``start_offset``) up to ``stop``
        (exclusive; default the ``next_offset`` when iteration starts)."""
        start, stop = self._range(start, stop)
        # The records of each chunk come from a C-level iterator (map over zip): chaining
        # them, rather than re-yielding each record from a generator, keeps the Python frame
        # out of the per-record path.
        return chain.from_iterable(self._scan_chunks(start, stop))

    def _range(self, start: int | None, stop: int | None) -> tuple[int, int]:
        """Checked ``[start, stop)`` of a read (defaults: ``start_offset``, ``next_offset``):
        ValueError when start is after stop, OffsetOutOfRangeError outside the log."""
        self._check_open()
        first, nxt = self.start_offset, self.stable_offset
        start = first if start is None else _check_offset(start, "start")
        stop = nxt if stop is None else _check_offset(stop, "stop")
        if start > stop:
            raise InvalidArgumentError(f"start={start} is after stop={stop}")
        if start < first or stop > nxt:
            raise OffsetOutOfRangeError(start if start < first else stop, first, nxt)
        return start, stop

    def _scan_chunks(self, offset: int, stop: int) -> Iterator[Iterator[Record]]:
        """Iterators over consecutive chunks of records in [offset, stop)."""
        while offset < stop:
            (recs, n, last), rc, bad, _used = self._read_segment(
                offset, 8 << 20, min(8192, stop - offset), False, lazy=True)
            if rc == _GAP_END:  # nothing left in a compacted segment: on to the next one
                offset = bad
                continue
            if n == 0:
                if rc != impl.OK:
                    seg = self._sealed_for(offset)
                    path = seg.store_path if seg is not None and offset < seg.next_offset else self._active.store_path
                    raise corrupt_error(path, bad, offset, rc)
                return
            if last >= stop:  # compacted segments skip offsets
                yield (r for r in recs if r[0] < stop)
                return
            yield recs
            offset = last + 1

    def __iter__(self) -> Iterator[Record]:
        return self.scan()

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first offset whose timestamp is >= ``timestamp_ms``, or None if there is none
        (below the last stable offset)."""
        off = self._offset_for_time(timestamp_ms)
        if off is not None and self._cap is not None and off >= self._cap:
            return None
        return off

    def _offset_for_time(self, timestamp_ms: int) -> int | None:
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, (int, np.integer)):
            raise ArgumentTypeError(f"timestamp_ms must be an int, got {type(timestamp_ms).__name__}")
        ts = int(timestamp_ms)
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            segs: list[Any] = [*self._sealed, self._active]
            active_max = self._active.app.max_timestamp
        def newest(i: int) -> int | None:
            # newest timestamp of segment i, or of the first non-empty one after it (compaction
            # can empty a segment): non-decreasing in i, so it can be bisected
            while i < len(segs):
                seg = segs[i]
                last = active_max if seg is segs[-1] else _last_timestamp(seg)
                if last is not None:
                    return last
                i += 1
            return None

        lo, hi = 0, len(segs)
        while lo < hi:  # first segment whose newest timestamp is >= ts
            mid = (lo + hi) // 2
            last = newest(mid)
            if last is not None and last >= ts:
                hi = mid
            else:
                lo = mid + 1
        for s in segs[lo:]:
            if s is segs[-1]:
                with self._lock:
                    return s.find_time(ts)
            off = s.find_time(ts)
            if off is not None:
                return off
        return None

    def refresh(self) -> None:
        """Read-only logs: pick up the writer's new records, segments and deletions."""
        self._check_open()
        if not self.readonly:
            return
        with self._lock:
            bases = self._list_bases()
            tail = self._active
            if not bases:
                return
            known = {s.base_offset: s for s in self._sealed}
            cfg = self.config
            sealed = []
            for i, b in enumerate(bases[:-1]):
                s = known.get(b)
                if s is None:
                    s = SealedSegment(self.path, b, bases[i + 1], os.path.getsize(paths(self.path, b)[0]),
                                      cfg.index_interval_bytes, self._cache, readonly=True)
                sealed.append(s)
            from pylog.tail import TailSegment

            if bases[-1] != tail.base_offset:
                tail = TailSegment(self.path, bases[-1], cfg)
            else:
                tail.refresh()
            self._sealed = sealed
            self._sealed_bases = [s.base_offset for s in sealed]
            self._active = tail
            # The marker is read after the store size: a reader that saw records of an
            # apply in flight also sees its marker (written before them, removed after).
            mark = read_stable_file(self.path)
            self._cap = None if mark is None else mark[1]

    # ------------------------------------------------------------------------------------
    # truncation and retention
    def truncate(self, offset: int) -> None:
        """Drop ``offset`` and every record after it (``next_offset`` becomes ``offset``).

        Views of dropped records stay readable, in this process and in read-only logs in
        others: the kept part of the segment is copied to a new file renamed over the old
        one (a kernel copy where the file system allows it), never cut in place.
        """
        offset = _check_offset(offset)
        with self._lock:
            active = self._check_writable()
            start, nxt = self.start_offset, active.next_offset
            if not start <= offset <= nxt:
                raise OffsetOutOfRangeError(offset, start, nxt)
            if offset == nxt:
                return
            tseg = self._sealed_for(offset) if offset < active.base_offset else None
            if tseg is not None:
                tseg.maps()  # learns tseg.gaps
                if tseg.gaps:  # the active segment cannot be a compacted one
                    raise PylogError(f"cannot truncate at offset {offset}: it lies in a compacted segment "
                                     f"({tseg.store_path}); truncate at or after {tseg.next_offset}")
            self._write_out(active)
            try:
                # From here a crash leaves the truncate to finish at the next open (the
                # point is durable before any file changes), and a failure leaves the log
                # fenced, its view matching the files (_match_files).
                checkpoint.write_truncate_point(self.path, offset)
            except OSError as e:
                self._truncate_failed(e, None, 0, [])
                raise
            if offset >= active.base_offset:
                target_base = active.base_offset
                doomed_files: list[int] = []
                cut_at = self._cut_hint.pop(offset, None) or _cut_position(active, offset)
            else:
                seg = self._sealed_for(offset)
                assert seg is not None
                target_base = seg.base_offset
                cut_at = self._cut_hint.pop(offset, None) or _cut_position(seg, offset)
                self._cache.discard(seg)
                # newest first: a crash (or a failure) part way leaves a shorter log, never
                # one with a hole in its offsets
                doomed_files = [active.base_offset] + [s.base_offset for s in reversed(self._sealed)
                                                       if s.base_offset > target_base]
            active.close_files()
            target = paths(self.path, target_base)[0]
            target_size = os.path.getsize(target)
            new = None
            try:
                self._delete_files(doomed_files)
                # copied, never cut in place: read-only logs in other processes may map it
                fileutil.shrink_file(target, cut_at, copy=True)
                new, _cut, _damage = ActiveSegment.recover(self.path, target_base, self.config, save_broken=False)
                checkpoint.write_recovery_point(self.path, target_base)
                checkpoint.clear_truncate_point(self.path)
            except OSError as e:
                if new is not None:
                    new.close_files()
                self._truncate_failed(e, target, target_size, doomed_files)
                raise
            keep = [s for s in self._sealed if s.base_offset < target_base]
            for s in self._sealed:
                if s.base_offset >= target_base:
                    self._cache.discard(s)
            self._sealed = keep
            self._sealed_bases = [s.base_offset for s in keep]
            self._active = new
            self._update_writable()
            with self._sync_cv:
                self._durable_next = min(self._durable_next, new.next_offset)

    def _truncate_failed(self, e: BaseException, target: str | None, size: int, doomed: list[int]) -> None:
        """A truncate failed: fence (:meth:`_fail`). If it changed no file (every doomed
        store is there and the kept one has its old size), its truncate point goes too, so
        a reopen finds the log as it was; else the point stays and the reopen finishes it."""
        self._fail(e)
        try:
            if (target is None or os.path.getsize(target) == size) and all(
                    os.path.exists(paths(self.path, b)[0]) for b in doomed):
                checkpoint.clear_truncate_point(self.path)
        except OSError:
            pass  # the point stays: the next open finishes the truncate

    def _fail(self, e: BaseException) -> None:
        """A truncate or retention failed part way: fence the log, and make what it shows
        match the files as the failure left them, so every offset it still claims reads."""
        self._fence(e)
        try:
            self._match_files()
        except OSError:
            pass  # the old view stays; reads of what is gone raise OffsetOutOfRangeError

    def _match_files(self) -> None:
        """Rebuild the segment list from the store files now in the directory. The active
        segment is kept while its files are open and it is still the last; otherwise the
        last store is read as a read-only reader would (whole, CRC-valid frames only)."""
        from pylog.tail import TailSegment  # the read-only tail, as in _load_readonly

        bases = self._list_bases()
        if not bases:
            return
        active = self._active
        if not (isinstance(active, ActiveSegment) and active.store_fd >= 0 and bases[-1] == active.base_offset):
            if isinstance(active, ActiveSegment):
                active.close_files()
            active = TailSegment(self.path, bases[-1], self.config)
        known = {s.base_offset: s for s in self._sealed}
        sealed = []
        for i, b in enumerate(bases[:-1]):
            s = known.get(b)
            if s is None or s.next_offset != bases[i + 1]:
                s = SealedSegment(self.path, b, bases[i + 1], None, self.config.index_interval_bytes, self._cache)
            sealed.append(s)
        for s in self._sealed:
            if s not in sealed:
                self._cache.discard(s)
        self._sealed = sealed
        self._sealed_bases = [s.base_offset for s in sealed]
        self._active = active

    def _delete_files(self, bases: Iterable[int]) -> None:
        """Delete segments crash-safely, in the order given: rename to .deleted (the store
        first, so a segment is gone as a whole), fsync dir, unlink."""
        renamed = []
        for b in bases:
            for p in paths(self.path, b):
                try:
                    vfs.rename(p, p + fmt.DELETED_SUFFIX)
                    renamed.append(p + fmt.DELETED_SUFFIX)
                except FileNotFoundError:
                    pass
        fileutil.fsync_dir(self.path)
        for p in renamed:
            vfs.unlink(p)
        if renamed:
            fileutil.fsync_dir(self.path)

    def _drop_oldest(self, count: int) -> int:
        if count <= 0:
            return 0
        doomed = self._sealed[:count]
        try:
            # oldest first: a crash part way leaves a log that starts later, never a hole
            self._delete_files([s.base_offset for s in doomed])
        except OSError as e:
            self._fail(e)  # start_offset moves only past the segments really gone
            raise
        for s in doomed:
            self._cache.discard(s)
        self._sealed = self._sealed[count:]
        self._sealed_bases = self._sealed_bases[count:]
        return count

    def remove_expired(self, max_age_ms: int) -> int:
        """Delete sealed segments whose newest record is older than ``max_age_ms``
        (never the active segment); returns how many were deleted."""
        if isinstance(max_age_ms, bool) or not isinstance(max_age_ms, int):
            raise ArgumentTypeError(f"max_age_ms must be an int, got {type(max_age_ms).__name__}")
        if max_age_ms < 0:
            raise InvalidArgumentError(f"max_age_ms={max_age_ms} must be >= 0")
        with self._lock:
            self._check_writable()
            cutoff = _now_ms() - max_age_ms
            count = 0
            for s in self._sealed:
                last = _last_timestamp(s)
                if last is None or last < cutoff:
                    count += 1
                else:
                    break
            return self._drop_oldest(count)

    def enforce_retention(self) -> int:
        """Apply ``retention_ms`` and ``retention_bytes`` (whole sealed segments, oldest
        first, never the active one); returns how many segments were deleted."""
        cfg = self.config
        removed = 0
        if cfg.retention_ms is not None:
            removed += self.remove_expired(cfg.retention_ms)
        if cfg.retention_bytes is not None:
            with self._lock:
                self._check_writable()
                total = sum(s.size for s in self._sealed) + self._active.size
                count = 0
                for s in self._sealed:
                    if total - s.size >= cfg.retention_bytes:
                        total -= s.size
                        count += 1
                    else:
                        break
                removed += self._drop_oldest(count)
        return removed

    # ------------------------------------------------------------------------------------
    # checking
    def compact(self, **options: Any) -> Any:
        """Compact the sealed segments: keep the latest record of each key (see
        :func:`pylog.compaction.compact`, which takes the same options); returns its
        CompactionReport."""
        from pylog.compaction import compact  # the layer above Log; imported on use

        return compact(self, **options)

    def verify(self, progress: Any = None) -> list[CorruptRecordError]:
        """CRC-check every frame of every segment. Returns the bad frames, one
        CorruptRecordError each (an empty list, so falsy, when all is well), then what the
        persisted recovery report holds and the walk did not find again (what recovery cut,
        or found in a segment since removed) until :meth:`clear_recovery_report`. A damaged
        region with valid frames after it is stepped over (one error for the region).
        ``progress``, if given, is called with the bytes checked after each segment."""
        self._check_open()
        with self._lock:
            if self._q:
                self._drain_locked()
            segs: list[Any] = [*self._sealed, self._active]
        bad: list[CorruptRecordError] = []
        for i, s in enumerate(segs):
            expected = segs[i + 1].base_offset if i + 1 < len(segs) else None
            if s is segs[-1]:
                with self._lock:
                    bad.extend(s.verify(None))
            else:
                try:
                    bad.extend(s.verify(expected))
                except FileNotFoundError:
                    continue
            if progress is not None:
                progress(s.size)
        seen = {(os.path.basename(e.path), e.position) for e in bad}
        return bad + [e for e in self.saved_recovery_report() if (os.path.basename(e.path), e.position) not in seen]

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

    # ------------------------------------------------------------------------------------
    # closing
    def close(self) -> None:
        """Write out and fsync everything, mark a clean shutdown, release the lock.
        Record views already handed out stay valid. Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            if self._q:
                try:
                    self._drain_locked()
                except OSError:
                    pass  # fenced: the queued appends were never acknowledged
            self._closed = True
            self._writable = None
            self._queueing = False
            flusher.unregister(self)
            try:
                if not self.readonly:
                    active = self._active
                    if self._fenced is None:
                        active.write_pending()
                        if active.preallocated and os.fstat(active.store_fd).st_size != active.written:
                            vfs.ftruncate(active.store_fd, active.written)  # so the marker matches the file
                        active.sync(indexes=True)
                        checkpoint.write_recovery_point(self.path, active.next_offset)
                        checkpoint.write_clean(self.path, checkpoint.CleanState(
                            active.next_offset, active.base_offset, active.written, active.app.max_timestamp,
                            os.fstat(active.store_fd).st_mtime_ns))
                    active.close_files()
                else:
                    self._active.close_files()
            finally:
                self._cache.clear()
                self._release_lock()

    def remove(self) -> None:
        """Close the log and delete its files (and its directory, if nothing else is in it)."""
        if not self._closed:
            self.close()
        if self.readonly:
            raise ReadOnlyLogError(f"log {self.path} was opened read-only")
        for name in os.listdir(self.path):
            ours = name in (fmt.CONFIG_FILE, fmt.CHECKPOINT_FILE, fmt.CLEAN_SHUTDOWN_FILE, fmt.LOCK_FILE,
                            fmt.TRUNCATE_FILE, fmt.REPORT_FILE) or any(
                fmt.parse_segment_name(name.split(".", 1)[0] + s, s) is not None
                for s in (fmt.STORE_SUFFIX, fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX)
            )
            if ours:
                vfs.unlink(os.path.join(self.path, name))
        try:
            vfs.rmdir(self.path)
        except OSError:
            pass

    def __del__(self) -> None:
        try:
            if not self._closed and not self.readonly and self._fenced is None:
                if self._q:
                    self._drain_locked()
                self._active.write_pending()
        except BaseException:  # never raise from a finalizer (a test's PowerCut included)
            pass

    def read_arrow(self, start: int | None = None, stop: int | None = None,
                   columns: Any = None) -> Any:
        """The records in ``[start, stop)`` as a ``pyarrow.Table``: columns offset,
        timestamp (ms, UTC), key, value, metadata. Needs pyarrow, imported only here; see
        :func:`pylog.arrow.read_table`."""
        from pylog.arrow import read_table

        return read_table(self, start, stop, columns)


#: A batch whose frames take at least this many bytes is laid out as frames and framed in
#: place (see _lay_out); a smaller one is copied into the write buffer, where batches coalesce.
IN_PLACE_MIN_BYTES = 64 << 10
_GAP = bytes(fmt.FRAME_HEADER_SIZE)


def _batch_lengths(values: Any, keys: Any, metadata: Any, n: int) -> tuple[Any, Any, Any] | None:
    """``(value_lens, key_lens, metadata_lens)`` (None for a column not given) when every
    given column is a list or tuple of ``n`` items that all have a length below 4 GiB; else
    None (append_batch's general path then takes the lengths it needs)."""
    out = []
    for c in (values, keys, metadata):
        if c is None:
            out.append(None)
            continue
        if type(c) not in (list, tuple):
            return None  # a PackedBytes, an iterator: the general path
        try:
            lens = _lengths(c)
        except (TypeError, OverflowError):  # a None, an int, a length >= 4 GiB
            return None
        if len(lens) != n:
            return None
        out.append(lens)
    return out[0], out[1], out[2]


def _lay_out(values: Any, keys: Any, metadata: Any, n: int,
             lens: tuple[Any, Any, Any] | None = None) -> tuple[bytearray, np.ndarray, Any, Any] | None:
    """A batch laid out as its frames will be, with a gap for each header: ``(buffer,
    value_lens, key_lens, metadata_lens)``; or None unless every item is a bytes-like of
    single bytes (no None, no str: append_batch's general path handles those) and the
    frames take at least IN_PLACE_MIN_BYTES. ``lens``: :func:`_batch_lengths`, if taken."""
    if lens is None:
        lens = _batch_lengths(values, keys, metadata, n)
        if lens is None:
            return None
    vlens, klens, mlens = lens
    total = n * fmt.FRAME_HEADER_SIZE + sum(int(x.sum(dtype=np.uint64)) for x in lens if x is not None)
    if total < IN_PLACE_MIN_BYTES:
        return None
    cols = [c for c in (keys, metadata) if c is not None]
    cols.append(values)
    stride = len(cols) + 1
    parts = [_GAP] * (n * stride)
    for j, c in enumerate(cols, 1):
        parts[j::stride] = c
    try:
        buf = bytearray().join(parts)
    except TypeError:  # a str or another non-buffer
        return None
    if len(buf) != total:  # a view whose items are wider than a byte
        return None
    return buf, vlens, klens, mlens


def _lengths(items: Any) -> np.ndarray:
    """``len()`` of every item as a uint32 array, without a Python-level loop. TypeError for
    an item without a length, OverflowError for one of 4 GiB or more; a view of wider items
    counts items, not bytes (callers compare the sum with what a join made)."""
    return np.frombuffer(array("I", map(len, items)), dtype=np.uint32)


def _largest(vlens: np.ndarray, klens: np.ndarray | None, mlens: np.ndarray | None) -> int:
    """Bytes of the largest record's key, metadata and value (a null counts 0)."""
    if klens is None and mlens is None:
        big = int(vlens.max())
        if big != fmt.NULL_LEN:
            return big
    sizes = vlens.astype(np.int64) * (vlens != fmt.NULL_LEN)
    if klens is not None:
        sizes += klens.astype(np.int64) * (klens != fmt.NULL_LEN)
    if mlens is not None:
        sizes += mlens.astype(np.int64) * (mlens != fmt.NULL_LEN)
    return int(sizes.max())


def sizes_of(lens: np.ndarray, a: int, b: int) -> int:
    part = lens[a:b]
    return int(part[part != fmt.NULL_LEN].sum(dtype=np.int64))


def corrupt_reason(rc: int) -> str:
    from pylog.segment import reason

    return reason(rc)

