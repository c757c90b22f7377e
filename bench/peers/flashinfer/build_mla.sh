#!/usr/bin/env bash
# Builds fi_mla_bench (FlashInfer 0.7.2 MLA paged decode, fa2 and Hopper kernels, timed from C++;
# sm_90a, static CUDA runtime). Needs nvcc from CUDA 12.8 or newer and, if the headers are not
# there yet, python3 -m pip with access to PyPI. No GPU needed.
#
#   build_mla.sh [OUT_BIN] [extra nvcc flags...]
#
#   OUT_BIN   the binary to write (argument or environment; default build-peers/fi_mla_bench in
#             the repository root)
#   NVCC, FI_DATA, FI_DEPS, FI_WHEEL   the compiler and where FlashInfer's headers come from:
#             see fi_env.sh (shared with build.sh), which fetches them on first use
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$here/fi_mla_bench.cu
out=${OUT_BIN:-$(cd "$here/../../.." && pwd)/build-peers/fi_mla_bench}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out=$1; shift; fi
# nvcc, the headers (FI_DATA, fetched on first use) and FlashInfer's flags (fi_flags)
# shellcheck source=fi_env.sh
. "$here/fi_env.sh"

# One translation unit: mla_hopper.cuh includes mla.cuh, so both kernels build together (as the
# fa2 and fa3 JIT modules each build one of them).
mkdir -p "$(dirname "$out")"
echo "build_mla.sh: nvcc $cu_major.$cu_minor, headers from $FI_DATA, writing $out" >&2
# -diag-suppress: two warnings raised inside FlashInfer's MLA headers on every kernel
# instantiation (177: unused constants; 946: ".template" before a member that is no template).
"$nvcc" "${fi_flags[@]}" -diag-suppress 177,946 -cudart static -o "$out" "$src" "$@" ||
  die "compiling $src failed"
echo "build_mla.sh: built $out" >&2
