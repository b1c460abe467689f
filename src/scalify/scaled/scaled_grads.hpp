#pragma once
// The backward rules, one per op: the gradients of the scaled ops (scaled_ops.hpp) on
// ScaledTensors, and the fused ops whose forward is more than one scaled op (normalisation with
// its affine, causal attention). The engine's autograd (autograd/functions.cpp) and scalify.torch's
// dispatch (python/src/scaled_grad_bindings.cpp) both call these, so a gradient's scale rule has
// one home. Each returns the gradients as computed; the caller rounds each into the storage of the
// value it is the gradient of (autograd/data_precision.hpp). The rules are listed in
// scale_rules() (docs/SCALE_RULES.md).
#include <cstdint>
#include <vector>

#include "scalify/scaled/scaled_tensor.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::scaled {

// Gradients summed back over the dimensions an operand was broadcast along (sum_to).
// mul: {g y, g x}. div (out = x / y): {g / y, -(g / y) out}.
std::vector<ScaledTensor> mul_backward(const ScaledTensor& x, const ScaledTensor& y, const ScaledTensor& g);
std::vector<ScaledTensor> div_backward(const ScaledTensor& out, const ScaledTensor& y, const Shape& x_shape, const ScaledTensor& g);
// x [..., M, K] @ w [..., K, N]: {g w^T, x^T g}, each a scaled matmul with its own reduction size;
// a 2-D weight shared by every batch row gets one GEMM over all rows.
std::vector<ScaledTensor> matmul_backward(const ScaledTensor& x, const ScaledTensor& w, const ScaledTensor& g);
// sum over dims of an x of `shape`: g broadcast back, its scale kept (as every gradient below).
ScaledTensor sum_backward(const ScaledTensor& g, const Shape& shape, const std::vector<int>& dims, bool keepdim);
// max over dim (keepdim or not) with the forward's index of the (first) maximum: g at the maximum, 0 elsewhere.
ScaledTensor max_backward(const ScaledTensor& g, const Shape& shape, int dim, const Tensor& index);
// where(cond, x, y): {g where cond else 0, 0 where cond else g}; the zeros are ANY-scaled.
std::vector<ScaledTensor> where_backward(const Tensor& cond, const ScaledTensor& g, const Shape& x_shape, const Shape& y_shape);
// slice [start, end) of dim from an x of `shape`: g in place, zeros elsewhere.
ScaledTensor slice_backward(const ScaledTensor& g, const Shape& shape, int dim, int64_t start, int64_t end);
// concat along dim of parts of these sizes: g split back.
std::vector<ScaledTensor> concat_backward(const ScaledTensor& g, const std::vector<int64_t>& sizes, int dim);

// grad * f'(x) for y = unary(op, x), in x's storage. Scaled powers (sqrt, rsqrt, square) go
// through the power and mul rules; every other map keeps g's scale. y is needed where the
// derivative is written with it (ops::derivative_uses_output: exp, sqrt, rsqrt, sigmoid, tanh),
// and then x may be undefined: y stands in for its shape and storage (its values are not read).
// relu's gradient from y equals the one from x (y > 0 exactly where x > 0, at the same scale).
// `store_as`: the storage the kernel writes the gradient's data in (autograd's kernel_store_as of
// x's storage).
ScaledTensor unary_backward(ops::Unary op, const ScaledTensor& x, const ScaledTensor& y, const ScaledTensor& g, DType store_as);
// d(x^p) = p x^(p-1) g.
ScaledTensor pow_backward(const ScaledTensor& x, double p, const ScaledTensor& g);

// From the forward's output y: softmax's gradient takes g_s / N (y's scale), log_softmax's g_s.
ScaledTensor softmax_backward(const ScaledTensor& y, const ScaledTensor& g, int dim = -1);
ScaledTensor log_softmax_backward(const ScaledTensor& y, const ScaledTensor& g, int dim = -1);

// What a normalisation's backward needs: the normalised data and 1 / sqrt(var + eps) per row of
// x's data (ops::NormResult without y), whether x was scaled and with what scale (X_s, or 1).
struct NormSaved {
  Tensor xhat, rstd;
  bool center = true, scaled = false;
  double x_scale = 1;
  DType x_storage = DType::f32;
};

// Normalisation without affine (layer_norm when center, else rms_norm): Y_s = 1 when x is scaled;
// the backward's scale is g_s / X_s.
struct Norm {
  ScaledTensor y;
  NormSaved saved;
};
Norm norm(const ScaledTensor& x, double eps, bool center);
ScaledTensor norm_backward(const NormSaved& saved, const ScaledTensor& g);

// The normalisation with its affine as one op (ops::norm_affine), y = xhat * w + b over the last
// dimension: the scales are the composition's (xhat scale 1, xhat w takes W_s, + b rebases both
// onto pow2_round(sqrt(W_s^2 + B_s^2))); only the intermediate roundings are gone. It applies when
// x, weight and bias (optional: undefined) are all unscaled or all carry one normal scale
// (fuses_norm_affine); otherwise the ops compose. `store_as`: the output's storage, as the
// kernel writes it.
bool fuses_norm_affine(const ScaledTensor& x, const ScaledTensor& weight, const ScaledTensor& bias);
Norm norm_affine(const ScaledTensor& x, const ScaledTensor& weight, const ScaledTensor& bias, double eps, bool center,
                 DType store_as = DType::f32);
// {dx, dweight} and dbias when has_bias: d xhat = g w (scale G_s W_s), then the normalisation's
// backward (scale / X_s); dx in x's storage where its scale needs no rescale.
// `store_as`: the storage the kernel writes dx's data in (kernel_store_as of x's storage).
std::vector<ScaledTensor> norm_affine_backward(const NormSaved& saved, const ScaledTensor& g, const ScaledTensor& weight, bool has_bias,
                                               DType store_as);

// embedding: the rows' gradients scattered-added into [vocab, D], g's scale kept.
ScaledTensor embedding_backward(const ScaledTensor& g, const Tensor& ids, int64_t vocab);
// Mean cross-entropy's gradient for the loss's gradient g (a single value): softmax - onehot per
// row is O(1) data, c = g / rows goes into a power-of-two scale.
ScaledTensor cross_entropy_backward(const ScaledTensor& logits, const Tensor& targets, const ScaledTensor& g);

// Fused causal multi-head attention on packed qkv [B, T, 3D] with one scale s (or none): Y_s = s;
// probs [B, heads, T, T] is what the backward needs. The backward's scale is g_s s
// (rules::attention_grad).
struct Attention {
  ScaledTensor y;
  Tensor probs;
};
Attention causal_attention(const ScaledTensor& qkv, int64_t heads);
ScaledTensor causal_attention_backward(const ScaledTensor& qkv, const Tensor& probs, const ScaledTensor& g, int64_t heads);

}  // namespace scalify::scaled
