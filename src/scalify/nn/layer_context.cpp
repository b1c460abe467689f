#include "scalify/nn/layer_context.hpp"

#include <cmath>

#include "scalify/tensor/ops.hpp"

namespace scalify::nn {

namespace {
double rms(const Tensor& t) { return std::sqrt(ops::mean(ops::unary(ops::Unary::square, t), {}).item()); }
}  // namespace

Var ScaleProbe::tap(const Var& x, const std::string& name) {
  const size_t i = entries.size();
  entries.push_back({name, rms(x.value()), -1, x.scaled().data.dtype(), DType::f32});
  if (observe) observe(name, false, x.scaled());
  return Var::make("probe", x.scaled(), {x}, [this, i](const ScaledTensor& g) {
    if (observe) observe(entries[i].name, true, g);
    entries[i].backward_rms = rms(g.is_scaled() ? g.value() : g.data);
    entries[i].backward_storage = g.data.dtype();
    return std::vector<ScaledTensor>{g};
  });
}

Var LayerOptions::tap(const Var& x, const char* name) const { return probe ? probe->tap(x, std::string(prefix).append(name)) : x; }

Var Init::weight(const Shape& s, bool output_projection) {
  const double sd = unit_scaled ? 1.0 : output_projection ? 0.02 / std::sqrt(2.0 * layers) : 0.02;
  ++seed;
  return Var(draw ? Tensor::randn(s, seed, sd) : Tensor::empty(s), true);
}
Var Init::constant(const Shape& s, double v) const { return Var(draw ? Tensor::full(s, v) : Tensor::empty(s), true); }

}  // namespace scalify::nn
