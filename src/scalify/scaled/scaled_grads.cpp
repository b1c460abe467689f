#include "scalify/scaled/scaled_grads.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "scalify/error.hpp"
#include "scalify/scaled/scale_rules.hpp"
#include "scalify/scaled/scaled_ops.hpp"

namespace scalify::scaled {

namespace {
// The represented value as a plain tensor (for derivative formulas that need it).
Tensor plain(const ScaledTensor& x) { return x.is_scaled() ? x.value() : x.data; }
bool one_normal_scale(const ScaledTensor& t) { return t.has_single_scale() && scale_kept_exactly(t.scalar_scale()); }
}  // namespace

std::vector<ScaledTensor> mul_backward(const ScaledTensor& x, const ScaledTensor& y, const ScaledTensor& g) {
  return {sum_to(mul(g, y), x.shape()), sum_to(mul(g, x), y.shape())};
}

std::vector<ScaledTensor> div_backward(const ScaledTensor& out, const ScaledTensor& y, const Shape& x_shape, const ScaledTensor& g) {
  const ScaledTensor gx = div(g, y);  // d(x/y)/dx = 1/y, d(x/y)/dy = -out/y
  return {sum_to(gx, x_shape), sum_to(mul_scalar(mul(gx, out), -1.0), y.shape())};
}

std::vector<ScaledTensor> matmul_backward(const ScaledTensor& x, const ScaledTensor& w, const ScaledTensor& g) {
  // dX = G W^T, dW = X^T G (transposed views go to the GEMM without copies), summed over
  // broadcast batch dimensions; each a scaled matmul with its own reduction size.
  const ScaledTensor dx = sum_to(matmul(g, transpose(w, -1, -2)), x.shape());
  if (w.shape().size() == 2 && x.shape().size() > 2 && (!x.is_scaled() || x.has_single_scale()) &&
      (!g.is_scaled() || g.has_single_scale())) {
    // A weight shared by every batch row (a linear layer): one GEMM reducing over all rows,
    // not one per batch index and then a sum over a [batch, K, N] temporary. Scaled, that is
    // the matmul rule over all rows' reduction.
    const int64_t K = x.shape().back(), N = g.shape().back(), rows = x.data.numel() / std::max<int64_t>(K, 1);
    const ScaledTensor x2 = reshape(x, {rows, K}), g2 = reshape(g, {rows, N});
    return {dx, matmul(transpose(x2, 0, 1), g2)};
  }
  return {dx, sum_to(matmul(transpose(x, -1, -2), g), w.shape())};
}

ScaledTensor sum_backward(const ScaledTensor& g, const Shape& shape, const std::vector<int>& dims, bool keepdim) {
  ScaledTensor gk = g;
  if (!keepdim) {  // put the reduced dimensions back as size 1, then broadcast
    Shape kept = shape;
    std::vector<int> d = dims;
    if (d.empty()) d.resize(shape.size()), std::iota(d.begin(), d.end(), 0);
    for (int i : d) kept[size_t(i < 0 ? i + int(shape.size()) : i)] = 1;
    gk = reshape(g, kept);
  }
  return with_grad_scale(gk, gk.data.expand(shape).contiguous());
}

ScaledTensor max_backward(const ScaledTensor& g, const Shape& shape, int dim, const Tensor& index) {
  // The gradient goes to the (first) maximum of each row: a 0/1 mask times g.
  const int d = dim < 0 ? dim + int(shape.size()) : dim;
  std::vector<float> pos(static_cast<size_t>(numel_of(shape)));
  const Shape strides = contiguous_strides(shape);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = float((int64_t(i) / strides[size_t(d)]) % shape[size_t(d)]);
  const Tensor hit = ops::sub(Tensor::from_vector(pos, shape), index.to(DType::f32));
  const Tensor is_max = ops::where(hit, Tensor::scalar(0.0), Tensor::scalar(1.0));
  return with_grad_scale(g, ops::mul(is_max, g.data.reshape(index.shape())));
}

std::vector<ScaledTensor> where_backward(const Tensor& cond, const ScaledTensor& g, const Shape& x_shape, const Shape& y_shape) {
  const ScaledTensor zero = any_scale_constant(Tensor::scalar(0.0, g.data.dtype() == DType::f64 ? DType::f64 : DType::f32));
  const ScaledTensor gz = g.is_scaled() ? zero : ScaledTensor(zero.data);
  return {sum_to(where(cond, g, gz), x_shape), sum_to(where(cond, gz, g), y_shape)};
}

ScaledTensor slice_backward(const ScaledTensor& g, const Shape& shape, int dim, int64_t start, int64_t end) {
  Tensor full = Tensor::zeros(shape, g.data.dtype() == DType::f64 ? DType::f64 : DType::f32);
  Tensor part = full.slice(dim, start, end);
  part.copy_(g.data);  // zeros elsewhere: any scale represents them, so g's scale is kept
  return with_grad_scale(g, full);
}

std::vector<ScaledTensor> concat_backward(const ScaledTensor& g, const std::vector<int64_t>& sizes, int dim) {
  std::vector<ScaledTensor> out;
  for (Tensor& part : ops::split(g.data, sizes, dim)) out.push_back(with_grad_scale(g, part));
  return out;
}

ScaledTensor unary_backward(ops::Unary op, const ScaledTensor& x_in, const ScaledTensor& y, const ScaledTensor& g, DType store_as) {
  using U = ops::Unary;
  const bool uses_output = ops::derivative_uses_output(op);
  if (uses_output && !y.data.defined()) throw Error(std::string("unary_backward: ") + ops::unary_name(op) + " needs its output");
  if (!uses_output && !x_in.data.defined()) throw Error(std::string("unary_backward: ") + ops::unary_name(op) + " needs its input");
  const ScaledTensor& x = x_in.data.defined() ? x_in : y;  // y's values are not read in x's place
  if (x.is_scaled() && (op == U::sqrt || op == U::rsqrt || op == U::square)) {
    // Powers propagate their scale (Y_s = X_s^p), so their derivatives do too: sqrt' = 1 / (2 y),
    // rsqrt' = -y^3 / 2, square' = 2 x, written with the scaled ops.
    switch (op) {
      case U::sqrt: return mul_scalar(div(g, y), 0.5);
      case U::rsqrt: return mul_scalar(mul(g, mul(y, unary(U::square, y))), -0.5);
      default: return mul_scalar(mul(g, x), 2.0);
    }
  }
  // grad * f'(x), linear in g: the gradient keeps g's scale; x's scale folds into the pass. It is
  // written in x's storage, which the gradient takes.
  const double xs = x.is_scaled() && !x.any_scale ? x.scalar_scale() : 1.0;
  const Tensor y_value = uses_output ? plain(y) : Tensor();
  return with_grad_scale(g, ops::unary_backward(op, x.data, y_value, g.data, xs, store_as));
}

ScaledTensor pow_backward(const ScaledTensor& x, double p, const ScaledTensor& g) {
  // Scaled: p x^(p-1) g through the power rule, so the local derivative's scale X_s^(p-1) lives
  // in the scale (folded in, it would leave f16 data's range at large scales).
  if (x.is_scaled() || g.is_scaled()) return mul(g, mul_scalar(pow_scalar(x, p - 1), p));
  const Tensor local = ops::scale_shift(ops::pow_scalar(x.data, p - 1), p, 0);
  return ScaledTensor(ops::mul(g.data, local));
}

ScaledTensor softmax_backward(const ScaledTensor& y, const ScaledTensor& g, int dim) {
  // The derivative is O(1/n): the forward rule's 1/N moves from the data into the scale.
  const ScaledTensor dx = with_grad_scale(g, ops::softmax_backward(plain(y), g.data, dim));
  return y.is_scaled() ? rebalance(dx, y.scalar_scale()) : dx;
}

ScaledTensor log_softmax_backward(const ScaledTensor& y, const ScaledTensor& g, int dim) {
  return with_grad_scale(g, ops::log_softmax_backward(plain(y), g.data, dim));
}

Norm norm(const ScaledTensor& x, double eps, bool center) {
  double scale = 1.0;
  const ops::NormResult r = normalise(x, eps, center, &scale);
  ScaledTensor y = x.is_scaled() ? ScaledTensor(r.y, 1.0f) : ScaledTensor(r.y);
  return {std::move(y), NormSaved{r.xhat, r.rstd, center, x.is_scaled(), scale, x.data.dtype()}};
}

ScaledTensor norm_backward(const NormSaved& saved, const ScaledTensor& g) {
  const ops::NormResult r{Tensor(), saved.xhat, saved.rstd};
  const Tensor d = saved.center ? ops::layer_norm_backward(r, g.data) : ops::rms_norm_backward(r, g.data);
  const double scale = saved.x_scale;
  if (!g.is_scaled()) return ScaledTensor(scale == 1.0 ? d : ops::scale_shift(d, 1.0 / scale, 0.0));
  return with_exact_scale(d, g.scalar_scale() / scale);
}

bool fuses_norm_affine(const ScaledTensor& x, const ScaledTensor& weight, const ScaledTensor& bias) {
  if (!weight.data.defined()) return false;
  const bool has_bias = bias.data.defined();
  const bool plain_all = !x.is_scaled() && !weight.is_scaled() && (!has_bias || !bias.is_scaled());
  const bool scaled_all = one_normal_scale(x) && one_normal_scale(weight) && (!has_bias || one_normal_scale(bias));
  return plain_all || scaled_all;
}

Norm norm_affine(const ScaledTensor& x, const ScaledTensor& weight, const ScaledTensor& bias, double eps, bool center, DType store_as) {
  if (!fuses_norm_affine(x, weight, bias))
    throw Error(std::string(center ? "layer_norm" : "rms_norm") +
                ": the fused affine needs a weight, and x, weight and bias all unscaled or all with one normal scale");
  const bool scaled = x.is_scaled(), has_bias = bias.data.defined();
  const double sx = scaled ? double(x.scalar_scale()) : 1.0, w_s = scaled ? double(weight.scalar_scale()) : 1.0;
  const double b_s = scaled && has_bias ? double(bias.scalar_scale()) : 0.0;
  // With a scaled bias, w xhat + b is a sum of two terms (the add rule); otherwise it keeps W_s.
  const rules::WeightedSum z = scaled && has_bias ? rules::weighted_sum(w_s, b_s) : rules::WeightedSum{float(w_s), 1.0, 0.0};
  const ops::Affine a{weight.data, has_bias ? bias.data : Tensor(), z.x_mul, scaled ? z.y_mul : 1.0};
  ops::NormResult r = ops::norm_affine(x.data, eps / (sx * sx), center, a, store_as);  // eps as normalise rescales it
  ScaledTensor y = scaled ? ScaledTensor(std::move(r.y), z.scale) : ScaledTensor(std::move(r.y));
  return {std::move(y), NormSaved{std::move(r.xhat), std::move(r.rstd), center, scaled, sx, x.data.dtype()}};
}

std::vector<ScaledTensor> norm_affine_backward(const NormSaved& saved, const ScaledTensor& g, const ScaledTensor& w, bool has_bias,
                                               DType store_as) {
  const ops::NormResult r{Tensor(), saved.xhat, saved.rstd};
  const double sx = saved.x_scale;
  // d xhat = g * w (scale G_s W_s), then the normalisation's backward (scale / X_s).
  ScaledTensor dx;
  if (!g.is_scaled() || one_normal_scale(g)) {
    const double g_scale = g.is_scaled() ? double(g.scalar_scale()) : 1.0, w_scale = saved.scaled ? double(w.scalar_scale()) : 1.0;
    const bool has_scale = g.is_scaled() || saved.scaled;
    // Written in x's storage, which the gradient takes, unless with_exact_scale must still
    // rescale the data (a scale beyond f32's normal range).
    const double dx_scale = g_scale * w_scale / sx;
    const bool final_data = !has_scale || scale_kept_exactly(dx_scale);
    const Tensor d = ops::norm_affine_backward(r, g.data, saved.center, w.data, 1.0, final_data ? store_as : DType::f32);
    dx = has_scale ? with_exact_scale(d, dx_scale) : ScaledTensor(d);
  } else {  // an ANY-scale gradient: the composition's mul and normalisation backward
    const ScaledTensor gw = mul(g, w);
    const Tensor d = saved.center ? ops::layer_norm_backward(r, gw.data) : ops::rms_norm_backward(r, gw.data);
    dx = gw.is_scaled() && !gw.any_scale ? with_exact_scale(d, gw.scalar_scale() / sx) : ScaledTensor(ops::scale_shift(d, 1.0 / sx, 0.0));
  }
  const ScaledTensor xhat = saved.scaled ? ScaledTensor(saved.xhat, 1.0f) : ScaledTensor(saved.xhat);
  std::vector<ScaledTensor> grads{dx, sum_to(mul(g, xhat), w.shape())};
  if (has_bias) grads.push_back(sum_to(g, w.shape()));  // the bias has the weight's shape [D]
  return grads;
}

ScaledTensor embedding_backward(const ScaledTensor& g, const Tensor& ids, int64_t vocab) {
  Shape rows = ids.shape();
  rows.push_back(g.data.dim() ? g.shape().back() : 0);
  if (g.shape() != rows)
    throw Error("embedding_backward: gradient " + shape_str(g.shape()) + " does not match ids " + shape_str(ids.shape()));
  return with_grad_scale(g, ops::embedding_backward(g.data, ids, vocab));
}

ScaledTensor cross_entropy_backward(const ScaledTensor& logits, const Tensor& targets, const ScaledTensor& g) {
  const double c = plain(g).item() / double(std::max<int64_t>(logits.shape()[0], 1));
  // One scale: data and scale go in separately (no folded f32 to overflow); per-block scales:
  // their represented values.
  const bool single = logits.has_single_scale();
  const Tensor p = ops::cross_entropy_backward(single ? logits.data : plain(logits), targets, double(logits.shape()[0]),
                                               single ? double(logits.scalar_scale()) : 1.0);
  if (!g.is_scaled()) return ScaledTensor(ops::scale_shift(p, c, 0.0));
  // softmax - onehot is O(1) per row: keep it as data, c as a power-of-two scale.
  if (c == 0) return any_scale_constant(ops::scale_shift(p, 0.0, 0.0));
  const float cs = pow2_round(std::fabs(c));
  return ScaledTensor(ops::scale_shift(p, c / cs, 0.0), cs);
}

namespace {
// qkv [B, T, 3D] with one scale or none, and D divisible by heads.
void check_qkv(const ScaledTensor& x, int64_t heads) {
  if (x.any_scale || (x.scale.defined() && x.scale.numel() != 1))
    throw Error("causal_self_attention: qkv needs one scale (or none); per-block or ANY scales compose matmul, causal_mask and softmax");
  if (x.shape().size() != 3 || heads < 1 || x.shape()[2] % (3 * heads) != 0)
    throw Error("causal_self_attention: qkv must be [B, T, 3D] with D divisible by heads = " + std::to_string(heads) + ", got " +
                shape_str(x.shape()));
}
// q k^T's multiplier: s^2 / sqrt(head dim) for data of scale s.
double score_multiplier(const ScaledTensor& qkv, int64_t heads) {
  const double scale = qkv.scale.defined() ? double(qkv.scalar_scale()) : 1.0;
  return scale * scale / std::sqrt(double(qkv.shape()[2] / (3 * heads)));
}
}  // namespace

Attention causal_attention(const ScaledTensor& x, int64_t heads) {
  check_qkv(x, heads);
  // Represented values s * X_d: scores s^2 (q_d k_d^T) / sqrt(hd). The output is a convex
  // combination of value rows, so it keeps their scale (Y_s = s, |Y_d| <= max |v_d|: it cannot
  // overflow).
  ops::AttentionResult r = ops::causal_attention(x.data, heads, score_multiplier(x, heads));
  ScaledTensor y = x.scale.defined() ? ScaledTensor(std::move(r.y), x.scalar_scale()) : ScaledTensor(std::move(r.y));
  return {std::move(y), std::move(r.probs)};
}

ScaledTensor causal_attention_backward(const ScaledTensor& x, const Tensor& probs, const ScaledTensor& g, int64_t heads) {
  check_qkv(x, heads);
  // dq and dk are s^2 times smaller than dv (they pass through the scores), and one scale holds
  // all three: the rule puts it between them.
  const double scale = x.scale.defined() ? double(x.scalar_scale()) : 1.0, score_mul = score_multiplier(x, heads);
  if (!g.has_single_scale() || scale == 1.0)
    return with_grad_scale(g, ops::causal_attention_backward(x.data, probs, g.data, heads, score_mul));
  const rules::AttentionGrad rule = rules::attention_grad(g.scalar_scale(), scale);
  const Tensor data = ops::causal_attention_backward(x.data, probs, g.data, heads, score_mul * rule.qk_mul, rule.v_mul);
  return with_exact_scale(data, rule.scale);
}

}  // namespace scalify::scaled
