#!/usr/bin/env bash
# The reader-facing tests under AddressSanitizer and UndefinedBehaviorSanitizer: the safetensors
# fuzz cases (truncations, byte flips, hostile headers), the killed checkpoint write, and the
# corpus's bad inputs. Any sanitizer report fails the run. Builds into build-sanitize/ (Debug
# with -O1; about 10 minutes on 2 cores the first time). Not part of .ci/run: run it after
# touching io/ or train/corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
cmake --build build-sanitize -j"$(nproc)" --target test_train
# The killed-write test ends a child with SIGKILL on purpose; ASan's leak check does not apply.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  build-sanitize/tests/test_train \
  --gtest_filter='SafeTensors.*:Checkpoint.*:Trainer.BadDataAndConfigAreClearErrorsBeforeAnyRunFolder'
echo "sanitizers: clean"
