#!/usr/bin/env bash
# The whole test suite: build, then run every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 600
