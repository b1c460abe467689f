#pragma once
// The GEMM of two block-quantised operands on their codes: per block of the reduction dimension a
// GEMM of the codes (exact products, f32 accumulation within the block), each partial product
// then multiplied by its row's and column's block scales and summed in f32. This is how blockwise
// FP8 GEMMs apply per-block scales (DeepSeek-V3's 128-element K blocks, TransformerEngine's
// blockwise recipe): the codes go to bf16 dot products where the CPU has them even though the
// block scales (amax / 448) are not powers of two.
#include <cstdint>

#include "scalify/formats/block.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::quant {

// C [M, N] = op(A) op(B), op = transpose when ta / tb is set; A is stored [M, K] (or [K, M] when
// ta), B [K, N] (or [N, K] when tb), as gemm::gemm_bf16. An undefined tensor when the operands do
// not fit: their blocks differ in length along the reduction, or their element format has values
// that are not bf16 values (only one-byte float formats qualify: FP8, FP6, FP4). The block
// products take gemm::code_gemm()'s path: bf16 dot products where native, else sgemm on the codes
// decoded to f32 (their products are exact either way).
Tensor block_scaled_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const BlockQuantized& a, const BlockQuantized& b);

}  // namespace scalify::quant
