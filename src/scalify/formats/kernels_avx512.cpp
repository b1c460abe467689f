// AVX-512 build of the SIMD kernels (compiled with -mavx512f/bw/vl/dq; used only on CPUs with them).
#define SCALIFY_SIMD_WIDTH 16
#define SCALIFY_SIMD_NS avx512
#define SCALIFY_SIMD_NAME "avx512"
#include "kernels_simd.inc"
