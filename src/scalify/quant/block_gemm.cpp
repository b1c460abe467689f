#include "scalify/quant/block_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/gemm.hpp"

namespace scalify::quant {

namespace {

// The codes' decoded values, unscaled: as f32, or as bf16 bit patterns.
template <class T>
std::vector<T> decoded_codes(const BlockQuantized& q) {
  std::vector<T> out(q.rows * q.cols);
  if constexpr (std::is_same_v<T, float>)
    dequantize(q.codes, q.element, 1.0f, out);
  else
    codes_to_bf16(q.codes, q.element, out);
  return out;
}

// One operand's view along the reduction: its decoded codes, stored [outer, K] (K along each
// row: k_along_cols) or [K, outer], and its block scale for (outer index, K block).
template <class T>
struct Operand {
  const BlockQuantized& q;
  bool k_along_cols;  // stored [outer, K]: the K block is a column slice, gathered per block
  std::vector<T> codes;
  size_t block_k() const { return k_along_cols ? q.block.cols : q.block.rows; }
  float scale(size_t outer, size_t kb) const {
    return k_along_cols ? q.scales[(outer / q.block.rows) * q.scale_cols() + kb] : q.scales[kb * q.scale_cols() + outer / q.block.cols];
  }
  // The K block [k0, k0 + len) as a dense matrix in the stored orientation: a pointer into the
  // codes when K runs down the rows (or the block is all of K), else gathered into `slice`.
  const T* block(size_t k0, size_t len, std::vector<T>& slice) const {
    if (!k_along_cols) return codes.data() + k0 * q.cols;
    if (len == q.cols) return codes.data();
    slice.resize(q.rows * len);
    for (size_t r = 0; r < q.rows; ++r) std::memcpy(slice.data() + r * len, codes.data() + r * q.cols + k0, len * sizeof(T));
    return slice.data();
  }
};

// One K block's product of dense operands, on the code GEMM path's arithmetic.
void block_product(bool ta, bool tb, int64_t M, int64_t N, int64_t len, const uint16_t* a, const uint16_t* b, float* c) {
  gemm::gemm_bf16(ta, tb, M, N, len, a, b, c);
}
void block_product(bool ta, bool tb, int64_t M, int64_t N, int64_t len, const float* a, const float* b, float* c) {
  gemm::sgemm(ta, tb, M, N, len, a, ta ? M : len, b, tb ? len : N, 0.0f, c, N);
}

template <class T>
Tensor k_blocked_product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const BlockQuantized& a, const BlockQuantized& b) {
  Operand<T> A{a, !ta, decoded_codes<T>(a)}, B{b, tb, decoded_codes<T>(b)};
  const size_t L = A.block_k();
  if (K == 0) return Tensor::zeros({M, N});  // an empty sum
  Tensor c = Tensor::empty({M, N});          // the first K block assigns, the others add
  Tensor part = Tensor::empty({M, N});
  float* pc = c.data<float>();
  const float* pp = part.data<float>();
  std::vector<T> slice_a, slice_b;
  std::vector<float> col_scale(static_cast<size_t>(N));
  for (size_t k0 = 0, kb = 0; k0 < size_t(K); k0 += L, ++kb) {
    const size_t len = std::min(L, size_t(K) - k0);
    block_product(ta, tb, M, N, int64_t(len), A.block(k0, len, slice_a), B.block(k0, len, slice_b), part.data<float>());
    for (int64_t j = 0; j < N; ++j) col_scale[size_t(j)] = B.scale(size_t(j), kb);
      // C += (P * row scale) * column scale, in f32: one scale at a time, as decoding applies them,
      // so a product of two tiny scales cannot underflow first. A NaN block scale (a block holding
      // NaN or inf) makes its products NaN, as decoding it would.
#pragma omp parallel for if (M * N > platform::kParallelGrain)
    for (int64_t i = 0; i < M; ++i) {
      const float sa = A.scale(size_t(i), kb);
      float* ci = pc + i * N;
      const float* pi = pp + i * N;
      if (kb == 0) {
        for (int64_t j = 0; j < N; ++j) ci[j] = (pi[j] * sa) * col_scale[size_t(j)];
      } else {
        for (int64_t j = 0; j < N; ++j) ci[j] += (pi[j] * sa) * col_scale[size_t(j)];
      }
    }
  }
  // The operands' tensor scales (nvfp4's 1 / S) apply to the whole sum, one at a time (the GEMM's
  // alpha on hardware).
  if (a.tensor_scale != 1.0f || b.tensor_scale != 1.0f)
    for (int64_t i = 0; i < M * N; ++i) pc[i] = (pc[i] * a.tensor_scale) * b.tensor_scale;
  return c;
}

}  // namespace

Tensor block_scaled_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const BlockQuantized& a, const BlockQuantized& b) {
  const bool a_fits = ta ? (a.rows == size_t(K) && a.cols == size_t(M)) : (a.rows == size_t(M) && a.cols == size_t(K));
  const bool b_fits = tb ? (b.rows == size_t(N) && b.cols == size_t(K)) : (b.rows == size_t(K) && b.cols == size_t(N));
  if (!a_fits || !b_fits) throw Error("block_scaled_gemm: operand shapes do not match the product's dimensions");
  check_blocks(a, a.rows * a.cols, "block_scaled_gemm");
  check_blocks(b, b.rows * b.cols, "block_scaled_gemm");
  const size_t la = ta ? a.block.rows : a.block.cols, lb = tb ? b.block.cols : b.block.rows;  // block lengths along K
  if (la != lb || !codes_fit_bf16(a.element) || !codes_fit_bf16(b.element)) return Tensor();
  return gemm::code_gemm() == gemm::CodeGemm::onednn_bf16 ? k_blocked_product<uint16_t>(ta, tb, M, N, K, a, b)
                                                          : k_blocked_product<float>(ta, tb, M, N, K, a, b);
}

}  // namespace scalify::quant
