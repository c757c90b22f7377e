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
#   NVCC      nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   FI_DATA   a flashinfer/data folder (include/, cutlass/include/, cutlass/tools/util/include/,
#             cccl/) to use as it is, instead of fetching one
#   FI_DEPS   where the fetched headers live (default .deps in the repository root, git-ignored);
#             they go to $FI_DEPS/flashinfer-0.7.2.post1
#   FI_WHEEL  a flashinfer_python-0.7.2.post1 wheel already on disk (skips the download)
#
# Headers: FI_DATA if set, else the folder under FI_DEPS, filled on first use from the PyPI wheel
# (pip download, about 62 MB, sha256 checked), of which only
# flashinfer/data/{include,cutlass/include,cutlass/tools/util/include,cccl} is unpacked (56 MB).
set -euo pipefail

FI_VERSION=0.7.2.post1
FI_WHEEL_SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
src=$here/fi_decode_bench.cu
out=${OUT_BIN:-$root/build-peers/fi_decode_bench}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out=$1; shift; fi
die() { echo "build.sh: $*" >&2; exit 1; }

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || die "nvcc not found (put it on PATH or set NVCC)"
ver=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n 1) ||
  die "$nvcc --version failed"
[ -n "$ver" ] || die "cannot read the CUDA version from $nvcc --version"
cu_major=${ver% *} cu_minor=${ver#* }
if [ "$cu_major" -lt 12 ] || { [ "$cu_major" -eq 12 ] && [ "$cu_minor" -lt 8 ]; }; then
  die "needs CUDA 12.8 or newer, $nvcc is $cu_major.$cu_minor"
fi

stage=
fetch_headers() {  # $1: the folder to create, holding flashinfer/data/...
  local dest=$1 whl sum
  mkdir -p "$(dirname "$dest")"
  stage=$(mktemp -d "$dest.tmp.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  if [ -n "${FI_WHEEL:-}" ]; then
    whl=$FI_WHEEL
  else
    python3 -m pip --version > /dev/null 2>&1 ||
      die "python3 -m pip is not available: install pip, or download" \
        "flashinfer_python-$FI_VERSION-py3-none-any.whl and set FI_WHEEL to it"
    echo "build.sh: downloading flashinfer-python==$FI_VERSION from PyPI" >&2
    # --python-version: the wheel needs Python >= 3.10 to install, not to read its headers
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
      --disable-pip-version-check -q -d "$stage/wheel" "flashinfer-python==$FI_VERSION" >&2
    whl=$(echo "$stage"/wheel/flashinfer_python-*.whl)
  fi
  [ -f "$whl" ] || die "no wheel at $whl"
  sum=$(python3 -c 'import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$whl")
  [ "$sum" = "$FI_WHEEL_SHA256" ] || die "$whl: sha256 $sum, expected $FI_WHEEL_SHA256"
  python3 - "$whl" "$stage/tree" flashinfer/data/include/ flashinfer/data/cutlass/include/ \
    flashinfer/data/cutlass/tools/util/include/ flashinfer/data/cccl/ << 'PY'
import sys, zipfile
whl, dest, keep = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith(keep) and not n.endswith("/")]
    for k in keep:
        if not any(n.startswith(k) for n in names):
            sys.exit(f"{whl}: nothing under {k}")
    for n in names:
        z.extract(n, dest)
print(f"build.sh: unpacked {len(names)} header files", file=sys.stderr)
PY
  touch "$stage/tree/.complete"
  # One rename publishes the whole tree, so a concurrent build sees all of it or none.
  [ -f "$dest/.complete" ] || rm -rf "$dest"
  mv -T "$stage/tree" "$dest" 2> /dev/null || [ -f "$dest/.complete" ] || die "cannot create $dest"
  rm -rf "$stage"
  trap - EXIT
}

if [ -z "${FI_DATA:-}" ]; then
  deps=${FI_DEPS:-$root/.deps}/flashinfer-$FI_VERSION
  [ -f "$deps/.complete" ] || fetch_headers "$deps"
  FI_DATA=$deps/flashinfer/data
fi
for d in include/flashinfer cutlass/include/cutlass cutlass/tools/util/include/cutlass/util \
  cccl/libcudacxx/include cccl/cub cccl/thrust; do
  [ -d "$FI_DATA/$d" ] || die "FlashInfer headers: $FI_DATA/$d is missing"
done

# Flags as FlashInfer's JIT builds these kernels (flashinfer/jit/core.py gen_jit_spec and
# cpp_ext.py build_cuda_cflags for sm90a). The wheel's vendored CCCL goes ahead of the toolkit's:
# fastdiv.cuh needs cuda::fast_mod_div, which the CCCL of CUDA 13.0 lacks.
# Two translation units from the one source, compiled side by side and linked: the file as is
# (decode and fa2 kernels) and with -DFI_BENCH_SM90_TU=1 (the fa3 Hopper kernels, whose headers
# cannot share a translation unit with the fa2 ones).
mkdir -p "$(dirname "$out")"
echo "build.sh: nvcc $cu_major.$cu_minor, headers from $FI_DATA, writing $out" >&2
# shellcheck disable=SC2054  # the commas belong to -gencode's argument
flags=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
  -use_fast_math -static-global-template-stub=false -DNDEBUG
  -DFLASHINFER_ENABLE_F16 -DFLASHINFER_ENABLE_BF16 -DFLASHINFER_ENABLE_FP8_E4M3
  -DFLASHINFER_ENABLE_FP8_E5M2 -DFLASHINFER_ENABLE_FP8_E8M0 -DFLASHINFER_ENABLE_FP4_E2M1
  -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  -I"$FI_DATA/cccl/cub" -I"$FI_DATA/cccl/libcudacxx/include" -I"$FI_DATA/cccl/thrust"
  -I"$FI_DATA/include" -I"$FI_DATA/cutlass/include" -I"$FI_DATA/cutlass/tools/util/include")
objs=$(mktemp -d "$(dirname "$out")/.fi_decode_bench.obj.XXXXXX")
trap 'rm -rf "$objs"' EXIT
"$nvcc" "${flags[@]}" -c -o "$objs/main.o" "$src" "$@" & main_pid=$!
"$nvcc" "${flags[@]}" -DFI_BENCH_SM90_TU=1 -c -o "$objs/sm90.o" "$src" "$@" & sm90_pid=$!
main_rc=0 sm90_rc=0
wait "$main_pid" || main_rc=$?
wait "$sm90_pid" || sm90_rc=$?
[ "$main_rc" -eq 0 ] || die "compiling $src failed (exit $main_rc)"
[ "$sm90_rc" -eq 0 ] || die "compiling $src with -DFI_BENCH_SM90_TU=1 (fa3) failed (exit $sm90_rc)"
"$nvcc" -gencode arch=compute_90a,code=sm_90a -cudart static -o "$out" "$objs/main.o" \
  "$objs/sm90.o" "$@"
echo "build.sh: built $out" >&2
