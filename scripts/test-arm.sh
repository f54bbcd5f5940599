#!/usr/bin/env bash
# The tests that can depend on the CPU, on Raspberry Pi CPUs, from an x86-64 Debian 12 machine (docs/arm.md).
#
#   bash scripts/test-arm.sh            # what CI runs
#
# 1. installs what is missing: Debian's cross gcc for aarch64 and armhf, qemu-user
# 2. C checks: scripts/c-selftest.c under UBSan on x86-64, and cross-built under qemu on
#    several aarch64 and armhf CPU models (hardware CRC and portable paths, odd addresses)
# 3. a sysroot per arch with Debian's own CPython 3.11 (private apt + dpkg -x), test
#    dependencies, the cffi extension cross-built with the target's own cffi, and the CPython
#    extension pylog._speedups cross-built from setup.py's SPEEDUPS_SOURCES
# 4. the project's tests that can depend on the CPU (ARM_FILES, below; ARM_FILES=all for the
#    whole suite, -m "not spark and not venv") under qemu-user, one run per target:
#      aarch64 on cortex-a53 / a72 / a76 (Pi 3 / 4 / 5) and with the portable CRC forced,
#      armhf on cortex-a7 (Pi 2: no CRC instructions) and on max (ARMv8 AArch32, with CRC)
#    Each run prints one line: "arm: <target> (<crc impl>, <secs> s): N passed, N failed, N skipped"
# 5. scripts/build-arm-wheels.sh: aarch64 and armv7l wheels, auditwheel, emulated smoke test
# Exits non-zero if any step or target fails.
#
# Environment knobs (all optional):
#   CI_WORK / ARM_WORK      work dir (default $CI_WORK/arm, else .ci-work/arm in the repo)
#   ARM_TARGETS             space-separated subset of target names (default: all)
#   ARM_JOBS                targets run at once (default 3: each qemu-user run is one thread
#                           and often waits on fsync or subprocesses)
#   ARM_TARGET_TIMEOUT      seconds per pytest run (default 1200)
#   ARM_DESELECT            test ids not run under emulation. Default: the pure-backend rerun
#                           of the core suite (pure Python, the same on every CPU, ~5 min under
#                           qemu) and the API-reference freshness check (docs/api.md is generated
#                           on 64-bit and shows LogConfig's 64-bit defaults), and the store-level
#                           multi-process model test (its rules are not CPU-specific; a dozen
#                           interpreters under emulation on 2 cores make its runs mostly start-up)
#   ARM_MARKERS             pytest -m expression (default "not spark and not venv": the fresh-venv
#                           install tests build and pip-install an x86 wheel; packaging is the same
#                           on every CPU, and scripts/build-arm-wheels.sh smoke-tests the ARM wheels)
#   ARM_PYTEST_ARGS         extra pytest arguments (e.g. "-x -k crc")
#   ARM_HYPOTHESIS_PROFILE  hypothesis profile under emulation (default "emulated": 20 examples)
#   ARM_SKIP_WHEELS=1       skip step 5
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/arm-common.sh
source scripts/arm-common.sh
T_START=$SECONDS
# qemu runs are slow to compile: let them keep the bytecode they write
unset PYTHONDONTWRITEBYTECODE

# name arch qemu-cpu expected-crc-impl force-portable
ALL_TARGETS="
aarch64-cortex-a53 aarch64 cortex-a53 armv8-crc 0
aarch64-cortex-a72 aarch64 cortex-a72 armv8-crc 0
aarch64-cortex-a76 aarch64 cortex-a76 armv8-crc 0
aarch64-portable aarch64 cortex-a72 portable 1
armhf-cortex-a7 armhf cortex-a7 portable 0
armhf-armv8 armhf max armv8-crc 0
"
ARM_JOBS=${ARM_JOBS:-3}
ARM_TARGET_TIMEOUT=${ARM_TARGET_TIMEOUT:-1200}
ARM_MARKERS=${ARM_MARKERS:-not spark and not venv}
# what is about x86 CI's tooling and the docs, not the platform: the README's commands and every
# docs code block (tests/test_examples.py, tests/test_docs_blocks.py: minutes on x86, past the
# target timeout under emulation), besides the three below
ARM_DESELECT=${ARM_DESELECT-tests/test_backends.py::test_core_suite_under_pure_backend tests/test_docs.py::test_api_reference_is_current tests/test_model_store.py::test_store_model_multiprocess tests/test_docs_blocks.py tests/test_examples.py}
RESULTS=$ARM_WORK/results
failed=()

# ---- 1. host tools ------------------------------------------------------------------------
ensure_host_tools

# ---- 2. C-level checks ---------------------------------------------------------------------
c_checks() {
  # the C core's files: csrc/speedups*.c are the CPython extension (built in step 3)
  local core=() f
  for f in csrc/*.c; do case $f in csrc/speedups*) ;; *) core+=("$f") ;; esac; done
  local d=$ARM_WORK/c F=(-O2 -g -std=c11 -Wall -Wextra -Werror -Icsrc) SRC=(scripts/c-selftest.c "${core[@]}")
  local ok=0
  mkdir -p "$d"
  # _FILE_OFFSET_BITS=64 must be in force in every C file, before any system header.
  for f in "${core[@]}"; do
    arm-linux-gnueabihf-gcc -E -dM -Icsrc "$f" >"$d/macros.txt" && grep -q '__USE_FILE_OFFSET64' "$d/macros.txt" ||
      { echo "arm: $f is not built with 64-bit off_t on armhf"; ok=1; }
  done
  # the x86-64 folding path where the kernel reports its instructions
  local x86_impl=sse4.2
  if grep -qw vpclmulqdq /proc/cpuinfo && grep -qw avx2 /proc/cpuinfo && grep -qw pclmulqdq /proc/cpuinfo; then
    x86_impl=sse4.2+vpclmulqdq
  fi
  gcc "${F[@]}" -fsanitize=alignment,undefined -fno-sanitize-recover=all "${SRC[@]}" -o "$d/selftest-ubsan" &&
    PYLOG_EXPECT_CRC_IMPL=$x86_impl "$d/selftest-ubsan" && PYLOG_CRC32C_NO_CLMUL=1 PYLOG_EXPECT_CRC_IMPL=sse4.2 "$d/selftest-ubsan" &&
    PYLOG_CRC32C_FORCE_PORTABLE=1 PYLOG_EXPECT_CRC_IMPL=portable "$d/selftest-ubsan" || ok=1
  aarch64-linux-gnu-gcc "${F[@]}" "${SRC[@]}" -o "$d/selftest-aarch64" || ok=1
  arm-linux-gnueabihf-gcc "${F[@]}" "${SRC[@]}" -o "$d/selftest-armhf" || ok=1
  local cpu
  for cpu in cortex-a53 cortex-a72 cortex-a76 max; do
    PYLOG_EXPECT_CRC_IMPL=armv8-crc qemu-aarch64 -cpu $cpu -L /usr/aarch64-linux-gnu "$d/selftest-aarch64" || ok=1
  done
  PYLOG_CRC32C_FORCE_PORTABLE=1 PYLOG_EXPECT_CRC_IMPL=portable \
    qemu-aarch64 -cpu cortex-a53 -L /usr/aarch64-linux-gnu "$d/selftest-aarch64" || ok=1
  for cpu in cortex-a7 cortex-a15; do
    PYLOG_EXPECT_CRC_IMPL=portable qemu-arm -cpu $cpu -L /usr/arm-linux-gnueabihf "$d/selftest-armhf" || ok=1
  done
  PYLOG_EXPECT_CRC_IMPL=armv8-crc qemu-arm -cpu max -L /usr/arm-linux-gnueabihf "$d/selftest-armhf" || ok=1
  return $ok
}
if c_checks; then echo "arm: C checks passed"; else echo "arm: C checks FAILED"; failed+=(c-checks); fi

# ---- 3. sysroots, test dependencies, extension builds (both arches at once) ----------------
# Sysroot packages and test dependencies per arch: SYSROOT_PKGS_* / SITE_PKGS_* in
# scripts/arm-common.sh.
prepare() {  # prepare ARCH (in a subshell: `die` ends only this arch)
  local arch=$1 pk si
  pk=SYSROOT_PKGS_$arch si=SITE_PKGS_$arch
  # shellcheck disable=SC2086
  ensure_sysroot "$arch" ${!pk}
  arch_vars "$arch"
  # shellcheck disable=SC2086
  ensure_site "$arch" "$SITE" ${!si}
  copy_tree "$ARM_WORK/tree-$arch"
  cross_build_ext "$arch" "$ARM_WORK/tree-$arch"
  # Like CI's `pip install -e .`: pylog imports from any directory (tests run the CLI
  # with `python -m pylog.cli` elsewhere). A wheel on PYTHONPATH still comes first.
  echo "$ARM_WORK/tree-$arch" >"$SITE/pylog-tree.pth"
}
mkdir -p "$RESULTS"
T_PREP=$SECONDS
declare -A prep_pid
for arch in aarch64 armhf; do
  (prepare "$arch") >"$ARM_WORK/prepare-$arch.log" 2>&1 &
  prep_pid[$arch]=$!
done
declare -A prep_ok
for arch in aarch64 armhf; do
  if wait "${prep_pid[$arch]}"; then prep_ok[$arch]=1; else
    prep_ok[$arch]=0; failed+=("prepare-$arch")
    echo "arm: preparing $arch FAILED; the end of its log:"; tail -n 20 "$ARM_WORK/prepare-$arch.log"
  fi
done
log "prepared in $((SECONDS - T_PREP)) s"

# ---- 4. the pytest suite per target ----------------------------------------------------------
run_target() {  # run_target NAME ARCH CPU EXPECT FORCE
  local name=$1 arch=$2 cpu=$3 expect=$4 force=$5
  arch_vars "$arch"
  local out=$RESULTS/$name t0=$SECONDS rc files d
  mapfile -t files <"$out/files"
  for d in $ARM_DESELECT; do files+=(--deselect "$d"); done
  rm -rf "$out/tmp" "$out/junit.xml" "$out/status"; mkdir -p "$out/tmp"
  (
    cd "$ARM_WORK/tree-$arch" || exit 99
    unset PYTHONPATH PYLOG_BACKEND
    export QEMU_CPU=$cpu TMPDIR=$out/tmp PYLOG_EXPECT_CRC_IMPL=$expect
    export HYPOTHESIS_PROFILE=${ARM_HYPOTHESIS_PROFILE:-emulated} HYPOTHESIS_STORAGE_DIRECTORY=$out/hypothesis
    # Debian's ARM packages have no Kafka clients, docs tools or linters: their tests skip here
    export PYLOG_TEST_SUBSET=1
    if [ "$force" = 1 ]; then export PYLOG_CRC32C_FORCE_PORTABLE=1; else unset PYLOG_CRC32C_FORCE_PORTABLE; fi
    # shellcheck disable=SC2086
    exec timeout -k 20 "$ARM_TARGET_TIMEOUT" "$PYQ" -m pytest -q -p no:cacheprovider -m "$ARM_MARKERS" \
      --basetemp="$out/tmp/pytest" --junitxml="$out/junit.xml" -o junit_family=xunit1 --durations=10 ${ARM_PYTEST_ARGS:-} "${files[@]}"
  ) >"$out/pytest.log" 2>&1 &
  echo $! >"$out/pid"  # the subshell exec'd timeout, which runs pytest in its own process group
  wait $!
  rc=$?
  rm -f "$out/pid"
  echo "$rc $((SECONDS - t0))" >"$out/status"
  rm -rf "$out/tmp"
}

selected=()
while read -r name arch cpu expect force; do
  [ -n "$name" ] || continue
  if [ -n "${ARM_TARGETS:-}" ] && [[ " $ARM_TARGETS " != *" $name "* ]]; then continue; fi
  selected+=("$name $arch $cpu $expect $force")
done <<<"$ALL_TARGETS"

# Which test files each target runs. Every target runs the files that exercise the C core
# and its CPU-dependent paths (CORE_FILES). With ARM_SHARD=1 (the default, to fit CI's time)
# the other files are split across the targets of each arch, so every arch still runs the
# whole suite once; ARM_SHARD=0 runs everything on every target. The split balances per-file
# times: this machine's last run ($ARM_WORK/timings.json), else the seed committed in
# scripts/arm-timings.json (copy a fresh timings.json there when the suite changes a lot),
# else file sizes.
CORE_FILES="test_arm.py test_crc32c.py test_vectors.py"
# What else runs under emulation (ARM_FILES=all: every file): the tests whose outcome can
# depend on the CPU or its ABI, i.e. the C core and the CPython extension through every entry
# point (framing, scanning, columns, gathers), 32-bit pointers, size_t and off_t (mmap'd
# segments and numpy index views on armhf), the on-disk format read and written there,
# recovery from damage and torn writes, and the library's API over them. The rest runs on
# x86 only: the broker, the CLI, Spark, docs, crash and concurrency tests, whose code is the
# same Python on every CPU and whose system calls qemu-user passes to the x86 kernel as they
# are (it does not emulate ARM's weaker memory ordering either), and the CI's own checks.
# test_txn_visibility.py (reader and writer processes racing) is one of those: under
# emulation on armhf-armv8 it once caught a consistent() snapshot cutting through a
# transaction (a reader's look between the publish's token and its rename; fixed, and now
# a deterministic test on x86). `ARM_FILES=test_txn_visibility.py PYLOG_LONG=1` reruns it here.
ARM_FILES=${ARM_FILES:-test_append_gather.py test_append_twins.py test_bad_input.py test_columns.py
  test_compaction.py test_consumer.py test_corruption.py test_frame.py test_fuzz.py test_index.py
  test_log.py test_memory.py
  test_recovery.py test_speedups.py test_stateful.py test_timestamps.py test_topics.py test_torn_writes.py
  test_transactions.py}
python3 - "$ARM_WORK" "${ARM_SHARD:-1}" "$CORE_FILES" "$ARM_FILES" "${selected[@]}" <<'PY' || exit 1
import json, os, sys
work, shard, core = sys.argv[1], sys.argv[2] == "1", sys.argv[3].split()
platform = None if sys.argv[4].strip() == "all" else set(sys.argv[4].split())
targets = [t.split()[:2] for t in sys.argv[5:]]
timings = {}
for path in (os.path.join("scripts", "arm-timings.json"), os.path.join(work, "timings.json")):
    try:  # the committed seed (a fresh CI clone), then this machine's last run
        for arch, per in json.load(open(path)).items():
            timings.setdefault(arch, {}).update(per)
    except (OSError, ValueError):
        pass
for arch in sorted({a for _, a in targets}):
    names = [n for n, a in targets if a == arch]
    tdir = os.path.join(work, f"tree-{arch}", "tests")
    files = sorted(f for f in os.listdir(tdir) if f.startswith("test_") and f.endswith(".py")) if os.path.isdir(tdir) else []
    assign = {n: [f for f in files if f in core] for n in names}
    rest = [f for f in files if f not in core and (platform is None or f in platform)]
    if platform is not None:
        missing = sorted(platform - set(files))
        if missing:
            sys.exit(f"arm: ARM_FILES names files that are not in tests/: {' '.join(missing)}")
        print(f"arm: {arch}: {len(core) + len(rest)} of {len(files)} test files under emulation, "
              f"the others on x86 only: {' '.join(f for f in files if f not in core and f not in rest)}")
    if not shard:
        for n in names:
            assign[n] += rest
    else:
        cost = lambda f: timings.get(arch, {}).get(f, os.path.getsize(os.path.join(tdir, f)) / 200)
        load = {n: 0.0 for n in names}
        for f in sorted(rest, key=cost, reverse=True):
            n = min(names, key=lambda k: load[k])
            assign[n].append(f)
            load[n] += cost(f)
    for n in names:
        os.makedirs(os.path.join(work, "results", n), exist_ok=True)
        with open(os.path.join(work, "results", n, "files"), "w") as fh:
            fh.write("\n".join("tests/" + f for f in sorted(assign[n])) + "\n")
PY

# If this script is stopped, stop the test runs too (timeout gives them their own group).
stop_runs() {
  local f
  for f in "$RESULTS"/*/pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; done
}
trap 'stop_runs; exit 130' INT TERM
trap stop_runs EXIT

T_TESTS=$SECONDS
running=0
for t in "${selected[@]}"; do
  read -r name arch cpu expect force <<<"$t"
  if [ "${prep_ok[$arch]}" != 1 ]; then
    mkdir -p "$RESULTS/$name"; echo "98 0" >"$RESULTS/$name/status"; continue
  fi
  while [ "$running" -ge "$ARM_JOBS" ]; do wait -n; running=$((running - 1)); done
  log "start $name"
  run_target $name $arch $cpu $expect $force &
  running=$((running + 1))
done
wait
log "test runs took $((SECONDS - T_TESTS)) s"

# One summary line per target, from its junit file (and the exit status when there is none).
summary() {  # summary NAME EXPECT -> prints the line; returns 1 if the target failed
  python3 - "$RESULTS/$1" "$1" "$2" <<'PY'
import os, sys, xml.etree.ElementTree as ET
out, name, expect = sys.argv[1:]
rc, secs = (open(os.path.join(out, "status")).read().split() + ["99", "0"])[:2]
rc = int(rc)
p = f = s = 0
impl = None
reasons = {}
try:
    root = ET.parse(os.path.join(out, "junit.xml")).getroot()
    for ts in root.iter("testsuite"):
        t, e, fl, sk = (int(ts.get(k, 0)) for k in ("tests", "errors", "failures", "skipped"))
        p += t - e - fl - sk; f += e + fl; s += sk
    for tc in root.iter("testcase"):
        for prop in tc.iter("property"):
            if prop.get("name") == "crc_impl":
                impl = prop.get("value")
except (OSError, ET.ParseError):
    pass
try:  # skip reasons from pytest's -ra summary ("SKIPPED [n] file:line: reason")
    for line in open(os.path.join(out, "pytest.log"), errors="replace"):
        if line.startswith("SKIPPED ["):
            n, _, msg = line[len("SKIPPED ["):].partition("] ")
            reasons[msg.strip()] = reasons.get(msg.strip(), 0) + int(n)
except (OSError, ValueError):
    pass
note = ""
if rc == 124 or rc == 137:
    note = " TIMEOUT"; f += 1
elif rc == 98:
    note = " NOT RUN (prepare failed)"; f += 1
elif rc not in (0, 1) and f == 0:
    note = f" pytest exit {rc}"; f += 1
print(f"arm: {name} ({impl or expect + '?'}, {secs} s): {p} passed, {f} failed, {s} skipped{note}")
with open(os.path.join(out, "skips.txt"), "w") as fh:
    for msg, n in sorted(reasons.items()):
        fh.write(f"{n:4d}  {msg}\n")
with open(os.path.join(out, "counts"), "w") as fh:
    fh.write(f"{p} {f} {s}\n")
sys.exit(1 if (f or rc != 0) else 0)
PY
}
echo
for t in "${selected[@]}"; do
  read -r name arch cpu expect force <<<"$t"
  summary "$name" "$expect" || failed+=("$name")
done
# Per-file durations of this run, for the next run's split.
python3 - "$ARM_WORK" "${selected[@]}" <<'PY' || true
import json, os, sys, xml.etree.ElementTree as ET
work = sys.argv[1]
path = os.path.join(work, "timings.json")
try:
    timings = json.load(open(path))
except (OSError, ValueError):
    timings = {}
for t in sys.argv[2:]:
    name, arch = t.split()[:2]
    try:
        root = ET.parse(os.path.join(work, "results", name, "junit.xml")).getroot()
    except (OSError, ET.ParseError):
        continue
    per = {}
    for tc in root.iter("testcase"):
        parts = (tc.get("classname") or "").split(".")
        mod = next((p for p in parts if p.startswith("test_")), None)
        if mod:
            per[mod + ".py"] = per.get(mod + ".py", 0.0) + float(tc.get("time") or 0)
    timings.setdefault(arch, {}).update(per)
json.dump(timings, open(path, "w"), indent=1, sort_keys=True)
PY
for t in "${selected[@]}"; do
  read -r name _ <<<"$t"
  if [ -s "$RESULTS/$name/skips.txt" ]; then echo "  skips on $name:"; sed 's/^/  /' "$RESULTS/$name/skips.txt"; fi
  if [[ " ${failed[*]} " == *" $name "* ]]; then
    echo "  --- end of $name's pytest log ($RESULTS/$name/pytest.log):"; tail -n 40 "$RESULTS/$name/pytest.log" | sed 's/^/  /'
  fi
done

# ---- 5. wheels ----------------------------------------------------------------------------
if [ "${ARM_SKIP_WHEELS:-0}" != 1 ]; then
  if [ "${prep_ok[aarch64]}" = 1 ] && [ "${prep_ok[armhf]}" = 1 ] && bash scripts/build-arm-wheels.sh; then
    echo "arm: wheels built, repaired and smoke-tested"
  else
    echo "arm: wheels FAILED"; failed+=(wheels)
  fi
fi

tp=0 tf=0 ts=0
for t in "${selected[@]}"; do
  read -r name _ <<<"$t"
  [ -f "$RESULTS/$name/counts" ] && read -r a b c <"$RESULTS/$name/counts" && tp=$((tp + a)) tf=$((tf + b)) ts=$((ts + c))
done
log "total $((SECONDS - T_START)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "arm: FAILED: ${failed[*]}"
  echo "arm: $tp passed, $tf failed, $ts skipped"
  exit 1
fi
echo "arm: $tp passed, $tf failed, $ts skipped"
