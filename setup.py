"""Build glue only: metadata lives in pyproject.toml.

cffi compiles csrc/ into ``pylog._cffi``. Wheels are abi3 (cp310-abi3) except on
free-threaded CPython, where the limited API does not exist.
"""
import sysconfig

from setuptools import setup

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # wheel not installed: plain (non-abi3) wheel tags
    bdist_wheel = None

cmdclass = {}
if bdist_wheel is not None and not sysconfig.get_config_var("Py_GIL_DISABLED"):

    class AbiWheel(bdist_wheel):
        def get_tag(self):
            python, abi, plat = super().get_tag()
            if python.startswith("cp"):
                return "cp310", "abi3", plat
            return python, abi, plat

    cmdclass["bdist_wheel"] = AbiWheel

setup(cffi_modules=["csrc/_build_pylog.py:ffibuilder"], cmdclass=cmdclass)
