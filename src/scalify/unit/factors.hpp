#pragma once
// Table A.2 of the Unit Scaling paper and the empirical estimation it was made with: for
// x ~ N(0, 1) and an independent unit gradient g, alpha = 1 / std(f(x)) and
// beta = 1 / std(f'(x) g).
#include <cstdint>
#include <string_view>
#include <vector>

#include "scalify/tensor/ops.hpp"

namespace scalify::unit {

struct ActivationFactors {
  std::string_view name;
  ops::Unary op;
  double alpha, beta;  // Table A.2
};
const std::vector<ActivationFactors>& table_a2_activations();
const ActivationFactors& activation_factors(ops::Unary op);

struct Estimate {
  double alpha, beta;
};
Estimate estimate_factors(ops::Unary op, int64_t samples, uint64_t seed);

}  // namespace scalify::unit
