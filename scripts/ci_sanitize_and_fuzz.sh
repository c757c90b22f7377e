#!/usr/bin/env bash
# CI: (a) the unit tests (and the fuzzer's own tests) under AddressSanitizer + UBSan, CPU only;
#     (b) a bounded CPU fuzz run with the release build's pagedattn-fuzz, beside (a) on one core.
#
#   scripts/ci_sanitize_and_fuzz.sh RELEASE_BUILD_DIR
#
# RELEASE_BUILD_DIR (or PAGEDATTN_RELEASE_BUILD) is a configured and built release tree holding
# fuzz/pagedattn-fuzz. Environment knobs:
#   ASAN_BUILD_DIR   sanitizer build tree              (default build-asan)
#   FUZZ_SECONDS     length of the fuzz run            (default 120)
#   FUZZ_SEED        fuzz seed                         (default: derived from the commit, so a
#                                                      rerun replays and each commit fuzzes anew)
#   FUZZ_OUT         where a failing, shrunk case is saved (default fuzz-failures)
#   JOBS             build and test parallelism        (default 2)
#   TEST_SHARDS      processes the unit tests run in   (default 11; 0: one per test)
#   SKIP_SANITIZE=1 / SKIP_FUZZ=1 run one half only.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
release="${1:-${PAGEDATTN_RELEASE_BUILD:-}}"
asan="${ASAN_BUILD_DIR:-build-asan}"
jobs="${JOBS:-2}"
shards="${TEST_SHARDS:-11}"
seconds="${FUZZ_SECONDS:-120}"
out="${FUZZ_OUT:-fuzz-failures}"
t0=$SECONDS
status=0

phase() { echo "=== $* ($((SECONDS - t0)) s)"; }

# The GoogleTest tests that failed in the ctest entries that failed, from ctest's log: each
# "[  FAILED  ]" test, and as "[ ABORTED  ]" the test a process died in (a sanitizer report
# aborts the whole shard).
failed_tests() {
  awk '
    /^[0-9]+\/[0-9]+ Testing: / { printf "%s", found; found = ""; run = ""; next }
    /^\[ RUN      \] / { run = substr($0, 14); next }
    /^\[       OK \] |^\[  SKIPPED \] / { run = ""; next }
    /^\[  FAILED  \] / {
      run = ""
      if ($0 !~ /listed below:$/) { sub(/ \([0-9]+ ms\)$/, ""); found = found $0 "\n" }
      next
    }
    /^<end of output>$/ { if (run != "") found = found "[ ABORTED  ] " run "\n"; run = ""; next }
    /^Test Passed\.$/ { found = "" }
    END { printf "%s", found }
  ' "$1" | sort -u
}

# The fuzz run takes one core for a fixed time, so it runs beside the sanitizer build and tests
# (which keep the other core busy) rather than after them.
fuzz_pid=""
if [[ "${SKIP_FUZZ:-0}" != 1 ]]; then
  if [[ -z "$release" ]]; then
    echo "ci_sanitize_and_fuzz: pass the release build directory (or PAGEDATTN_RELEASE_BUILD)" >&2
    exit 2
  fi
  fuzz="$release/fuzz/pagedattn-fuzz"
  if [[ ! -x "$fuzz" ]]; then
    echo "ci_sanitize_and_fuzz: $fuzz not found; build the release tree with PAGEDATTN_BUILD_FUZZ" >&2
    exit 2
  fi
  seed="${FUZZ_SEED:-}"
  if [[ -z "$seed" ]]; then
    head="$(git rev-parse --short=12 HEAD 2>/dev/null || echo 1)"
    seed=$((16#${head:0:12}))
  fi
  mkdir -p "$out"
  phase "fuzz (in the background): $fuzz --backend cpu --seconds $seconds --seed $seed"
  "$fuzz" --backend cpu --seconds "$seconds" --seed "$seed" --out "$out" >"$out/fuzz.log" 2>&1 &
  fuzz_pid=$!
fi

if [[ "${SKIP_SANITIZE:-0}" != 1 ]]; then
  phase "sanitizer build: configure $asan"
  san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  # The unit tests as a few sharded processes, not one per test: an instrumented process takes
  # longer to start than most tests take to run. GoogleTest deals the tests out round-robin; a
  # prime count keeps each shard from drawing the same rows of every parameter grid.
  # -g1: line tables and inlined frames, all a sanitizer report's stack trace reads; -g's
  # variable locations are for a debugger, and tracking them slowed the build by about a sixth.
  # -O1, the level the sanitizers' own docs suggest: the instrumented SIMD kernels compile
  # several times faster than at -O2, which outweighs the slower tests (docs/fuzzing.md).
  cmake -S . -B "$asan" -DPAGEDATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DPAGEDATTN_TEST_SHARDS="$shards" \
    -DPAGEDATTN_BUILD_TESTS=ON -DPAGEDATTN_BUILD_FUZZ=ON -DPAGEDATTN_BUILD_BENCH=OFF \
    -DPAGEDATTN_BUILD_TOOLS=OFF -DPAGEDATTN_INSTALL=OFF \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san"
  phase "sanitizer build: build"
  if ! cmake --build "$asan" -j "$jobs"; then
    echo "ci_sanitize_and_fuzz: the sanitizer build failed" >&2
    status=1
  else
    phase "sanitizer build: ctest"
    export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    # The fuzzer's clean run and planted-bug tests run under the sanitizers too. A failing
    # shard's log is long: ctest keeps its start and its end (where a sanitizer report and
    # GoogleTest's list of failed tests are), and the failed tests are listed once more below.
    if ! ctest --test-dir "$asan" --output-on-failure -j "$jobs" \
      --test-output-truncation middle; then
      echo "ci_sanitize_and_fuzz: tests failed under ASan/UBSan:" >&2
      failed_tests "$asan/Testing/Temporary/LastTest.log" >&2 || true
      status=1
    fi
  fi
fi

if [[ -n "$fuzz_pid" ]]; then
  fuzz_status=0
  wait "$fuzz_pid" || fuzz_status=$?
  cat "$out/fuzz.log"
  phase "fuzz: finished, status $fuzz_status"
  if [[ "$fuzz_status" != 0 ]]; then
    echo "ci_sanitize_and_fuzz: the fuzzer found a failure; the shrunk case is in $out" >&2
    status=1
  fi
fi

phase "done, status $status"
exit "$status"
