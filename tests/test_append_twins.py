"""The append path under both backends writes the same bytes (issue 16).

With pylog._speedups the native backend frames the common record at once in C
(``Framer.append``), where the pure backend queues it and frames the queue per write buffer;
appends with keys, batches, flushes, write-outs, rolls, reopens and a clock that stands
still or goes back mix with them. Two child interpreters (tests/append_twin.py), one per
backend, run the same operations with the same clock; every file they leave (stores,
indexes, time indexes, config, recovery point) must be byte-identical. The pure backend is
the oracle.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import py_env
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog import format as fmt

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_FILES = {fmt.CLEAN_SHUTDOWN_FILE, fmt.LOCK_FILE}  # a file mtime; the lock


class Twin:
    def __init__(self, backend: str) -> None:
        env = dict(py_env(), PYLOG_BACKEND=backend)
        env.pop("PYLOG_SPEEDUPS", None)
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "append_twin.py")], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.p.stdout is not None
        self.info = json.loads(self.p.stdout.readline())

    def run(self, path: str, config: dict, ops: list) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps({"path": path, "config": config, "ops": ops}) + "\n")
        self.p.stdin.flush()
        answer = self.p.stdout.readline().strip()
        assert answer == "ok", f"{self.info}: {json.loads(answer) if answer else 'no answer'}"

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(30)


@pytest.fixture(scope="module")
def twins():
    pure, native = Twin("pure"), Twin("native")
    try:
        if not native.info["speedups"]:
            pytest.skip("pylog._speedups is not built: the native backend has no C append path to compare")
        assert pure.info == {"backend": "pure", "speedups": False}
        yield pure, native
    finally:
        pure.close()
        native.close()


def files(path: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(path)):
        if name not in SKIP_FILES:
            with open(os.path.join(path, name), "rb") as f:
                out[name] = f.read()
    return out


OPS = st.one_of(
    st.tuples(st.just("a"), st.integers(0, 300)),
    st.tuples(st.just("a"), st.integers(0, 300)),
    st.tuples(st.just("k"), st.integers(0, 100), st.integers(0, 20)),
    st.tuples(st.just("b"), st.lists(st.integers(0, 200), min_size=1, max_size=30)),
    st.tuples(st.just("t"), st.integers(-5, 20)),
    st.tuples(st.sampled_from(["f", "w", "r", "o"])),
)
CONFIGS = st.fixed_dictionaries({
    "fsync": st.sampled_from(["never", "interval", "always"]),
    "segment_bytes": st.sampled_from([4096, 6000, 65536]),
    "write_buffer_bytes": st.sampled_from([0, 100, 1000, 65536]),
    "index_interval_bytes": st.sampled_from([0, 300, 4096]),
    "flush_messages": st.sampled_from([None, 3]),
    "flush_ms": st.just(None),
})


@settings(max_examples=40)
@given(config=CONFIGS, ops=st.lists(OPS, min_size=1, max_size=60))
def test_both_backends_write_the_same_bytes(twins, tmp_path_factory, config, ops):
    pure, native = twins
    base = tmp_path_factory.mktemp("twins")
    a, b = str(base / "pure"), str(base / "native")
    pure.run(a, config, ops)
    native.run(b, config, ops)
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between the backends ({len(fa[name])} / {len(fb[name])} bytes)"
