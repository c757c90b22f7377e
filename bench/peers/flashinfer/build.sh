#!/usr/bin/env bash
# Builds fi_decode_bench (FlashInfer 0.7.2 paged decode, timed from C++; sm_90a, static CUDA
# runtime). Needs nvcc from CUDA 12.8 or newer and, the first time, python3 -m pip with access
# to PyPI. No GPU needed.
#
#   build.sh [OUT_BIN] [extra nvcc flags...]
#   e.g. build.sh build-peers/fi_decode_bench -DFI_BENCH_FP8_QLEN=1   (also builds the causal
#        fp8-KV kernels that --q-len > 1 with --kv-dtype fp8_* needs; off by default)
#
#   OUT_BIN   the binary to write (argument or environment; default build-peers/fi_decode_bench
#             in the repository root)
#   NVCC, FI_DATA, FI_DEPS, FI_WHEEL   the compiler and where FlashInfer's headers come from:
#             see fi_env.sh (shared with build_mla.sh), which fetches them on first use
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$here/fi_decode_bench.cu
out=${OUT_BIN:-$(cd "$here/../../.." && pwd)/build-peers/fi_decode_bench}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out=$1; shift; fi
# nvcc, the headers (FI_DATA, fetched on first use) and FlashInfer's flags (fi_flags)
# shellcheck source=fi_env.sh
. "$here/fi_env.sh"

# Two translation units from the one source, compiled side by side and linked: the file as is
# (decode and fa2 kernels) and with -DFI_BENCH_SM90_TU=1 (the fa3 Hopper kernels, whose headers
# cannot share a translation unit with the fa2 ones).
mkdir -p "$(dirname "$out")"
echo "build.sh: nvcc $cu_major.$cu_minor, headers from $FI_DATA, writing $out" >&2
objs=$(mktemp -d "$(dirname "$out")/.fi_decode_bench.obj.XXXXXX")
trap 'rm -rf "$objs"' EXIT
"$nvcc" "${fi_flags[@]}" -c -o "$objs/main.o" "$src" "$@" & main_pid=$!
"$nvcc" "${fi_flags[@]}" -DFI_BENCH_SM90_TU=1 -c -o "$objs/sm90.o" "$src" "$@" & sm90_pid=$!
main_rc=0 sm90_rc=0
wait "$main_pid" || main_rc=$?
wait "$sm90_pid" || sm90_rc=$?
[ "$main_rc" -eq 0 ] || die "compiling $src failed (exit $main_rc)"
[ "$sm90_rc" -eq 0 ] || die "compiling $src with -DFI_BENCH_SM90_TU=1 (fa3) failed (exit $sm90_rc)"
"$nvcc" -gencode arch=compute_90a,code=sm_90a -cudart static -o "$out" "$objs/main.o" \
  "$objs/sm90.o" "$@"
echo "build.sh: built $out" >&2
