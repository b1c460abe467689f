#include "scalify/nn/linear.hpp"

#include <cmath>

#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

Linear Linear::make(int64_t in, int64_t out, Init& init, bool output_projection, bool bias) {
  return {init.weight({in, out}, output_projection), bias ? init.constant({out}, 0.0) : Var(), quant::QLinear()};
}

Var Linear::operator()(const Var& x, const LayerOptions& o, unit::Constrain constrain, int fused) const {
  if (!o.unit_scaled && !o.umup) return gemms(x, w, b);
  // The bias's gradient sums over every row: beta = rows^-1/2 (as LayerNorm's).
  unit::MatmulFn product;
  if (gemms.recipe().quantized) product = [this](const Var& xs, const Var& ws) { return gemms(xs, ws); };
  const int64_t rows = numel_of(x.shape()) / x.shape().back();
  Var y;
  if (o.umup) {
    const double alpha = 1 / std::sqrt(double(w.shape()[0])), beta_w = 1 / std::sqrt(double(rows));
    const double beta_x = constrain == unit::Constrain::x_to_output_scale ? alpha : 1 / std::sqrt(double(w.shape()[1] / fused));
    y = unit::matmul(x, w, alpha, beta_x, beta_w, product);
  } else {
    y = unit::matmul(x, w, unit::Constrain::x, product);
  }
  if (!b.defined()) return y;
  return y + unit::scaled(b, 1.0, 1.0 / std::sqrt(double(rows)));
}

}  // namespace scalify::nn
