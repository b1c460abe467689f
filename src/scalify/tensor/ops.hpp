#pragma once
#include <string_view>
// Tensor operations (no autograd): the kernels every model runs on. Inputs of any dtype and
// layout; compute in f64 when any input is f64, else in f32; outputs are f64 or f32. Kernels with
// a `store_as` parameter write an f32 result straight into f16 or bf16 storage when asked
// (rounded as storage_rounding.hpp says, chunk by chunk: no f32 output is written). Shape errors
// throw scalify::Error naming the op and the shapes.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify::ops {

// ---- elementwise ----
enum class Unary : uint8_t {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  abs,
  relu,
  gelu_tanh,
  gelu_erf,
  silu,
  sigmoid,
  tanh,
  square,
};
// out = out_mul * op(in_mul * x): scalar factors fold into the one pass (scale propagation).
Tensor unary(Unary op, const Tensor& x, double in_mul = 1.0, double out_mul = 1.0, DType store_as = DType::f32);
// grad * d op(x)/dx at x = x_mul * x_data, given y = op(x) where the formula needs it
// (derivative_uses_output; y may be undefined otherwise).
bool derivative_uses_output(Unary op);
Tensor unary_backward(Unary op, const Tensor& x_data, const Tensor& y, const Tensor& grad, double x_mul = 1.0, DType store_as = DType::f32);
const char* unary_name(Unary op);
Unary parse_unary(std::string_view name);  // the op unary_name names; scalify::Error listing the names otherwise

// maximum/minimum: elementwise, NaN-propagating; max_picks_a / min_picks_a: 1 where that
// extremum takes a (a >= b / a <= b, or a is NaN), else 0 (their gradients' routing).
enum class Binary : uint8_t { add, sub, mul, div, maximum, minimum, max_picks_a, min_picks_a };
// op(a_mul * a, b_mul * b) with numpy broadcasting.
Tensor binary(Binary op, const Tensor& a, const Tensor& b, double a_mul = 1.0, double b_mul = 1.0, DType store_as = DType::f32);
inline Tensor add(const Tensor& a, const Tensor& b) { return binary(Binary::add, a, b); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(Binary::sub, a, b); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(Binary::mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(Binary::div, a, b); }
inline Tensor maximum(const Tensor& a, const Tensor& b) { return binary(Binary::maximum, a, b); }
inline Tensor minimum(const Tensor& a, const Tensor& b) { return binary(Binary::minimum, a, b); }
Tensor scale_shift(const Tensor& x, double mul, double add, DType store_as = DType::f32);  // x * mul + add
Tensor pow_scalar(const Tensor& x, double p);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // cond != 0 ? a : b
// Reduce a (broadcast) gradient back to `shape` by summing the broadcast dimensions.
Tensor sum_to(const Tensor& g, const Shape& shape);
// The dimensions of `from` that broadcasting `to` up to `from` created or stretched.
std::vector<int> broadcast_dims(const Shape& from, const Shape& to);

// ---- reductions ----
Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);  // {} = all
Tensor mean(const Tensor& x, const std::vector<int>& dims, bool keepdim = false);
// Sum of x^2 over every element, in f64 (gradient norms, RMS statistics): the same result on
// any thread count.
double sum_squares(const Tensor& x);
double sum_squares(std::span<const float> x);  // one span, on the calling thread
// Max over one dimension: values and the index of the (first) maximum, as i64.
std::pair<Tensor, Tensor> max(const Tensor& x, int dim, bool keepdim = false);

// ---- linear algebra ----
// a [..., M, K] @ b [..., K, N] with batch broadcasting; a 1-D operand is not supported.
Tensor matmul(const Tensor& a, const Tensor& b, double alpha = 1.0);  // alpha * (a @ b)

// ---- neural-network kernels (over the last dimension unless a dim is given) ----
Tensor softmax(const Tensor& x, int dim = -1, double in_mul = 1.0);  // softmax(in_mul * x)
Tensor log_softmax(const Tensor& x, int dim = -1, double in_mul = 1.0);
Tensor softmax_backward(const Tensor& y, const Tensor& grad, int dim = -1);
Tensor log_softmax_backward(const Tensor& y, const Tensor& grad, int dim = -1);

// Causal multi-head self-attention on a packed projection qkv [B, T, 3D] (queries, keys, values
// side by side, heads contiguous in each): y [B, T, D] = softmax(mask(score_mul q k^T)) v per head,
// and the probabilities [B, heads, T, T] the backward needs. score_mul is 1/sqrt(D/heads) for
// plain values (s^2/sqrt(D/heads) for data with scale s). f32 or f64 (other formats decode to f32).
struct AttentionResult {
  Tensor y, probs;
};
AttentionResult causal_attention(const Tensor& qkv, int64_t heads, double score_mul);
// d qkv from dy: dv = dv_mul P^T dy, and dq, dk through the softmax with `score_mul` in place of
// the forward's (a scaled caller moves powers of two between the parts and the gradient's scale).
Tensor causal_attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& grad_y, int64_t heads, double score_mul,
                                 double dv_mul = 1.0);

struct NormResult {
  Tensor y, xhat, rstd;  // rstd: 1 / sqrt(var + eps) per row
};
NormResult layer_norm(const Tensor& x, double eps);  // no affine
NormResult rms_norm(const Tensor& x, double eps);    // no affine
Tensor layer_norm_backward(const NormResult& r, const Tensor& grad_xhat);
Tensor rms_norm_backward(const NormResult& r, const Tensor& grad_xhat);
// Normalisation with its affine fused into the row loop: y = xhat * (weight_mul w) + bias_mul b
// (bias optional), one pass per row instead of three elementwise ops. r.xhat stays available for
// the weight's gradient.
struct Affine {
  Tensor weight, bias;  // [D]
  double weight_mul = 1, bias_mul = 1;
};
NormResult norm_affine(const Tensor& x, double eps, bool center, const Affine& a, DType store_as = DType::f32);  // y in store_as
// dx from dy: the norm backward of dy * (weight_mul w), formed per row.
Tensor norm_affine_backward(const NormResult& r, const Tensor& grad_y, bool center, const Tensor& weight, double weight_mul,
                            DType store_as = DType::f32);

Tensor embedding(const Tensor& weight, const Tensor& ids);                        // weight [V, D], ids int: [..., D]
Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t vocab);  // scatter-add
// Mean cross-entropy of logits [N, C] against integer targets [N].
// Of in_mul * logits (a scaled tensor's data and scale, which need not be folded into an f32 first).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double in_mul = 1.0);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, double grad, double in_mul = 1.0);

Tensor concat(const std::vector<Tensor>& xs, int dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);
// Keep mask (1/(1-p) where kept, 0 where dropped) from a counter-based seed: reproducible.
Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, DType dtype = DType::f32);
// [T, T] mask: 1 where key position <= query position, else 0.
Tensor causal_mask(int64_t T);

}  // namespace scalify::ops
