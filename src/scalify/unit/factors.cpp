#include "scalify/unit/factors.hpp"

#include <cmath>
#include <numbers>

#include "scalify/error.hpp"

namespace scalify::unit {

const std::vector<ActivationFactors>& table_a2_activations() {
  static const std::vector<ActivationFactors> t = {
      {"relu", ops::Unary::relu, std::sqrt(2.0 / (1.0 - 1.0 / std::numbers::pi)), std::sqrt(2.0)},
      {"gelu", ops::Unary::gelu_erf, 1.701, 1.481},
      {"tanh", ops::Unary::tanh, 1.593, 1.467},
      {"sigmoid", ops::Unary::sigmoid, 4.802, 4.722},
  };
  return t;
}

const ActivationFactors& activation_factors(ops::Unary op) {
  for (const ActivationFactors& f : table_a2_activations())
    if (f.op == op) return f;
  if (op == ops::Unary::gelu_tanh) return activation_factors(ops::Unary::gelu_erf);  // same to 3 digits
  throw Error(std::string("unit scaling: no Table A.2 factors for ") + ops::unary_name(op));
}

Estimate estimate_factors(ops::Unary op, int64_t samples, uint64_t seed) {
  const Tensor x = Tensor::randn({samples}, seed, 1.0, DType::f64);
  const Tensor g = Tensor::randn({samples}, seed + 1, 1.0, DType::f64);
  const Tensor y = ops::unary(op, x);
  const Tensor dx = ops::unary_backward(op, x, y, g);
  auto stddev = [](const Tensor& t) {
    const double m = ops::mean(t, {}).item();
    return std::sqrt(ops::mean(ops::unary(ops::Unary::square, t), {}).item() - m * m);
  };
  return {1.0 / stddev(y), 1.0 / stddev(dx)};
}

}  // namespace scalify::unit
