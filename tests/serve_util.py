"""A `pylog serve` process for the broker tests: real process, loopback, a free port."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from conftest import ROOT, py_env


class BrokerProcess:
    """``pylog serve --port 0`` over ``root`` in a child process; ``bootstrap`` is host:port."""

    def __init__(self, root: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        cmd = [sys.executable, "-m", "pylog.cli", "--root", root, "serve", "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**py_env(), **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded: the child exits (EOF) if it cannot start
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"pylog serve did not start: {line!r} {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
        self.port = int(m.group(2))
        self.bootstrap = f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the broker and wait for it to exit; returns its exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def stderr(self) -> str:
        """What the broker wrote to stderr (after it stopped)."""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


def wait_for(pred, timeout: float = 20.0, step: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``pred`` until it returns something true or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)
