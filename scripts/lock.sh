#!/usr/bin/env bash
# `make lock`: regenerate the hashed lock files in requirements/ from pyproject.toml with pip-compile.
#   requirements/serve.txt  the service on CPU (dependencies + the `cpu` and `redis` extras): `make serve`, the CPU image
#   requirements/gpu.txt    the service on CUDA (dependencies + the `gpu` and `redis` extras): the GPU image
#   requirements/dev.txt    every extra but `gpu` (dev, train, cpu and any extra added later): `make test`, CI
# Every line has its sha256 hashes, except torch: it is left out of dev.txt (--unsafe-package) and installed
# by its exact version from pyproject.toml (TORCH_REQUIREMENT in the Makefile), because the right torch
# wheel depends on the machine (CPU or CUDA build), and PyPI's wheels are the multi-GB CUDA builds.
# Usage: scripts/lock.sh PIP_COMPILE [more pip-compile options, e.g. --upgrade]
set -euo pipefail
cd "$(dirname "$0")/.."
pip_compile=$1
shift
python=$(dirname "$pip_compile")/python
test_extras=$("$python" - <<'PY'
import tomllib

extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(" ".join(f"--extra={name}" for name in sorted(extras) if name != "gpu"))
PY
)
compile() {
  local output=$1
  shift
  echo "==> $output ($*)"
  "$pip_compile" --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links \
    --output-file="$output" "$@" pyproject.toml
}
mkdir -p requirements
compile requirements/serve.txt --extra=cpu --extra=redis "$@"
compile requirements/gpu.txt --extra=gpu --extra=redis "$@"
# shellcheck disable=SC2086  # one --extra=NAME word per extra
compile requirements/dev.txt $test_extras --unsafe-package=torch "$@"
if grep -q '^onnxruntime-gpu==' requirements/serve.txt requirements/dev.txt \
  || grep -q '^onnxruntime==' requirements/gpu.txt; then
  echo "lock: onnxruntime and onnxruntime-gpu must never be in the same lock file" >&2
  exit 1
fi
