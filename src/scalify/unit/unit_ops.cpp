#include "scalify/unit/unit_ops.hpp"

#include <cmath>

#include "scalify/error.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/unit/factors.hpp"

namespace scalify::unit {

namespace {
thread_local bool exact_gradients = false;
}  // namespace

ExactGradients::ExactGradients() : previous_(exact_gradients) { exact_gradients = true; }
ExactGradients::~ExactGradients() { exact_gradients = previous_; }
bool ExactGradients::active() { return exact_gradients; }

Var scaled(const Var& x, double alpha, double beta_in) {
  const double beta = exact_gradients ? alpha : beta_in;
  return Var::make("scaled_identity", scaled::mul_scalar(x.scaled(), alpha), {x},
                   [beta](const ScaledTensor& g) { return std::vector<ScaledTensor>{scaled::mul_scalar(g, beta)}; });
}

namespace {
// Composition for f*(x; alpha, beta): id*(f(id*(x, 1, beta)), alpha, 1). The gradient reaching f's
// output is g, f's backward gives f'(x) g, and the entry identity multiplies by beta.
template <class F>
Var scaled_unary(const Var& x, double alpha, double beta, F f) {
  return scaled(f(scaled(x, 1.0, beta)), alpha, 1.0);
}
int64_t rows_of(const Var& x) { return x.shape().empty() ? 1 : numel_of(x.shape()) / x.shape().back(); }
}  // namespace

Var matmul(const Var& x, const Var& w, Constrain constrain, const MatmulFn& product) {
  if (w.shape().size() != 2) throw Error("unit::matmul: weight must be [m, n], got " + shape_str(w.shape()));
  const double m = double(w.shape()[0]), n = double(w.shape()[1]), b = double(rows_of(x));
  double alpha = 1 / std::sqrt(m), beta_x = 1 / std::sqrt(n), beta_w = 1 / std::sqrt(b);
  switch (constrain) {  // non-cut edges need alpha = beta: geometric mean (Figure A.2)
    case Constrain::both: alpha = beta_x = beta_w = std::cbrt(alpha * beta_x * beta_w); break;
    case Constrain::x: alpha = beta_x = std::sqrt(alpha * beta_x); break;
    case Constrain::w: alpha = beta_w = std::sqrt(alpha * beta_w); break;
    case Constrain::x_to_output_scale: beta_x = alpha; break;
    case Constrain::x_to_grad_input_scale: alpha = beta_x; break;
    case Constrain::none: break;
  }
  return matmul(x, w, alpha, beta_x, beta_w, product);
}

Var matmul(const Var& x, const Var& w, double alpha, double beta_x, double beta_w, const MatmulFn& product) {
  const Var xs = scaled(x, 1.0, beta_x), ws = scaled(w, 1.0, beta_w);
  return scaled(product ? product(xs, ws) : scalify::matmul(xs, ws), alpha, 1.0);
}

Var matmul_activations(const Var& a, const Var& b) {
  const double M = double(a.shape()[a.shape().size() - 2]), K = double(a.shape().back()), N = double(b.shape().back());
  const double f = std::cbrt(1 / std::sqrt(K * N * M));
  return scaled(scalify::matmul(scaled(a, 1.0, f), scaled(b, 1.0, f)), f, 1.0);
}

Var causal_softmax(const Var& scores) {
  const int64_t T = scores.shape().back();
  std::vector<float> counts(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) counts[size_t(i)] = float(i + 1);
  return scalify::softmax(causal_mask(scores)) * Var(Tensor::from_vector(counts, {T, 1}));
}

Var sum(const Var& x, const std::vector<int>& dims) {
  double n = 1;
  for (int d : dims) n *= double(x.shape()[size_t(d < 0 ? d + int(x.shape().size()) : d)]);
  return scaled(scalify::sum(x, dims), 1 / std::sqrt(n), 1.0);
}

Var weighted_add(const std::vector<Var>& xs, const std::vector<double>& gammas) {
  if (xs.empty() || xs.size() != gammas.size()) throw Error("weighted_add: needs one gamma per input");
  double sq = 0;
  for (double g : gammas) sq += g * g;
  const double alpha = 1 / std::sqrt(sq);
  // alpha gamma_i forward; beta_i = 1/gamma_i cancels gamma_i backward: each input gets g.
  Var out = scaled(xs[0], alpha * gammas[0], 1.0);
  for (size_t i = 1; i < xs.size(); ++i) out = out + scaled(xs[i], alpha * gammas[i], 1.0);
  return out;
}

namespace {
Var activation(ops::Unary op, const Var& x, bool constrained) {
  const ActivationFactors& f = activation_factors(op);
  const double a = constrained ? std::sqrt(f.alpha * f.beta) : f.alpha, b = constrained ? a : f.beta;
  return scaled_unary(x, a, b, [op](const Var& v) { return scalify::unary(op, v); });
}
}  // namespace
Var relu(const Var& x, bool c) { return activation(ops::Unary::relu, x, c); }
Var gelu(const Var& x, bool c) { return activation(ops::Unary::gelu_tanh, x, c); }
Var tanh(const Var& x, bool c) { return activation(ops::Unary::tanh, x, c); }
Var sigmoid(const Var& x, bool c) { return activation(ops::Unary::sigmoid, x, c); }

namespace {
// logarithmic interpolation: lo at t = 0, hi at t = 1, a constant ratio in between.
double interpolate(double t, double lo, double hi) { return std::exp(t * std::log(hi) + (1 - t) * std::log(lo)); }
std::pair<double, double> constrained(double alpha, double beta, Constraint c) {
  switch (c) {
    case Constraint::none: return {alpha, beta};
    case Constraint::gmean: return {std::sqrt(alpha * beta), std::sqrt(alpha * beta)};
    case Constraint::to_output_scale: return {alpha, alpha};
    case Constraint::to_grad_input_scale: return {beta, beta};
  }
  return {alpha, beta};
}
void check_mult(double mult, const char* op) {
  if (!(mult > 0) || !std::isfinite(mult))
    throw Error(std::string(op) + ": mult must be a finite positive number, got " + std::to_string(mult));
}
}  // namespace

Var gelu_erf(const Var& x, double mult, Constraint c) {
  check_mult(mult, "unit::gelu_erf");
  const double t = 1 / (1 + 0.25 / (mult * mult));
  const auto [a, b] = constrained(interpolate(t, 2, std::sqrt(2 / (1 - 1 / M_PI))), interpolate(t, 2, std::sqrt(2.0)), c);
  return scaled_unary(x, a, b,
                      [mult](const Var& v) { return mult == 1 ? scalify::gelu_erf(v) : scalify::gelu_erf(v * mult) * (1 / mult); });
}

Var silu(const Var& x, double mult, Constraint c) {
  check_mult(mult, "unit::silu");
  const double alpha = interpolate(1 / (1 + 0.25 / (mult * mult)), 2, std::sqrt(2 / (1 - 1 / M_PI)));
  const auto [a, b] = constrained(alpha, interpolate(1 / (1 + 1 / (mult * mult)), 2, std::sqrt(2.0)), c);
  return scaled_unary(x, a, b, [mult](const Var& v) { return mult == 1 ? scalify::silu(v) : v * scalify::sigmoid(v * mult); });
}

Var softmax(const Var& x, int dim, double mult, Constraint c) {
  check_mult(mult, "unit::softmax");
  const int rank = int(x.shape().size());
  if (dim < -rank || dim >= rank) throw Error("unit::softmax: dim " + std::to_string(dim) + " out of range for " + shape_str(x.shape()));
  const double n = double(x.shape()[size_t(dim < 0 ? dim + rank : dim)]);
  const double t = 1 / (1 + 4 / (mult * mult));
  const auto [a, b] = constrained(interpolate(t, n, std::sqrt(n)), interpolate(t, n / mult, std::sqrt(n / mult)), c);
  return scaled_unary(x, a, b, [dim, mult](const Var& v) { return scalify::softmax(mult == 1 ? v : v * mult, dim); });
}

Var softmax(const Var& x) {
  const double s = double(x.shape().back());
  return scaled_unary(x, s, s, [](const Var& v) { return scalify::softmax(v); });
}

Var softmax_cross_entropy(const Var& logits, const Tensor& targets) {
  // Table A.2 gives beta = s / sqrt(s - 1) for one row's loss; our loss is the mean over N rows,
  // which divides every gradient by N, so beta also carries N.
  const double s = double(logits.shape().back()), N = double(rows_of(logits));
  if (s < 2) throw Error("softmax_cross_entropy: needs at least 2 classes");
  return scaled_unary(logits, 1.0, N * s / std::sqrt(s - 1), [&](const Var& v) { return scalify::cross_entropy(v, targets); });
}

Var silu_glu(const Var& input, const Var& gate, double mult) {
  check_mult(mult, "unit::silu_glu");
  const double s = interpolate(1 / (1 + 1 / (mult * mult)), 2, std::sqrt(2.0));
  const Var g = scaled(gate, 1.0, s);
  const Var act = mult == 1 ? scalify::silu(g) : g * scalify::sigmoid(g * mult);
  return scaled(scaled(input, 1.0, s) * act, s, 1.0);
}

// scaled_dot_product_attention's s for T keys of width d.
double attention_scale(double T, double d, double mult) {
  return T > 1 ? 1 / interpolate(1 / (1 + 4 * d / (mult * mult)), std::sqrt(std::log(T) / T), 1.0) : 1.0;
}

Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, double mult, int64_t length) {
  check_mult(mult, "unit::scaled_dot_product_attention");
  const double T = double(length > 0 ? length : v.shape()[v.shape().size() - 2]);
  const double d = double(v.shape().back()), s = attention_scale(T, d, mult);
  const Var scores = mul_scalar(scalify::matmul(scaled(q, 1.0, s), transpose(scaled(k, 1.0, s), -1, -2)), mult / d);
  return scaled(scalify::matmul(scalify::softmax(causal_mask(scores)), scaled(v, 1.0, s)), s, 1.0);
}

Var causal_self_attention(const Var& qkv, int64_t heads, double mult, int64_t length) {
  check_mult(mult, "unit::causal_self_attention");
  const int64_t D = qkv.shape().back() / 3;
  const double d = double(D / heads), s = attention_scale(double(length > 0 ? length : qkv.shape()[1]), d, mult);
  // The fused kernel scales the scores by d^-1/2; u-μP's are mult / d, which q takes, exactly in
  // both directions.
  const Var x = scaled(qkv, 1.0, s);
  const Var q = mul_scalar(slice(x, 2, 0, D), mult / std::sqrt(d));
  return scaled(scalify::causal_self_attention(concat({q, slice(x, 2, D, 3 * D)}, 2), heads), s, 1.0);
}

Var cross_entropy(const Var& logits, const Tensor& targets, double mult) {
  check_mult(mult, "unit::cross_entropy");
  const double s = double(logits.shape().back()), N = double(rows_of(logits));
  if (s < 2) throw Error("cross_entropy: needs at least 2 classes");
  // scalify::cross_entropy is the mean: N on the gradient gives unit-scaling's sum's gradient.
  return scalify::cross_entropy(scaled(scaled(logits, 1.0, N * s / std::sqrt(s - 1)), mult, 1.0), targets);
}

Var rms_norm(const Var& x, const Var& weight, double eps) {
  return scalify::rms_norm(x, weight.defined() ? scaled(weight, 1.0, 1 / std::sqrt(double(rows_of(x)))) : weight, eps);
}

double umup_residual_tau(int index, int adds, double residual_mult, double residual_attn_ratio) {
  if (index < 0 || index >= adds)
    throw Error("umup_residual_tau: index " + std::to_string(index) + " outside [0, " + std::to_string(adds) + ")");
  const double alpha_mlp = residual_mult * std::sqrt(2 / (1 + residual_attn_ratio * residual_attn_ratio));
  const double alpha_attn = residual_attn_ratio * alpha_mlp;
  const int n_attn = (index + 1) / 2, n_mlp = index / 2;
  return (index % 2 == 0 ? alpha_attn : alpha_mlp) /
         std::sqrt(adds / 2.0 + n_attn * alpha_attn * alpha_attn + n_mlp * alpha_mlp * alpha_mlp);
}

Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps) {
  const double beta = 1 / std::sqrt(double(rows_of(x)));  // weights and bias are cut edges
  Var y = scalify::layer_norm(x, {}, {}, eps);
  if (weight.defined()) y = y * scaled(weight, 1.0, beta);
  if (bias.defined()) y = y + scaled(bias, 1.0, beta);
  return y;
}

Var embedding(const Var& weight, const Tensor& ids) {
  const double V = double(weight.shape()[0]), N = double(std::max<int64_t>(ids.numel(), 1));
  return scalify::embedding(scaled(weight, 1.0, std::sqrt(V / N)), ids);
}

Var residual(const Var& x, const std::function<Var(const Var&)>& branch, const Residual& r) {
  double a = 1, b = 1;
  if (r.kind == Residual::Kind::fixed) {
    if (!(r.tau > 0 && r.tau < 1)) throw Error("residual: fixed(tau) needs 0 < tau < 1");
    a = std::sqrt(1 - r.tau), b = std::sqrt(r.tau);
  } else if (r.kind == Residual::Kind::running_mean) {
    if (r.layer < 1) throw Error("residual: running-mean needs layer >= 1");
    a = std::sqrt(double(r.layer) / (r.layer + 1)), b = std::sqrt(1.0 / (r.layer + 1));
  } else if (r.kind == Residual::Kind::umup) {
    const double t = umup_residual_tau(r.layer - 1, r.adds, r.residual_mult, r.residual_attn_ratio);
    a = 1 / std::sqrt(1 + t * t), b = t / std::sqrt(1 + t * t);
  }
  const Var skip = a == 1 ? x : mul_scalar(x, a);
  if (r.branch_rewrite) return skip + scaled(branch(scaled(x, 1.0, b)), b, 1.0);
  const Var f = branch(x);
  return skip + (b == 1 ? f : mul_scalar(f, b));
}

}  // namespace scalify::unit
