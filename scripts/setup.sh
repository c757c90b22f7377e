#!/usr/bin/env bash
# Installs pagedattn's build dependencies from Debian packages (run as root, or with sudo
# available). The CUDA toolkit is optional: with nvcc on PATH (or in /usr/local/cuda) the CUDA
# backend is built too.
set -euo pipefail

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
