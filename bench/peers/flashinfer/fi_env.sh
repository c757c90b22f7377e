# shellcheck shell=bash
# Sourced by build.sh and build_mla.sh: finds nvcc, makes FlashInfer 0.7.2's headers available and
# sets the nvcc flags FlashInfer's JIT builds its sm90a kernels with. Not run on its own.
#
# Environment (see README.md):
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
#
# Sets: fi_root (the repository root), nvcc, cu_major, cu_minor, FI_DATA, and the array fi_flags;
# defines die().

FI_VERSION=0.7.2.post1
FI_WHEEL_SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
fi_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
fi_prog=$(basename "$0")
die() { echo "$fi_prog: $*" >&2; exit 1; }

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || die "nvcc not found (put it on PATH or set NVCC)"
ver=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n 1) ||
  die "$nvcc --version failed"
[ -n "$ver" ] || die "cannot read the CUDA version from $nvcc --version"
cu_major=${ver% *} cu_minor=${ver#* }
if [ "$cu_major" -lt 12 ] || { [ "$cu_major" -eq 12 ] && [ "$cu_minor" -lt 8 ]; }; then
  die "needs CUDA 12.8 or newer, $nvcc is $cu_major.$cu_minor"
fi

fi_stage=
fetch_headers() {  # $1: the folder to create, holding flashinfer/data/...
  local dest=$1 whl sum
  mkdir -p "$(dirname "$dest")"
  fi_stage=$(mktemp -d "$dest.tmp.XXXXXX")
  trap 'rm -rf "$fi_stage"' EXIT
  if [ -n "${FI_WHEEL:-}" ]; then
    whl=$FI_WHEEL
  else
    python3 -m pip --version > /dev/null 2>&1 ||
      die "python3 -m pip is not available: install pip, or download" \
        "flashinfer_python-$FI_VERSION-py3-none-any.whl and set FI_WHEEL to it"
    echo "$fi_prog: downloading flashinfer-python==$FI_VERSION from PyPI" >&2
    # --python-version: the wheel needs Python >= 3.10 to install, not to read its headers
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
      --disable-pip-version-check -q -d "$fi_stage/wheel" "flashinfer-python==$FI_VERSION" >&2
    whl=$(echo "$fi_stage"/wheel/flashinfer_python-*.whl)
  fi
  [ -f "$whl" ] || die "no wheel at $whl"
  sum=$(python3 -c 'import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$whl")
  [ "$sum" = "$FI_WHEEL_SHA256" ] || die "$whl: sha256 $sum, expected $FI_WHEEL_SHA256"
  python3 - "$whl" "$fi_stage/tree" "$fi_prog" flashinfer/data/include/ \
    flashinfer/data/cutlass/include/ flashinfer/data/cutlass/tools/util/include/ \
    flashinfer/data/cccl/ << 'PY'
import sys, zipfile
whl, dest, prog, keep = sys.argv[1], sys.argv[2], sys.argv[3], tuple(sys.argv[4:])
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith(keep) and not n.endswith("/")]
    for k in keep:
        if not any(n.startswith(k) for n in names):
            sys.exit(f"{whl}: nothing under {k}")
    for n in names:
        z.extract(n, dest)
print(f"{prog}: unpacked {len(names)} header files", file=sys.stderr)
PY
  touch "$fi_stage/tree/.complete"
  # One rename publishes the whole tree, so a concurrent build sees all of it or none.
  [ -f "$dest/.complete" ] || rm -rf "$dest"
  mv -T "$fi_stage/tree" "$dest" 2> /dev/null || [ -f "$dest/.complete" ] || die "cannot create $dest"
  rm -rf "$fi_stage"
  trap - EXIT
}

if [ -z "${FI_DATA:-}" ]; then
  fi_deps=${FI_DEPS:-$fi_root/.deps}/flashinfer-$FI_VERSION
  [ -f "$fi_deps/.complete" ] || fetch_headers "$fi_deps"
  FI_DATA=$fi_deps/flashinfer/data
fi
for d in include/flashinfer cutlass/include/cutlass cutlass/tools/util/include/cutlass/util \
  cccl/libcudacxx/include cccl/cub cccl/thrust; do
  [ -d "$FI_DATA/$d" ] || die "FlashInfer headers: $FI_DATA/$d is missing"
done

# Flags as FlashInfer's JIT builds these kernels (flashinfer/jit/core.py gen_jit_spec and
# cpp_ext.py build_cuda_cflags for sm90a). The wheel's vendored CCCL goes ahead of the toolkit's:
# fastdiv.cuh needs cuda::fast_mod_div, which the CCCL of CUDA 13.0 lacks.
# shellcheck disable=SC2034,SC2054  # used by the sourcing script; -gencode's argument has commas
fi_flags=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
  -use_fast_math -static-global-template-stub=false -DNDEBUG
  -DFLASHINFER_ENABLE_F16 -DFLASHINFER_ENABLE_BF16 -DFLASHINFER_ENABLE_FP8_E4M3
  -DFLASHINFER_ENABLE_FP8_E5M2 -DFLASHINFER_ENABLE_FP8_E8M0 -DFLASHINFER_ENABLE_FP4_E2M1
  -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  -I"$FI_DATA/cccl/cub" -I"$FI_DATA/cccl/libcudacxx/include" -I"$FI_DATA/cccl/thrust"
  -I"$FI_DATA/include" -I"$FI_DATA/cutlass/include" -I"$FI_DATA/cutlass/tools/util/include")
