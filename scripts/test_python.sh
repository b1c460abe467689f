#!/usr/bin/env bash
# The Python package's tests: a fresh virtual environment (build/venv, Debian's python3), `pip
# install .[test]` from the checkout (nanobind and scikit-build-core from PyPI build the extension
# against the Debian C++ dependencies), CPU PyTorch for the DLPack tests, then pytest. Run by scripts/test.sh after the C++ suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
rm -rf build/venv
/usr/bin/python3 -m venv build/venv
build/venv/bin/pip install --quiet --upgrade pip
build/venv/bin/pip install --quiet ".[test]"
scripts/install_torch_cpu.sh build/venv  # the DLPack tests hand CPU torch tensors over without a copy
SCALIFY_CLI="$PWD/build/apps/scalify/scalify" build/venv/bin/python -m pytest -q python/tests
