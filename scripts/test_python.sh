#!/usr/bin/env bash
# The Python package's tests: scripts/build.sh (the CLI the tests run, and the library the package
# links: nothing to do when scripts/test.sh just built it), a fresh virtual environment (build/venv,
# Debian's python3), `pip install .[test,plot]` linking build/'s libscalify.a instead of compiling
# the library again (SCALIFY_LIBRARY_DIR, cmake/library_dir.cmake), CPU PyTorch for the DLPack
# and scalify.torch tests, transformers for the latter, mypy --strict on the installed package and
# the examples, then pytest.
# Run by scripts/test.sh after the C++ suite; works alone too.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
rm -rf build/venv
/usr/bin/python3 -m venv build/venv
build/venv/bin/pip install --quiet --upgrade pip
build/venv/bin/pip install --quiet --config-settings=cmake.define.SCALIFY_LIBRARY_DIR="$PWD/build" ".[test,plot]"
scripts/install_torch_cpu.sh build/venv  # the DLPack tests hand CPU torch tensors over without a copy
# scalify.torch on transformers' GPT-2, Llama and BERT, built from configs (no hub): ~7 s, no torch
# pulled in; accelerate for transformers' GGUF loader (the exported GGUF files are run through it)
build/venv/bin/pip install --quiet "transformers>=5" accelerate
echo "== mypy --strict: the installed package's stubs and wrappers, the examples"
build/venv/bin/mypy --cache-dir build/mypy_cache --strict -p scalify
build/venv/bin/mypy --cache-dir build/mypy_cache --strict examples/python
SCALIFY_CLI="$PWD/build/apps/scalify/scalify" build/venv/bin/python -m pytest -q python/tests
