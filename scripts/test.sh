#!/usr/bin/env bash
# Configures, builds and runs the whole test suite (CUDA backend on AUTO: built when nvcc is
# found; CUDA tests skip themselves where no GPU is present). BUILD_DIR overrides ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPAGEDATTN_CUDA=AUTO
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs"
