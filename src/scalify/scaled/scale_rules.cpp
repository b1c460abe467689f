#include "scalify/scaled/scale_rules.hpp"

#include <algorithm>
#include <cmath>

namespace scalify::scaled::rules {

float reduction(double n) { return pow2_round(std::sqrt(std::max(n, 1.0))); }

WeightedSum weighted_sum(double x_scale, double y_scale, double a, double b, Pow2Rounding mode) {
  const double xs = a * x_scale, ys = b * y_scale;
  const float zs = pow2_round(std::sqrt(xs * xs + ys * ys), mode);
  return {zs, xs / zs, ys / zs};
}

WeightedSum ema(double m_scale, double x_scale, double beta) {
  return weighted_sum(m_scale, x_scale, beta, 1 - beta, Pow2Rounding::nearest);
}

AttentionGrad attention_grad(double g_scale, double qkv_scale) { return {g_scale * qkv_scale, 1 / qkv_scale, 1 / qkv_scale}; }

}  // namespace scalify::scaled::rules
