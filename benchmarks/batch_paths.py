"""append_batch's three paths against the plain file's batched write, alternating in one process.

    python -m benchmarks.batch_paths --size 1024 --records 100000 --repeat 9
    python -m benchmarks.batch_paths --size 100 --records 1000000 --repeat 7

Each repetition writes the same records, in batches of 1,000, four ways: the plain file
(``f.write(b"".join([pack(len(v)) + v for v in batch]))``, as in benchmarks.compare), pylog
with every batch gathered (pylog._speedups' ``Framer.frame_gather``: what big batches of
bytes values take with the extension; skipped without it), pylog with every batch framed in
place (``pylog.log.IN_PLACE_MIN_BYTES = 0``, the gathered write off) and pylog with every
batch copied into the write buffer (the threshold out of reach), through the same workload
code and values as benchmarks.compare, the order rotating from one repetition to the next.
``fsync="never"``; the time is the appends only, not the close. Prints each system's
median and its ratio to the file's (above 1: faster than the file).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile

import pylog.log as log_mod
from benchmarks.compare import FileSystem, PylogSystem, dataset_values


def pylog_write(path: str, batches: list[list[bytes]], threshold: int, gather: bool = False) -> float:
    """compare's pylog batch workload, with IN_PLACE_MIN_BYTES set to ``threshold`` and the
    gathered write on or off."""
    saved = log_mod.IN_PLACE_MIN_BYTES, log_mod._c_bytes_only
    log_mod.IN_PLACE_MIN_BYTES = threshold
    if not gather:
        log_mod._c_bytes_only = None
    try:
        return PylogSystem().write_batches(path, batches)
    finally:
        log_mod.IN_PLACE_MIN_BYTES, log_mod._c_bytes_only = saved


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes (default 1024)")
    ap.add_argument("--records", type=int, default=100_000, help="records per write (default 100,000)")
    ap.add_argument("--repeat", type=int, default=9, help="repetitions (default 9)")
    ap.add_argument("--tmpdir", default=None, help="where to write (default: the system temp dir)")
    args = ap.parse_args(argv)
    values = dataset_values(args.records, args.size)
    batches = [values[i : i + 1000] for i in range(0, args.records, 1000)]
    systems = {
        "file join+write": lambda d: FileSystem().write_batches(d, batches),
        "pylog gathered": lambda d: pylog_write(d, batches, 0, gather=True),
        "pylog in place": lambda d: pylog_write(d, batches, 0),
        "pylog copied": lambda d: pylog_write(d, batches, 1 << 62),
    }
    if log_mod._c_bytes_only is None:
        del systems["pylog gathered"]
    times: dict[str, list[float]] = {k: [] for k in systems}
    names = list(systems)
    for rep in range(args.repeat):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            run = systems[name]
            d = tempfile.mkdtemp(dir=args.tmpdir)
            try:
                times[name].append(run(d))
            finally:
                shutil.rmtree(d, ignore_errors=True)
    base = statistics.median(times["file join+write"])
    print(f"{args.records:,} records x {args.size} B in batches of 1,000, {args.repeat} repetitions (median)")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:16s} {m * 1e3:8.1f} ms  {args.records / m / 1e6:6.2f} M records/s  x file {base / m:5.2f}")


if __name__ == "__main__":
    main()
