#pragma once
// Scale propagation (SPEC §2): for every op f, f_scaled on (data, scale) pairs is mathematically
// equal to f, and keeps E[Y_d^2] ~ 1 when E[X_d^2] ~ 1, using only input scales and shapes
// (independent-Gaussian assumption), never tensor statistics. Every rule sits next to its op in
// scaled_ops.cpp and is listed in scale_rules() (the source of docs/SCALE_RULES.md).
// When no input is scaled, each op runs the plain kernel: results are bit-identical to the
// unscaled engine. Unscaled inputs mixed with scaled ones behave as scale 1.
#include <string_view>
#include <vector>

#include "scalify/scaled/scaled_tensor.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::scaled {

// `store_as` (add, sub, unary): the output data's storage, f16 or bf16 written by the kernel
// directly (ops.hpp), else f32.
ScaledTensor add(const ScaledTensor& x, const ScaledTensor& y, DType store_as = DType::f32);
ScaledTensor sub(const ScaledTensor& x, const ScaledTensor& y, DType store_as = DType::f32);
ScaledTensor mul(const ScaledTensor& x, const ScaledTensor& y);
ScaledTensor div(const ScaledTensor& x, const ScaledTensor& y);
ScaledTensor matmul(const ScaledTensor& x, const ScaledTensor& y);
ScaledTensor sum(const ScaledTensor& x, const std::vector<int>& dims, bool keepdim = false);
ScaledTensor mean(const ScaledTensor& x, const std::vector<int>& dims, bool keepdim = false);
ScaledTensor max(const ScaledTensor& x, int dim, bool keepdim = false);
ScaledTensor unary(ops::Unary op, const ScaledTensor& x, DType store_as = DType::f32);
ScaledTensor softmax(const ScaledTensor& x, int dim = -1);
ScaledTensor log_softmax(const ScaledTensor& x, int dim = -1);
ScaledTensor layer_norm(const ScaledTensor& x, double eps);  // no affine
ScaledTensor rms_norm(const ScaledTensor& x, double eps);    // no affine
// The normalisation of x's data with eps / X_s^2, so the result equals normalising the
// represented value exactly; also what the autograd backward needs.
// `scale_used` receives X_s (per-block scales rebased onto their largest, as every rule does).
ops::NormResult normalise(const ScaledTensor& x, double eps, bool center, double* scale_used = nullptr);
ScaledTensor where(const Tensor& cond, const ScaledTensor& x, const ScaledTensor& y);
// Elementwise maximum / minimum: as where, Z_s = max(X_s, Y_s) with both operands rebased.
ScaledTensor maximum(const ScaledTensor& x, const ScaledTensor& y);
ScaledTensor minimum(const ScaledTensor& x, const ScaledTensor& y);
ScaledTensor concat(const std::vector<ScaledTensor>& xs, int dim);
ScaledTensor embedding(const ScaledTensor& weight, const Tensor& ids);
ScaledTensor cross_entropy(const ScaledTensor& logits, const Tensor& targets);
ScaledTensor reshape(const ScaledTensor& x, const Shape& shape);
ScaledTensor transpose(const ScaledTensor& x, int d0, int d1);
ScaledTensor slice(const ScaledTensor& x, int dim, int64_t start, int64_t end);
ScaledTensor expand(const ScaledTensor& x, const Shape& shape);

// Scalar operands: c is split exactly into mantissa and exponent (a broadcast scalar).
ScaledTensor mul_scalar(const ScaledTensor& x, double c);
ScaledTensor add_scalar(const ScaledTensor& x, double c);
// Exponential moving average b m + (1 - b) x, 0 <= b <= 1 (the optimizer's moments): b is kept
// whole, Z_s = pow2_round_nearest(sqrt((b M_s)^2 + ((1 - b) X_s)^2)). Composing mul_scalar and add
// instead splits b = 0.999 into 1.998 * 2^-1 and rounds down, halving M_s at every step while M_d
// grows (a moment's f16 data overflows within ~20 steps); this rule is stationary for a
// stationary input (seed 000 §3.2.1 custom scale).
ScaledTensor ema(const ScaledTensor& m, const ScaledTensor& x, double b);
// x^p: scale folded in, output scale 1 (x^p is not scale-equivariant for non-integer p).
ScaledTensor pow_scalar(const ScaledTensor& x, double p);

// Backward-pass helpers.
// Sum a broadcast gradient back to `shape` (the sum rule over the broadcast dimensions).
ScaledTensor sum_to(const ScaledTensor& g, const Shape& shape);
// A map linear in the gradient: new data from g's data, g's scale kept.
ScaledTensor with_grad_scale(const ScaledTensor& g, Tensor data);

struct ScaleRule {
  std::string_view op, rule, why;
};
const std::vector<ScaleRule>& scale_rules();
std::string scale_rules_markdown();  // the table of docs/SCALE_RULES.md

}  // namespace scalify::scaled
