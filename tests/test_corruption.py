"""Corruption of sealed segments and of index files (DESIGN.md §5, crash-tests.md §6
scenarios 3 and 4).

* Bit flips in sealed store files, thousands of them: every flip is detected, by a read
  (``CorruptRecordError``, never wrong bytes) and by ``verify()`` (a non-empty list), and
  none crashes the process. This covers every byte of the file: the 32-byte file header,
  frame headers (length, CRC, offset, timestamp, attributes, key and metadata lengths) and
  payloads.
* Index damage in every way crash-tests.md §4 lists: the index is rebuilt from the store and
  offset and time lookups stay exact.
"""
from __future__ import annotations

import os
import random
import shutil
import struct

import pytest
from conftest import scaled, store_files, store_frames

import pylog
from pylog import format as fmt

HDR = fmt.FILE_HEADER_SIZE


def build(path: str, n: int = 400, seed: int = 3, **kw) -> tuple[list[bytes], list[int]]:
    r = random.Random(seed)
    values = [r.randbytes(r.randint(0, 60)) for _ in range(n)]
    stamps = sorted(r.randrange(1_000, 1_000_000) for _ in range(n))
    opts = dict(fsync="never", segment_bytes=4096, index_interval_bytes=128)
    opts.update(kw)
    with pylog.Log(path, **opts) as log:
        for i in range(0, n, 7):
            log.append_batch(values[i : i + 7], timestamps=stamps[i : i + 7],
                             keys=[b"k%d" % j if j % 3 else None for j in range(i, min(n, i + 7))])
    return values, stamps


FIELDS = [(0, "length"), (4, "crc"), (8, "offset"), (16, "timestamp"), (24, "attributes"),
          (28, "key_length"), (32, "metadata_length")]


def field_of(frames, pos: int) -> str:
    if pos < HDR:
        return "file-header"
    for fpos, size, _off in frames:
        if fpos <= pos < fpos + size:
            rel = pos - fpos
            if rel >= fmt.FRAME_HEADER_SIZE:
                return "payload"
            return [name for start, name in FIELDS if start <= rel][-1]
    return "past-end"


def test_bit_flips_in_sealed_segments_are_always_detected(tmp_path):
    path = str(tmp_path / "log")
    values, stamps = build(path)
    stores = store_files(path)
    sealed = stores[:-1]
    assert len(sealed) >= 3
    pristine = {s: open(s, "rb").read() for s in sealed}
    layout = {s: store_frames(s) for s in sealed}
    # A reader maps the sealed stores; flips written to the files show through the maps,
    # so one open log serves every trial (and nothing here can change what it caches).
    log = pylog.Log(path, readonly=True)
    trials = scaled(3000, 30000)
    rng = random.Random(99)
    by_field: dict[str, int] = {}
    undetected: list[str] = []
    try:
        for t in range(trials):
            s = rng.choice(sealed)
            data = pristine[s]
            pos = rng.randrange(len(data))
            bit = 1 << rng.randrange(8)
            field = field_of(layout[s], pos)
            by_field[field] = by_field.get(field, 0) + 1
            fd = os.open(s, os.O_WRONLY)
            try:
                os.pwrite(fd, bytes([data[pos] ^ bit]), pos)
                frames = layout[s]
                first, last = frames[0][2], frames[-1][2]
                hit = [f for f in frames if f[0] <= pos < f[0] + f[1]]
                raised = 0
                for off in range(first, last + 1):
                    try:
                        rec = log.read(off)
                    except pylog.CorruptRecordError as e:
                        raised += 1
                        assert e.path == s and e.position >= HDR
                        continue
                    # whatever a read returns is exactly what was written
                    assert rec.offset == off and bytes(rec.value) == values[off], (t, field, off)
                    assert rec.timestamp == stamps[off]
                    if hit and hit[0][2] == off:
                        undetected.append(f"trial {t}: read of offset {off} missed a flip in its {field}")
                # a fetch returns whole records and stops before the bad frame
                try:
                    for rec in log.read_batch(first, max_bytes=1 << 20, max_records=last - first + 1):
                        assert bytes(rec.value) == values[rec.offset]
                except pylog.CorruptRecordError:
                    raised += 1
                bad = log.verify()
                if not bad:
                    undetected.append(f"trial {t}: verify() missed a flip in the {field} at {pos} of {s}")
                else:
                    assert all(isinstance(b, pylog.CorruptRecordError) for b in bad)
                    assert {b.path for b in bad} == {s}
                if field != "file-header" and not raised:
                    undetected.append(f"trial {t}: no read noticed a flip in the {field}")
            finally:
                os.pwrite(fd, data[pos : pos + 1], pos)
                os.close(fd)
        assert log.verify() == []
    finally:
        log.close()
    print(f"bit flips: {trials} trials by field {dict(sorted(by_field.items()))}")
    assert set(by_field) >= {"file-header", "length", "crc", "offset", "timestamp", "payload"}
    assert not undetected, "\n".join(undetected[:20])


def test_flip_in_sealed_segment_reported_at_unclean_open(tmp_path):
    """Recovery reports (never truncates) a bad frame in a sealed segment past the recovery
    point, and the rest of the log stays readable."""
    path = str(tmp_path / "log")
    values, _ = build(path)
    stores = store_files(path)
    victim = stores[-2]
    frames = store_frames(victim)
    pos, size, off = frames[len(frames) // 2]
    with open(os.path.join(path, fmt.CHECKPOINT_FILE), "wb") as f:
        f.write(b"")  # a damaged recovery point: full recovery
    os.unlink(os.path.join(path, fmt.CLEAN_SHUTDOWN_FILE))
    with open(victim, "r+b") as f:
        f.seek(pos + size - 1)
        b = f.read(1)[0]
        f.seek(pos + size - 1)
        f.write(bytes([b ^ 1]))
    size_before = os.path.getsize(victim)
    with pylog.Log(path) as log:
        assert [(e.path, e.offset) for e in log.recovery_report] == [(victim, off)]
        assert os.path.getsize(victim) == size_before  # never truncated
        assert log.next_offset == len(values)
        with pytest.raises(pylog.CorruptRecordError) as e:
            log.read(off)
        assert (e.value.path, e.value.position, e.value.offset) == (victim, pos, off)
        assert bytes(log.read(off - 1).value) == values[off - 1]
        assert bytes(log.read(frames[-1][2] + 1).value) == values[frames[-1][2] + 1]
        assert [x.offset for x in log.verify()] == [off]


# -- index damage -------------------------------------------------------------------------------
def _zero_fill(p: str) -> None:
    n = os.path.getsize(p)
    with open(p, "wb") as f:
        f.write(bytes(n))


def _spaces(p: str) -> None:
    n = os.path.getsize(p)
    with open(p, "wb") as f:
        f.write(b" " * n)


def _odd_length(p: str) -> None:
    with open(p, "ab") as f:
        f.write(b"\x01\x02\x03")


def _entries_only_truncated(p: str) -> None:  # short: cut inside an entry
    os.truncate(p, os.path.getsize(p) - 5)


def _header_only(p: str) -> None:  # short: no entries at all (a crash before they were written)
    os.truncate(p, HDR)


def _last_below_base(p: str) -> None:
    """The last entry's offset lies below the base offset: its relative offset, read as the
    i32 it would be, is -1 (as u32 it lies far past the segment's end)."""
    with open(p, "r+b") as f:
        data = bytearray(f.read())
        if p.endswith(fmt.INDEX_SUFFIX):
            struct.pack_into("<I", data, len(data) - fmt.INDEX_ENTRY_SIZE, 0xFFFFFFFF)
        else:
            struct.pack_into("<I", data, len(data) - fmt.TIMEINDEX_ENTRY_SIZE + 8, 0xFFFFFFFF)
        f.seek(0)
        f.write(data)


def _last_past_segment(p: str) -> None:
    """The last entry names an offset past the segment's last record (still increasing)."""
    with open(p, "r+b") as f:
        data = bytearray(f.read())
        at = len(data) - (fmt.INDEX_ENTRY_SIZE if p.endswith(fmt.INDEX_SUFFIX) else fmt.TIMEINDEX_ENTRY_SIZE - 8)
        rel = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<I", data, at, rel + 500)
        f.seek(0)
        f.write(data)


def _wrong_base_header(p: str) -> None:
    with open(p, "r+b") as f:
        data = bytearray(f.read())
        struct.pack_into("<Q", data, 16, struct.unpack_from("<Q", data, 16)[0] + 1)
        f.seek(0)
        f.write(data)


def _full_size_zero(p: str) -> None:
    """A preallocated index left full-size by a crash before trim (proglog, KAFKA-19200)."""
    with open(p, "ab") as f:
        f.write(bytes(1 << 20))


def _delete(p: str) -> None:
    os.unlink(p)


def _garbage(p: str) -> None:
    n = os.path.getsize(p)
    with open(p, "wb") as f:
        f.write(random.Random(n).randbytes(n))


def _swap_entries(p: str) -> None:
    """Entries out of order (not strictly increasing)."""
    esize = fmt.INDEX_ENTRY_SIZE if p.endswith(fmt.INDEX_SUFFIX) else fmt.TIMEINDEX_ENTRY_SIZE
    with open(p, "r+b") as f:
        data = bytearray(f.read())
        if len(data) >= HDR + 2 * esize:
            a, b = HDR, HDR + esize
            data[a:a + esize], data[b:b + esize] = data[b:b + esize], data[a:a + esize]
        f.seek(0)
        f.write(data)


def _points_past_store(p: str) -> None:
    with open(p, "r+b") as f:
        data = bytearray(f.read())
        poff = 4 if p.endswith(fmt.INDEX_SUFFIX) else 12
        esize = fmt.INDEX_ENTRY_SIZE if p.endswith(fmt.INDEX_SUFFIX) else fmt.TIMEINDEX_ENTRY_SIZE
        struct.pack_into("<I", data, len(data) - esize + poff, 0x7FFFFFF0)
        f.seek(0)
        f.write(data)


DAMAGE = {f.__name__.lstrip("_"): f for f in (
    _delete, _zero_fill, _spaces, _odd_length, _entries_only_truncated, _header_only, _last_below_base,
    _last_past_segment,
    _wrong_base_header, _full_size_zero, _garbage, _swap_entries, _points_past_store)}


def _check_lookups(log: pylog.Log, values: list[bytes], stamps: list[int]) -> None:
    assert log.next_offset == len(values)
    for off in range(len(values)):
        rec = log.read(off)
        assert bytes(rec.value) == values[off] and rec.timestamp == stamps[off]
    assert [bytes(r.value) for r in log.scan()] == values
    probes = sorted({stamps[0] - 1, stamps[-1], stamps[-1] + 1, *stamps[::13],
                     *(s + 1 for s in stamps[::17])})
    for ts in probes:
        want = next((i for i, s in enumerate(stamps) if s >= ts), None)
        assert log.offset_for_time(ts) == want, ts


@pytest.mark.parametrize("which", ["sealed", "active"])
@pytest.mark.parametrize("kind", [".index", ".timeindex", "both"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_index_damage_is_rebuilt(tmp_path, damage, kind, which):
    path = str(tmp_path / "log")
    values, stamps = build(path, n=300)
    stores = store_files(path)
    victim = stores[1] if which == "sealed" else stores[-1]
    base = fmt.parse_segment_name(os.path.basename(victim), fmt.STORE_SUFFIX)
    targets = [fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX] if kind == "both" else [kind]
    pristine = {}
    for suffix in (fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX):
        with open(os.path.join(path, fmt.segment_name(base, suffix)), "rb") as f:
            pristine[suffix] = f.read()
    for suffix in targets:
        DAMAGE[damage](os.path.join(path, fmt.segment_name(base, suffix)))
    for clean in (True, False):
        d = str(tmp_path / f"copy-{clean}")
        shutil.copytree(path, d)
        if not clean:
            os.unlink(os.path.join(d, fmt.CLEAN_SHUTDOWN_FILE))
        with pylog.Log(d) as log:
            _check_lookups(log, values, stamps)
            assert log.verify() == []
        # rebuilt: the index files are whole again, byte for byte what pylog wrote
        for suffix in (fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX):
            with open(os.path.join(d, fmt.segment_name(base, suffix)), "rb") as f:
                assert f.read() == pristine[suffix], (suffix, clean)
        with pylog.Log(d, readonly=True) as log:
            _check_lookups(log, values, stamps)


def test_orphan_index_files_are_removed(tmp_path):
    path = str(tmp_path / "log")
    values, stamps = build(path, n=200)
    stores = store_files(path)
    # an orphan: the index files of a segment whose store is gone (a crash mid-delete)
    gone = stores[-1]
    base = fmt.parse_segment_name(os.path.basename(gone), fmt.STORE_SUFFIX)
    orphan_base = base + 1_000_000
    for suffix in (fmt.INDEX_SUFFIX, fmt.TIMEINDEX_SUFFIX):
        shutil.copy(os.path.join(path, fmt.segment_name(base, suffix)),
                    os.path.join(path, fmt.segment_name(orphan_base, suffix)))
    with pylog.Log(path) as log:
        names = os.listdir(path)
        assert fmt.segment_name(orphan_base, fmt.INDEX_SUFFIX) not in names
        assert fmt.segment_name(orphan_base, fmt.TIMEINDEX_SUFFIX) not in names
        _check_lookups(log, values, stamps)
