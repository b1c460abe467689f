#include "scalify/optim/adamw.hpp"

#include <cmath>
#include <string>

#include "scalify/error.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::optim {

namespace {
void check_finite(const Tensor& g, size_t k, const Shape& shape) {
  const Dense<float> d(g);
  const float* p = d.data();
  const int64_t n = g.numel();
  bool bad = false;
#pragma omp parallel for reduction(|| : bad) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(p[i]);
  if (bad) throw Error("optimizer: non-finite gradient in parameter " + std::to_string(k) + " of shape " + shape_str(shape));
}
// A new represented value for a scaled parameter, stored against its current scale.
ScaledTensor restore(const ScaledTensor& p, const Tensor& value) {
  ScaledTensor out = p;
  out.data = ops::scale_shift(value, 1.0 / p.scalar_scale(), 0.0).to(p.data.dtype());
  return out;
}
void check_lr(double lr, const char* who) {
  if (!(lr >= 0) || !std::isfinite(lr)) throw Error(std::string(who) + ": lr must be finite and >= 0, got " + std::to_string(lr));
}
void check_config(const AdamWConfig& c) {
  check_lr(c.lr, "AdamW");
  auto need = [](bool ok, const char* field, const char* what, double got) {
    if (!ok) throw Error(std::string("AdamW: ") + field + " must be " + what + ", got " + std::to_string(got));
  };
  need(c.beta1 >= 0 && c.beta1 < 1, "beta1", "in [0, 1)", c.beta1);
  need(c.beta2 >= 0 && c.beta2 < 1, "beta2", "in [0, 1)", c.beta2);
  need(c.eps > 0 && std::isfinite(c.eps), "eps", "finite and > 0", c.eps);
  need(c.weight_decay >= 0 && std::isfinite(c.weight_decay), "weight_decay", "finite and >= 0", c.weight_decay);
  need(c.rescale_every >= 0, "rescale_every", ">= 0 (0: never)", c.rescale_every);
}
}  // namespace

AdamW::AdamW(std::vector<Var> params, AdamWConfig config, std::vector<double> lr_scale, std::vector<bool> decay)
    : params_(std::move(params)), lr_scale_(std::move(lr_scale)), decay_(std::move(decay)), c_(config) {
  check_config(c_);
  if (lr_scale_.empty()) lr_scale_.assign(params_.size(), 1.0);
  if (decay_.empty()) decay_.assign(params_.size(), true);
  if (lr_scale_.size() != params_.size() || decay_.size() != params_.size())
    throw Error("AdamW: " + std::to_string(lr_scale_.size()) + " learning-rate multipliers and " + std::to_string(decay_.size()) +
                " decay switches for " + std::to_string(params_.size()) + " parameters");
  for (size_t k = 0; k < lr_scale_.size(); ++k)
    if (!(lr_scale_[k] >= 0) || !std::isfinite(lr_scale_[k]))
      throw Error("AdamW: lr_scale of parameter " + std::to_string(k) + " must be finite and >= 0, got " + std::to_string(lr_scale_[k]));
  for (const Var& p : params_) {
    if (p.scaled().is_scaled()) {  // zeros whose scale is ANY: the first update takes g's scale
      m_.push_back(any_scale_constant(Tensor::zeros(p.shape(), c_.state_dtype)));
      v_.push_back(any_scale_constant(Tensor::zeros(p.shape(), c_.state_dtype)));
    } else {
      m_.emplace_back(Tensor::zeros(p.shape()));
      v_.emplace_back(Tensor::zeros(p.shape()));
    }
  }
}

void AdamW::set_lr(double lr) {
  check_lr(lr, "AdamW::set_lr");
  c_.lr = lr;
}

void AdamW::step(double gradient_multiplier) {
  ++t_;
  const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].scaled_grad().data.defined()) continue;
    if (params_[k].scaled().is_scaled())
      step_scaled(k, bc1, bc2, gradient_multiplier);
    else
      step_plain(k, bc1, bc2, gradient_multiplier);
    params_[k].zero_grad();
  }
}

void AdamW::step_plain(size_t k, double bc1, double bc2, double gradient_multiplier) {
  Var& p = params_[k];
  const Tensor value = p.value(), grad = p.grad();
  check_finite(grad, k, p.shape());
  // One parallel, vectorised pass in f32 arithmetic (as PyTorch's): read the weight, gradient
  // and moments, write the moments in place and the new weight into a fresh (pooled) buffer.
  const Dense<float> w(value), g(grad);
  Tensor next = Tensor::empty(p.shape(), DType::f32);
  float* pw = next.data<float>();
  float* m = m_[k].data.data<float>();
  float* v = v_[k].data.data<float>();
  const float* pg = g.data();
  const float* pold = w.data();
  const int64_t n = next.numel();
  const float lr = float(c_.lr * lr_scale_[k]), wd = decay_[k] ? float(c_.weight_decay) : 0.0f;
  const float b1 = float(c_.beta1), b2 = float(c_.beta2), c1 = float(1 - c_.beta1), c2 = float(1 - c_.beta2);
  const float ibc1 = float(1 / bc1), ibc2 = float(1 / bc2), eps = float(c_.eps), gm = float(gradient_multiplier);
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = pg[i] * gm;
    m[i] = b1 * m[i] + c1 * gi;
    v[i] = b2 * v[i] + c2 * gi * gi;
    pw[i] = pold[i] - lr * ((m[i] * ibc1) / (std::sqrt(v[i] * ibc2) + eps) + wd * pold[i]);
  }
  p.set_value(next.to(value.dtype()));
}

namespace {
// One scalar scale, not ANY, not per block.
bool single_scale(const ScaledTensor& x) { return !x.any_scale && x.scale.defined() && x.scale.numel() == 1; }
bool in_scale_range(double s) { return s >= 0x1p-126 && s <= 0x1p127; }
// ema's scales: Z_s = pow2_round(sqrt(ms^2 + xs^2)) and the two data multipliers (scaled::ema).
struct Ema {
  float zs, a, b;
};
Ema ema_scales(double m_scale, double x_scale, double beta) {
  const double ms = beta * m_scale, xs = (1 - beta) * x_scale;
  const float zs = pow2_round(std::sqrt(ms * ms + xs * xs), Pow2Rounding::nearest);
  return {zs, float(ms / zs), float(xs / zs)};
}
}  // namespace

// The composed step below, fused: every op's f32 arithmetic in the same order, per element, in one
// parallel pass (the composed form makes ~20 passes over each parameter). Returns false, doing
// nothing, where it does not apply: ANY or per-block scales (the first step's zero moments),
// scale products outside [2^-126, 2^127] (with_exact_scale would move them into the data), a
// rescale step. KernelsVsReference.FusedScaledAdamWIsBitIdentical checks it.
bool AdamW::step_scaled_fused(size_t k, double bc1, double bc2, double gradient_multiplier) {
  Var& p = params_[k];
  const ScaledTensor& g = p.scaled_grad();
  if (!c_.fused || !single_scale(g) || !single_scale(m_[k]) || !single_scale(v_[k]) || !single_scale(p.scaled())) return false;
  if (c_.rescale_every > 0 && t_ % c_.rescale_every == 0) return false;
  // g * multiplier (scaled::mul_scalar): a power of two moves into the scale, the rest multiplies the data.
  double gs = g.scalar_scale();
  float gmul = 1.0f;
  if (gradient_multiplier != 1.0) {
    const ScaledTensor c = scaled_scalar(gradient_multiplier);
    if (c.any_scale) return false;
    gs *= c.scalar_scale();
    const double m = c.data.item();
    gmul = float(m);
    if (m == 1.0) gmul = 1.0f;
  }
  const double sq_scale = gs * gs;  // square's power rule for a power-of-two scale: exact
  int e;
  if (!in_scale_range(gs) || !in_scale_range(sq_scale) || std::frexp(gs, &e) != 0.5) return false;
  const Ema em = ema_scales(m_[k].scalar_scale(), gs, c_.beta1), ev = ema_scales(v_[k].scalar_scale(), sq_scale, c_.beta2);
  const float ps = p.scaled().scalar_scale();
  const bool scale_g = gradient_multiplier != 1.0 && gmul != 1.0f;
  const float inv_bc2 = float(1.0 / bc2), inv_bc1 = float(1.0 / bc1), eps = float(c_.eps);
  const bool decays = c_.weight_decay != 0 && decay_[k];
  const float wd = float(c_.weight_decay), lr = float(c_.lr * lr_scale_[k]), inv_ps = float(1.0 / ps);
  const Dense<float> gd(g.data), md(m_[k].data), vd(v_[k].data), pd(p.scaled().data);
  const DType state = m_[k].data.dtype();
  const int64_t n = g.data.numel();
  Tensor m_new = Tensor::empty(p.shape()), v_new = Tensor::empty(p.shape()), p_new = Tensor::empty(p.shape());
  float *mo = m_new.data<float>(), *vo = v_new.data<float>(), *po = p_new.data<float>();
  const float *pg = gd.data(), *pm = md.data(), *pv = vd.data(), *pp = pd.data();
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {  // the moments (ema)
    const float gi = scale_g ? pg[i] * gmul + 0.0f : pg[i];
    mo[i] = em.a * pm[i] + em.b * gi;
    vo[i] = ev.a * pv[i] + ev.b * (gi * gi);
  }
  // The update reads the moments through their storage (cast_data): an f16 state rounds first.
  const Tensor m_state = m_new.to(state), v_state = v_new.to(state);
  const Dense<float> ms(m_state), vs(v_state);
  const float *pms = ms.data(), *pvs = vs.data();
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float denom = std::sqrt((pvs[i] * ev.zs) * inv_bc2 + 0.0f) * 1.0f + eps;
    float update = ((pms[i] * em.zs) * inv_bc1 + 0.0f) / denom;
    const float w = pp[i] * ps;
    if (decays) update = update + (w * wd + 0.0f);
    po[i] = (w - (update * lr + 0.0f)) * inv_ps + 0.0f;
  }
  m_[k] = ScaledTensor(m_state, em.zs);
  v_[k] = ScaledTensor(v_state, ev.zs);
  ScaledTensor next = p.scaled();
  next.data = p_new.to(p.scaled().data.dtype());
  p.set_value(next);
  return true;
}

void AdamW::step_scaled(size_t k, double bc1, double bc2, double gradient_multiplier) {
  Var& p = params_[k];
  check_finite(p.scaled_grad().data, k, p.shape());
  if (step_scaled_fused(k, bc1, bc2, gradient_multiplier)) return;
  const ScaledTensor g = gradient_multiplier == 1.0 ? p.scaled_grad() : scaled::mul_scalar(p.scaled_grad(), gradient_multiplier);
  // Moments in scaled form: the ema rule picks their scales; data stored in state_dtype.
  m_[k] = cast_data(scaled::ema(m_[k], g, c_.beta1), *dtype_format(c_.state_dtype));
  v_[k] = cast_data(scaled::ema(v_[k], scaled::unary(ops::Unary::square, g), c_.beta2), *dtype_format(c_.state_dtype));
  // The update direction m / (sqrt(v) + eps) is O(1) elementwise: computed on represented values.
  const Tensor denom = ops::scale_shift(ops::unary(ops::Unary::sqrt, ops::scale_shift(v_[k].value(), 1.0 / bc2, 0.0)), 1.0, c_.eps);
  Tensor update = ops::div(ops::scale_shift(m_[k].value(), 1.0 / bc1, 0.0), denom);
  const Tensor w = p.value();
  if (c_.weight_decay != 0 && decay_[k]) update = ops::add(update, ops::scale_shift(w, c_.weight_decay, 0.0));
  ScaledTensor next = restore(p.scaled(), ops::sub(w, ops::scale_shift(update, c_.lr * lr_scale_[k], 0.0)));
  if (c_.rescale_every > 0 && t_ % c_.rescale_every == 0) {
    next = dynamic_rescale_l2(next);
    m_[k] = dynamic_rescale_l2(m_[k]);
    v_[k] = dynamic_rescale_l2(v_[k]);
  }
  p.set_value(next);
}

void AdamW::load_state(int64_t steps, std::vector<ScaledTensor> m, std::vector<ScaledTensor> v) {
  if (steps < 0 || m.size() != params_.size() || v.size() != params_.size())
    throw Error("AdamW: state for " + std::to_string(m.size()) + " parameters, expected " + std::to_string(params_.size()));
  for (size_t k = 0; k < params_.size(); ++k)
    if (m[k].shape() != params_[k].shape() || v[k].shape() != params_[k].shape())
      throw Error("AdamW: state of parameter " + std::to_string(k) + " has shape " + shape_str(m[k].shape()) + ", expected " +
                  shape_str(params_[k].shape()));
  t_ = steps;
  m_ = std::move(m);
  v_ = std::move(v);
}

void sgd_step(const std::vector<Var>& params, double lr) {
  check_lr(lr, "sgd_step");
  for (Var p : params) {
    if (!p.scaled_grad().data.defined()) continue;
    const Tensor w = ops::sub(p.value(), ops::scale_shift(p.grad(), lr, 0));
    if (p.scaled().is_scaled())
      p.set_value(restore(p.scaled(), w));
    else
      p.set_value(w.to(p.value().dtype()));
    p.zero_grad();
  }
}

}  // namespace scalify::optim
