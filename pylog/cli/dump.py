"""``pylog dump``: decode one partition file (segment, index, time index, offsets) like kafka-dump-log."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from pylog.cli._common import CONTEXT, CliError, _json_field


def _is_sealed(path: str, base: int) -> bool:
    """Whether the store file ``path`` has a later segment beside it (so it is sealed)."""
    from pylog import format as fmt

    d = os.path.dirname(os.path.abspath(path))
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return any((b := fmt.parse_segment_name(n, fmt.STORE_SUFFIX)) is not None and b > base for n in names)


def _show_bytes(b: Any, limit: int) -> str:
    if b is None:
        return "null"
    raw = bytes(b[:limit])
    s = raw.decode("utf-8", "backslashreplace")
    return json.dumps(s, ensure_ascii=False) + ("..." if len(b) > limit else "")


@click.command(context_settings=CONTEXT)
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--print-data", "-d", is_flag=True, help="Print keys, values and metadata too.")
@click.option("--max-bytes", type=click.IntRange(0), default=100, show_default=True,
              help="With --print-data: show at most this many bytes of each field.")
@click.option("--max-records", type=click.IntRange(1), default=None, help="Stop after this many records.")
@click.option("--format", "fmt_", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object per line (the file, then each record or index entry).")
def dump(path: str, print_data: bool, max_bytes: int, max_records: int | None, fmt_: str) -> None:
    """Decode a segment file (.log), an offset index (.index), a time index (.timeindex) or
    a committed-offset file (.offset), like kafka-dump-log. Exit 1 at a bad frame."""
    import mmap
    import struct

    from pylog import format as fmt
    from pylog._backend import impl

    try:
        f = open(path, "rb")
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if path.endswith(".offset"):
            from pylog.consumer import OFFSET_FILE_MAX, decode_commit

            found = decode_commit(f.read(OFFSET_FILE_MAX + 1))
            if found is None:
                raise CliError(f"{path}: not a valid committed-offset file")
            off, epoch, note = found
            if fmt_ == "json":
                click.echo(json.dumps({"file": path, "kind": "offset", "committed_offset": off,
                                       "leader_epoch": epoch, "metadata": note}))
            else:
                extra = (f"\nleader epoch: {epoch}" if epoch >= 0 else "") + (f"\nmetadata: {note!r}" if note else "")
                click.echo(f"Dumping {path}\ncommitted offset: {off}{extra}")
            return
        kinds = {fmt.STORE_SUFFIX: fmt.STORE_MAGIC, fmt.INDEX_SUFFIX: fmt.INDEX_MAGIC,
                 fmt.TIMEINDEX_SUFFIX: fmt.TIMEINDEX_MAGIC}
        suffix = next((s for s in kinds if path.endswith(s)), None)
        if suffix is None:
            raise CliError(f"{path}: unknown file kind (expected .log, .index, .timeindex or .offset)")
        head = f.read(fmt.FILE_HEADER_SIZE)
        rc, base, flags = impl.header_check(head, kinds[suffix])
        if rc != impl.OK:
            raise CliError(f"{path}: bad file header (not a pylog {suffix} file, or damaged)")
        version = struct.unpack_from("<H", head, 8)[0]
        out = sys.stdout.buffer
        js = fmt_ == "json"
        if js:
            out.write((json.dumps({"file": path, "kind": suffix.lstrip("."), "base_offset": base, "version": version,
                                   "flags": flags, "compacted": bool(flags & fmt.HEADER_COMPACTED),
                                   "size": size}) + "\n").encode())
        else:
            out.write(f"Dumping {path}\nbase offset: {base} version: {version} flags: {flags}"
                      f"{' (compacted)' if flags & fmt.HEADER_COMPACTED else ''} size: {size}\n".encode())
        if suffix != fmt.STORE_SUFFIX:
            esize = fmt.INDEX_ENTRY_SIZE if suffix == fmt.INDEX_SUFFIX else fmt.TIMEINDEX_ENTRY_SIZE
            body = f.read()
            if len(body) % esize:
                raise CliError(f"{path}: {len(body)} bytes of entries is not a multiple of {esize}")
            lines = []
            for i in range(len(body) // esize):
                if suffix == fmt.INDEX_SUFFIX:
                    rel, pos = struct.unpack_from("<II", body, i * esize)
                    lines.append(json.dumps({"offset": base + rel, "position": pos}) if js
                                 else f"offset: {base + rel} position: {pos}")
                else:
                    ts, rel, pos = struct.unpack_from("<qII", body, i * esize)
                    lines.append(json.dumps({"timestamp": ts, "offset": base + rel, "position": pos}) if js
                                 else f"timestamp: {ts} offset: {base + rel} position: {pos}")
                if max_records is not None and len(lines) >= max_records:
                    break
            if lines:
                out.write(("\n".join(lines) + "\n").encode())
            return
        if size <= fmt.FILE_HEADER_SIZE:
            return
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        buf = impl.Buffer(mm)
        mv = memoryview(mm)
        pos = fmt.FILE_HEADER_SIZE
        shown = 0
        gaps = bool(flags & fmt.HEADER_COMPACTED)
        expected = base
        try:
            while pos < size:
                rc, frames, end = impl.scan(buf, size, pos, expected, 4096, (1 << 64) - 1, gaps)
                lines = []
                for fr in frames.tolist():
                    fpos, off, ts, fsize, attrs, klen, mlen, vlen, crc = fr
                    if js:
                        obj: dict[str, Any] = {
                            "offset": off, "position": fpos, "timestamp": ts, "size": fsize, "crc": crc,
                            "keysize": -1 if attrs & 1 else klen, "metadatasize": -1 if attrs & 2 else mlen,
                            "valuesize": -1 if attrs & 4 else vlen}
                        if print_data:
                            p = fpos + fmt.FRAME_HEADER_SIZE
                            fields = (("key", attrs & 1, p, klen), ("metadata", attrs & 2, p + klen, mlen),
                                      ("value", attrs & 4, p + klen + mlen, vlen))
                            for name, absent, lo, n in fields:
                                _json_field(obj, name, None if absent else mv[lo : lo + min(n, max_bytes)])
                        lines.append(json.dumps(obj))
                        shown += 1
                        if max_records is not None and shown >= max_records:
                            break
                        continue
                    line = (f"offset: {off} position: {fpos} timestamp: {ts} size: {fsize} crc: {crc} "
                            f"isvalid: true keysize: {-1 if attrs & 1 else klen} "
                            f"metadatasize: {-1 if attrs & 2 else mlen} valuesize: {-1 if attrs & 4 else vlen}")
                    if print_data:
                        p = fpos + fmt.FRAME_HEADER_SIZE
                        key = None if attrs & 1 else mv[p : p + klen]
                        meta = None if attrs & 2 else mv[p + klen : p + klen + mlen]
                        val = None if attrs & 4 else mv[p + klen + mlen : p + klen + mlen + vlen]
                        line += (f" key: {_show_bytes(key, max_bytes)} metadata: {_show_bytes(meta, max_bytes)}"
                                 f" payload: {_show_bytes(val, max_bytes)}")
                        del key, meta, val
                    lines.append(line)
                    shown += 1
                    if max_records is not None and shown >= max_records:
                        break
                if lines:
                    out.write(("\n".join(lines) + "\n").encode())
                if max_records is not None and shown >= max_records:
                    return
                if len(frames):
                    expected = int(frames[-1]["offset"]) + 1
                    pos = int(end)
                if rc != impl.OK:
                    from pylog.fileutil import data_end
                    from pylog.segment import reason

                    if not _is_sealed(path, base) and data_end(f.fileno(), int(end), size) == int(end):
                        # nothing but zeros after the last frame of the active segment: space
                        # preallocated (preallocate=True) or a tail a crash left unwritten,
                        # which recovery cuts. (In a sealed segment they would be lost records.)
                        after = "the last record" if shown else "the file header"
                        out.write((json.dumps({"zeros": size - int(end), "after": after}) + "\n").encode() if js
                                  else f"zeros: {size - int(end)} bytes after {after} "
                                       f"(preallocated, or never written)\n".encode())
                        return
                    out.flush()
                    raise CliError(f"{path}: bad frame at position {int(end)} (expected offset {expected}): "
                                   f"{reason(rc)}")
                if not len(frames):
                    break
        finally:
            del mv
            del buf
            try:
                mm.close()
            except BufferError:
                pass
