"""cffi builder for pylog's C core (out-of-line API mode).

setup.py names this file in ``cffi_modules``; it is not shipped in the wheel. The cdef is
the block between the CDEF markers of ``pylog.h``, read verbatim: the header stays the one
place the C API is written down, and the compiler checks every .c file against it.

Environment variables (read here, never argv flags):

* ``PYLOG_CFLAGS``: extra compiler flags (e.g. ``-fsanitize=undefined`` for a UBSan build).
"""
import os
import pathlib
import sys
import sysconfig

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
SOURCES = ["crc32c.c", "store.c", "index.c", "hash.c", "kafka.c"]


def read_cdef() -> str:
    text = (HERE / "pylog.h").read_text()
    start = text.index("/* CDEF BEGIN */") + len("/* CDEF BEGIN */")
    end = text.index("/* CDEF END */")
    return text[start:end]


# The limited API (abi3) is not available for free-threaded CPython builds (cffi 2.0 notes).
LIMITED_API = not sysconfig.get_config_var("Py_GIL_DISABLED")

ffibuilder = FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "pylog._cffi",
    '#include "pylog.h"\n',
    sources=[os.path.relpath(HERE / s) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    define_macros=[("_FILE_OFFSET_BITS", "64")],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"]
    + os.environ.get("PYLOG_CFLAGS", "").split(),
    py_limited_api=LIMITED_API,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True, tmpdir=sys.argv[1] if len(sys.argv) > 1 else ".")
