"""A child interpreter for tests/test_append_twins.py: runs lists of log operations it reads
from stdin (one JSON object a line) under whichever backend its environment chose, with a
clock the operations set, and answers one line each ("ok" or the error).

The clock is patched before pylog is imported (``time.time_ns``, which pylog binds at
import) and handed to pylog._speedups (its Framer reads CLOCK_REALTIME itself), so every
record gets the timestamp its operation set, whichever code path framed it. fsyncs are
skipped: what is compared is the bytes written, not their durability.
"""
from __future__ import annotations

import json
import sys
import time
import traceback

CLOCK = [1_700_000_000_000]  # ms since the epoch
time.time_ns = lambda: CLOCK[0] * 1_000_000 + 999_999  # type: ignore[assignment]

import pylog  # noqa: E402
from pylog import vfs  # noqa: E402
from pylog._backend import speedups  # noqa: E402

if speedups is not None:
    speedups.set_test_clock(lambda: CLOCK[0])
vfs.fdatasync = vfs.fsync = lambda fd: None  # type: ignore[assignment]


def value(i: int, size: int) -> bytes:
    return (b"%d," % i * (size // 2 + 1))[:size]


def run(path: str, config: dict, ops: list) -> None:
    CLOCK[0] = 1_700_000_000_000
    log = pylog.Log(path, **config)
    i = 0
    try:
        for op in ops:
            kind = op[0]
            if kind == "a":  # the common record: append's fast path
                log.append(value(i, op[1]))
                i += 1
            elif kind == "k":  # with a key: the general path
                log.append(value(i, op[1]), key=value(-i, op[2]))
                i += 1
            elif kind == "b":
                log.append_batch([value(i + j, n) for j, n in enumerate(op[1])])
                i += len(op[1])
            elif kind == "t":
                CLOCK[0] += op[1]
            elif kind == "f":
                log.flush()
            elif kind == "w":
                log.write_out()
            elif kind == "r":
                log.roll()
            elif kind == "o":
                log.close()
                log = pylog.Log(path, **config)
    finally:
        log.close()


def main() -> None:
    print(json.dumps({"backend": pylog.backend, "speedups": speedups is not None}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            run(job["path"], job["config"], job["ops"])
            print("ok", flush=True)
        except Exception:
            print(json.dumps(traceback.format_exc()), flush=True)


if __name__ == "__main__":
    main()
