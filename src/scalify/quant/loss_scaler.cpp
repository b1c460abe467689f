#include "scalify/quant/loss_scaler.hpp"

#include <cmath>

#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/dense.hpp"

namespace scalify::quant {

LossScaler::LossScaler(LossScalerConfig config) : c_(config), scale_(config.kind == LossScalerConfig::Kind::none ? 1.0 : config.scale) {
  if (!(scale_ > 0) || !std::isfinite(scale_)) throw Error("loss scaler: the scale must be finite and positive");
  if (c_.growth_interval < 1) throw Error("loss scaler: growth interval must be at least 1");
  // backoff shrinks the scale after an overflow, growth enlarges it after clean steps.
  if (!(c_.backoff > 0 && c_.backoff <= 1)) throw Error("loss scaler: backoff must be in (0, 1], got " + std::to_string(c_.backoff));
  if (!(c_.growth >= 1) || !std::isfinite(c_.growth))
    throw Error("loss scaler: growth must be finite and >= 1, got " + std::to_string(c_.growth));
}

Var LossScaler::scale_loss(const Var& loss) const { return scale_ == 1.0 ? loss : mul_scalar(loss, scale_); }

bool LossScaler::unscale(const std::vector<Var>& params) {
  ++steps_;
  bool finite = true;
  for (const Var& p : params) {
    if (!p.scaled_grad().data.defined()) continue;
    const Tensor grad = p.grad();  // keep the represented gradient alive while Dense reads it
    const Dense<float> g(grad);
    for (int64_t i = 0, n = grad.numel(); i < n && finite; ++i) finite = std::isfinite(g[i]);
    if (!finite) break;
  }
  if (!finite) {
    for (Var p : params) p.zero_grad();
    ++skipped_;
    clean_ = 0;
    if (c_.kind == LossScalerConfig::Kind::dynamic) scale_ = std::max(scale_ * c_.backoff, 1.0);
    return false;
  }
  if (scale_ != 1.0)
    for (Var p : params)
      if (p.scaled_grad().data.defined()) p.set_grad(scaled::mul_scalar(p.scaled_grad(), 1.0 / scale_));
  if (c_.kind == LossScalerConfig::Kind::dynamic && ++clean_ >= c_.growth_interval) {
    // Growth stops at the largest finite double rather than reaching inf (then inf * 0 = NaN).
    if (std::isfinite(scale_ * c_.growth)) scale_ *= c_.growth;
    clean_ = 0;
  }
  return true;
}

void LossScaler::load_state(const State& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale) || s.skipped < 0 || s.steps < 0 || s.clean < 0)
    throw Error("loss scaler: invalid state (scale " + std::to_string(s.scale) + ")");
  scale_ = s.scale;
  skipped_ = s.skipped;
  steps_ = s.steps;
  clean_ = s.clean;
}

}  // namespace scalify::quant
