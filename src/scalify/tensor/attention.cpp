// Fused causal self-attention over a packed qkv tensor (ops.hpp: causal_attention). One pass per
// (batch, head), in parallel across them: the scores, the masked softmax and the mix never leave a
// T x T scratch, and the backward writes dq, dk, dv straight into one [B, T, 3D] gradient, where
// the composed ops would slice, permute, mask and scale through a dozen full-size temporaries.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/gemm.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/tensor/storage_rounding.hpp"
#include "scalify/tensor/vector_math.hpp"

namespace scalify::ops {

namespace {

// One GEMM of a (batch, head) pair: oneDNN for f32 (single-threaded inside the parallel loop),
// the f64 reference for f64 (gradient checks).
template <class T>
void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc, T alpha,
        T beta = T(0)) {
  if constexpr (std::is_same_v<T, float>) {
    gemm::sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, alpha);
  } else {
    gemm::gemm_reference(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, alpha);
  }
}

// Query rows go in blocks; a block's keys stop at its last row (the causal prefix), which skips
// the masked upper triangle: 5/8 of the full T x T products at T = 4 blocks.
constexpr int64_t kRowBlock = 64;

struct Dims {
  int64_t B, T, D, H, hd;
};

Dims check(const Tensor& qkv, int64_t heads, const char* op) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0 || heads < 1 || (qkv.size(2) / 3) % heads != 0)
    throw Error(std::string(op) + ": qkv must be [B, T, 3D] with D divisible by heads = " + std::to_string(heads) + ", got " +
                shape_str(qkv.shape()));
  if (is_integer(qkv.dtype())) throw Error(std::string(op).append(": qkv must be floating point, got ").append(dtype_name(qkv.dtype())));
  const int64_t D = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), D, heads, D / heads};
}

// Row i of probs: softmax over scores[0..i] (the causal prefix), zeros after it.
template <class T>
void causal_softmax_row(const T* s, T* p, int64_t i, int64_t T_) {
  const int64_t n = i + 1;
  T m = s[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, s[j]);
  double sum = 0;
  if constexpr (std::is_same_v<T, float>) {
    sum = vecmath::active().exp_shifted_sum(s, p, n, 1.0f, m);
  } else {
    for (int64_t j = 0; j < n; ++j) sum += p[j] = std::exp(s[j] - m);
  }
  const T inv = T(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
  std::fill(p + n, p + T_, T(0));
}

// f64 stays f64; every other floating format computes in f32.
Tensor compute_form(const Tensor& x) { return (x.dtype() == DType::f64 ? x : x.to(DType::f32)).contiguous(); }

// 16-bit float storage (SCALIFY's f16 activations) is read in place and widened one head at a
// time inside the parallel loop, instead of through an f32 copy of the whole qkv.
bool widens_per_head(const Tensor& x) { return is_rounded_storage(x.dtype()) && x.is_contiguous(); }

// One (batch, head)'s query, key and value rows: row t of q at q + t * ld, likewise k and v.
template <class T>
struct HeadRows {
  const T *q, *k, *v;
  int64_t ld;
};

// In place for a compute-form qkv; widened into `local` ([T, 3 hd]) for 16-bit storage.
template <class T>
HeadRows<T> head_rows(const Tensor& qkv, bool widen, const Dims& d, int64_t b, int64_t h, std::vector<T>& local) {
  const int64_t ld = 3 * d.D;
  if constexpr (std::is_same_v<T, float>) {
    if (widen) {
      const int64_t bytes = dtype_size(qkv.dtype());
      for (int64_t t = 0; t < d.T; ++t)
        for (int64_t part = 0; part < 3; ++part)
          widen_for_compute(qkv.raw_bytes() + ((b * d.T + t) * ld + part * d.D + h * d.hd) * bytes, d.hd, qkv.dtype(),
                            local.data() + t * 3 * d.hd + part * d.hd);
      return {local.data(), local.data() + d.hd, local.data() + 2 * d.hd, 3 * d.hd};
    }
  }
  const T* q = qkv.data<T>() + b * d.T * ld + h * d.hd;
  return {q, q + d.D, q + 2 * d.D, ld};
}

}  // namespace

AttentionResult causal_attention(const Tensor& qkv_in, int64_t heads, double score_mul) {
  const Dims d = check(qkv_in, heads, "causal_attention");
  const bool widen = widens_per_head(qkv_in);
  const Tensor qkv = widen ? qkv_in : compute_form(qkv_in);
  const DType dt = widen ? DType::f32 : qkv.dtype();
  AttentionResult r{Tensor::empty({d.B, d.T, d.D}, dt), Tensor::empty({d.B, d.H, d.T, d.T}, dt)};
  dispatch_compute(dt == DType::f64, [&]<class T>() {
    T* y = r.y.data<T>();
    T* probs = r.probs.data<T>();
    const T alpha = T(score_mul);
#pragma omp parallel
    {
      std::vector<T> scores(size_t(d.T * d.T)), local(widen ? size_t(3 * d.T * d.hd) : 0);
#pragma omp for
      for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
        const int64_t b = bh / d.H, h = bh % d.H;
        const HeadRows<T> x = head_rows<T>(qkv, widen, d, b, h, local);
        T* p = probs + bh * d.T * d.T;
        for (int64_t r0 = 0; r0 < d.T; r0 += kRowBlock) {
          const int64_t r1 = std::min(d.T, r0 + kRowBlock);  // rows [r0, r1) see keys [0, r1)
          mm<T>(false, true, r1 - r0, r1, d.hd, x.q + r0 * x.ld, x.ld, x.k, x.ld, scores.data() + r0 * d.T, d.T, alpha);
          for (int64_t i = r0; i < r1; ++i) causal_softmax_row(scores.data() + i * d.T, p + i * d.T, i, d.T);
          mm<T>(false, false, r1 - r0, d.hd, r1, p + r0 * d.T, d.T, x.v, x.ld, y + (b * d.T + r0) * d.D + h * d.hd, d.D, T(1));
        }
      }
    }
    return 0;
  });
  return r;
}

Tensor causal_attention_backward(const Tensor& qkv_in, const Tensor& probs_in, const Tensor& grad_y_in, int64_t heads, double score_mul,
                                 double dv_mul) {
  const Dims d = check(qkv_in, heads, "causal_attention_backward");
  if (probs_in.shape() != Shape{d.B, d.H, d.T, d.T} || grad_y_in.shape() != Shape{d.B, d.T, d.D})
    throw Error("causal_attention_backward: probs " + shape_str(probs_in.shape()) + " or gradient " + shape_str(grad_y_in.shape()) +
                " do not match qkv " + shape_str(qkv_in.shape()));
  const bool widen = widens_per_head(qkv_in);
  const Tensor qkv = widen ? qkv_in : compute_form(qkv_in);
  const DType dt = widen ? DType::f32 : qkv.dtype();
  const Tensor probs = probs_in.to(dt).contiguous(), gy = grad_y_in.to(dt).contiguous();
  Tensor dqkv = Tensor::empty(qkv.shape(), dt);
  dispatch_compute(dt == DType::f64, [&]<class T>() {
    const T *P = probs.data<T>(), *G = gy.data<T>();
    T* dx = dqkv.data<T>();
    const T alpha = T(score_mul), alpha_v = T(dv_mul);
    const int64_t ld = 3 * d.D;
#pragma omp parallel
    {
      std::vector<T> dp(size_t(d.T * d.T)), local(widen ? size_t(3 * d.T * d.hd) : 0);
#pragma omp for
      for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
        const int64_t b = bh / d.H, h = bh % d.H;
        const HeadRows<T> x = head_rows<T>(qkv, widen, d, b, h, local);
        const T* p = P + bh * d.T * d.T;
        const T* g = G + b * d.T * d.D + h * d.hd;
        T* dq = dx + b * d.T * ld + h * d.hd;
        for (int64_t t = 0; t < d.T; ++t) {  // dk and dv accumulate over row blocks
          std::fill(dq + t * ld + d.D, dq + t * ld + d.D + d.hd, T(0));
          std::fill(dq + t * ld + 2 * d.D, dq + t * ld + 2 * d.D + d.hd, T(0));
        }
        for (int64_t r0 = 0; r0 < d.T; r0 += kRowBlock) {
          const int64_t r1 = std::min(d.T, r0 + kRowBlock), rb = r1 - r0;
          const T* pb = p + r0 * d.T;
          T* s = dp.data() + r0 * d.T;
          mm<T>(true, false, r1, d.hd, rb, pb, d.T, g + r0 * d.D, d.D, dq + 2 * d.D, ld, alpha_v, T(1));  // dv += P^T dy
          mm<T>(false, true, rb, r1, d.hd, g + r0 * d.D, d.D, x.v, x.ld, s, d.T, T(1));                   // dP = dy v^T
          for (int64_t i = r0; i < r1; ++i) {  // dS = P (dP - rowsum(P dP)) / sqrt(hd) on the causal prefix
            const T* pr = p + i * d.T;
            T* r = dp.data() + i * d.T;
            double dot = 0;
            for (int64_t j = 0; j <= i; ++j) dot += double(pr[j]) * double(r[j]);
            for (int64_t j = 0; j <= i; ++j) r[j] = alpha * pr[j] * (r[j] - T(dot));
            std::fill(r + i + 1, r + r1, T(0));
          }
          mm<T>(false, false, rb, d.hd, r1, s, d.T, x.k, x.ld, dq + r0 * ld, ld, T(1));               // dq = dS k
          mm<T>(true, false, r1, d.hd, rb, s, d.T, x.q + r0 * x.ld, x.ld, dq + d.D, ld, T(1), T(1));  // dk += dS^T q
        }
      }
    }
    return 0;
  });
  return dqkv;
}

}  // namespace scalify::ops
