"""On-disk format v1: file names, magic numbers, sizes and numpy dtypes.

The byte-by-byte specification is docs/format.md; this module is its code. Everything is
little-endian.

File header (32 bytes, every file)::

    0  8s  magic            b"PYLOGSTO" (.log), b"PYLOGIDX" (.index), b"PYLOGTIX" (.timeindex)
    8  u16 version          1
    10 u16 header_size      32
    12 u32 flags            bit 0: compacted (offsets may skip); other bits 0
    16 u64 base_offset
    24 u32 reserved         0
    28 u32 crc32c           of bytes 0..27

Record frame (36-byte header, then key, metadata, value)::

    0  u32 length           bytes after the crc field (28 + key + metadata + value)
    4  u32 crc32c           of those bytes
    8  u64 offset
    16 i64 timestamp_ms
    24 u32 attributes       bit 0 null key, bit 1 null metadata, bit 2 null value (tombstone),
                            bit 3 the write unit goes on after this frame
    28 u32 key_length
    32 u32 metadata_length

Offset index entry: ``u32 relative_offset, u32 position``. Time index entry: ``i64
timestamp_ms, u32 relative_offset, u32 position``.
"""
from __future__ import annotations

import numpy as np

FORMAT_VERSION = 1
FILE_HEADER_SIZE = 32
FRAME_HEADER_SIZE = 36
FRAME_PREFIX_SIZE = 8
INDEX_ENTRY_SIZE = 8
TIMEINDEX_ENTRY_SIZE = 16

STORE_MAGIC = b"PYLOGSTO"
INDEX_MAGIC = b"PYLOGIDX"
TIMEINDEX_MAGIC = b"PYLOGTIX"

ATTR_NULL_KEY = 1
ATTR_NULL_METADATA = 2
ATTR_NULL_VALUE = 4
#: the write unit (an ``append_batch``) goes on after this frame: set on every frame of a
#: batch but its last, so recovery can tell a whole unit from a torn one (docs/format.md)
ATTR_UNIT_CONTINUES = 8
ATTR_KNOWN = 15
NULL_LEN = 0xFFFFFFFF
#: store header flag: a compacted segment, whose offsets may skip
HEADER_COMPACTED = 1

#: Largest frame body a length field may claim (fits an i32).
MAX_FRAME_BODY = 0x7FFFFFFF
#: Positions in index entries are u32, so a store file stays below 4 GiB.
MAX_SEGMENT_BYTES = 0xFFFFFFFF
#: Timestamps must lie in [0, year 9999].
MAX_TIMESTAMP_MS = 253_402_300_799_999

STORE_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TEMP_SUFFIX = ".tmp"
DELETED_SUFFIX = ".deleted"
BROKEN_SUFFIX = ".broken"
#: segments found after a gap in the offsets at an unclean open: set aside, never deleted
GAP_SUFFIX = ".gap"

CONFIG_FILE = "config.json"
CHECKPOINT_FILE = "recovery-point"
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
#: every offset below the one it holds is durable (rewritten in place after fsyncs)
DURABLE_FILE = "durable-point"
#: an interrupted truncate's target offset (written before it changes a file)
TRUNCATE_FILE = "truncate-point"
#: the log start offset ``Log.delete_records`` set: offsets below it are never served (docs/format.md)
LOG_START_FILE = "log-start-offset"
#: what recovery cut or found at open, kept until the operator clears it (docs/format.md)
REPORT_FILE = "recovery-report.json"
#: the directory ``Log.truncate_at_damage`` saves what it cuts to: ``cut-at-<offset>``
CUT_DIR_PREFIX = "cut-at-"
LOCK_FILE = ".lock"

#: numpy views of index files (little-endian, packed: entries start at byte 32 of the file)
INDEX_DTYPE = np.dtype([("relative_offset", "<u4"), ("position", "<u4")])
TIMEINDEX_DTYPE = np.dtype([("timestamp", "<i8"), ("relative_offset", "<u4"), ("position", "<u4")])

#: mirrors the C ``plog_frame`` struct (what a scan reports)
FRAME_DTYPE = np.dtype(
    [
        ("position", "<u8"),
        ("offset", "<u8"),
        ("timestamp", "<i8"),
        ("frame_size", "<u4"),
        ("attributes", "<u4"),
        ("key_length", "<u4"),
        ("metadata_length", "<u4"),
        ("value_length", "<u4"),
        ("crc", "<u4"),
    ]
)


def segment_name(base_offset: int, suffix: str) -> str:
    """File name of a segment file: ``{base_offset:020d}{suffix}``."""
    return f"{base_offset:020d}{suffix}"


def parse_segment_name(name: str, suffix: str) -> int | None:
    """Base offset from a segment file name, or None if the name is not one."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)
