"""Appends to one partition of the broker: the gate that orders plain and idempotent
appends, and the fence a partition is under after a failed write or fsync.

A partition's appends pass a :class:`Gate`: plain appends run together (they share the
Log's fsyncs: group commit); an idempotent batch runs alone between its intent and its
records (:mod:`.producers`), and plain appends that arrive meanwhile wait behind it. A
partition whose Log refused an append carries a :class:`Fence` until the broker reopens
it (docs/serve.md, "Storage errors"): at once after a transient refusal
(:data:`TRANSIENT_ERRNOS`: resources ran out), after a back-off after an I/O error.
"""
from __future__ import annotations

import errno
import threading
from dataclasses import dataclass

__all__ = ["Gate", "Fence", "TRANSIENT_ERRNOS", "errno_of"]


class Gate:
    """Appends to one partition: many plain ones at once (they share fsyncs), or one
    idempotent batch alone (between its intent and its records), which waiting plain ones
    do not overtake."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._alone = False
        self._waiting = 0

    def enter(self, exclusive: bool) -> None:
        """Wait for the gate: alone with ``exclusive``, else beside other plain appends."""
        with self._cond:
            if exclusive:
                self._waiting += 1
                while self._alone or self._shared:
                    self._cond.wait()
                self._waiting -= 1
                self._alone = True
            else:
                while self._alone or self._waiting:
                    self._cond.wait()
                self._shared += 1

    def leave(self, exclusive: bool) -> None:
        """Leave the gate entered with the same ``exclusive``."""
        with self._cond:
            if exclusive:
                self._alone = False
            else:
                self._shared -= 1
            self._cond.notify_all()


#: errno values that are refusals to retry (resources run out), not damage: a partition
#: failing with one is reopened at the next produce, without the back-off of a fence
TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


@dataclass
class Fence:
    """A partition whose Log refused an append (a failed write or fsync fences a Log)."""

    reason: str
    transient: bool
    since: float  # time.monotonic() of the failure, or of the last failed reopen


def errno_of(e: BaseException | None) -> int | None:
    while e is not None:
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno
        e = e.__cause__ or e.__context__
    return None
