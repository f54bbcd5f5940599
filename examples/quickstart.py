"""pylog in one page: append, read, fetch, scan, reopen, retention, then the `pylog` command.

    python examples/quickstart.py [DIR]

The smoke test of an install without Spark or Java: the library and the command alone, in a
few seconds. The data goes to DIR (kept), else to a temporary folder removed at the end.
"""
import os
import shutil
import subprocess
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
    command(os.path.join(root, "store"))
    print("ok: backend", pylog.backend, sorted(pylog.backend_features))


def command(root: str) -> None:
    """The `pylog` command on the data root ``root``: create, produce, consume, verify."""
    exe = shutil.which("pylog")
    pylog_cmd = [exe] if exe else [sys.executable, "-m", "pylog"]  # not on PATH: the same command

    def run(*args: str, stdin: str = "") -> str:
        return subprocess.run([*pylog_cmd, "--root", root, *args], input=stdin, capture_output=True,
                              text=True, check=True).stdout

    run("topic", "create", "orders", "--partitions", "3")
    run("produce", "orders", "--key-separator", ":", stdin="alice:1\nbob:2\ncarol:3\n")
    got = sorted(run("consume", "orders", "--from-beginning").split())
    assert got == ["1", "2", "3"], got
    run("verify")
    print("the pylog command: 3 records produced and consumed across 3 partitions, verify ok")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory(prefix="pylog-quickstart-") as tmp:
            main(tmp)
