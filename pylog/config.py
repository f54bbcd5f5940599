"""LogConfig: the validated, persisted configuration of one partition."""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any, Literal

from pylog import format as fmt
from pylog.errors import ConfigError, InvalidTimestampError

FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES = ("always", "interval", "never")
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
#: ``LogConfig.timestamps``: how a log keeps the timestamps appends give (docs/format.md).
TIMESTAMP_MODES = ("monotonic", "as-given", "append-time")

#: Fields that may not change once a log holds data.
FIXED_ONCE_WRITTEN = ("initial_offset",)

#: A 32-bit Python (armhf: Raspberry Pi OS 32-bit) has 2-3 GiB of address space for the
#: interpreter, its libraries and every map, and pylog maps whole store files. There the
#: default segment is 64 MiB, no segment may pass 256 MiB, and the maps of the LRU plus the
#: active segment, ``(cached_segments + 1) * segment_bytes``, stay within 1.5 GiB
#: (docs/arm.md). 64-bit Pythons are unaffected.
IS_32BIT = sys.maxsize < 2**32
MAX_SEGMENT_BYTES_32BIT = 256 << 20
MAX_MAPPED_BYTES_32BIT = 3 << 29
DEFAULT_SEGMENT_BYTES = (64 << 20) if IS_32BIT else (1 << 30)


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """Configuration of one log (partition). Immutable; every field is validated.

    Parameters
    ----------
    segment_bytes
        Roll to a new segment when the active store file would pass this size.
        Between 4 KiB and 4 GiB - 1 (index positions are u32). Default 1 GiB; on 32-bit
        Python 64 MiB, at most 256 MiB (see ``IS_32BIT``).
    segment_ms
        Roll when the active segment's first and newest record timestamps are this far
        apart. None: never roll by time.
    index_interval_bytes
        Bytes of store between two sparse index entries; 0 indexes every record.
    index_max_bytes
        Size limit of one offset index file: a full index rolls the segment.
    max_record_bytes
        Largest record (key + metadata + value) accepted. Default 10 MiB.
    fsync
        ``"always"``: every append is durable before it returns (concurrent appenders share
        one fsync). ``"interval"``: fsync after ``flush_messages`` records or ``flush_ms``
        milliseconds. ``"never"``: the OS decides; ``flush()`` and ``close()`` force it.
    flush_messages, flush_ms
        The ``"interval"`` policy's limits (None: no limit of that kind).
    write_buffer_bytes
        User-space buffer of appends not yet written to the OS (``"interval"``/``"never"``).
    retention_ms, retention_bytes
        ``enforce_retention()`` deletes whole sealed segments older than this / while the
        log is larger than this. None: keep forever / any size.
    cached_segments
        How many sealed segments keep their files mapped (an LRU). None: all of them.
    initial_offset
        The first offset of an empty log. Cannot change once the log holds data.
    preallocate
        Reserve ``segment_bytes`` of disk for the active store file when it is created, and
        again when it is reopened (best effort: a full disk leaves the file to grow); it is
        trimmed to its records at roll and close. Each active segment then holds that much
        disk, but under ``fsync="always"`` an fdatasync need not record a new file size:
        1.35-1.6x the durable appends a second on the benchmark VM (ext4 on virtio;
        docs/benchmarks.md). Readers in
        other processes never map past the last whole record, so the trim cannot fault them.
    cleanup_policy
        ``"delete"`` (retention), ``"compact"`` (keep the latest record per key) or
        ``"compact,delete"`` (both, as Kafka's ``cleanup.policy=compact,delete``: compacted,
        and retention deletes old segments).
    delete_retention_ms
        Compacted logs: how long a tombstone (a record whose value is None) is kept after
        its timestamp before compaction may remove it (Kafka's ``delete.retention.ms``).
    timestamps
        What an append's explicit timestamp becomes. ``"monotonic"`` (the default):
        timestamps never decrease, a lower one raises InvalidTimestampError.
        ``"as-given"`` (Kafka's ``CreateTime``): kept as given, also below the newest one;
        the time index holds the running maximum, so ``offset_for_time`` still answers the
        first record at or after a time. ``"append-time"`` (Kafka's ``LogAppendTime``):
        timestamps never decrease, as with ``"monotonic"``, and they are the writer's clock
        at append: ``pylog serve`` stamps every record it appends with its own time and says
        so in Fetch answers (appends through the library should give no timestamp). A log
        that holds data cannot change to ``"monotonic"`` from another mode (its records may
        be out of order; ``offset_for_time`` bisects only a monotonic log's segments).
        A record appended without a timestamp gets the time now, raised to the newest
        timestamp when the clock is behind it, in every mode.
    timestamp_before_max_ms, timestamp_after_max_ms
        An explicit timestamp more than this before / after the clock at append raises
        InvalidTimestampError (Kafka's ``message.timestamp.before.max.ms`` /
        ``after.max.ms``). None (the default): no bound.
    """

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int | None = None
    index_interval_bytes: int = 4096
    index_max_bytes: int = 10 << 20
    max_record_bytes: int = 10 << 20
    fsync: FsyncPolicy = "interval"
    flush_messages: int | None = None
    flush_ms: int | None = 1000
    write_buffer_bytes: int = 256 << 10
    retention_ms: int | None = None
    retention_bytes: int | None = None
    cached_segments: int | None = 16
    initial_offset: int = 0
    preallocate: bool = False
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 86_400_000
    timestamps: str = "monotonic"
    timestamp_before_max_ms: int | None = None
    timestamp_after_max_ms: int | None = None

    def __post_init__(self) -> None:
        def integer(name: str, lo: int, hi: int, optional: bool = False) -> None:
            v = getattr(self, name)
            if v is None and optional:
                return
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name} must be an int{' or None' if optional else ''}, got {v!r}")
            if not lo <= v <= hi:
                raise ConfigError(f"{name}={v!r} is out of range [{lo}, {hi}]")

        integer("segment_bytes", 4096, fmt.MAX_SEGMENT_BYTES)
        integer("segment_ms", 1, 1 << 62, optional=True)
        integer("index_interval_bytes", 0, 1 << 31)
        integer("index_max_bytes", 4 * fmt.INDEX_ENTRY_SIZE, 1 << 31)
        integer("max_record_bytes", 0, fmt.MAX_FRAME_BODY - fmt.FRAME_HEADER_SIZE)
        integer("flush_messages", 1, 1 << 62, optional=True)
        integer("flush_ms", 1, 1 << 62, optional=True)
        integer("write_buffer_bytes", 0, 1 << 30)
        integer("retention_ms", 0, 1 << 62, optional=True)
        integer("retention_bytes", 0, 1 << 62, optional=True)
        integer("cached_segments", 0, 1 << 20, optional=True)
        if IS_32BIT:
            self._check_32bit()
        integer("initial_offset", 0, (1 << 63) - 1)
        integer("delete_retention_ms", 0, 1 << 62)
        integer("timestamp_before_max_ms", 0, 1 << 62, optional=True)
        integer("timestamp_after_max_ms", 0, 1 << 62, optional=True)
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync={self.fsync!r} is not one of {', '.join(FSYNC_POLICIES)}")
        if not isinstance(self.preallocate, bool):
            raise ConfigError(f"preallocate must be a bool, got {self.preallocate!r}")
        if self.timestamps not in TIMESTAMP_MODES:
            raise ConfigError(f"timestamps={self.timestamps!r} is not one of {', '.join(TIMESTAMP_MODES)}")
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise ConfigError(
                f"cleanup_policy={self.cleanup_policy!r} is not one of {', '.join(CLEANUP_POLICIES)}"
            )

    def _check_32bit(self) -> None:
        mib = 1 << 20
        if self.segment_bytes > MAX_SEGMENT_BYTES_32BIT:
            raise ConfigError(
                f"segment_bytes={self.segment_bytes} is over {MAX_SEGMENT_BYTES_32BIT // mib} MiB, "
                "the limit on 32-bit Python, where every segment is mapped into one small "
                "address space (docs/arm.md)")
        if self.cached_segments is not None:
            mapped = (self.cached_segments + 1) * self.segment_bytes
            if mapped > MAX_MAPPED_BYTES_32BIT:
                raise ConfigError(
                    f"(cached_segments + 1) * segment_bytes = {mapped // mib} MiB could be mapped at "
                    f"once; on 32-bit Python keep it within {MAX_MAPPED_BYTES_32BIT // mib} MiB "
                    "(fewer cached_segments or smaller segments; docs/arm.md)")

    def check_time_bounds(self, lo: int, hi: int, now: int | None = None) -> None:
        """InvalidTimestampError when explicit timestamps from ``lo`` to ``hi`` reach more
        than ``timestamp_before_max_ms`` before ``now`` (default: the clock) or
        ``timestamp_after_max_ms`` after it."""
        before, after = self.timestamp_before_max_ms, self.timestamp_after_max_ms
        if before is None and after is None:
            return
        if now is None:
            import time

            now = time.time_ns() // 1_000_000
        if before is not None and lo < now - before:
            raise InvalidTimestampError(
                f"timestamp {lo} is more than timestamp_before_max_ms={before} before the time now ({now})")
        if after is not None and hi > now + after:
            raise InvalidTimestampError(
                f"timestamp {hi} is more than timestamp_after_max_ms={after} after the time now ({now})")

    @property
    def index_max_entries(self) -> int:
        """How many entries one offset index holds before the segment rolls."""
        return self.index_max_bytes // fmt.INDEX_ENTRY_SIZE

    def replace(self, **changes: Any) -> LogConfig:
        """A copy with ``changes`` applied (validated). Unknown names raise ConfigError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown config option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what ``config.json`` stores)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogConfig:
        """Build from a mapping; unknown keys raise ConfigError."""
        return cls().replace(**dict(data))

    @classmethod
    def load(cls, path: str) -> LogConfig | None:
        """The config stored at ``path`` (a JSON file), or None if there is none."""
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {path} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} does not hold an object")
        data.pop("version", None)
        return cls.from_dict(data)

    def dump(self, path: str) -> None:
        """Write atomically (temp file, fsync, rename, fsync dir)."""
        from pylog import fileutil

        body = json.dumps({"version": 1, **self.to_dict()}, indent=1, sort_keys=True).encode()
        fileutil.atomic_write(path, body)


def merge(stored: LogConfig | None, passed: Mapping[str, Any], *, has_data: bool) -> LogConfig:
    """The config a reopened log runs with: stored values, replaced by those passed.

    A value that cannot change (``initial_offset`` of a log that holds data) raises
    ConfigError when it differs.
    """
    if stored is None:
        return LogConfig().replace(**passed)
    if has_data:
        for name in FIXED_ONCE_WRITTEN:
            if name in passed and passed[name] != getattr(stored, name):
                raise ConfigError(
                    f"{name} cannot change on a log that holds data "
                    f"(stored {getattr(stored, name)!r}, passed {passed[name]!r})"
                )
        if stored.timestamps != "monotonic" and passed.get("timestamps") == "monotonic":
            raise ConfigError(f"timestamps cannot change from {stored.timestamps!r} to 'monotonic' on a log "
                              "that holds data: its timestamps may be out of order")
    return stored.replace(**passed)

