#!/usr/bin/env bash
# Installs pagedattn's build dependencies from Debian packages (run as root, or with sudo
# available). The CUDA toolkit is optional: with nvcc on PATH (or in /usr/local/cuda) the CUDA
# backend is built too, and NCCL is fetched for the NCCL communicator (see the end).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make libeigen3-dev libxsimd-dev libgtest-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all dependencies present"
fi

# NCCL for the NCCL communicator (pagedattn::nccl), when the CUDA backend will be built: the
# headers and libnccl.so.2 of the nvidia-nccl-cu13 wheel from PyPI, unpacked into .deps/nccl
# (CMake looks there; PAGEDATTN_NCCL=OFF skips this and the communicator).
nccl_version=2.28.9
nccl_dir=.deps/nccl/nvidia/nccl
if [ "${PAGEDATTN_NCCL:-AUTO}" != OFF ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } &&
   [ ! -f "$nccl_dir/lib/libnccl.so.2" ]; then
  echo "setup: fetching NCCL $nccl_version (the nvidia-nccl-cu13 wheel) into .deps/nccl"
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
       "nvidia-nccl-cu13==$nccl_version"; then
    python3 - "$tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/nvidia_nccl_cu13-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("nvidia/nccl/include/") or name == "nvidia/nccl/lib/libnccl.so.2":
            z.extract(name, ".deps/nccl")
PY
  else
    echo "setup: NCCL could not be fetched; building without the NCCL communicator"
  fi
  rm -rf "$tmp"
fi
