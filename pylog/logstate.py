"""LogState: the state a Log's parts share, declared once with its types.

:class:`pylog.log.Log` is one facade over four parts (pylog/loader.py, pylog/appender.py,
pylog/reading.py, pylog/retention.py), each a class it inherits. They all work on the same
state, which ``Log.__init__`` and the loading code set. This class declares that state, and
the methods one part calls on another, so each part can be read (and type-checked) on its
own. It holds no code: the attributes are bare annotations (no class attributes are created)
and the methods are declared only for type checkers (``TYPE_CHECKING``), so nothing here
exists at run time but an empty base class.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from typing import Any

    from pylog.cache import SegmentCache
    from pylog.config import LogConfig
    from pylog.errors import CorruptRecordError
    from pylog.segment import ActiveSegment, SealedSegment

__all__ = ["LogState"]


class LogState:
    """The state of one Log, shared by its parts. Set in ``Log.__init__`` and by loading."""

    # what the caller passed, and what opening found
    path: str
    readonly: bool
    config: LogConfig
    recovery_report: list[CorruptRecordError]
    recovery_actions: list[str]
    truncated_bytes: int

    # segments: the sealed ones in offset order, their base offsets, and the active one
    # (a TailSegment in a read-only log, which uses only the read side the two share)
    _sealed: list[SealedSegment]
    _sealed_bases: list[int]
    _listed: list[int] | None
    _active: ActiveSegment
    _cache: SegmentCache

    # locks and life cycle
    _lock: threading.RLock
    _lock_fd: int  # the directory's writer lock (flock), -1 when not held
    _closed: bool
    _fenced: BaseException | None  # the failed write or fsync that fenced the log

    # the append path: config values read on every append, the queue and its drain
    _policy: int  # one of appender's _ALWAYS, _INTERVAL, _NEVER
    _max_record: int
    _segment_ms: int | None
    _stored_preallocate: bool  # the stored config had preallocate=True (recovery: reserved zeros)
    _writable: ActiveSegment | None  # the active segment while appends may go to it
    _queueing: bool
    _q: list[bytes]
    _q_ts: list[int]
    _q_bytes: int
    _q_start: int
    _q_limit: int
    _drains: int  # odd while a drain of the append queue is under way
    # pylog._speedups' per-record path (see LogAppending._set_framer): the append target's
    # Framer, and the calls append frames the common record with (None without it)
    _framer: Any
    _frame_fast: Callable[[bytes, int], int] | None  # "interval": under append's lock
    # "never": Framer.append; "always": Framer.append_durable(value, log, gc). Both take the lock
    _fast_append: Callable[..., int] | None

    # the append_batch being framed: its first offset (a roll splitting it records it), else None
    _unit_first: int | None

    # durability: group commit and the flush policy
    _gc: Any  # the group commit of fsync="always", its state and waits (pylog.groupcommit.GroupCommit)
    _unflushed: int
    _last_flush_ms: int
    _flush_n: int
    _flush_t: int

    # transactions and truncation
    _cap: int | None  # the last stable offset while a transaction applies
    _vis: tuple[tuple[Any, ...], str] | None  # read-only: the token of the last look (loader._token), the txn dir
    _cut_hint: dict[int, int]  # truncate_at_damage: offset -> where to cut
    _old_mark: tuple[int, int, int | None] | None  # truncate: the durable-point mark before it (put back on failure)
    # the log start offset delete_records set (the log-start-offset file; 0: none): no offset
    # below it is served (start_offset is the larger of it and the first segment's base)
    _start_mark: int

    if TYPE_CHECKING:
        # methods one part calls on another (defined in Log and in the parts)
        @property
        def start_offset(self) -> int: ...
        @property
        def next_offset(self) -> int: ...
        @property
        def stable_offset(self) -> int: ...
        def _check_open(self) -> None: ...
        def _check_writable(self) -> ActiveSegment: ...
        def _update_writable(self) -> None: ...
        # loader.py
        def _load_start_mark(self) -> None: ...
        def _list_bases(self, names: list[str] | None = None) -> list[int]: ...
        def refresh(self) -> None: ...
        def saved_recovery_report(self) -> list[CorruptRecordError]: ...
        # appender.py
        def _drain_locked(self) -> None: ...
        def _write_out(self, seg: ActiveSegment) -> None: ...
        def _fence(self, e: BaseException) -> None: ...
        # reading.py
        def _sealed_for(self, offset: int) -> SealedSegment | None: ...
        # retention.py
        def truncate(self, offset: int) -> None: ...
