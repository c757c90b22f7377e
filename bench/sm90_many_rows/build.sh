#!/usr/bin/env bash
# Builds the Hopper many-row decode study (sm90_many_rows.cu) into build-sm90/sm90_many_rows.
# Hand-written PTX (wgmma, TMA, mbarriers): needs only the CUDA toolkit (12.3 or newer) and runs
# on sm_90 GPUs (H100, H200). Extra nvcc flags may follow, e.g. -Xptxas -v, or -DPROTO_STAGES=4
# for a deeper pipeline at one CTA per SM.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
mkdir -p "$root/build-sm90"
# -arch=sm_90a also embeds portable compute_90 PTX, where the kernel body is compiled out;
# warning 177 (unused functions) comes from that pass.
"$nvcc" -O3 -std=c++17 -arch=sm_90a -lineinfo -Xcompiler -fopenmp -diag-suppress 177 "$@" \
  "$(dirname "${BASH_SOURCE[0]}")/sm90_many_rows.cu" -o "$root/build-sm90/sm90_many_rows"
echo "built $root/build-sm90/sm90_many_rows"
