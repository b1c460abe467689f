#include "scalify/scaled/scaled_ops.hpp"

#include "scalify/scaled/scale_rules.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "scalify/error.hpp"

namespace scalify::scaled {

namespace {

bool any_scaled(std::initializer_list<const ScaledTensor*> xs) {
  for (const ScaledTensor* x : xs)
    if (x->is_scaled()) return true;
  return false;
}
// A tensor times a power of two: exact (unless it leaves the f32 range).
Tensor times(const Tensor& t, double s) { return s == 1.0 ? t : ops::scale_shift(t, s, 0.0); }
// The represented value (data * scale) for rules that fold the scale in.
Tensor folded(const ScaledTensor& x) { return x.any_scale ? x.data : times(x.data, x.scalar_scale()); }

// Per-block (non-scalar) scales enter the rules rebased onto their largest block scale, which is
// a power of two: data * (block scale / max scale) is exact and no statistic of the data is used.
ScaledTensor uniform(const ScaledTensor& x) {
  if (!x.scale.defined() || x.scale.numel() == 1) return x;
  const double top = ops::max(x.scale.reshape({-1}), 0).first.item();
  return ScaledTensor(ops::mul(x.data, ops::scale_shift(x.scale, 1.0 / top, 0.0)), float(top));
}

}  // namespace

// add/sub: Z_s = pow2_round(sqrt(X_s^2 + Y_s^2)); Z_d = (X_s/Z_s) X_d ± (Y_s/Z_s) Y_d.
// An ANY operand takes the other's scale.
namespace {
ScaledTensor add_sub(const ScaledTensor& x_in, const ScaledTensor& y_in, ops::Binary op, DType store_as) {
  const ScaledTensor x = uniform(x_in);
  const ScaledTensor y = uniform(y_in);
  if (!any_scaled({&x, &y})) return ScaledTensor(ops::binary(op, x.data, y.data, 1.0, 1.0, store_as));
  if (x.any_scale && y.any_scale) return any_scale_constant(ops::binary(op, x.data, y.data, 1.0, 1.0, store_as));
  const double xs = x.scalar_scale(), ys = y.scalar_scale();
  if (x.any_scale || y.any_scale)  // an ANY operand takes the other's scale
    return ScaledTensor(ops::binary(op, x.data, y.data, 1.0, 1.0, store_as), float(x.any_scale ? ys : xs));
  // The rebasing factors fold into the one elementwise pass.
  const rules::WeightedSum z = rules::weighted_sum(xs, ys);
  return ScaledTensor(ops::binary(op, x.data, y.data, z.x_mul, z.y_mul, store_as), z.scale);
}
}  // namespace
ScaledTensor add(const ScaledTensor& x, const ScaledTensor& y, DType store_as) { return add_sub(x, y, ops::Binary::add, store_as); }
ScaledTensor sub(const ScaledTensor& x, const ScaledTensor& y, DType store_as) { return add_sub(x, y, ops::Binary::sub, store_as); }

ScaledTensor ema(const ScaledTensor& m_in, const ScaledTensor& x_in, double b) {
  if (!(b >= 0 && b <= 1)) throw Error("ema: decay must be in [0, 1], got " + std::to_string(b));
  const ScaledTensor m = uniform(m_in);
  const ScaledTensor x = uniform(x_in);
  const Tensor plain = ops::binary(ops::Binary::add, m.data, x.data, b, 1 - b);
  if (!any_scaled({&m, &x})) return ScaledTensor(plain);
  if (m.any_scale && x.any_scale) return any_scale_constant(plain);
  const rules::WeightedSum z = rules::ema(m.any_scale ? 0 : m.scalar_scale(), x.any_scale ? 0 : x.scalar_scale(), b);
  return ScaledTensor(ops::binary(ops::Binary::add, m.data, x.data, m.any_scale ? b : z.x_mul, x.any_scale ? 1 - b : z.y_mul), z.scale);
}

// mul: Z_s = X_s Y_s, Z_d = X_d Y_d. div: Z_s = X_s / Y_s, Z_d = X_d / Y_d.
ScaledTensor mul(const ScaledTensor& x_in, const ScaledTensor& y_in) {
  const ScaledTensor x = uniform(x_in);
  const ScaledTensor y = uniform(y_in);
  if (!any_scaled({&x, &y})) return ScaledTensor(ops::mul(x.data, y.data));
  if (x.any_scale || y.any_scale) return any_scale_constant(ops::mul(folded(x), folded(y)));
  return with_exact_scale(ops::mul(x.data, y.data), double(x.scalar_scale()) * y.scalar_scale());
}

ScaledTensor div(const ScaledTensor& x_in, const ScaledTensor& y_in) {
  const ScaledTensor x = uniform(x_in);
  const ScaledTensor y = uniform(y_in);
  if (!any_scaled({&x, &y})) return ScaledTensor(ops::div(x.data, y.data));
  if (x.any_scale || y.any_scale) return ScaledTensor(ops::div(folded(x), folded(y)), 1.0f);
  return with_exact_scale(ops::div(x.data, y.data), double(x.scalar_scale()) / y.scalar_scale());
}

// matmul over K: r = pow2_round(sqrt K); Z_s = r X_s Y_s; Z_d = (X_d @ Y_d) / r.
ScaledTensor matmul(const ScaledTensor& x_in, const ScaledTensor& y_in) {
  const ScaledTensor x = uniform(x_in);
  const ScaledTensor y = uniform(y_in);
  if (!any_scaled({&x, &y})) return ScaledTensor(ops::matmul(x.data, y.data));
  const float r = rules::reduction(double(x.data.size(-1)));
  // 1/r in the GEMM's alpha; the scale product by exponent arithmetic (2^127 * 2^-126 is 2, not inf).
  return with_exact_scale(ops::matmul(x.data, y.data, 1.0 / r), double(r) * x.scalar_scale() * y.scalar_scale());
}

namespace {
double reduced_count(const Tensor& x, const std::vector<int>& dims) {
  if (dims.empty()) return double(x.numel());
  double n = 1;
  for (int d : dims) n *= double(x.size(d));
  return n;
}
}  // namespace

// sum over n: like matmul, r = pow2_round(sqrt n); Z_s = r X_s; Z_d = sum(X_d) / r.
ScaledTensor sum(const ScaledTensor& x_in, const std::vector<int>& dims, bool keepdim) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::sum(x.data, dims, keepdim));
  const float r = rules::reduction(reduced_count(x.data, dims));
  return with_exact_scale(times(ops::sum(x.data, dims, keepdim), 1.0 / r), double(r) * x.scalar_scale());
}

// mean over n = sum / n: Z_s = X_s / r; Z_d = sum(X_d) r / n (r = pow2_round(sqrt n)).
ScaledTensor mean(const ScaledTensor& x_in, const std::vector<int>& dims, bool keepdim) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::mean(x.data, dims, keepdim));
  const double n = reduced_count(x.data, dims);
  const float r = rules::reduction(n);
  return with_exact_scale(ops::scale_shift(ops::sum(x.data, dims, keepdim), double(r) / n, 0.0), double(x.scalar_scale()) / r);
}

// max: a positive scale commutes with max: Z_s = X_s, Z_d = max(X_d).
ScaledTensor max(const ScaledTensor& x_in, int dim, bool keepdim) {
  const ScaledTensor x = uniform(x_in);
  auto [values, index] = ops::max(x.data, dim, keepdim);
  if (!x.is_scaled()) return ScaledTensor(values);
  ScaledTensor out = x;
  out.data = values;
  return out;
}

// Powers: (X_d X_s)^p = X_d^p X_s^p. Y_s = 2^floor(p log2 X_s); the rest of X_s^p, 2^frac with frac
// in [0, 1) (0 for integer p and power-of-two X_s; 0 or 1/2 for p = +-1/2), goes into the data as
// Y_d = (X_d 2^(frac / p))^p: for sqrt of an odd power of two that is sqrt(2 X_d), exact. Homogeneous
// maps keep their scale out of the data, so f16 data stays in range whatever the input scale.
namespace {
ScaledTensor power(const ScaledTensor& x, double p, const std::function<Tensor(const Tensor&, double in_mul)>& f) {
  const double log2_scale = std::log2(double(x.scalar_scale())) * p;
  const double whole = std::floor(log2_scale);
  return with_exact_scale(f(x.data, p == 0 ? 1.0 : std::exp2((log2_scale - whole) / p)), std::exp2(whole));
}
}  // namespace

// Elementwise maps. Four families:
// - f(x) = x g(x) (relu, gelu, silu) and odd scale-free maps (neg, abs): keep the input scale,
//   Y_d = f(X_d X_s) / X_s = X_d g(X_d X_s), Y_s = X_s.
// - powers (square, sqrt, rsqrt): Y_s = X_s^p (see power above).
// - exp, log, sigmoid, tanh: not homogeneous, so no scale can be pulled out; the scale is folded
//   in first and the output has scale 1. That is right because their outputs do not grow with the
//   input scale the way data would: sigmoid and tanh are bounded by 1; log(x s) = log x + log s is
//   shifted, not multiplied, and |log s| <= 88 for any f32 scale; exp is fed O(1) arguments
//   (max-subtracted logits) in the models, where exp(x) is O(1) too.
ScaledTensor unary(ops::Unary op, const ScaledTensor& x_in, DType store_as) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::unary(op, x.data, 1.0, 1.0, store_as));
  using U = ops::Unary;
  if (x.any_scale) return any_scale_constant(ops::unary(op, x.data, 1.0, 1.0, store_as));
  const float s = x.scalar_scale();
  const auto map = [op](const Tensor& d, double in_mul) { return ops::unary(op, d, in_mul); };
  // Powers go through with_exact_scale, which may still rescale their data: f32 until then.
  switch (op) {
    case U::sqrt: return power(x, 0.5, map);
    case U::rsqrt: return power(x, -0.5, map);
    case U::neg:
    case U::abs: return ScaledTensor(ops::unary(op, x.data, 1.0, 1.0, store_as), s);
    case U::relu:
    case U::gelu_tanh:
    case U::gelu_erf:
    case U::silu: return ScaledTensor(ops::unary(op, x.data, s, 1.0 / s, store_as), s);
    case U::square: return power(x, 2, map);
    default: return ScaledTensor(ops::unary(op, x.data, s, 1.0, store_as), 1.0f);
  }
}

// softmax: fold the scale in (softmax is not scale-equivariant). Probabilities over n entries
// average 1/n, so Y_s = 1 / N with N = pow2_round(n) and Y_d = N softmax(X): data ~1 (exactly 1
// for uniform rows, e^(sigma^2) in mean square for Gaussian logits), as unit scaling's softmax
// (alpha = s). Without it, attention's probabilities @ V comes out near 1/sqrt(T) of unit.
ScaledTensor softmax(const ScaledTensor& x_in, int dim) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::softmax(x.data, dim));
  const float n = pow2_round(double(x.data.size(dim)));
  return ScaledTensor(times(ops::softmax(x.data, dim, x.any_scale ? 1.0 : x.scalar_scale()), n), 1.0f / n);
}
// log_softmax: log-probabilities, scale 1.
ScaledTensor log_softmax(const ScaledTensor& x_in, int dim) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::log_softmax(x.data, dim));
  return ScaledTensor(ops::log_softmax(x.data, dim, x.any_scale ? 1.0 : x.scalar_scale()), 1.0f);
}

// layer_norm / rms_norm (no affine): normalise X_d, output scale 1. The epsilon is divided by
// X_s^2 so the result equals the unscaled normalisation exactly (model invariance).
ops::NormResult normalise(const ScaledTensor& x_in, double eps, bool center, double* scale_used) {
  const ScaledTensor x = uniform(x_in);
  const double s = x.is_scaled() && !x.any_scale ? x.scalar_scale() : 1.0;
  if (scale_used) *scale_used = s;
  return center ? ops::layer_norm(x.data, eps / (s * s)) : ops::rms_norm(x.data, eps / (s * s));
}
ScaledTensor layer_norm(const ScaledTensor& x, double eps) {
  const Tensor y = normalise(x, eps, true).y;
  return x.is_scaled() ? ScaledTensor(y, 1.0f) : ScaledTensor(y);
}
ScaledTensor rms_norm(const ScaledTensor& x, double eps) {
  const Tensor y = normalise(x, eps, false).y;
  return x.is_scaled() ? ScaledTensor(y, 1.0f) : ScaledTensor(y);
}

// where / select and concat: the output mixes elements of both operands, so Z_s = the larger
// scale and each operand's data is rebased onto it; an ANY operand (zeros, ±inf, NaN constants)
// takes the other's scale unchanged (seed 000, Appendix B).
namespace {
// The rule of ops whose output elements come from either operand (where, maximum, minimum):
// Z_s = max(X_s, Y_s), each operand's data rebased onto it (an ANY operand as it is); `f` gets the
// data and the rebasing factors, to fold them into its one pass.
template <class F>
ScaledTensor from_either(const ScaledTensor& x_in, const ScaledTensor& y_in, F f) {
  const ScaledTensor x = uniform(x_in);
  const ScaledTensor y = uniform(y_in);
  if (!any_scaled({&x, &y})) return ScaledTensor(f(x.data, y.data, 1.0, 1.0));
  if (x.any_scale && y.any_scale) return any_scale_constant(f(x.data, y.data, 1.0, 1.0));
  const float xs = x.scalar_scale(), ys = y.scalar_scale();
  const float zs = x.any_scale ? ys : y.any_scale ? xs : std::max(xs, ys);
  return ScaledTensor(f(x.data, y.data, x.any_scale ? 1.0 : double(xs) / zs, y.any_scale ? 1.0 : double(ys) / zs), zs);
}
ScaledTensor extremum(const ScaledTensor& x, const ScaledTensor& y, ops::Binary op) {
  return from_either(x, y, [op](const Tensor& a, const Tensor& b, double am, double bm) { return ops::binary(op, a, b, am, bm); });
}
}  // namespace

ScaledTensor where(const Tensor& cond, const ScaledTensor& x, const ScaledTensor& y) {
  return from_either(
      x, y, [&cond](const Tensor& a, const Tensor& b, double am, double bm) { return ops::where(cond, times(a, am), times(b, bm)); });
}
ScaledTensor maximum(const ScaledTensor& x, const ScaledTensor& y) { return extremum(x, y, ops::Binary::maximum); }
ScaledTensor minimum(const ScaledTensor& x, const ScaledTensor& y) { return extremum(x, y, ops::Binary::minimum); }

ScaledTensor concat(const std::vector<ScaledTensor>& xs_in, int dim) {
  std::vector<ScaledTensor> xs;
  for (const ScaledTensor& x : xs_in) xs.push_back(uniform(x));
  bool scaled = false;
  float zs = 0;
  for (const ScaledTensor& x : xs) {
    scaled = scaled || x.is_scaled();
    if (!x.any_scale) zs = std::max(zs, x.scalar_scale());
  }
  std::vector<Tensor> parts;
  for (const ScaledTensor& x : xs) parts.push_back(!scaled || x.any_scale ? x.data : times(x.data, double(x.scalar_scale()) / zs));
  if (!scaled) return ScaledTensor(ops::concat(parts, dim));
  return zs == 0 ? any_scale_constant(ops::concat(parts, dim)) : ScaledTensor(ops::concat(parts, dim), zs);
}

// embedding: a gather: Z_s = W_s.
ScaledTensor embedding(const ScaledTensor& weight_in, const Tensor& ids) {
  const ScaledTensor weight = uniform(weight_in);
  ScaledTensor out = weight;
  out.data = ops::embedding(weight.data, ids);
  return out;
}

// cross_entropy: a loss value of the logits' values, output scale 1 (the scale enters the kernel as
// its input multiplier, so no folded f32 copy can overflow).
ScaledTensor cross_entropy(const ScaledTensor& logits_in, const Tensor& targets) {
  const ScaledTensor logits = uniform(logits_in);
  if (!logits.is_scaled()) return ScaledTensor(ops::cross_entropy(logits.data, targets));
  return ScaledTensor(ops::cross_entropy(logits.data, targets, logits.any_scale ? 1.0 : logits.scalar_scale()), 1.0f);
}

// Shape ops keep the scale.
namespace {
template <class F>
ScaledTensor keep_scale(const ScaledTensor& x_in, F f) {
  const ScaledTensor x = uniform(x_in);
  ScaledTensor out = x;
  out.data = f(x.data);
  return out;
}
}  // namespace
ScaledTensor reshape(const ScaledTensor& x, const Shape& s) {
  return keep_scale(x, [&](const Tensor& t) { return t.reshape(s); });
}
ScaledTensor transpose(const ScaledTensor& x, int a, int b) {
  return keep_scale(x, [&](const Tensor& t) { return t.transpose(a, b); });
}
ScaledTensor slice(const ScaledTensor& x, int d, int64_t a, int64_t b) {
  return keep_scale(x, [&](const Tensor& t) { return t.slice(d, a, b); });
}
ScaledTensor expand(const ScaledTensor& x, const Shape& s) {
  return keep_scale(x, [&](const Tensor& t) { return t.expand(s); });
}

// Scalars: c = m 2^e exactly; multiplying keeps the data's magnitude (|m| in [1, 2)) and moves
// 2^e into the scale. Adding a scalar is an add with a broadcast scalar operand.
ScaledTensor mul_scalar(const ScaledTensor& x_in, double c) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::scale_shift(x.data, c, 0.0));
  if (x.any_scale) return any_scale_constant(ops::scale_shift(x.data, c, 0.0));
  const ScaledTensor cs = scaled_scalar(c);
  if (cs.any_scale) return any_scale_constant(ops::scale_shift(x.data, c, 0.0));
  const double m = cs.data.item();  // a power-of-two c moves entirely into the scale: no pass
  return with_exact_scale(m == 1.0 ? x.data : ops::scale_shift(x.data, m, 0.0), double(x.scalar_scale()) * cs.scalar_scale());
}

ScaledTensor add_scalar(const ScaledTensor& x_in, double c) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::scale_shift(x.data, 1.0, c));
  return add(x, scaled_scalar(c));
}

ScaledTensor pow_scalar(const ScaledTensor& x_in, double p) {
  const ScaledTensor x = uniform(x_in);
  if (!x.is_scaled()) return ScaledTensor(ops::pow_scalar(x.data, p));
  if (x.any_scale) return any_scale_constant(ops::pow_scalar(x.data, p));
  return power(x, p,
               [p](const Tensor& d, double in_mul) { return ops::pow_scalar(in_mul == 1.0 ? d : ops::scale_shift(d, in_mul, 0.0), p); });
}

ScaledTensor sum_to(const ScaledTensor& g_in, const Shape& shape) {
  const ScaledTensor g = uniform(g_in);
  if (!g.is_scaled()) return ScaledTensor(ops::sum_to(g.data, shape));
  if (g.shape() == shape) return g;
  const std::vector<int> dims = ops::broadcast_dims(g.shape(), shape);
  return reshape(dims.empty() ? g : sum(g, dims, true), shape);
}

ScaledTensor with_grad_scale(const ScaledTensor& g, Tensor data) {
  ScaledTensor out = g;
  out.data = std::move(data);
  return out;
}

const std::vector<ScaleRule>& scale_rules() {
  static const std::vector<ScaleRule> rules = {
      {"add, sub", "Z_s = pow2(sqrt(X_s^2 + Y_s^2)); Z_d = (X_s/Z_s) X_d ± (Y_s/Z_s) Y_d", "variance of a sum of independent terms"},
      {"mul", "Z_s = X_s Y_s; Z_d = X_d Y_d", "product of unit-variance independents is unit-variance"},
      {"div", "Z_s = X_s / Y_s; Z_d = X_d / Y_d", "exact; the data ratio keeps the operands' scale"},
      {"matmul", "r = pow2(sqrt K); Z_s = r X_s Y_s; Z_d = (X_d @ Y_d) / r", "a dot product of K unit terms has variance K"},
      {"sum over n", "r = pow2(sqrt n); Z_s = r X_s; Z_d = sum(X_d) / r", "as matmul"},
      {"mean over n", "r = pow2(sqrt n); Z_s = X_s / r; Z_d = sum(X_d) r / n", "mean = sum / n"},
      {"max", "Z_s = X_s; Z_d = max(X_d)", "a positive scale commutes with max"},
      {"relu, gelu, silu", "Y_s = X_s; Y_d = X_d g(X_d X_s)", "f(x) = x g(x) keeps the input's magnitude"},
      {"neg, abs", "Y_s = X_s; Y_d = f(X_d)", "scale-equivariant"},
      {"powers x^p (square, sqrt, rsqrt, pow)", "Y_s = 2^floor(p log2 X_s); Y_d = (X_d 2^(f / p))^p, f = p log2 X_s - log2 Y_s",
       "homogeneous: (x s)^p = x^p s^p; for sqrt of an odd power of two, Y_d = sqrt(2 X_d)"},
      {"exp, log, sigmoid, tanh", "Y_d = f(X_d X_s); Y_s = 1",
       "not homogeneous, and their outputs do not grow like the input: sigmoid, tanh bounded; log shifted by log s (|log s| <= 88); exp "
       "fed O(1) arguments"},
      {"softmax over n", "Y_d = N softmax(X_d X_s); Y_s = 1 / N, N = pow2(n)",
       "fold: probabilities lie in [0, 1] whatever the input scale and average 1 / n (unit scaling's alpha = s)"},
      {"log_softmax", "Y_d = log_softmax(X_d X_s); Y_s = 1", "fold: log-probabilities are O(log n), not O(X_s)"},
      {"layer_norm, rms_norm (no affine)", "Y_d = norm(X_d, eps / X_s^2); Y_s = 1",
       "normalisation removes the scale; eps rescaled for exact invariance"},
      {"where, concat, maximum, minimum", "Z_s = max(X_s, Y_s), operands rebased; ANY takes the other's scale",
       "elements come from either operand"},
      {"embedding", "Z_s = W_s; Z_d = gather(W_d)", "a gather"},
      {"cross_entropy", "loss of f(X_d X_s); Y_s = 1", "fold: a loss value, O(log n)"},
      {"reshape, transpose, slice, expand", "Z_s = X_s", "shape ops move data only"},
      {"mul_scalar c = m 2^e", "Z_s = 2^e X_s; Z_d = m X_d", "broadcast scalar split into mantissa and exponent"},
      {"add_scalar c", "add with the scalar (m, 2^e)", "as add"},
      {"ema b m + (1 - b) x", "Z_s = pow2_nearest(sqrt((b M_s)^2 + ((1 - b) X_s)^2))",
       "b kept whole: the optimizer moments' scale is stationary"},
      {"gradients linear in g (activations, log_softmax, gather)", "dX_s = g_s; dX_d = f'(X) g_d", "the local derivative is O(1)"},
      {"power backward", "dX = p X^(p-1) g through the power and mul rules", "the local derivative's scale X_s^(p-1) stays in the scale"},
      {"scale products (mul, div, matmul, sum, mean, powers)",
       "by exponent arithmetic; beyond [2^-126, 2^127] the scale is clamped and the rest moves into the data",
       "2^127 * 2^-126 is 2, not inf; the value is kept, never a silent inf or 0"},
      {"X_d X_s beyond f32 (scales near 2^127)",
       "relu, gelu, silu: X_d g(+-inf) = X_d or 0, gradient G_d or 0; log: log X_d + log X_s; softmax, log_softmax, cross_entropy: such "
       "rows in double",
       "the true result is finite: never inf or NaN from a finite input; every other value as the fast path computes it"},
      {"softmax backward", "dX_s = g_s / N; dX_d = N p (g_d - sum p g_d)", "the local derivative is O(1 / n)"},
      {"fused causal attention (qkv with one scale s)",
       "Y_s = s; Y_d = softmax(mask(s^2 q_d k_d^T / sqrt(hd))) v_d; dQKV_s = g_s s, dq_d and dk_d carry s, dv_d 1 / s",
       "a convex combination of value rows: |Y_d| <= max |v_d|, never an overflow; dq and dk are s^2 smaller than dv, and one scale sits "
       "between them"},
      {"norm backward", "dX_s = g_s / X_s; dX_d = rstd(X_d) (g_d - ...)", "d norm / dx scales as 1 / sigma(x)"},
      {"cross_entropy backward", "dX_d = (softmax - onehot) c / pow2(c); dX_s = pow2(c), c = g / N", "rows of softmax - onehot are O(1)"},
  };
  return rules;
}

std::string scale_rules_markdown() {
  std::string s = "| op | rule | why |\n|---|---|---|\n";
  for (const ScaleRule& r : scale_rules())
    s += "| " + std::string(r.op) + " | " + std::string(r.rule) + " | " + std::string(r.why) + " |\n";
  return s;
}

}  // namespace scalify::scaled
