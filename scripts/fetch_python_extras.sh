#!/usr/bin/env bash
# Downloads the wheels of the Python package's optional integrations (pyproject.toml's
# `transformers` extra: Transformers at its pinned release and PyTorch, with their dependencies)
# and the extra's requirements.txt into a folder, for scripts/test_python.sh to install without
# the network:
#   scripts/fetch_python_extras.sh DIR
# The download is network-bound, so CI runs it beside the C++ build.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/fetch_python_extras.sh DIR}
python=${PYTHON:-python3}
extra=$("$python" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["project"]["optional-dependencies"]["transformers"]))
PY
)
mkdir -p "$dir"
# The extra's requirements beside its wheels: what scripts/test_python.sh installs from them.
# shellcheck disable=SC2086  # the requirements are one word each
printf '%s\n' $extra > "$dir/requirements.txt"
"$python" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$dir" \
  -r "$dir/requirements.txt"
echo "fetch_python_extras: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
