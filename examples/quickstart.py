"""pylog in one page: append, read, fetch, scan, reopen, retention."""
import os
import sys
import tempfile

import pylog


def main(root: str) -> None:
    path = os.path.join(root, "orders")
    with pylog.Log(path, segment_bytes=1 << 20, fsync="interval") as log:
        first = log.append_batch([b"order-%06d" % i for i in range(100_000)])
        off = log.append(b"priority order", key=b"customer-7", metadata=b"source=web")
        print(f"appended {log.next_offset - first} records, last offset {off}")
        rec = log.read(off)
        print(f"read({off}) -> key={bytes(rec.key)!r} value={bytes(rec.value)!r}")
        batch = log.read_batch(50_000, max_bytes=4096)
        print(f"fetch from 50000 with a 4 KiB budget -> {len(batch)} records")
        total = sum(len(r.value) for r in log.scan())
        print(f"scanned {len(log)} records, {total} value bytes, {len(log.segments())} segments")
    with pylog.Log(path, retention_bytes=2 << 20) as log:  # reopen with a new retention
        removed = log.enforce_retention()
        print(f"retention removed {removed} segments; log now [{log.start_offset}, {log.next_offset})")
        assert log.verify() == [], "CRC scan found corruption"
    print("ok: backend", pylog.backend, sorted(pylog.backend_features))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="pylog-quickstart-"))
