#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer; any report fails the run
# (-fno-sanitize-recover=all). Builds into build-sanitize/ (Debug with -O1, no benchmarks).
#
#   scripts/sanitize.sh          the whole non-slow suite (ctest -LE slow: unit tests, the CLI checks
#                                with their hostile inputs, the recipe and config fuzzers), then the
#                                reader-facing tests of the slow-labelled test_train. 20+ minutes on
#                                2 cores the first time: run it after touching input handling (io/,
#                                train/, formats/, quant/recipe) or the kernels.
#   scripts/sanitize.sh --quick  what .ci/run runs (about 7 minutes on 2 cores from nothing): the
#                                library, the CLI and the tests that hold every parser fuzzer and the
#                                hostile-input cases — recipe JSON, TOML config, safetensors, GGUF and
#                                checkpoints, corpus, CLI numbers, empty and mismatched tensors,
#                                block/MX quantisation, the format kernels' edge carries, the fast
#                                kernels against their references, the optimizer-state codecs and
#                                AdamW's encoded step.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-full}"
case "$mode" in
  full | --quick) ;;
  *) echo "usage: scripts/sanitize.sh [--quick]" >&2; exit 2 ;;
esac
scripts/setup.sh
jobs="${JOBS:-$(nproc)}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DSCALIFY_BUILD_BENCH=OFF > /dev/null
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=abort_on_error=1
# The parsers' and readers' tests of the slow-labelled test_train. The killed-write test ends a
# child with SIGKILL on purpose, so ASan's leak check does not apply.
train_readers='SafeTensors.*:Checkpoint.*:Config.*:Trainer.BadDataAndConfigAreClearErrorsBeforeAnyRunFolder'

if [[ "$mode" == --quick ]]; then
  quick_tests=(test_recipe test_run_folder test_tensor test_block test_quantizer test_bulk_kernels test_snr test_autograd test_loss_scaler test_kernels_vs_reference test_ptq test_data_parallel test_tokenize test_tokenize_json test_hub test_gguf test_hostile_json test_implausible_loss test_state_format test_adamw_state test_state_layout test_recipe_state)
  cmake --build build-sanitize -j"$jobs" --target scalify_cli test_train "${quick_tests[@]}"
  for t in "${quick_tests[@]}"; do
    echo "== sanitizers: $t"
    build-sanitize/tests/"$t" --gtest_brief=1
  done
  # The optimizer's fused pass has an AVX2 form beside the AVX-512 one the native run takes.
  if grep -qw avx512f /proc/cpuinfo; then
    echo "== sanitizers: test_adamw_state, SCALIFY_ISA=avx2"
    SCALIFY_ISA=avx2 build-sanitize/tests/test_adamw_state --gtest_brief=1
  fi
  echo "== sanitizers: cli"
  tests/cli_test.sh build-sanitize/apps/scalify/scalify
else
  cmake --build build-sanitize -j"$jobs"
  # install_and_find_package links an uninstrumented consumer against the instrumented library
  # (undefined __asan_* symbols): a build-setup mismatch, not a finding, so it is left out here.
  ctest --test-dir build-sanitize -LE slow -E '^install_and_find_package$' --output-on-failure -j"$jobs"
fi
echo "== sanitizers: test_train readers"
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 build-sanitize/tests/test_train --gtest_brief=1 --gtest_filter="$train_readers"
echo "sanitizers: clean"
