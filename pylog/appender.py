"""The append path: queue, framing, write-out, durability, flush timers, rolls.

Split out of pylog/log.py; :class:`pylog.log.Log` inherits :class:`LogAppending`.
``append_batch`` stays in pylog/log.py with its in-place layout (``IN_PLACE_MIN_BYTES``,
``_lay_out``), which tests and benchmarks set on that module.
"""
from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from pylog import checkpoint, fileutil
from pylog import format as fmt
from pylog._backend import impl, speedups
from pylog.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    InvalidTimestampError,
    OffsetMismatchError,
    PylogError,
    RecordTooLargeError,
)
from pylog.groupcommit import LogGroupCommit
from pylog.reading import _check_offset
from pylog.segment import ActiveSegment

_BYTES_LIKE = (bytes, bytearray, memoryview)
_ALWAYS, _INTERVAL, _NEVER = 0, 1, 2
_POLICIES = {"always": _ALWAYS, "interval": _INTERVAL, "never": _NEVER}
_FRAME_HEADER = fmt.FRAME_HEADER_SIZE
_BATCH_BUFFER = 1 << 20    # write buffer a batch append grows to: 1 MiB keeps the framed bytes in
                           # L2 for the kernel copy (4 MiB measured 2x slower per record)
_time_ns = time.time_ns
# pylog._speedups' append part, None without it (or with a build older than it: then the
# Python paths, as without the extension)
_Framer = getattr(speedups, "Framer", None)
_c_lengths = getattr(speedups, "lengths", None)
_c_bytes_only = getattr(speedups, "bytes_only", None)


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


def _check_timestamp(ts: Any) -> int:
    if isinstance(ts, bool) or not isinstance(ts, (int, np.integer)):
        raise ArgumentTypeError(f"timestamp must be an int (milliseconds since the epoch), got {type(ts).__name__}")
    t = int(ts)
    if not 0 <= t <= fmt.MAX_TIMESTAMP_MS:
        raise InvalidTimestampError(f"timestamp {t} is outside [0, {fmt.MAX_TIMESTAMP_MS}] (ms since the epoch)")
    return t


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


def _lengths(items: Any) -> np.ndarray:
    """``len()`` of every item as a uint32 array, without a Python-level loop (in one C loop
    with pylog._speedups). TypeError for an item without a length, OverflowError for one of
    4 GiB or more; a view of wider items counts items, not bytes (callers compare the sum
    with what a join made)."""
    if _c_lengths is not None and type(items) in (list, tuple):
        return np.frombuffer(_c_lengths(items), dtype=np.uint32)
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


class LogAppending(LogGroupCommit):
    """The append path of a Log.

    The append queue, framing, the write buffer going to the OS, fsync policy and group
    commit, flush timers, segment rolls.

    Mixed into :class:`pylog.log.Log`, which sets up the state. The state it uses, and the
    methods of the other parts it calls, are declared with their types in
    :class:`pylog.logstate.LogState`.
    """

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
            raise ArgumentTypeError(
                f"value must be bytes-like (or an iterable of bytes-like chunks), got {t.__name__}") from None
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
            Milliseconds since the epoch; default now, raised to the newest timestamp if the
            clock is behind it. An explicit one below the newest raises, unless the log's
            ``timestamps`` config is ``"as-given"`` (then it is kept as given).
        expected_offset
            If given, append only if it equals ``next_offset`` (a conditional append).

        Raises
        ------
        TypeError, RecordTooLargeError, InvalidTimestampError, OffsetMismatchError,
        LogClosedError, LogFencedError, ReadOnlyLogError
        """
        if (type(value) is bytes and key is None and metadata is None and timestamp is None
                and expected_offset is None and len(value) <= self._max_record):
            # The common record, in as few steps as possible. With pylog._speedups it is
            # framed into the write buffer at once by the active segment's Framer (see
            # _set_framer). Without it, under "interval" and "never" it is only queued,
            # with its offset and timestamp fixed now; the queue is framed in one C call
            # when it fills, and before anything reads or writes out the active segment
            # (it is the first stage of the write buffer).
            # A with-statement, not acquire() then try/finally: that is ~0.15 us faster on
            # CPython 3.11, but a signal handler's exception (Ctrl-C) can land between the
            # acquire and the try and leave the lock held, hanging every other thread.
            # (Framer.append takes and releases the lock in C, where no handler runs.)
            fa = self._fast_append
            if fa is not None:
                if self._policy != _ALWAYS:
                    # pylog._speedups, "never": one C call takes the lock, frames the record
                    # into the write buffer and releases the lock
                    off = fa(value)
                    if off >= 0:
                        return off
                else:
                    # "always": Framer.append_durable frames it the same way, then waits for
                    # the group commit's leader or leads the group itself, all in
                    # the same C call (write-out, fdatasync, gc.durable_next moved past it)
                    gc = self._gc
                    off = fa(value, self, gc)
                    if off >= 0:
                        if gc.durable_next <= off:
                            self._wait_durable(off)  # the group commit leader writes it out
                        return off
                # no room, segment full, index full, or the segment is no longer the
                # append target (a roll, a close, a fence): the general path
                return self._append(value, key, metadata, timestamp, expected_offset)
            with self._lock:
                fr = self._frame_fast
                if fr is not None:
                    # pylog._speedups, "interval": framed at once, in one C call
                    now = _time_ns() // 1_000_000
                    off = fr(value, now)
                    if off >= 0:
                        self._unflushed += 1
                        if self._unflushed >= self._flush_n or now - self._last_flush_ms >= self._flush_t:
                            self._flush_locked()
                        return off
                    seg = None  # no room, segment full, index full: the general path makes room
                elif self._queueing:
                    q = self._q
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
                else:
                    seg = self._writable
                    if seg is not None and self._segment_ms is None and not self._q:
                        off = seg.app.frame_value(value, _time_ns() // 1_000_000)
                        if off >= 0:
                            if self._policy != _ALWAYS:
                                self._after_append(seg, 1)
                                return off
                            # "always": framed only; the group commit leader writes it out
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
            cfg.check_time_bounds(timestamp, timestamp)
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
                if mx is not None and ts < mx and cfg.timestamps != "as-given":
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

    def _frame_locked(self, seg: ActiveSegment, vjoined: Any, vlens: np.ndarray, kjoined: Any,
                      klens: np.ndarray | None, mjoined: Any, mlens: np.ndarray | None,
                      ts_arr: np.ndarray | None, default_ts: int, laid: bytearray | None = None,
                      gather: list[bytes] | None = None) -> ActiveSegment:
        """Frame a validated batch into the active segment(s), writing out, rolling and
        growing the index as needed. Returns the active segment after it.

        With ``gather`` (a list of bytes only, that no one else holds: see
        :func:`pylog.log.gather_batch`) the frames are made and written by pylog._speedups'
        ``Framer.frame_gather``: a chunk of frames at a time in the empty write buffer (kept
        in the CPU's cache), written with pwritev, large values from where they lie.

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
            if gather is not None:
                if app.used:  # what is pending goes first: the frames follow it
                    self._write_out(seg)
                if app.buffer_capacity < _BATCH_BUFFER:
                    app.reserve(_BATCH_BUFFER)  # frame_gather frames in it, a chunk at a time
                at = app.position
                try:
                    # frames values[done:] and writes them at ``at`` (one C call, pwritev); the
                    # native backend's Appender only: gather is None under the pure backend
                    got = app.framer(_Framer).frame_gather(  # type: ignore[attr-defined]
                        seg.store_fd, gather, done, 0 if ts_arr is None else ts_arr[sl].ctypes.data, default_ts)
                except OSError as e:
                    self._fence(e)
                    raise
                except BaseException:
                    # interrupted (a signal handler's exception) once the call had returned:
                    # what it framed is written, so the segment says so
                    if app.position > at and self._fenced is None:
                        seg.wrote_direct(app.position)
                    raise
                if got is None:  # cannot happen: append_batch checked the (private) list
                    raise RuntimeError("append_batch: frame_gather refused a checked batch")
                rc, k, w = got
                if k:
                    seg.wrote_direct(at + w)
                    done += k
            elif laid is not None:
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
              lens: np.ndarray | None = None) -> tuple[bytes | memoryview, np.ndarray]:
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
        assert lens is not None  # every way here counted them
        return joined, lens

    def _after_append(self, seg: ActiveSegment, count: int) -> None:
        """Apply the fsync policy after ``count`` records went into the write buffer.

        Under "always" nothing happens here: the caller then waits in :meth:`_wait_durable`,
        whose group commit leader writes out the whole group's frames at once."""
        policy = self._policy
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

    def _set_framer(self, framer: Any) -> None:
        """Make ``framer`` (the active segment's pylog._speedups Framer, or None) the one
        ``append`` frames the common record with; under the lock (or where no append can
        run). The one it replaces is turned off first: an ``append`` that picked it up just
        before (``_fast_append`` is read without the lock) finds it off once it holds the
        lock, and takes the general path, so nothing is ever framed into a segment that is
        no longer the append target. "never" and "always" frame with ``Framer.append``,
        which takes the lock itself; "interval" with ``Framer.frame_value`` under ``append``'s
        lock (it counts records for its flush rule)."""
        old = self._framer
        if old is not None and old is not framer:
            old.enable(False)
        self._framer = framer
        if framer is None:
            self._frame_fast = self._fast_append = None
            return
        framer.set_lock(self._lock)
        framer.enable(True)
        if self._policy == _INTERVAL:
            self._frame_fast, self._fast_append = framer.frame_value, None
        elif self._policy == _ALWAYS:
            self._frame_fast, self._fast_append = None, framer.append_durable
        else:
            self._frame_fast, self._fast_append = None, framer.append

    def _fence(self, e: BaseException) -> None:
        self._gc.fence()  # first, in one call: every follower wakes to it, no one leads again
        self._fenced = e
        if isinstance(self._active, ActiveSegment):
            self._active.broken = True  # unwritten appends vanish; reads stop writing
        self._writable = None
        self._set_framer(None)
        self._queueing = False
        self._q = []
        self._q_ts = []

    def _unit_failed(self, seg0: ActiveSegment, first: int, pos0: int) -> None:
        """An ``append_batch`` that began at offset ``first``, store position ``pos0`` of
        ``seg0``, failed part way (a write, or a roll's fsync: the log is fenced). The frames
        of it already written stay in the file, out of view: ``next_offset`` and every read
        stop at ``first``, and the next open cuts them (a write unit that did not end)."""
        if self._fenced is None:
            return
        act = self._active
        if act is seg0:
            act.written = min(act.written, pos0)
            act.written_next = min(act.written_next, first)
            return
        # the batch rolled: its first frames are in a sealed segment now; reads stop at the
        # cap (the one a transaction's apply sets), next_offset falls back to first
        act.written, act.written_next = fmt.FILE_HEADER_SIZE, first
        self._cap = first if self._cap is None else min(self._cap, first)

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
        self._gc.advance(seg.written_next)
        # recovery tells damage (below it) from a torn write (past it) by this mark: one
        # pwrite, not synced (whichever version a crash keeps is a lower bound)
        try:
            checkpoint.write_durable_point(self.path, seg.base_offset, seg.written_next)
        except OSError:
            pass  # the mark stays lower: never unsafe (the data is synced, the log is fine)

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
        due = cfg.fsync == "interval" and cfg.flush_ms is not None and now_ms - self._last_flush_ms >= cfg.flush_ms
        if due:  # noqa: SIM102 - the lock is tried only when the timer is due; acquire pairs with release below
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

    def write_out(self) -> None:
        """Hand buffered appends to the OS (``pwrite``) without fsync.

        Other processes (a ``readonly`` Log, the CLI) see the records from then on; they
        are durable only after an fsync (the ``fsync`` policy, :meth:`flush` or
        :meth:`close`). Does nothing on a closed, fenced or read-only log (nothing is
        buffered there), so it never raises for those: the flusher thread calls it at exit.
        A failed write fences the log, as every write-out does.
        """
        if self._closed or self._fenced is not None or self.readonly:
            return
        with self._lock:
            if not self._closed and self._fenced is None:
                self._write_out(self._active)

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
        unit_end = old.app.unit_end
        try:
            if self._unit_first is not None and unit_end > old.app.next_offset:
                # a batch framed across the roll stays one write unit: its first records,
                # sealed now, go too if a crash leaves the next segment without its end
                # (pylog.loader). Recorded before that segment can exist.
                checkpoint.write_durable_point(self.path, old.app.next_offset, old.app.next_offset,
                                               open_unit=self._unit_first, sync=True)
            sealed = old.seal(self.config, self._cache)
            new = ActiveSegment.create(self.path, sealed.next_offset, self.config)
            fileutil.fsync_dir(self.path)
            checkpoint.write_recovery_point(self.path, new.base_offset)
            new.app.unit_end = unit_end
            if self.config.timestamps != "as-given":  # never decrease across segments either
                new.app.max_timestamp = old.app.max_timestamp
        except OSError as e:
            self._fence(e)
            raise
        self._sealed = [*self._sealed, sealed]
        self._sealed_bases = [*self._sealed_bases, sealed.base_offset]
        self._active = new
        self._update_writable()
        self._gc.advance(sealed.next_offset)
        return new
