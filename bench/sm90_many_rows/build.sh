#!/usr/bin/env bash
# Builds the Hopper many-row decode study (sm90_many_rows.cu) into build-sm90/: the default
# design as sm90_many_rows and the study variants beside it, so one run can time them all:
#   sm90_many_rows_v1  STUDY_OVERLAP: split K/V rings, S of the next tile and P V of the last
#                      issued before the softmax (software pipelining in the warpgroup)
#   sm90_many_rows_v2  STUDY_BALANCED: one CTA per resident slot, equal shares of all tiles
#   sm90_many_rows_v3  STUDY_OVERLAP + STUDY_BALANCED + STUDY_EVICT_FIRST (L2 evict-first TMA)
# Hand-written PTX (wgmma, TMA, mbarriers): needs only the CUDA toolkit (12.3 or newer) and runs
# on sm_90 GPUs (H100, H200). Extra nvcc flags may follow and apply to every binary, e.g.
# -Xptxas -v, or -DPROTO_STAGES=4 for a deeper pipeline at one CTA per SM. VARIANTS=0 builds
# the default binary only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
src="$(dirname "${BASH_SOURCE[0]}")/sm90_many_rows.cu"
mkdir -p "$root/build-sm90"
# -arch=sm_90a also embeds portable compute_90 PTX, where the kernel body is compiled out;
# warning 177 (unused functions) comes from that pass.
build() {
  local out="$1"
  shift
  "$nvcc" -O3 -std=c++17 -arch=sm_90a -lineinfo -Xcompiler -fopenmp -diag-suppress 177 "$@" \
    "$src" -o "$root/build-sm90/$out"
  echo "built $root/build-sm90/$out"
}
build sm90_many_rows "$@"
if [[ "${VARIANTS:-1}" != 0 ]]; then
  build sm90_many_rows_v1 -DSTUDY_OVERLAP=1 "$@"
  build sm90_many_rows_v2 -DSTUDY_BALANCED=1 "$@"
  build sm90_many_rows_v3 -DSTUDY_OVERLAP=1 -DSTUDY_BALANCED=1 -DSTUDY_EVICT_FIRST=1 "$@"
fi
