#!/usr/bin/env bash
# CI for AArch64: cross-compiles the library and its tests with Debian's cross toolchain
# (g++-aarch64-linux-gnu; cmake/toolchains/aarch64-linux-gnu.cmake) and runs the CPU tests on the
# NEON kernel under qemu-user. Eigen and xsimd are header-only, so the host's headers serve;
# GoogleTest is built for AArch64 from the sources libgtest-dev ships (/usr/src/googletest).
#
#   scripts/ci_aarch64.sh [BUILD_DIR]          (default build-aarch64)
#
# Installs what it needs with apt-get (as scripts/setup.sh does); when the packages cannot be
# installed it says so and exits 0 without testing. PAGEDATTN_AARCH64_TESTS (a --gtest_filter)
# overrides the tests it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-aarch64}
start=$(date +%s)

packages=(cmake make g++ g++-aarch64-linux-gnu qemu-user libeigen3-dev libxsimd-dev libgtest-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ci_aarch64: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  if ! { "${sudo_cmd[@]}" apt-get update -qq &&
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
    echo "ci_aarch64: SKIPPED: could not install ${missing[*]} (apt-get failed);" \
      "the AArch64 build and tests did not run" >&2
    exit 0
  fi
fi
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
if [ -z "$qemu" ] || ! command -v aarch64-linux-gnu-g++ >/dev/null; then
  echo "ci_aarch64: SKIPPED: qemu-aarch64 or aarch64-linux-gnu-g++ missing after installing" >&2
  exit 0
fi
toolchain="$PWD/cmake/toolchains/aarch64-linux-gnu.cmake"
jobs=$(nproc)

# GoogleTest for AArch64, built once per build directory.
gtest_prefix="$PWD/$build/googletest-install"
if [ ! -f "$gtest_prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
  cmake -S /usr/src/googletest -B "$build/googletest" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$gtest_prefix" >/dev/null
  cmake --build "$build/googletest" -j"$jobs" >/dev/null
  cmake --install "$build/googletest" >/dev/null
fi
xsimd_config=$(dpkg -L libxsimd-dev | grep '/xsimdConfig.cmake$' | head -n1)

cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_BUILD_TYPE=Release \
  -DPAGEDATTN_CUDA=OFF -DPAGEDATTN_BUILD_FUZZ=OFF -DPAGEDATTN_BUILD_BENCH=OFF \
  -DPAGEDATTN_BUILD_TOOLS=OFF -DPAGEDATTN_INSTALL=OFF \
  -DGTest_DIR="$gtest_prefix/lib/cmake/GTest" -Dxsimd_DIR="$(dirname "$xsimd_config")"
cmake --build "$build" -j"$jobs"
echo "ci_aarch64: built after $(($(date +%s) - start)) s"

# A representative part of the CPU suite (the whole grid takes too long under emulation): the
# CPU reference grid rows for f32 and bf16 storage, every kernel test, the API, validation,
# online-softmax, reference, dtype, layout/plan, cache, block-manager and NaN/Inf tests. One
# emulated process per shard (a process per test would spend most of the time starting qemu),
# then the ctest checks of PAGEDATTN_CPU_ISA.
filter=${PAGEDATTN_AARCH64_TESTS:-'*/BackendReferenceTest.*/cpu_f32_*:*/BackendReferenceTest.*/cpu_bf16_*:CpuPerfKernel.*:Api.*:Validation.*:OnlineSoftmaxTest/*:Reference.*:Dtype.*:CacheLayout.*:SplitPlan.*:CacheWrite.*:CopyBlocks.*:BlockManager.*:*/CacheWriteDTypes.Cpu*:*/NonFinite.*/cpu_*:*/ForkDecode.*'}
test_start=$(date +%s)
shards=$jobs
pids=()
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$qemu" -L /usr/aarch64-linux-gnu \
    "$build/tests/pagedattn_tests" --gtest_filter="$filter" --gtest_brief=1 \
    >"$build/aarch64-shard$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < shards; ++i)); do
  if ! wait "${pids[$i]}"; then failed=1; fi
  tail -n 3 "$build/aarch64-shard$i.log"
done
if ((failed)); then
  for ((i = 0; i < shards; ++i)); do cat "$build/aarch64-shard$i.log"; done
  echo "ci_aarch64: FAILED under $qemu" >&2
  exit 1
fi
ctest --test-dir "$build" -R '^cpu_isa_' --output-on-failure
echo "ci_aarch64: the AArch64 CPU tests passed under $qemu in $(($(date +%s) - test_start)) s" \
  "(total $(($(date +%s) - start)) s)"
