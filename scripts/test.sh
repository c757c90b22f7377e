#!/usr/bin/env bash
# Configures, builds and runs the whole test suite (CUDA backend on AUTO: built when nvcc is
# found; CUDA tests skip themselves where no GPU is present). BUILD_DIR overrides ./build.
# The GoogleTest suite runs as TEST_SHARDS processes (default 11), not a process per test:
# starting thousands of processes took longer than the tests. A failing shard's output names its
# failed tests. TEST_SHARDS=0 registers each test with ctest on its own (for `ctest -R NAME`).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPAGEDATTN_CUDA=AUTO \
  -DPAGEDATTN_TEST_SHARDS="${TEST_SHARDS:-11}"
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs" --test-output-truncation middle
