#include "scalify/optim/adamw.hpp"

#include <cmath>
#include <string>

#include "scalify/error.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::optim {

AdamW::AdamW(std::vector<Var> params, AdamWConfig config) : params_(std::move(params)), c_(config) {
  for (const Var& p : params_) {
    m_.push_back(Tensor::zeros(p.shape()));
    v_.push_back(Tensor::zeros(p.shape()));
  }
}

void AdamW::step() {
  ++t_;
  const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
  for (size_t k = 0; k < params_.size(); ++k) {
    Var& p = params_[k];
    if (!p.grad().defined()) continue;
    Tensor w = p.value().to(DType::f32).contiguous().clone();
    const Dense<float> g(p.grad());
    float* pw = w.data<float>();
    float* m = m_[k].data<float>();
    float* v = v_[k].data<float>();
    const int64_t n = w.numel();
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(g[i]))
        throw Error("AdamW: non-finite gradient in parameter " + std::to_string(k) + " of shape " + shape_str(p.shape()));
      m[i] = float(c_.beta1 * m[i] + (1 - c_.beta1) * g[i]);
      v[i] = float(c_.beta2 * v[i] + (1 - c_.beta2) * double(g[i]) * g[i]);
      const double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c_.eps) + c_.weight_decay * pw[i];
      pw[i] = float(pw[i] - c_.lr * update);
    }
    p.set_value(w.to(p.value().dtype()));
    p.zero_grad();
  }
}

void sgd_step(const std::vector<Var>& params, double lr) {
  for (Var p : params) {
    if (!p.grad().defined()) continue;
    p.set_value(ops::sub(p.value(), ops::scale_shift(p.grad(), lr, 0)).to(p.value().dtype()));
    p.zero_grad();
  }
}

}  // namespace scalify::optim
