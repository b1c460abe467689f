// Forward and backward of every differentiable op, one small function each. Both directions run
// on ScaledTensors through the scale rules of scaled/scaled_ops and the backward rules of
// scaled/scaled_grads (with no scaled input anywhere these are the plain kernels), so scales
// propagate through forward and backward alike; scalify.torch calls the same rules.
#include "scalify/autograd/functions.hpp"

#include <cmath>
#include <limits>
#include <optional>

#include "scalify/autograd/data_precision.hpp"
#include "scalify/error.hpp"
#include "scalify/scaled/scaled_grads.hpp"
#include "scalify/scaled/scaled_ops.hpp"

namespace scalify {

namespace s = scaled;
using Grads = std::vector<ScaledTensor>;

namespace {
// The represented value as a plain tensor (for derivative formulas that need x itself).
Tensor plain(const ScaledTensor& x) { return x.is_scaled() ? x.value() : x.data; }
// An op's output rounded into its storage before its backward keeps it (Var::make would round
// only the Var's copy, and the graph would hold both).
ScaledTensor stored(ScaledTensor y, const std::vector<Var>& inputs, const std::string& name) {
  y.data = to_storage(y.data, Var::storage_for(inputs, y.data.dtype()), name);
  return y;
}
// The storage an op's kernel writes its output in directly: the one the output takes (f16 for an
// f16 graph), so Var::make finds it stored and rounds nothing; f32 where that is not possible.
DType store_as(const std::vector<Var>& inputs) { return kernel_store_as(Var::storage_for(inputs, DType::f32)); }
}  // namespace

Var add(const Var& a, const Var& b) {
  return Var::make("add", s::add(a.scaled(), b.scaled(), store_as({a, b})), {a, b},
                   [sa = a.shape(), sb = b.shape()](const ScaledTensor& g) {
                     return Grads{s::sum_to(g, sa), s::sum_to(g, sb)};
                   });
}

Var sub(const Var& a, const Var& b) {
  return Var::make("sub", s::sub(a.scaled(), b.scaled(), store_as({a, b})), {a, b},
                   [sa = a.shape(), sb = b.shape()](const ScaledTensor& g) {
                     return Grads{s::sum_to(g, sa), s::sum_to(s::mul_scalar(g, -1.0), sb)};
                   });
}

Var mul(const Var& a, const Var& b) {
  return Var::make("mul", s::mul(a.scaled(), b.scaled()), {a, b},
                   [x = a.scaled(), y = b.scaled()](const ScaledTensor& g) { return s::mul_backward(x, y, g); });
}

Var div(const Var& a, const Var& b) {
  const ScaledTensor out = stored(s::div(a.scaled(), b.scaled()), {a, b}, "div");
  return Var::make("div", out, {a, b},
                   [out, y = b.scaled(), sa = a.shape()](const ScaledTensor& g) { return s::div_backward(out, y, sa, g); });
}

Var neg(const Var& x) { return mul_scalar(x, -1.0); }

Var add_scalar(const Var& x, double c) {
  return Var::make("add_scalar", s::add_scalar(x.scaled(), c), {x}, [](const ScaledTensor& g) { return Grads{g}; });
}

Var mul_scalar(const Var& x, double c) {
  return Var::make("mul_scalar", s::mul_scalar(x.scaled(), c), {x}, [c](const ScaledTensor& g) { return Grads{s::mul_scalar(g, c)}; });
}

Var pow_scalar(const Var& x, double p) {
  return Var::make("pow", s::pow_scalar(x.scaled(), p), {x},
                   [x = x.scaled(), p](const ScaledTensor& g) { return Grads{s::pow_backward(x, p, g)}; });
}

Var unary(ops::Unary op, const Var& x) {
  const ScaledTensor y = stored(s::unary(op, x.scaled(), store_as({x})), {x}, ops::unary_name(op));
  using U = ops::Unary;
  const bool scaled_power = x.scaled().is_scaled() && (op == U::sqrt || op == U::rsqrt || op == U::square);
  // The backward keeps y only where the derivative is written with it (GELU's is not).
  const ScaledTensor kept = scaled_power || ops::derivative_uses_output(op) ? y : ScaledTensor();
  return Var::make(ops::unary_name(op), y, {x}, [op, x = x.scaled(), y = kept](const ScaledTensor& g) {
    return Grads{s::unary_backward(op, x, y, g, kernel_store_as(x.data.dtype()))};
  });
}

Var matmul(const Var& a, const Var& b) {
  return Var::make("matmul", s::matmul(a.scaled(), b.scaled()), {a, b},
                   [x = a.scaled(), w = b.scaled()](const ScaledTensor& g) { return s::matmul_backward(x, w, g); });
}

Var sum(const Var& x, const std::vector<int>& dims, bool keepdim) {
  return Var::make("sum", s::sum(x.scaled(), dims, keepdim), {x},
                   [shape = x.shape(), dims, keepdim](const ScaledTensor& g) { return Grads{s::sum_backward(g, shape, dims, keepdim)}; });
}

Var mean(const Var& x, const std::vector<int>& dims, bool keepdim) {
  double n = dims.empty() ? double(x.scaled().data.numel()) : 1.0;
  for (int d : dims) n *= double(x.scaled().data.size(d));
  return mul_scalar(sum(x, dims, keepdim), 1.0 / n);
}

Var max(const Var& x, int dim, bool keepdim) {
  ScaledTensor out = s::max(x.scaled(), dim, true);
  const Tensor index = ops::max(x.scaled().data, dim, true).second;
  if (!keepdim)
    out = s::reshape(out, [&] {
      Shape sh = out.shape();
      sh.erase(sh.begin() + (dim < 0 ? dim + int(sh.size()) : dim));
      return sh;
    }());
  return Var::make("max", out, {x},
                   [shape = x.shape(), dim, index](const ScaledTensor& g) { return Grads{s::max_backward(g, shape, dim, index)}; });
}

Var softmax(const Var& x, int dim) {
  const ScaledTensor y = stored(s::softmax(x.scaled(), dim), {x}, "softmax");
  return Var::make("softmax", y, {x}, [y, dim](const ScaledTensor& g) { return Grads{s::softmax_backward(y, g, dim)}; });
}

Var log_softmax(const Var& x, int dim) {
  const ScaledTensor y = stored(s::log_softmax(x.scaled(), dim), {x}, "log_softmax");
  return Var::make("log_softmax", y, {x}, [y, dim](const ScaledTensor& g) { return Grads{s::log_softmax_backward(y, g, dim)}; });
}

namespace {
// y = xhat * weight + bias over the last dimension, as ops so the affine part differentiates itself.
Var affine(Var xhat, const Var& weight, const Var& bias) {
  if (weight.defined()) xhat = mul(xhat, weight);
  if (bias.defined()) xhat = add(xhat, bias);
  return xhat;
}
void check_affine(const char* op, const Var& x, const Var& p) {
  if (p.defined() && (p.shape().size() != 1 || p.shape()[0] != x.shape().back()))
    throw Error(std::string(op) + ": parameter of shape " + shape_str(p.shape()) + " does not match the last dimension of " +
                shape_str(x.shape()));
}
// Normalisation of x's data (scaled::norm: eps rescaled by the data scale, so the value equals the
// unscaled normalisation); the backward scales as 1 / sigma(x): g_s / X_s.
Var norm(const char* name, const Var& x, double eps, bool center) {
  s::Norm n = s::norm(x.scaled(), eps, center);
  return Var::make(name, std::move(n.y), {x},
                   [saved = std::move(n.saved)](const ScaledTensor& g) { return Grads{s::norm_backward(saved, g)}; });
}

// The normalisation and its affine as one op (scaled::norm_affine): one pass per row forward, and
// g * w formed inside the normalisation's backward, with the composition's scales. Applies when
// x, weight and bias are all unscaled, or all carry one normal scale each; ANY-scale and
// per-block scales compose the ops.
std::optional<Var> fused_norm(const char* name, const Var& x, const Var& weight, const Var& bias, double eps, bool center) {
  const ScaledTensor no_bias;
  const ScaledTensor& b = bias.defined() ? bias.scaled() : no_bias;
  if (!s::fuses_norm_affine(x.scaled(), weight.scaled(), b)) return std::nullopt;
  std::vector<Var> inputs = {x, weight};
  if (bias.defined()) inputs.push_back(bias);
  s::Norm n = s::norm_affine(x.scaled(), weight.scaled(), b, eps, center, store_as(inputs));
  return Var::make(name, std::move(n.y), inputs,
                   [saved = std::move(n.saved), w = weight.scaled(), has_bias = bias.defined()](const ScaledTensor& g) {
                     return s::norm_affine_backward(saved, g, w, has_bias, kernel_store_as(saved.x_storage));
                   });
}
}  // namespace

Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps) {
  check_affine("layer_norm", x, weight);
  check_affine("layer_norm", x, bias);
  if (weight.defined())
    if (std::optional<Var> y = fused_norm("layer_norm", x, weight, bias, eps, true)) return *y;
  return affine(norm("layer_norm", x, eps, true), weight, bias);
}

Var rms_norm(const Var& x, const Var& weight, double eps) {
  check_affine("rms_norm", x, weight);
  if (weight.defined())
    if (std::optional<Var> y = fused_norm("rms_norm", x, weight, {}, eps, false)) return *y;
  return affine(norm("rms_norm", x, eps, false), weight, {});
}

Var embedding(const Var& weight, const Tensor& ids) {
  return Var::make("embedding", s::embedding(weight.scaled(), ids), {weight},
                   [ids, v = weight.shape()[0]](const ScaledTensor& g) { return Grads{s::embedding_backward(g, ids, v)}; });
}

Var cross_entropy(const Var& logits, const Tensor& targets) {
  return Var::make(
      "cross_entropy", s::cross_entropy(logits.scaled(), targets), {logits},
      [l = logits.scaled(), targets](const ScaledTensor& g) { return Grads{s::cross_entropy_backward(l, targets, g)}; },
      // The loss stays f32 whatever the logits' storage (as mixed-precision frameworks
      // keep losses): it is read, logged and compared, and one value costs nothing.
      Var::Storage::as_computed);
}

namespace {
// max(a, b) is where(a >= b, a, b): the same forward value (NaNs kept) and the gradient routed to
// the chosen operand.
Var extremum(const Var& a, const Var& b, bool take_max) {
  // Compared on the represented values (any scales, per-block ones included).
  const Tensor picks_a = ops::binary(take_max ? ops::Binary::max_picks_a : ops::Binary::min_picks_a, plain(a.scaled()), plain(b.scaled()));
  const Shape shape = picks_a.shape();
  return where(picks_a, expand(a, shape), expand(b, shape));
}
}  // namespace
Var maximum(const Var& a, const Var& b) { return extremum(a, b, true); }
Var minimum(const Var& a, const Var& b) { return extremum(a, b, false); }

Var where(const Tensor& cond, const Var& a, const Var& b) {
  return Var::make("where", s::where(cond, a.scaled(), b.scaled()), {a, b},
                   [cond, sa = a.shape(), sb = b.shape()](const ScaledTensor& g) { return s::where_backward(cond, g, sa, sb); });
}

Var causal_mask(const Var& scores) {
  const Shape& sh = scores.shape();
  if (sh.size() < 2 || sh[sh.size() - 2] != sh.back()) throw Error("causal_mask: scores must be [..., T, T], got " + shape_str(sh));
  const DType dt = scores.scaled().data.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor minus_inf = Tensor::scalar(-std::numeric_limits<double>::infinity(), dt);
  // -inf ignores scale: an ANY constant when the scores are scaled.
  const Var fill = scores.scaled().is_scaled() ? Var(any_scale_constant(minus_inf)) : Var(minus_inf);
  return where(ops::causal_mask(sh.back()), scores, fill);
}

Var causal_self_attention(const Var& qkv, int64_t heads) {
  // Scaled qkv: Y_s = s; backward, dq and dk are s^2 times smaller than dv and one scale holds
  // all three (scaled::causal_attention_backward).
  s::Attention a = s::causal_attention(qkv.scaled(), heads);
  return Var::make("causal_attention", std::move(a.y), {qkv}, [x = qkv.scaled(), probs = std::move(a.probs), heads](const ScaledTensor& g) {
    return Grads{s::causal_attention_backward(x, probs, g, heads)};
  });
}

Var dropout(const Var& x, double p, uint64_t seed) {
  if (p == 0.0) return x;
  const DType dt = x.scaled().data.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor mask = ops::dropout_mask(x.shape(), p, seed, dt);
  return Var::make("dropout", s::with_grad_scale(x.scaled(), ops::mul(x.scaled().data, mask)), {x},
                   [mask](const ScaledTensor& g) { return Grads{s::with_grad_scale(g, ops::mul(g.data, mask))}; });
}

Var reshape(const Var& x, const Shape& shape) {
  return Var::make("reshape", s::reshape(x.scaled(), shape), {x},
                   [sh = x.shape()](const ScaledTensor& g) { return Grads{s::reshape(g, sh)}; });
}

Var permute(const Var& x, const std::vector<int>& dims) {
  std::vector<int> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[size_t(dims[i] < 0 ? dims[i] + int(dims.size()) : dims[i])] = int(i);
  return Var::make("permute", s::with_grad_scale(x.scaled(), x.scaled().data.permute(dims)), {x},
                   [inverse](const ScaledTensor& g) { return Grads{s::with_grad_scale(g, g.data.permute(inverse))}; });
}

Var transpose(const Var& x, int d0, int d1) {
  return Var::make("transpose", s::transpose(x.scaled(), d0, d1), {x},
                   [d0, d1](const ScaledTensor& g) { return Grads{s::transpose(g, d0, d1)}; });
}

Var slice(const Var& x, int dim, int64_t start, int64_t end) {
  return Var::make("slice", s::slice(x.scaled(), dim, start, end), {x},
                   [sh = x.shape(), dim, start, end](const ScaledTensor& g) { return Grads{s::slice_backward(g, sh, dim, start, end)}; });
}

Var expand(const Var& x, const Shape& shape) {
  return Var::make("expand", s::expand(x.scaled(), shape), {x},
                   [sh = x.shape()](const ScaledTensor& g) { return Grads{s::sum_to(g, sh)}; });
}

Var concat(const std::vector<Var>& xs, int dim) {
  std::vector<ScaledTensor> values;
  std::vector<int64_t> sizes;
  for (const Var& x : xs) {
    values.push_back(x.scaled());
    sizes.push_back(x.shape()[size_t(dim < 0 ? dim + int(x.shape().size()) : dim)]);
  }
  return Var::make("concat", s::concat(values, dim), xs, [sizes, dim](const ScaledTensor& g) { return s::concat_backward(g, sizes, dim); });
}

std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int dim) {
  std::vector<Var> out;
  int64_t at = 0;
  for (int64_t sz : sizes) {
    out.push_back(slice(x, dim, at, at + sz));
    at += sz;
  }
  const int64_t n = x.shape()[size_t(dim < 0 ? dim + int(x.shape().size()) : dim)];
  if (at != n)
    throw Error("split: sizes sum to " + std::to_string(at) + ", dimension " + std::to_string(dim) + " of " + shape_str(x.shape()) +
                " has " + std::to_string(n));
  return out;
}

}  // namespace scalify
