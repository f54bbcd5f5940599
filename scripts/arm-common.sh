# Shared helpers for scripts/test-arm.sh and scripts/build-arm-wheels.sh (sourced, not run).
#
# Everything lives in one work dir ($ARM_WORK: $CI_WORK/arm, else .ci-work/arm in the repo):
#   sysroot-<arch>/    Debian's own CPython 3.11 for the target, unpacked with a private apt
#                      (dpkg -x; no dpkg --add-architecture, nothing installed system-wide)
#   apt-<arch>/        that private apt's state, cache and sources
#   sysroot-<arch>/usr/local/lib/python3.11/dist-packages
#                      test dependencies (pip --target --platform, no emulation)
#   tree-<arch>/       a copy of the working tree with the cross-built extension in it
# Sysroots and site dirs are cached between runs (a stamp file records what they hold).
# shellcheck shell=bash

ARM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARM_WORK=${ARM_WORK:-${CI_WORK:+$CI_WORK/arm}}
ARM_WORK=${ARM_WORK:-$ARM_ROOT/.ci-work/arm}
mkdir -p "$ARM_WORK"
ARM_WORK=$(cd "$ARM_WORK" && pwd)
export PIP_DISABLE_PIP_VERSION_CHECK=1

# cffi that generates the aarch64 extension's C and backs it at run time (keep them equal).
# armhf uses Debian's python3-cffi (PyPI has no armv7l cffi wheel) and generates with it.
ARM_CFFI_PIN=${ARM_CFFI_PIN:-2.1.1}
ARM_PYVER=3.11

# What each sysroot holds (Debian packages) and what PyPI adds for the tests. aarch64 gets
# cffi, numpy, psutil and crc32c as PyPI wheels; armhf gets them from Debian (PyPI has no
# armv7l wheels of them: on a 32-bit Pi they come from apt or piwheels too).
SYSROOT_PKGS_aarch64="python3 libpython3.11-dev libstdc++6"
SYSROOT_PKGS_armhf="python3 libpython3.11-dev python3-distutils python3-cffi python3-numpy python3-psutil python3-crc32c"
PURE_TEST_DEPS="pytest hypothesis click rich"
SITE_PKGS_aarch64="cffi==$ARM_CFFI_PIN numpy psutil crc32c $PURE_TEST_DEPS"
SITE_PKGS_armhf="$PURE_TEST_DEPS"

log() { echo "[arm $(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "arm: error: $*" >&2; exit 1; }

# Per-arch facts: Debian arch, qemu binary, cross gcc, GNU triplet, pip platform tag.
arch_vars() {
  case $1 in
    aarch64) DEB_ARCH=arm64 QEMU=qemu-aarch64 CROSS_CC=aarch64-linux-gnu-gcc
             TRIPLET=aarch64-linux-gnu PIP_PLAT="manylinux2014_aarch64 manylinux_2_28_aarch64 manylinux_2_34_aarch64" ;;
    armhf)   DEB_ARCH=armhf QEMU=qemu-arm CROSS_CC=arm-linux-gnueabihf-gcc
             TRIPLET=arm-linux-gnueabihf PIP_PLAT=linux_armv7l ;;
    *) die "unknown arch $1" ;;
  esac
  SYSROOT=$ARM_WORK/sysroot-$1
  # Test dependencies go where the target's own site.py looks (Debian's /usr/local
  # dist-packages), so no PYTHONPATH is needed and tests that start children with a
  # trimmed environment still find them.
  SITE=$SYSROOT/usr/local/lib/python$ARM_PYVER/dist-packages
  PYQ=$SYSROOT/usr/bin/python3-qemu
}

retry() {  # retry N CMD...: run CMD up to N times
  local n=$1 i; shift
  for ((i = 1; i <= n; i++)); do "$@" && return 0; log "attempt $i/$n failed: ${*:1:3} ..."; sleep $((i * 2)); done
  return 1
}

apt_quiet() {  # apt_quiet LOGFILE CMD...: run, keep the output in LOGFILE, show its errors on failure
  local out=$1; shift
  "$@" >"$out" 2>&1 && return 0
  grep -E '^(E|W):' "$out" | head -3 >&2
  return 1
}

# Host packages: Debian's cross compilers and qemu-user. Installs only what is missing.
# `apt-get update` may fail for an index nobody needs (a mirror mid-sync): carry on.
ensure_host_tools() {
  local need=()
  command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
  command -v arm-linux-gnueabihf-gcc >/dev/null || need+=(gcc-arm-linux-gnueabihf libc6-dev-armhf-cross)
  { command -v qemu-aarch64 >/dev/null && command -v qemu-arm >/dev/null; } || need+=(qemu-user)
  command -v gcc >/dev/null || need+=(gcc libc6-dev)
  [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing host packages: ${need[*]}"
  [ "$(id -u)" = 0 ] || die "need root to apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  retry 3 apt-get update -qq || log "apt-get update failed; trying the install with the indexes we have"
  retry 3 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    die "apt-get install ${need[*]} failed"
}

# The host's Debian sources (same mirror, same suites), for the private apt. Written as a
# deb822 file without any Architectures: restriction; non-Debian repositories are dropped.
write_private_sources() {  # write_private_sources OUT_DIR
  python3 - "$1" <<'PY'
import glob, os, re, sys
out = sys.argv[1]
codename = ""
try:
    for line in open("/etc/os-release"):
        if line.startswith("VERSION_CODENAME="):
            codename = line.split("=", 1)[1].strip().strip('"')
except OSError:
    pass
codename = os.environ.get("ARM_DEBIAN_CODENAME", codename or "bookworm")
stanzas = []
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for block in re.split(r"\n\s*\n", open(path).read()):
        f = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            k, v = line.split(":", 1)
            f[k.strip()] = v.strip()
        if "deb" not in f.get("Types", "").split() or f.get("Enabled", "yes") == "no":
            continue
        suites = [s for s in f.get("Suites", "").split() if s.split("-")[0] == codename]
        if suites and "debian-archive-keyring" in f.get("Signed-By", "debian-archive-keyring"):
            stanzas.append((f["URIs"], suites, f.get("Components", "main")))
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        w = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(w) >= 4 and w[0] == "deb" and w[2].split("-")[0] == codename and "debian" in w[1]:
            stanzas.append((w[1], [w[2]], " ".join(w[3:])))
if os.environ.get("ARM_DEBIAN_MIRROR"):
    m = os.environ["ARM_DEBIAN_MIRROR"].rstrip("/")
    stanzas = [(m, [codename, codename + "-updates"], "main")]
if not stanzas:
    sys.exit("no Debian apt source found in /etc/apt; set ARM_DEBIAN_MIRROR to a Debian mirror URL")
with open(os.path.join(out, "debian.sources"), "w") as fh:
    for uri, suites, comps in stanzas:
        fh.write(f"Types: deb\nURIs: {uri}\nSuites: {' '.join(suites)}\nComponents: {comps}\n"
                 "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n")
PY
}

# A target root filesystem holding Debian's CPython: a private apt (own state, cache and
# sources; APT::Architecture=<target>) downloads the dependency closure of the packages,
# and dpkg -x unpacks each .deb. No maintainer script runs, so the stdlib has no .pyc yet:
# compileall adds them once (under emulation). Cached: a stamp lists what the sysroot holds.
ensure_sysroot() {  # ensure_sysroot ARCH PKG...
  local arch=$1; shift
  arch_vars "$arch"
  local want="$DEB_ARCH $* v2"
  if [ -f "$SYSROOT/.pylog-sysroot" ] && [ "$(cat "$SYSROOT/.pylog-sysroot")" = "$want" ]; then
    log "sysroot $arch: cached"
  else
    local A=$ARM_WORK/apt-$arch t0=$SECONDS
    rm -rf "$SYSROOT" "$A"
    mkdir -p "$A/state/lists/partial" "$A/cache/archives/partial" "$A/sources.list.d" "$A/prefs.d" "$SYSROOT"
    : >"$A/status"; : >"$A/sources.list"
    write_private_sources "$A/sources.list.d" || die "cannot find the Debian mirror"
    local opts=(-o "Dir::State=$A/state" -o "Dir::State::status=$A/status" -o "Dir::Cache=$A/cache"
      -o "Dir::Etc::SourceList=$A/sources.list" -o "Dir::Etc::SourceParts=$A/sources.list.d"
      -o "Dir::Etc::PreferencesParts=$A/prefs.d" -o "APT::Architecture=$DEB_ARCH"
      -o "APT::Architectures::=$DEB_ARCH" -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1"
      -o "Acquire::Languages=none" -o "Acquire::Retries=3")
    # An index that fails (e.g. a security index mid-sync) must not stop us if main is there.
    retry 3 apt_quiet "$A/update.log" apt-get -qq "${opts[@]}" update ||
      compgen -G "$A/state/lists/*_main_binary-${DEB_ARCH}_Packages*" >/dev/null ||
      die "private apt-get update for $DEB_ARCH failed"
    retry 3 apt-get -qq -y "${opts[@]}" --no-install-recommends --download-only install "$@" >/dev/null ||
      die "downloading $* for $DEB_ARCH failed"
    local deb
    for deb in "$A"/cache/archives/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
    rm -f "$A"/cache/archives/*.deb
    # update-alternatives links that postinst scripts would have made (numpy's BLAS/LAPACK).
    local alt
    for alt in "$SYSROOT"/usr/lib/"$TRIPLET"/{blas,lapack}/lib*.so.3; do
      [ -e "$alt" ] && ln -sfn "${alt#"$SYSROOT/usr/lib/$TRIPLET/"}" "$SYSROOT/usr/lib/$TRIPLET/$(basename "$alt")"
    done
    [ -x "$SYSROOT/usr/bin/python$ARM_PYVER" ] || die "no python$ARM_PYVER in the $arch sysroot"
    echo "$want" >"$SYSROOT/.pylog-sysroot"
    log "sysroot $arch: $(find "$SYSROOT" -type f | wc -l) files in $((SECONDS - t0)) s"
  fi
  # The launcher: sys.executable becomes this script, so subprocess([sys.executable, ...]),
  # multiprocessing and pip re-exec work without binfmt_misc. QEMU_CPU (read by qemu
  # itself) is inherited by children, so they run on the same CPU model.
  cat >"$PYQ" <<EOF
#!/bin/sh
exec $QEMU -L "$SYSROOT" -0 "$PYQ" "$SYSROOT/usr/bin/python$ARM_PYVER" "\$@"
EOF
  chmod +x "$PYQ"
  if [ ! -f "$SYSROOT/.pylog-compiled" ]; then
    local t0=$SECONDS
    # Bytecode depends only on the minor version: when the host python is also 3.11, compile
    # natively (seconds) instead of under emulation (about 40 s per sysroot).
    local pyc=("$PYQ")
    [ "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$ARM_PYVER" ] && pyc=(python3)
    env -u PYTHONDONTWRITEBYTECODE "${pyc[@]}" -m compileall -q -j0 \
      "$SYSROOT/usr/lib/python$ARM_PYVER" "$SYSROOT/usr/lib/python3/dist-packages" >/dev/null 2>&1 || true
    touch "$SYSROOT/.pylog-compiled"
    log "sysroot $arch: compileall in $((SECONDS - t0)) s"
  fi
}

# Pip packages for the target into DIR, chosen by platform tag, without emulation.
# Cached by the exact argument list.
ensure_site() {  # ensure_site ARCH DIR PKG...
  local arch=$1 dir=$2; shift 2
  arch_vars "$arch"
  local want="$PIP_PLAT $* v1"
  if [ -f "$dir/.pylog-site" ] && [ "$(cat "$dir/.pylog-site")" = "$want" ]; then
    log "site $(basename "$dir"): cached"; return 0
  fi
  rm -rf "$dir"
  local t0=$SECONDS
  local plats=() p
  for p in $PIP_PLAT; do plats+=(--platform "$p"); done
  retry 3 python3 -m pip install -q --root-user-action=ignore --target "$dir" "${plats[@]}" --python-version "$ARM_PYVER" \
    --implementation cp --only-binary=:all: "$@" || die "pip install for $arch failed: $*"
  # .pyc files depend on the minor version only (the host's 3.11 writes them fine).
  env -u PYTHONDONTWRITEBYTECODE python3 -m compileall -q -j0 "$dir" >/dev/null 2>&1 || true
  echo "$want" >"$dir/.pylog-site"
  log "site $(basename "$dir"): $((SECONDS - t0)) s"
}

# A copy of the working tree (tracked and untracked-but-not-ignored files, so tests being
# written are included) for one arch, without any host-built extension.
copy_tree() {  # copy_tree DEST
  local dest=$1
  rm -rf "$dest"; mkdir -p "$dest"
  (cd "$ARM_ROOT" && git ls-files -z --cached --others --exclude-standard |
    tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$dest"
  find "$dest" -name '*.so' -delete
}

# Cross-build pylog._cffi for ARCH into TREE/pylog. The target's own python (under qemu)
# runs csrc/_build_pylog.py to emit the C, so the generated code always matches the cffi
# backend it will run with, and prints the builder's sources/defines/flags; the host's
# cross gcc compiles them with the sysroot's Python headers.
cross_build_ext() {  # cross_build_ext ARCH TREE
  local arch=$1 tree=$2
  arch_vars "$arch"
  local t0=$SECONDS args
  (cd "$tree" && "$PYQ" - <<'PY'
import runpy
ns = runpy.run_path("csrc/_build_pylog.py")  # not __main__: builds nothing
fb = ns["ffibuilder"]
fb.emit_c_code("_cffi_gen.c")
_name, _src, _ext, kw = fb._assigned_source
args = ["_cffi_gen.c"] + list(kw.get("sources", []))
args += ["-I" + d for d in kw.get("include_dirs", [])]
args += ["-D%s=%s" % (k, v) if v is not None else "-D" + k for k, v in kw.get("define_macros", [])]
args += list(kw.get("extra_compile_args", []))
open("_cffi_gen.args", "w").write("\n".join(args) + "\n")
PY
  ) >/dev/null || die "emitting the cffi C for $arch failed"
  mapfile -t args <"$tree/_cffi_gen.args"
  (cd "$tree" && $CROSS_CC -shared -fPIC -g0 "${args[@]}" -Werror=implicit-function-declaration \
    -I"$SYSROOT/usr/include/python$ARM_PYVER" -idirafter "$SYSROOT/usr/include" \
    -o pylog/_cffi.abi3.so) || die "cross-compiling the extension for $arch failed"
  log "extension $arch: built in $((SECONDS - t0)) s (${args[*]:1})"
  cross_build_speedups "$arch" "$tree"
}

# Cross-build pylog._speedups (the CPython extension: Records, reads, scans in C) for ARCH
# into TREE/pylog, from the sources and flags setup.py gives it (SPEEDUPS_SOURCES; the
# limited API of Python 3.10, as the x86 build), against the sysroot's Python headers.
cross_build_speedups() {  # cross_build_speedups ARCH TREE
  local arch=$1 tree=$2 t0=$SECONDS src
  arch_vars "$arch"
  mapfile -t src < <(cd "$tree" && python3 - <<'PY'
import ast
tree = ast.parse(open("setup.py").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SPEEDUPS_SOURCES" for t in node.targets):
        print("\n".join(ast.literal_eval(node.value)))
PY
  )
  [ ${#src[@]} -gt 0 ] || die "no SPEEDUPS_SOURCES in setup.py"
  (cd "$tree" && $CROSS_CC -shared -fPIC -g0 -O3 -std=c11 -Wall -Wextra -fvisibility=hidden \
    -Werror=implicit-function-declaration -D_FILE_OFFSET_BITS=64 -DPy_LIMITED_API=0x030A0000 -Icsrc \
    -I"$SYSROOT/usr/include/python$ARM_PYVER" -idirafter "$SYSROOT/usr/include" \
    "${src[@]}" -o pylog/_speedups.abi3.so) || die "cross-compiling pylog._speedups for $arch failed"
  log "speedups $arch: built in $((SECONDS - t0)) s (${src[*]})"
}
