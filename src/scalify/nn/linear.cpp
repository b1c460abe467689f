#include "scalify/nn/linear.hpp"

#include <cmath>

#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

Linear Linear::make(int64_t in, int64_t out, Init& init, bool output_projection, bool bias) {
  return {init.weight({in, out}, output_projection), bias ? init.constant({out}, 0.0) : Var(), quant::QLinear()};
}

Var Linear::operator()(const Var& x, const LayerOptions& o) const {
  if (!o.unit_scaled) return gemms(x, w, b);
  // The bias's gradient sums over every row: beta = rows^-1/2 (as LayerNorm's).
  unit::MatmulFn product;
  if (gemms.recipe().quantized) product = [this](const Var& xs, const Var& ws) { return gemms(xs, ws); };
  const Var y = unit::matmul(x, w, unit::Constrain::x, product);
  if (!b.defined()) return y;
  const int64_t rows = numel_of(x.shape()) / x.shape().back();
  return y + unit::scaled(b, 1.0, 1.0 / std::sqrt(double(rows)));
}

}  // namespace scalify::nn
