#pragma once
// The random Hadamard transform NVFP4 applies to the operands of the weight-gradient GEMM
// (TransformerEngine; arXiv 2509.25149): each 16 consecutive rows of x [rows, cols] (the rows run
// along that GEMM's reduction, the tokens) become (1/4) H16 D times themselves, H16 the Sylvester
// Hadamard matrix (entries ±1, H16 H16^T = 16 I) and D a fixed random ±1 diagonal. (1/4) H16 D is
// orthogonal, so a GEMM of two operands transformed alike equals the plain GEMM up to rounding,
// while an outlier spreads over its 16 rows before the cast. A tail of fewer than 16 rows is left
// as it is (both operands alike: the product is unchanged).
#include <array>

#include "scalify/scaled/scaled_tensor.hpp"

namespace scalify::quant {

// H16[i][j] = (-1)^popcount(i & j).
constexpr int hadamard16_entry(int i, int j) { return __builtin_popcount(unsigned(i & j)) % 2 ? -1 : 1; }
// D: 16 signs drawn once at random (fixed, so every run and checkpoint agrees).
constexpr std::array<int, 16> kHadamardSigns = {1, -1, 1, 1, -1, 1, -1, -1, 1, 1, -1, -1, -1, 1, 1, -1};

// The transform of a 2-D tensor's rows, computed in f32 (the data of a scaled tensor, whose scale
// it keeps: the map is orthogonal).
ScaledTensor hadamard16_rows(const ScaledTensor& x);

}  // namespace scalify::quant
