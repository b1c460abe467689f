#!/usr/bin/env bash
# The whole non-slow test suite (ctest -LE slow: unit tests, the CLI checks with their hostile
# inputs, the recipe and config fuzzers) under AddressSanitizer and UndefinedBehaviorSanitizer,
# then the reader-facing tests of the slow-labelled test_train: the safetensors fuzz cases, the
# killed checkpoint write, the corpus's bad inputs and the config fuzzer. Any sanitizer report
# fails the run (-fno-sanitize-recover=all). Builds into build-sanitize/ (Debug with -O1, no
# benchmarks; 20+ minutes on 2 cores the first time). Not part of .ci/run: run it after touching
# input handling (io/, train/, formats/, quant/recipe) or the kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs="${JOBS:-$(nproc)}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DSCALIFY_BUILD_BENCH=OFF > /dev/null
cmake --build build-sanitize -j"$jobs"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# install_and_find_package links an uninstrumented consumer against the instrumented library
# (undefined __asan_* symbols): a build-setup mismatch, not a finding, so it is left out here.
ASAN_OPTIONS=abort_on_error=1 ctest --test-dir build-sanitize -LE slow -E '^install_and_find_package$' \
  --output-on-failure -j"$jobs"
# The killed-write test ends a child with SIGKILL on purpose; ASan's leak check does not apply.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 build-sanitize/tests/test_train \
  --gtest_filter='SafeTensors.*:Checkpoint.*:Config.*:Trainer.BadDataAndConfigAreClearErrorsBeforeAnyRunFolder'
echo "sanitizers: clean"
