"""Log compaction: keep only the latest record of each key in sealed segments.

A log with ``cleanup_policy="compact"`` is a changelog: what matters is the newest value of
each key. :func:`compact` rewrites every sealed segment that holds a superseded record
(an older record of a key that appears again later in the log, sealed or active) without
those records; records keep their offsets, so a compacted segment's offsets skip (its store
header carries ``format.HEADER_COMPACTED``). A tombstone (a record whose value is None) is
itself removed once it is older than ``delete_retention_ms`` (by its timestamp), so a reader
that starts from the beginning within that delay still learns that the key was deleted.
Records without a key are never removed. The active segment is never rewritten.

Frames are copied byte for byte (their CRC covers their offset, which does not change).

Crash-safe swap, per segment ``B`` (Kafka's LogCleaner protocol)::

    1. write B.index.cleaned, B.timeindex.cleaned, B.log.cleaned; fsync each
    2. rename them to .swap (the store last: B.log.swap is the commit point); fsync the dir
    3. rename B.index.swap, B.timeindex.swap, then B.log.swap over the originals; fsync the dir

Opening a log (``Log._clean_stray_files``) deletes every ``.cleaned`` file (the old segment
is whole), finishes step 3 for every ``B.log.swap``, and deletes index ``.swap`` files that
have no store ``.swap`` (step 2 never committed). A rename replaces the directory entry but
not the old inode, so readers that hold views of the old segment keep reading it unharmed.

The latest-offset map holds every distinct key of the log in memory (bytes keys).
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from pylog import fileutil, vfs
from pylog import format as fmt
from pylog import store as store_mod
from pylog._backend import impl
from pylog.errors import ArgumentTypeError, CorruptRecordError
from pylog.loader import CLEANED_SUFFIX, SWAP_SUFFIX, LogLoading, finish_swaps
from pylog.segment import SealedSegment, corrupt_error, paths, walker

if TYPE_CHECKING:  # Log is the layer above: compaction imports only what lies below it
    from pylog.log import Log

__all__ = ["compact", "CompactionReport", "STEPS", "finish_swaps"]

#: The points of the swap protocol at which :data:`crash_hook` is called (tests crash there).
STEPS = (
    "cleaned-written",
    "index-swap", "timeindex-swap", "log-swap",
    "index-replaced", "timeindex-replaced", "log-replaced",
)

#: Tests set this to a callable taking a step name (one of :data:`STEPS`) to simulate a
#: crash there by raising. None in normal use.
crash_hook: Callable[[str], None] | None = None

_CHUNK = 8192
_U64_MAX = (1 << 64) - 1


@dataclasses.dataclass
class CompactionReport:
    """What one :func:`compact` call did."""

    segments_cleaned: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    def __bool__(self) -> bool:
        return self.segments_cleaned > 0


def _step(name: str) -> None:
    if crash_hook is not None:
        crash_hook(name)


def _frames(seg: Any, path: str, gaps: bool) -> Iterator[tuple[Any, np.ndarray]]:
    """Yield (map, frames array) chunks of every frame of a segment; CRC-checked."""
    m = seg._view(None)[0]
    pos = fmt.FILE_HEADER_SIZE
    expected = seg.base_offset
    while pos < m.length:
        rc, frames, end = impl.scan(m.buf, m.length, pos, expected, _CHUNK, _U64_MAX, gaps)
        if len(frames):
            yield m, frames
            expected = int(frames[-1]["offset"]) + 1
            pos = int(end)
        if rc != impl.OK:
            raise corrupt_error(path, int(end), expected, rc)
        if not len(frames):
            break


def _keys(m: Any, frames: Any) -> list[bytes | None]:
    mv = m.mv
    out: list[bytes | None] = []
    starts = (frames["position"] + fmt.FRAME_HEADER_SIZE).tolist()
    lens = frames["key_length"].tolist()
    attrs = frames["attributes"].tolist()
    for s, n, a in zip(starts, lens, attrs):
        out.append(None if a & fmt.ATTR_NULL_KEY else mv[s : s + n].tobytes())
    return out


def compact(log: Log, *, now_ms: int | None = None, min_lag_ms: int = 0) -> CompactionReport:
    """Compact ``log``'s sealed segments (see the module docstring); returns a report.

    Holds the log's lock throughout (appends wait). ``now_ms`` (default: now) decides which
    tombstones are older than ``delete_retention_ms``; a segment holding a record newer
    than ``now_ms - min_lag_ms`` is not rewritten (Kafka's ``min.compaction.lag.ms``).
    Raises CorruptRecordError, leaving the log unchanged, if a segment fails its CRC checks.
    """
    if not isinstance(log, LogLoading):  # every Log is one (pylog.log.Log inherits it)
        raise ArgumentTypeError(f"log must be a pylog.Log, got {type(log).__name__}")
    now = time.time_ns() // 1_000_000 if now_ms is None else int(now_ms)
    report = CompactionReport()
    with log._lock:
        log._check_writable()
        sealed: list[SealedSegment] = list(log._sealed)
        if not sealed:
            return report
        active = log._active
        cutoff = now - log.config.delete_retention_ms
        # 1. the latest offset of every key, over the whole log
        latest: dict[bytes, int] = {}
        for seg in [*sealed, active]:
            if isinstance(seg, SealedSegment):
                seg.maps()  # learns seg.gaps from the store header
            for m, frames in _frames(seg, seg.store_path, seg.gaps):
                for k, off in zip(_keys(m, frames), frames["offset"].tolist()):
                    if k is not None:
                        latest[k] = off
        # 2. rewrite each sealed segment that holds something to remove
        for i, seg in enumerate(sealed):
            seg.maps()
            keep: list[tuple[int, int]] = []  # (position, size) runs of kept frames
            removed = tombs = 0
            m = None
            newest = -(1 << 63)
            for m, frames in _frames(seg, seg.store_path, seg.gaps):
                if len(frames):
                    newest = max(newest, int(frames["timestamp"].max()))
                keys = _keys(m, frames)
                for k, off, pos, size, attrs, ts in zip(
                        keys, frames["offset"].tolist(), frames["position"].tolist(),
                        frames["frame_size"].tolist(), frames["attributes"].tolist(),
                        frames["timestamp"].tolist()):
                    if k is not None and (latest[k] != off or (attrs & fmt.ATTR_NULL_VALUE and ts < cutoff)):
                        removed += 1
                        if latest[k] == off:
                            tombs += 1
                        continue
                    if keep and keep[-1][0] + keep[-1][1] == pos:
                        keep[-1] = (keep[-1][0], keep[-1][1] + size)
                    else:
                        keep.append((pos, size))
            if not removed or (min_lag_ms > 0 and newest > now - min_lag_ms):
                continue
            sm = m if m is not None else seg.maps().store
            new_size = _write_cleaned(log, seg, sm, keep)
            _swap(log.path, seg.base_offset)
            new = SealedSegment(log.path, seg.base_offset, seg.next_offset, new_size,
                                log.config.index_interval_bytes, log._cache)
            log._cache.discard(seg)
            seg.unmap()
            j = log._sealed.index(seg)
            log._sealed = [*log._sealed[:j], new, *log._sealed[j + 1 :]]
            report.segments_cleaned += 1
            report.records_removed += removed
            report.tombstones_removed += tombs
            report.bytes_before += seg.size
            report.bytes_after += new_size
    return report


def _write_cleaned(log: Log, seg: SealedSegment, sm: Any, keep: list[tuple[int, int]]) -> int:
    """Step 1: the ``.cleaned`` store and index files of ``seg``; returns the store size."""
    sp, ip, tp = paths(log.path, seg.base_offset)
    base = seg.base_offset
    header = impl.header_encode(fmt.STORE_MAGIC, base, fmt.HEADER_COMPACTED)
    fd = vfs.open(sp + CLEANED_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fileutil.pwrite_all(fd, header, 0)
        size = fmt.FILE_HEADER_SIZE
        for pos, n in keep:
            fileutil.pwrite_all(fd, sm.mv[pos : pos + n], size)
            size += n
        vfs.fsync(fd)
        new_map = store_mod.StoreMap(fd, size)
    finally:
        vfs.close(fd)
    app = walker(base, log.config.index_interval_bytes, gaps=True)
    rc, _n = app.recover(new_map.buf, new_map.length)
    del new_map
    if rc != impl.OK:  # cannot happen: every frame was CRC-checked as it was read
        raise CorruptRecordError(sp + CLEANED_SUFFIX, app.position, app.next_offset, "compacted copy is bad")
    n = app.index_count
    _write_file(ip + CLEANED_SUFFIX, impl.header_encode(fmt.INDEX_MAGIC, base) + app.index_bytes(0, n))
    _write_file(tp + CLEANED_SUFFIX, impl.header_encode(fmt.TIMEINDEX_MAGIC, base) + app.timeindex_bytes(0, n))
    _step("cleaned-written")
    return size


def _write_file(path: str, data: bytes) -> None:
    fd = vfs.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fileutil.write_all(fd, data)
        vfs.fsync(fd)
    finally:
        vfs.close(fd)


def _swap(dirpath: str, base: int) -> None:
    """Steps 2 and 3 for segment ``base``."""
    sp, ip, tp = paths(dirpath, base)
    fileutil.fsync_dir(dirpath)
    vfs.rename(ip + CLEANED_SUFFIX, ip + SWAP_SUFFIX)
    _step("index-swap")
    vfs.rename(tp + CLEANED_SUFFIX, tp + SWAP_SUFFIX)
    _step("timeindex-swap")
    vfs.rename(sp + CLEANED_SUFFIX, sp + SWAP_SUFFIX)
    fileutil.fsync_dir(dirpath)
    _step("log-swap")
    vfs.replace(ip + SWAP_SUFFIX, ip)
    _step("index-replaced")
    vfs.replace(tp + SWAP_SUFFIX, tp)
    _step("timeindex-replaced")
    vfs.replace(sp + SWAP_SUFFIX, sp)
    fileutil.fsync_dir(dirpath)
    _step("log-replaced")
