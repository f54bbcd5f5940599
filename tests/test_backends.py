"""Both backends: what each offers, and the core suite run again under the pure one."""
import os
import subprocess
import sys

import pytest

import pylog
from pylog import _pure

HERE = os.path.dirname(os.path.abspath(__file__))

#: The core test modules, run again with PYLOG_BACKEND=pure by test_core_suite_under_pure_backend.
CORE_MODULES = ["test_crc32c.py", "test_index.py", "test_frame.py", "test_log.py", "test_vectors.py",
                "test_stateful.py", "test_groupcommit.py"]


def test_backend_features():
    assert pylog.backend in ("native", "pure")
    assert {"crc32c", "frame", "scan", "index-search"} <= pylog.backend_features
    if pylog.backend == "native":
        from pylog import _native

        assert "zero-copy-c" in pylog.backend_features
        assert f"crc32c-{_native.crc_impl()}" in pylog.backend_features
    else:
        assert pylog.backend_features >= {"crc32c-portable"}


def test_both_backends_export_the_same_names():
    native = pytest.importorskip("pylog._native")
    names = {n for n in dir(_pure) if not n.startswith("_") and n.isidentifier()}
    names -= {"annotations", "struct", "np", "fmt", "NAME"}
    names -= {"TYPE_CHECKING", "Any", "Callable"}  # imported for the annotations
    missing = {n for n in names if not hasattr(native, n)}
    assert not missing, f"_native lacks {missing}"
    for cls in ("Appender", "Buffer"):
        pure_methods = {m for m in dir(getattr(_pure, cls)) if not m.startswith("_")}
        native_methods = {m for m in dir(getattr(native, cls)) if not m.startswith("_")}
        # representation differs by design: a memoryview (pure) vs a C pointer (native)
        assert pure_methods <= native_methods | {"base_offset", "index_interval", "mv"}, pure_methods - native_methods


def test_bad_backend_name_is_an_import_error():
    code = "import pylog"
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYLOG_BACKEND="fortran"),
                       capture_output=True, text=True)
    assert r.returncode != 0 and "PYLOG_BACKEND" in r.stderr


@pytest.mark.skipif(os.environ.get("PYLOG_BACKEND") == "pure", reason="already the pure backend")
def test_core_suite_under_pure_backend(tmp_path):
    env = dict(os.environ, PYLOG_BACKEND="pure", HYPOTHESIS_PROFILE="default")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           f"--basetemp={tmp_path}", *[os.path.join(HERE, m) for m in CORE_MODULES]]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.dirname(HERE), timeout=1800)
    tail = "\n".join(r.stdout.splitlines()[-15:])
    assert r.returncode == 0, f"core suite failed under PYLOG_BACKEND=pure:\n{tail}\n{r.stderr[-2000:]}"
    assert " passed" in tail
