#!/usr/bin/env bash
# What CI runs for benchmarks (.ci/run calls this when it exists):
#   1. the peer comparison in quick mode (prints the table and every speed target);
#   2. an asv smoke run of a few benchmarks, built from this checkout in asv's own env.
# Speed is reported, not gated (CI machines are noisy): a missed target exits 0. A benchmark
# that crashes, or a broken asv suite, exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${CI_WORK:-$ROOT/.ci-work}
mkdir -p "$WORK"
status=0

echo "--- benchmarks: python -m benchmarks.compare --quick"
if ! python3 -m benchmarks.compare --quick --json "$WORK/compare-quick.json"; then
  echo "benchmarks: compare crashed"; status=1
fi

echo "--- benchmarks: python -m benchmarks.bench_serve --quick (pylog serve vs Redis Streams)"
if python3 -c "import confluent_kafka, kio" 2>/dev/null; then
  if ! timeout 600 python3 -m benchmarks.bench_serve --quick --json "$WORK/bench-serve-quick.json"; then
    echo "benchmarks: bench_serve crashed"; status=1
  fi
fi

echo "--- benchmarks: asv smoke run"
if ! python3 -c "import asv, virtualenv" 2>/dev/null; then
  python3 -m pip install -q asv virtualenv || { echo "benchmarks: cannot install asv"; exit 1; }
fi
cd "$ROOT/asv_bench"
asv machine --yes --machine ci >/dev/null
# asv builds the package from the committed HEAD in its own virtualenv (cffi compiles csrc/).
# A couple of quick benchmarks from different suites; --quick runs each once.
smoke='^(bench_crc\.Crc\.time_crc32c|bench_index\.IndexSearch\.time_lookup|bench_append\.AppendBatch\.time_append_batch|bench_read\.ReadRandomWarm\.time_read_random_warm|bench_frame\.VerifyThroughput)'
log="$WORK/asv-smoke.log"
if ! timeout 900 asv run HEAD^! --machine ci --quick --show-stderr -b "$smoke" 2>&1 | tee "$log"; then
  echo "benchmarks: asv run failed"; status=1
fi
# asv exits 0 even when a benchmark raised: look for failures in its output.
if grep -qE "failed$|Traceback|asv: benchmark failed" "$log"; then
  echo "benchmarks: an asv benchmark failed"; status=1
fi
if ! grep -qE "time_crc32c|time_lookup" "$log"; then
  echo "benchmarks: asv ran no benchmark"; status=1
fi
exit $status
