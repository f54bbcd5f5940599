"""Build glue only: metadata lives in pyproject.toml.

Two extension modules, both from csrc/:

* ``pylog._cffi``: the C core through cffi (csrc/_build_pylog.py).
* ``pylog._speedups``: the CPython extension that makes Python objects fast (Records, reads,
  scans; csrc/speedups.h says how it is laid out). It compiles its own copy of the core's
  sources it calls, with hidden visibility. Optional: if it fails to build, pylog runs
  the Python code paths over the cffi module (the install does not fail).

The JVM connector's jar (``jvm/``, see pylog/spark/jvm_build.py) is built into
``pylog/spark/`` as package data when ``javac`` and pyspark's jars are found; without them
the install goes on without it (Spark then uses the Python source).

Wheels are abi3 (cp310-abi3: both modules use the limited API of Python 3.10) except on
free-threaded CPython, where the limited API does not exist.
"""
import os
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # wheel not installed: plain (non-abi3) wheel tags
    bdist_wheel = None

LIMITED_API = not sysconfig.get_config_var("Py_GIL_DISABLED")

#: the sources of pylog._speedups: its parts (one file per concern), then the C core files
#: they call. A new part adds its file here and its init hook in csrc/speedups.h.
SPEEDUPS_SOURCES = ["csrc/speedups.c", "csrc/speedups_read.c", "csrc/speedups_append.c",
                    "csrc/speedups_groupcommit.c", "csrc/crc32c.c", "csrc/store.c", "csrc/index.c"]

speedups = Extension(
    "pylog._speedups",
    sources=SPEEDUPS_SOURCES,
    include_dirs=["csrc"],
    define_macros=[("_FILE_OFFSET_BITS", "64")] + ([("Py_LIMITED_API", "0x030A0000")] if LIMITED_API else []),
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-fvisibility=hidden"]
    + os.environ.get("PYLOG_CFLAGS", "").split(),
    py_limited_api=LIMITED_API,
    optional=True,
)


class BuildExt(build_ext):
    """``PYLOG_NO_SPEEDUPS=1`` leaves pylog._speedups out (pylog then runs its Python code
    paths over the cffi module)."""

    def build_extensions(self):
        if os.environ.get("PYLOG_NO_SPEEDUPS") == "1":
            self.extensions = [e for e in self.extensions if e.name != "pylog._speedups"]
        super().build_extensions()


def build_jar():
    """The JVM connector's jar, rebuilt when its sources changed; never fails the install."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "pylog" / "spark" / "jvm_build.py"
    try:
        spec = importlib.util.spec_from_file_location("_pylog_jvm_build", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        jar = Path(__file__).resolve().parent / "pylog" / "spark" / mod.JAR_NAME
        if mod.stale(jar):
            mod.build(jar)
    except Exception as e:  # noqa: BLE001 (the jar is optional)
        print(f"pylog: the JVM connector was not built: {e}")


class BuildPy(build_py):
    """Builds the JVM connector's jar first (package data of pylog.spark)."""

    def run(self):
        build_jar()
        super().run()


cmdclass = {"build_ext": BuildExt, "build_py": BuildPy}
if bdist_wheel is not None and LIMITED_API:

    class AbiWheel(bdist_wheel):
        def get_tag(self):
            python, abi, plat = super().get_tag()
            if python.startswith("cp"):
                return "cp310", "abi3", plat
            return python, abi, plat

    cmdclass["bdist_wheel"] = AbiWheel

setup(cffi_modules=["csrc/_build_pylog.py:ffibuilder"], ext_modules=[speedups], cmdclass=cmdclass)
