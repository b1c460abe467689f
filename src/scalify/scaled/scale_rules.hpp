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

// Fused causal attention's backward on qkv of scale s with an incoming gradient of scale g_s: dq
// and dk are s^2 times smaller than dv (they pass through the scores, s^2 q_d k_d^T), and one scale
// holds all three. The rule takes the geometric middle, dQKV_s = g_s s: dq_d and dk_d carry s
// (the kernel's score multiplier times qk_mul = 1 / s) and dv_d carries 1 / s (v_mul), each
// |log2 s| binades from unit, where g_s alone left dq_d and dk_d 2 |log2 s| away (at s = 2^-8, in
// f16's subnormals).
struct AttentionGrad {
  double scale, qk_mul, v_mul;
};
AttentionGrad attention_grad(double g_scale, double qkv_scale);

}  // namespace scalify::scaled::rules
