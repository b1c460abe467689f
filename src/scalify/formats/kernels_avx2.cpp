// AVX2 build of the SIMD kernels (compiled with -mavx2 -mfma; used only on CPUs with them).
#define SCALIFY_SIMD_WIDTH 8
#define SCALIFY_SIMD_NS avx2
#define SCALIFY_SIMD_NAME "avx2"
#include "kernels_simd.inc"
