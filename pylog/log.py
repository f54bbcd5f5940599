"""Log: one partition, a directory of segments (the seeds' SegmentedLog).

Append path: ``append`` -> the active segment's appender frames the record in C into the
write buffer -> the buffer goes to the OS in one ``pwrite`` (at once under
``fsync="always"``, when full or when the flush policy says otherwise) -> fsync per policy.

Read path: ``read(offset)`` -> bisect over segment base offsets -> C search of that
segment's sparse index -> C walk of at most one index interval -> a Record whose value is
a memoryview of the map.

Durability, recovery and the lock are described in docs/concepts.md.

``Log`` is the one public facade; its methods live in parts it inherits, along the seams of
Kafka's log layer: opening and recovery in pylog/loader.py, the append path in
pylog/appender.py (``append_batch`` and its in-place layout stay here), reads in
pylog/reading.py, truncation and retention in pylog/retention.py.
"""
from __future__ import annotations

import errno
import os
import threading
from typing import Any

import numpy as np

from pylog import checkpoint, fileutil, flusher, vfs
from pylog import format as fmt
from pylog.appender import (  # noqa: F401  (re-exported: see __all__'s comment)
    _ALWAYS,
    _FRAME_HEADER,
    _POLICIES,
    LogAppending,
    PackedBytes,
    _c_bytes_only,
    _Framer,
    _largest,
    _lengths,
    _now_ms,
    corrupt_reason,
    sizes_of,
)
from pylog.cache import SegmentCache
from pylog.config import LogConfig, merge
from pylog.errors import (
    ArgumentTypeError,
    CorruptRecordError,
    InvalidArgumentError,
    InvalidTimestampError,
    LogClosedError,
    LogFencedError,
    PylogError,
    ReadOnlyLogError,
    RecordTooLargeError,
)
from pylog.groupcommit import GroupCommit, append_durable
from pylog.loader import (  # noqa: F401
    CLEANED_SUFFIX,
    STABLE_FILE,
    STABLE_HOOKS,
    SWAP_SUFFIX,
    LogLoading,
    finish_swaps,
    read_stable_file,
)
from pylog.reading import LogReading
from pylog.retention import LogRetention
from pylog.segment import ActiveSegment, SealedSegment, paths

__all__ = ["Log", "PackedBytes"]
# Also importable from here, as before the split (other modules, tests and docs use them):
# CLEANED_SUFFIX, SWAP_SUFFIX, STABLE_FILE, STABLE_HOOKS, read_stable_file, finish_swaps,
# PackedBytes, _now_ms, sizes_of, corrupt_reason; IN_PLACE_MIN_BYTES and _lay_out live here.


class Log(LogLoading, LogAppending, LogReading, LogRetention):
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
        kind = fileutil.dir_kind(self.path)
        if kind in ("topic", "store"):  # its segment files would land among the topic's or store's
            what = "a topic (its partitions are Logs)" if kind == "topic" else "a LogStore's data root"
            raise InvalidArgumentError(f"{self.path!r} is the directory of {what}, not of a Log")
        if config is not None and not isinstance(config, LogConfig):
            raise ArgumentTypeError(f"config must be a LogConfig, got {type(config).__name__}")
        self.readonly = readonly
        self._listed: list[int] | None = None  # a read-only log's last settled listing (_list_bases)
        self._lock = threading.RLock()
        self._drains = 0  # odd while a drain of the append queue is under way
        # the group commit of fsync="always" (see LogGroupCommit._wait_durable): its state
        # (the leader, its followers, durable_next, the leader's descriptor) and its waits
        self._gc = GroupCommit()
        self._fenced: BaseException | None = None
        self._closed = False
        self._lock_fd = -1
        self._unflushed = 0
        self._last_flush_ms = _now_ms()
        self.recovery_report: list[CorruptRecordError] = []
        self.recovery_actions: list[str] = []
        self.truncated_bytes = 0
        self._cap: int | None = None  # the last stable offset while a transaction applies
        self._unit_first: int | None = None  # the first offset of the append_batch being framed
        self._cut_hint: dict[int, int] = {}  # truncate_at_damage: offset -> where to cut
        self._start_mark = 0  # delete_records' log start offset (read once the segments are)
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
            self._stored_preallocate = stored is not None and stored.preallocate
            if not readonly and (stored is None or self.config != stored):
                self.config.dump(os.path.join(self.path, fmt.CONFIG_FILE))
            self._cache = SegmentCache(self.config.cached_segments)
            self._policy = _POLICIES[self.config.fsync]
            self._max_record = self.config.max_record_bytes
            self._segment_ms = self.config.segment_ms
            self._writable: ActiveSegment | None = None
            self._queueing = False
            self._framer: Any = None  # the append target's pylog._speedups Framer (see _set_framer)
            self._frame_fast: Any = None
            self._fast_append: Any = None
            self._q: list[bytes] = []
            self._q_ts: list[int] = []
            self._q_bytes = 0
            self._q_start = 0
            self._q_limit = self.config.write_buffer_bytes
            self._flush_n = self.config.flush_messages or (1 << 62)
            self._flush_t = self.config.flush_ms or (1 << 62)
            self._load(bases)
            self._load_start_mark()
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
        """``_writable`` is the active segment while appends may go to it, else None.

        Also chooses how ``append`` takes the common record: with pylog._speedups, framed
        at once into the write buffer by the active segment's Framer (see ``_set_framer``);
        else, under "interval" and "never", queued and framed in one C call per write
        buffer (``_queueing``)."""
        ok = not (self._closed or self.readonly or self._fenced is not None)
        self._writable = self._active if ok else None
        direct = (ok and _Framer is not None and self._segment_ms is None
                  and (self._policy != _ALWAYS or append_durable is not None))
        app: Any = self._active.app  # the native Appender when _Framer is not None (it has framer())
        self._set_framer(app.framer(_Framer) if direct else None)
        self._queueing = (ok and not direct and self._policy != _ALWAYS and self._segment_ms is None
                          and self.config.write_buffer_bytes > 0)

    @property
    def start_offset(self) -> int:
        """Lowest offset still in the log (inclusive): the first segment's base offset, or
        past it the log start offset :meth:`delete_records` set."""
        self._check_open()
        sealed = self._sealed
        base = sealed[0].base_offset if sealed else self._active.base_offset
        mark = self._start_mark
        return mark if mark > base else base

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

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append_batch(self, values: Any, keys: Any = None, timestamps: Any = None,
                     metadata: Any = None) -> int:
        """Append records in one C call per write buffer; returns the first offset.

        ``values``: a sequence of bytes-likes (None = tombstone). ``keys``, ``metadata``:
        None, or sequences of the same length (bytes-like or None each). ``timestamps``:
        None (now), or a sequence of ints (that never decreases, unless the config says
        ``timestamps="as-given"``; see LogConfig). All or nothing: a bad
        element raises before anything is written.
        """
        if isinstance(values, (bytes, bytearray, memoryview, str)):
            raise ArgumentTypeError(f"values must be a sequence of bytes-likes, not a single {type(values).__name__}")
        if type(values) is not list and not isinstance(values, PackedBytes):
            try:
                values = list(values)
            except TypeError:
                raise ArgumentTypeError(
                    f"values must be a sequence of bytes-likes, got {type(values).__name__}") from None
        n = len(values)
        if n == 0:
            raise InvalidArgumentError("append_batch needs at least one value")
        cfg = self.config
        lens = _batch_lengths(values, keys, metadata, n)  # taken once, for either path
        gather = None if lens is None else gather_batch(values, keys, metadata, n, lens[0])
        laid = None if lens is None or gather is not None else _lay_out(values, keys, metadata, n, lens)
        if gather is not None:  # a big batch of bytes values: written from where they lie
            vlens, klens, mlens = lens[0], None, None  # type: ignore[index]
            vjoined = kjoined = mjoined = None
        elif laid is not None:  # a big batch of plain bytes-likes: framed where it lies
            vlens, klens, mlens = laid[1:]
            vjoined = kjoined = mjoined = None
        else:
            vl, kl, ml = (None, None, None) if lens is None else lens
            vjoined, vlens = self._join(values, "values", n, nullable=True, lens=vl)
            kjoined, klens = (None, None) if keys is None else self._join(keys, "keys", n, nullable=True, lens=kl)
            mjoined, mlens = ((None, None) if metadata is None
                              else self._join(metadata, "metadata", n, nullable=True, lens=ml))
        # no record can be larger than the whole batch: most batches need no search
        small = ((laid is not None and len(laid[0]) - n * _FRAME_HEADER <= cfg.max_record_bytes)
                 or (gather is not None and int(vlens.sum(dtype=np.uint64)) <= cfg.max_record_bytes))
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
                raise ArgumentTypeError(
                    f"timestamps must be a sequence of ints, got {type(timestamps).__name__}") from None
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
            self.config.check_time_bounds(int(ts_arr.min()), int(ts_arr.max()))
            if n > 1 and self.config.timestamps != "as-given" and bool((np.diff(ts_arr) < 0).any()):
                i = int(np.flatnonzero(np.diff(ts_arr) < 0)[0]) + 1
                raise InvalidTimestampError(
                    f"timestamps[{i}]={int(ts_arr[i])} is below timestamps[{i - 1}]: timestamps never decrease")
        with self._lock:
            seg = self._check_writable()
            mx = seg.app.max_timestamp
            if ts_arr is not None:
                if mx is not None and int(ts_arr[0]) < mx and self.config.timestamps != "as-given":
                    raise InvalidTimestampError(
                        f"timestamps[0]={int(ts_arr[0])} is below the log's latest timestamp {mx}")
                default_ts = 0
            else:
                default_ts = _now_ms()
                if mx is not None and default_ts < mx:
                    default_ts = mx
            first: int = seg.app.next_offset
            seg0, pos0 = seg, seg.app.position
            seg.app.unit_end = first + n  # one write unit: every frame but the last says it goes on
            self._unit_first = first
            try:
                seg = self._frame_locked(seg, vjoined, vlens, kjoined, klens, mjoined, mlens, ts_arr, default_ts,
                                         laid[0] if laid is not None else None, gather)
            except OSError:
                self._unit_failed(seg0, first, pos0)  # fenced: none of the batch stays in view
                raise
            finally:
                self._active.app.unit_end = 0
                self._unit_first = None
            last = seg.app.next_offset - 1
            self._after_append(seg, n)
        if cfg.fsync == "always":
            try:
                self._wait_durable(last)
            except (OSError, LogFencedError):
                with self._lock:  # its fdatasync failed: never acknowledged, out of view
                    self._unit_failed(seg0, first, pos0)
                raise
        return first

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
            self._set_framer(None)
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
                        checkpoint.write_durable_point(self.path, active.base_offset, active.next_offset,
                                                       sync=True)
                        checkpoint.write_clean(self.path, checkpoint.CleanState(
                            active.next_offset, active.base_offset, active.written, active.app.max_timestamp,
                            os.fstat(active.store_fd).st_mtime_ns))
                    active.close_files()
                else:
                    self._active.close_files()
            finally:
                self._close_sync_fd()
                self._cache.clear()
                self._release_lock()

    def _forked(self) -> None:
        """This process was forked from the one that opened the log (see pylog.flusher):
        fence it here, touching neither its lock nor its files, which stay the parent's.
        Reads still work; appends raise LogFencedError; close() closes only this process's
        descriptors. The lock file's descriptor is closed at once (in the at-fork handler,
        before ``fork()`` returns in the child), so the parent's lock goes when the parent
        closes the log, not when this process ends."""
        self._lock = threading.RLock()  # a thread of the parent may have held the old one
        self._fenced = PylogError(f"opened by process {os.getppid()}, which this process was forked from: "
                                  "open the log again in this process")
        self._writable = None
        self._framer = self._frame_fast = self._fast_append = None
        self._queueing = False
        self._q, self._q_ts = [], []
        if self._lock_fd >= 0:
            try:
                os.close(self._lock_fd)
            except OSError:
                pass
            self._lock_fd = -1

    def remove(self) -> None:
        """Close the log and delete its files (and its directory, if nothing else is in it)."""
        if not self._closed:
            self.close()
        if self.readonly:
            raise ReadOnlyLogError(f"log {self.path} was opened read-only")
        for name in os.listdir(self.path):
            ours = name in (fmt.CONFIG_FILE, fmt.CHECKPOINT_FILE, fmt.CLEAN_SHUTDOWN_FILE, fmt.LOCK_FILE,
                            fmt.TRUNCATE_FILE, fmt.REPORT_FILE, fmt.DURABLE_FILE) or any(
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
    out: list[Any] = []
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


def gather_batch(values: Any, keys: Any, metadata: Any, n: int, vlens: np.ndarray) -> list[bytes] | None:
    """A private copy of ``values`` for a gathered write (``Framer.frame_gather``: the
    values are framed where they lie and written with pwritev, never copied into one
    buffer), or None for the other paths: it needs pylog._speedups, values only (no keys,
    no metadata), a list of exactly bytes, frames of at least IN_PLACE_MIN_BYTES (a smaller
    batch is copied into the write buffer, where batches coalesce), and the operating
    system's pwrite (a fault-injection layer installed in :mod:`pylog.vfs` must see every
    write, so it gets the in-place path). The copy holds the items fixed, whatever the
    caller's list goes through meanwhile."""
    if (_c_bytes_only is None or keys is not None or metadata is not None or type(values) is not list
            or vfs.pwrite is not os.pwrite):
        return None
    if n * _FRAME_HEADER + int(vlens.sum(dtype=np.uint64)) < IN_PLACE_MIN_BYTES or not _c_bytes_only(values):
        return None
    return values[:]


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


