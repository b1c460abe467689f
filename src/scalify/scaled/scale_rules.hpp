#pragma once
// The scale rules that more than one place computes, each in one function: the scaled ops, their
// backward passes, the quantised linear layer, the fused norm and the optimizer all call these,
// so a rule changes in one place. Pure functions of scales and sizes (no tensors); each states
// its rule, and ScaleRules.EveryRuleIsTheOneItsOpsApply checks every op that claims to use it.
// The reference text of every rule, these included, is scale_rules() (docs/SCALE_RULES.md).
#include "scalify/scaled/scaled_tensor.hpp"

namespace scalify::scaled::rules {

// A reduction of n terms (matmul over K, sum over n): r = pow2_round(sqrt(max(n, 1))). The
// output's scale is r times the inputs' (Z_s = r X_s Y_s) and the data is divided by r (the
// GEMM's alpha 1 / r): a sum of n unit terms has variance n.
float reduction(double n);

// A weighted sum a X + b Y of independent terms (add / sub: a = b = 1; the fused norm's
// w xhat + bias; the optimizer's moments, b m + (1 - b) x): Z_s = pow2(sqrt((a X_s)^2 + (b Y_s)^2)),
// and the data multipliers a X_s / Z_s and b Y_s / Z_s. `mode`: the add's pow2 rounds down; the
// moments' rounds to nearest, which keeps their scale stationary under a constant decay.
struct WeightedSum {
  float scale;
  double x_mul, y_mul;
};
WeightedSum weighted_sum(double x_scale, double y_scale, double a = 1, double b = 1, Pow2Rounding mode = Pow2Rounding::down);
// The moments' rule: weighted_sum(m_scale, x_scale, beta, 1 - beta, nearest).
WeightedSum ema(double m_scale, double x_scale, double beta);

}  // namespace scalify::scaled::rules
