#!/usr/bin/env bash
# Builds and installs the Python package into a fresh virtual environment (`pip install .`) and
# runs its tests: NumPy only; the PyTorch, CUDA, JAX and CuPy tests skip themselves where those
# are missing. The build compiles the library like the C++ build does (the CUDA backend when
# nvcc is found); PAGEDATTN_CUDA=OFF in the environment skips the CUDA backend. EXTRAS_WHEELS,
# a folder filled by scripts/fetch_python_extras.sh, adds the `transformers` extra (Transformers
# and PyTorch) from it without the network, so the Transformers integration's tests run too.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" -m venv "$tmp/venv"
py="$tmp/venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check numpy pytest ml_dtypes
"$py" -m pip install -q --disable-pip-version-check .
if [ -n "${EXTRAS_WHEELS:-}" ]; then
  "$py" -m pip install -q --disable-pip-version-check --no-index --find-links "$EXTRAS_WHEELS" \
    -r "$EXTRAS_WHEELS/requirements.txt"
fi
"$py" -c 'import pagedattn; print("python: pagedattn", pagedattn.__version__, "built with CUDA:", pagedattn.built_with_cuda)'

status=0
"$py" -m pytest python/tests -q -p no:cacheprovider || status=$?
if [ "$status" -eq 5 ]; then
  echo "python: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
