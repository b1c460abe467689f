// Scaled tensors: power-of-two rounding, bundling primitives, and for every op's scale rule the
// two checks of SPEC §2 — the represented value equals the unscaled computation (model
// invariance), and the output data stays unit-scaled.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "expect_error.hpp"
#include "scalify/error.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/autograd/scaling.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/scaled/scale_rules.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify {
namespace {

using SOp = std::function<ScaledTensor(const std::vector<ScaledTensor>&)>;
using TOp = std::function<Tensor(const std::vector<Tensor>&)>;

double mean_square(const Tensor& t) {
  double s = 0;
  const std::vector<double> v = t.to_vector();
  for (double x : v) s += x * x;
  return s / double(v.size());
}

TEST(Pow2Round, Modes) {
  EXPECT_EQ(pow2_round(1.0), 1.0f);
  EXPECT_EQ(pow2_round(1.9), 1.0f);
  EXPECT_EQ(pow2_round(3.0), 2.0f);
  EXPECT_EQ(pow2_round(3.0, Pow2Rounding::up), 4.0f);
  EXPECT_EQ(pow2_round(4.0, Pow2Rounding::up), 4.0f);
  EXPECT_EQ(pow2_round(1.4, Pow2Rounding::nearest), 1.0f);  // below sqrt(2)
  EXPECT_EQ(pow2_round(1.5, Pow2Rounding::nearest), 2.0f);
  EXPECT_EQ(pow2_round(0.3), 0.25f);
  EXPECT_THROW(pow2_round(0.0), Error);
  EXPECT_THROW(pow2_round(std::nan("")), Error);
}

TEST(ScaledTensor, AsScaledGivesUnitDataAndExactValue) {
  for (double sigma : {1e-6, 0.03, 1.0, 700.0}) {
    const Tensor x = Tensor::randn({4096}, 3, sigma);
    const ScaledTensor s = as_scaled(x);
    const double ms = mean_square(s.data);
    EXPECT_GE(ms, 1.0 * 0.95) << sigma;  // scale rounded down: rms(X_d) in [1, 2)
    EXPECT_LT(ms, 4.0) << sigma;
    EXPECT_EQ(s.value().to_vector(), x.to_vector()) << "power-of-two scaling is exact";
    const ScaledTensor h = as_scaled(x, DType::f16);
    EXPECT_EQ(h.data.dtype(), DType::f16);
  }
  EXPECT_EQ(as_scaled(Tensor::zeros({8})).scalar_scale(), 1.0f);
}

TEST(ScaledTensor, BundlingPrimitivesAreNoOpsOnTheValue) {
  const Tensor x = Tensor::randn({300}, 4, 5.0);
  const ScaledTensor s = as_scaled(x);
  for (const ScaledTensor& t :
       {set_scaling(s, 0.125f), rebalance(s, 8.0f), dynamic_rescale_l2(s), dynamic_rescale_max(s), set_scaling(ScaledTensor(x), 4.0f)})
    EXPECT_EQ(t.value().to_vector(), x.to_vector());
  EXPECT_EQ(set_scaling(s, 0.125f).scalar_scale(), 0.125f);
  // dynamic_rescale_max multiplies the scale by pow2_round(amax(data)) and divides the data by it.
  const ScaledTensor shifted = rebalance(s, 1.0f / 64);
  const double amax = ops::max(ops::unary(ops::Unary::abs, shifted.data), 0).first.item();
  EXPECT_EQ(dynamic_rescale_max(shifted).scalar_scale(), shifted.scalar_scale() * pow2_round(amax));
  const auto [d, sc] = get_data_and_scale(ScaledTensor(x));
  EXPECT_EQ(sc, 1.0f);
  EXPECT_TRUE(d.same_storage(x));
  EXPECT_FALSE(rebalance(ScaledTensor(x), 4.0f).is_scaled());  // unscaled stays unscaled
  EXPECT_EQ(scaled_scalar(-3.0).value().item(), -3.0);
  EXPECT_EQ(scaled_scalar(-3.0).scalar_scale(), 2.0f);
  EXPECT_EQ(cast_data(s, Format::e4m3).data.dtype(), DType::e4m3);
}

struct OpCase {
  std::string name;
  std::vector<Shape> shapes;
  SOp scaled;
  TOp plain;
  double lo, hi;           // bound on E[Y_d^2] for unit-variance data at any scale (derived in comments)
  bool scale_free = true;  // false: the output magnitude depends on the represented value
};

std::vector<OpCase> cases() {
  using namespace scaled;
  using U = ops::Unary;
  const Tensor ids = Tensor::from_indices({3, 1, 4, 1, 5, 9, 2, 6}, {8});
  const Tensor cond = ops::unary(ops::Unary::relu, Tensor::randn({64, 32}, 77));
  const double r2 = 1.0 / 2, k4 = 4.0;
  return {
      // add: Z_s rounds sqrt(X_s^2+Y_s^2) down, so E[Z_d^2] in [1, 4) (equal scales: 2/1 = 2).
      {"add", {{64, 32}, {64, 32}}, [](auto& v) { return add(v[0], v[1]); }, [](auto& v) { return ops::add(v[0], v[1]); }, 1, k4},
      {"sub", {{64, 32}, {32}}, [](auto& v) { return sub(v[0], v[1]); }, [](auto& v) { return ops::sub(v[0], v[1]); }, 1, k4},
      {"mul", {{64, 32}, {64, 32}}, [](auto& v) { return mul(v[0], v[1]); }, [](auto& v) { return ops::mul(v[0], v[1]); }, r2, 2},
      // matmul: r = pow2 floor sqrt K: K / r^2 in [1, 4).
      {"matmul", {{64, 48}, {48, 32}}, [](auto& v) { return matmul(v[0], v[1]); }, [](auto& v) { return ops::matmul(v[0], v[1]); }, 1, k4},
      {"sum", {{64, 48}}, [](auto& v) { return sum(v[0], {1}); }, [](auto& v) { return ops::sum(v[0], {1}); }, 1, k4},
      // mean: r^2 / n in [1/4, 1].
      {"mean", {{64, 256}}, [](auto& v) { return mean(v[0], {0}); }, [](auto& v) { return ops::mean(v[0], {0}); }, 0.25, 1},
      // max of 48 unit Gaussians: E[max^2] ~ 5: a statistic, not unit-preserving by design.
      {"max", {{64, 48}}, [](auto& v) { return max(v[0], 1); }, [](auto& v) { return ops::max(v[0], 1).first; }, 1, 8},
      // relu: E[relu(z)^2] = 1/2; gelu ~0.43; silu ~0.36.
      {"relu", {{64, 32}}, [](auto& v) { return unary(U::relu, v[0]); }, [](auto& v) { return ops::unary(U::relu, v[0]); }, 0.4, 0.6},
      {"gelu",
       {{64, 32}},
       [](auto& v) { return unary(U::gelu_tanh, v[0]); },
       [](auto& v) { return ops::unary(U::gelu_tanh, v[0]); },
       0.3,
       1,
       false},
      {"silu", {{64, 32}}, [](auto& v) { return unary(U::silu, v[0]); }, [](auto& v) { return ops::unary(U::silu, v[0]); }, 0.25, 1, false},
      {"abs", {{64, 32}}, [](auto& v) { return unary(U::abs, v[0]); }, [](auto& v) { return ops::unary(U::abs, v[0]); }, r2, 2},
      {"square",
       {{64, 32}},
       [](auto& v) { return unary(U::square, v[0]); },
       [](auto& v) { return ops::unary(U::square, v[0]); },
       2,
       4},  // E[z^4] = 3
      {"tanh", {{64, 32}}, [](auto& v) { return unary(U::tanh, v[0]); }, [](auto& v) { return ops::unary(U::tanh, v[0]); }, 0.3, 1, false},
      {"exp", {{64, 32}}, [](auto& v) { return unary(U::exp, v[0]); }, [](auto& v) { return ops::unary(U::exp, v[0]); }, 1, 10, false},
      // softmax over n = 32 (N = 32): E[(N p)^2] ~ E[e^(2z)] / E[e^z]^2 = e for unit Gaussian logits.
      {"softmax", {{64, 32}}, [](auto& v) { return softmax(v[0]); }, [](auto& v) { return ops::softmax(v[0]); }, 1.5, 4, false},
      {"layer_norm",
       {{64, 32}},
       [](auto& v) { return layer_norm(v[0], 1e-5); },
       [](auto& v) { return ops::layer_norm(v[0], 1e-5).y; },
       0.9,
       1.01},
      {"rms_norm",
       {{64, 32}},
       [](auto& v) { return rms_norm(v[0], 1e-6); },
       [](auto& v) { return ops::rms_norm(v[0], 1e-6).y; },
       0.9,
       1.01},
      {"where",
       {{64, 32}, {64, 32}},
       [cond](auto& v) { return where(cond, v[0], v[1]); },
       [cond](auto& v) { return ops::where(cond, v[0], v[1]); },
       0.25,
       1},
      {"concat",
       {{64, 32}, {64, 16}},
       [](auto& v) {
         return concat({v[0], v[1]}, 1);
       },
       [](auto& v) {
         return ops::concat({v[0], v[1]}, 1);
       },
       0.25,
       1},
      {"embedding",
       {{10, 32}},
       [ids](auto& v) { return embedding(v[0], ids); },
       [ids](auto& v) { return ops::embedding(v[0], ids); },
       r2,
       2},
      // ema (b = 0.9): Z_s rounds sqrt(b^2 M_s^2 + (1-b)^2 X_s^2) to the nearest power of two: [1/2, 2].
      {"ema",
       {{64, 32}, {64, 32}},
       [](auto& v) { return ema(v[0], v[1], 0.9); },
       [](auto& v) { return ops::binary(ops::Binary::add, v[0], v[1], 0.9, 1 - 0.9); },
       r2,
       2},
      {"transpose", {{64, 32}}, [](auto& v) { return transpose(v[0], 0, 1); }, [](auto& v) { return v[0].transpose(0, 1); }, r2, 2},
      // maximum / minimum of two unit Gaussians: E[max^2] = E[min^2] = 1; rebasing the smaller-scale
      // operand onto the larger scale shrinks it: [1/4, 1].
      {"maximum",
       {{64, 32}, {64, 32}},
       [](auto& v) { return maximum(v[0], v[1]); },
       [](auto& v) { return ops::maximum(v[0], v[1]); },
       0.25,
       1.2},
      {"minimum",
       {{64, 32}, {32}},
       [](auto& v) { return minimum(v[0], v[1]); },
       [](auto& v) { return ops::minimum(v[0], v[1]); },
       0.25,
       1.2},
  };
}

// Inputs: unit-variance data times a random power-of-two scale (per input).
std::vector<ScaledTensor> scaled_inputs(const OpCase& c, int trial, bool unit_scale) {
  std::vector<ScaledTensor> in;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const float s = unit_scale ? 1.0f : std::ldexp(1.0f, int((trial * 7 + int(i) * 13) % 25) - 12);
    in.emplace_back(Tensor::randn(c.shapes[i], 100 + trial * 10 + i), s);
  }
  return in;
}

TEST(ScaleRules, ModelInvarianceForEveryOp) {
  for (const OpCase& c : cases()) {
    for (int trial = 0; trial < 4; ++trial) {
      const bool unit = trial == 0;
      if (!c.scale_free && !unit && trial > 1) continue;  // exp of 2^12-scaled data overflows anyway
      const std::vector<ScaledTensor> in = scaled_inputs(c, trial, unit);
      std::vector<Tensor> values;
      for (const ScaledTensor& s : in) values.push_back(s.value());
      const Tensor want = c.plain(values), got = c.scaled(in).value();
      const std::vector<double> w = want.to_vector(), g = got.to_vector();
      ASSERT_EQ(w.size(), g.size()) << c.name;
      for (size_t i = 0; i < w.size(); ++i) {
        // The scaled op computes the same f32 expression up to power-of-two factors, which are
        // exact; only reassociated sums (add of rebased operands) may differ by an ulp or two.
        const double tol = 4 * std::numeric_limits<float>::epsilon() * std::max(1.0, std::fabs(w[i]));
        ASSERT_NEAR(g[i], w[i], unit ? 0.0 : tol) << c.name << " trial " << trial << " element " << i;
      }
    }
  }
}

TEST(ScaleRules, UnscaledInputsGiveBitIdenticalUnscaledResults) {
  for (const OpCase& c : cases()) {
    std::vector<ScaledTensor> in;
    std::vector<Tensor> values;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      values.push_back(Tensor::randn(c.shapes[i], 300 + i));
      in.emplace_back(values.back());
    }
    const ScaledTensor out = c.scaled(in);
    EXPECT_FALSE(out.is_scaled()) << c.name;
    const std::vector<double> a = out.data.to_vector(), b = c.plain(values).to_vector();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(std::bit_cast<uint64_t>(a[i]), std::bit_cast<uint64_t>(b[i])) << c.name << " " << i;
  }
}

TEST(ScaleRules, OutputDataStaysUnitScaled) {
  for (const OpCase& c : cases()) {
    for (int trial = 1; trial < 4; ++trial) {
      const bool unit = !c.scale_free;  // value-dependent maps are checked at scale 1 only
      const ScaledTensor out = c.scaled(scaled_inputs(c, trial, unit));
      const double ms = mean_square(out.data);
      // The bounds are on E[Y_d^2]; the sample mean of n squares of unit-variance Gaussians has a
      // relative standard deviation of sqrt(2/n): allow 5 of them.
      const double margin = 5 * std::sqrt(2.0 / double(out.data.numel()));
      EXPECT_GE(ms, c.lo * (1 - margin)) << c.name << " trial " << trial;
      EXPECT_LE(ms, c.hi * (1 + margin)) << c.name << " trial " << trial;
    }
  }
}

// Backward: with unit-variance data at arbitrary scales in the inputs and in the incoming
// gradient, every input gradient's data has E[d^2] within the bound stated per op.
TEST(ScaleRules, BackwardKeepsGradientDataUnitScaled) {
  struct Case {
    const char* name;
    std::vector<Shape> shapes;
    std::function<Var(const std::vector<Var>&)> f;
    double lo, hi;
  };
  const Case cases[] = {
      {"add (broadcast bias: sum rule over 64 rows, r = 8: 64/64 = 1)", {{64, 32}, {32}}, [](auto& v) { return v[0] + v[1]; }, 0.5, 2},
      {"mul", {{64, 32}, {64, 32}}, [](auto& v) { return v[0] * v[1]; }, 0.5, 2},
      // dX = G W^T over N = 32: r = pow2(sqrt 32) = 4, 32/16 = 2; dW = X^T G over 64: 64/64 = 1.
      {"matmul", {{64, 48}, {48, 32}}, [](auto& v) { return matmul(v[0], v[1]); }, 0.5, 4},
      // A weight shared by 4 x 16 rows: dW is one matmul over all 64 rows, as above.
      {"batched matmul, shared weight", {{4, 16, 48}, {48, 32}}, [](auto& v) { return matmul(v[0], v[1]); }, 0.5, 4},
      {"relu (half the gradient passes)", {{64, 32}}, [](auto& v) { return relu(v[0]); }, 0.25, 1},
      {"gelu", {{64, 32}}, [](auto& v) { return gelu(v[0]); }, 0.25, 1.5},
      {"layer_norm (rstd of unit data ~1)", {{64, 32}}, [](auto& v) { return layer_norm(v[0]); }, 0.5, 2},
      {"sum over rows (gradient broadcast)", {{64, 32}}, [](auto& v) { return sum(v[0], {1}); }, 0.5, 2},
      {"reshape/transpose",
       {{64, 32}},
       [](auto& v) {
         return transpose(reshape(v[0], {32, 64}), 0, 1);
       },
       0.5,
       2},
  };
  for (const Case& c : cases)
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<Var> in;
      for (size_t i = 0; i < c.shapes.size(); ++i)
        in.emplace_back(ScaledTensor(Tensor::randn(c.shapes[i], 500 + trial * 7 + i), std::ldexp(1.0f, trial * 5 - 5 + int(i))), true);
      const Var out = c.f(in);
      out.backward(ScaledTensor(Tensor::randn(out.shape(), 900 + trial), std::ldexp(1.0f, 3 - 4 * trial)));
      for (size_t i = 0; i < in.size(); ++i) {
        const ScaledTensor& g = in[i].scaled_grad();
        ASSERT_TRUE(g.is_scaled()) << c.name;
        const double ms = mean_square(g.data), margin = 5 * std::sqrt(2.0 / double(g.data.numel()));
        EXPECT_GE(ms, c.lo * (1 - margin)) << c.name << " input " << i << " trial " << trial;
        EXPECT_LE(ms, c.hi * (1 + margin)) << c.name << " input " << i << " trial " << trial;
      }
    }
}

TEST(ScaleRules, SoftmaxGradientDataIsUnitScaled) {
  // Not scale-free: logits of small and of unit value (a peaked row's derivative vanishes). The
  // derivative p (g - sum p g) is O(1/n); the rule moves 1/N into the scale: E[dX_d^2] ~ E[(N p)^2].
  for (const float s : {1.0f / 32, 1.0f}) {
    const Var x(ScaledTensor(Tensor::randn({64, 32}, 950), s), true);
    softmax(x).backward(ScaledTensor(Tensor::randn({64, 32}, 951), 8.0f));
    const double ms = mean_square(x.scaled_grad().data);
    EXPECT_GT(ms, 0.5) << "logit scale " << s;
    EXPECT_LT(ms, 4.0) << "logit scale " << s;
    EXPECT_EQ(x.scaled_grad().scalar_scale(), 8.0f / 32) << "logit scale " << s;
  }
}

TEST(ScaleRules, EmaOfAStationaryInputKeepsItsDataInRange) {
  // An optimizer moment: 300 steps of m = b m + (1 - b) x over fresh unit-variance x at scale 2^-5.
  // The ema rule settles where its data is O(1); composing mul_scalar and add halves M_s each step
  // while M_d grows (about 1 / (1 - b) = 10 here, 1000 for Adam's b2 = 0.999).
  const double b = 0.9;
  ScaledTensor m = any_scale_constant(Tensor::zeros({4096})), composed = m;
  for (int step = 0; step < 300; ++step) {
    const ScaledTensor x(Tensor::randn({4096}, 500 + uint64_t(step)), 1.0f / 32);
    m = scaled::ema(m, x, b);
    composed = scaled::add(scaled::mul_scalar(composed, b), scaled::mul_scalar(x, 1 - b));
  }
  EXPECT_GT(mean_square(m.data), 0.25);
  EXPECT_LT(mean_square(m.data), 4.0);
  EXPECT_GT(mean_square(composed.data), 8.0) << "the composition no longer drifts: revisit the ema rule's comment";
  const std::vector<double> a = m.value().to_vector(), c = composed.value().to_vector();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], c[i], 1e-5 * (std::fabs(c[i]) + 1e-3)) << i;
}

TEST(ScaleRules, PerBlockScaleTensorsAreRebasedExactly) {
  // A per-row scale tensor [rows, 1] (channel / block scaling): every rule rebases it onto the
  // largest block scale, exactly, so the represented values stay those of the unscaled ops.
  std::vector<float> rows;
  for (int r = 0; r < 16; ++r) rows.push_back(std::ldexp(1.0f, r % 7 - 3));
  const ScaledTensor x(Tensor::randn({16, 24}, 31), Tensor::from_vector(rows, {16, 1}));
  const ScaledTensor y(Tensor::randn({24, 8}, 32), 0.5f);
  const Tensor xv = x.value(), yv = y.value();
  using namespace scaled;
  const std::pair<Tensor, Tensor> checks[] = {
      {matmul(x, y).value(), ops::matmul(xv, yv)},
      {add(x, x).value(), ops::add(xv, xv)},
      {unary(ops::Unary::gelu_tanh, x).value(), ops::unary(ops::Unary::gelu_tanh, xv)},
      {layer_norm(x, 1e-5).value(), ops::layer_norm(xv, 1e-5).y},
      {sum(x, {1}).value(), ops::sum(xv, {1})},
      {transpose(x, 0, 1).value(), xv.transpose(0, 1)},
  };
  for (const auto& [got, want] : checks) {
    const std::vector<double> g = got.to_vector(), w = want.to_vector();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], w[i], 4 * std::numeric_limits<float>::epsilon() * std::max(1.0, std::fabs(w[i])));
  }
  // Rebased onto the largest block scale (8); add: pow2 rounds sqrt(8^2 + 8^2) = 11.3 down to 8.
  EXPECT_EQ(add(x, x).scalar_scale(), 8.0f);
}

TEST(ScaleRules, LogSumExpDecompositionWithAnyScale) {
  // Appendix B of seed 000: logsumexp(x) = m + log(sum(exp(x - m))) with
  // m = select(isfinite(max), max, 0): the broadcast 0 has scale ANY, so select keeps max's scale.
  const ScaledTensor x(Tensor::randn({5, 7}, 9), 8.0f);
  using namespace scaled;
  const ScaledTensor mx = max(x, 1, true);
  const Tensor finite = Tensor::ones(mx.shape());  // all rows finite here
  const ScaledTensor m = where(finite, mx, any_scale_constant(Tensor::zeros(mx.shape())));
  EXPECT_EQ(m.scalar_scale(), 8.0f) << "select with an ANY-scaled zero keeps the other scale";
  const ScaledTensor lse = add(reshape(m, {5}), unary(ops::Unary::log, sum(unary(ops::Unary::exp, sub(x, m)), {1})));
  const std::vector<double> got = lse.value().to_vector();
  const std::vector<double> xv = x.value().to_vector();
  for (int r = 0; r < 5; ++r) {
    double mm = -1e300, s = 0;
    for (int j = 0; j < 7; ++j) mm = std::max(mm, xv[size_t(r * 7 + j)]);
    for (int j = 0; j < 7; ++j) s += std::exp(xv[size_t(r * 7 + j)] - mm);
    EXPECT_NEAR(got[size_t(r)], mm + std::log(s), 1e-4 * std::fabs(mm + std::log(s)));
  }
}

TEST(Scaled, BadScalesAreErrorsNamingTheParameter) {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {0.0f, -2.0f, inf, -inf, nan}) {
    EXPECT_ERROR(ScaledTensor(x, bad), "ScaledTensor: scale must be a finite positive number");
    EXPECT_ERROR(set_scaling(ScaledTensor(x, 2.0f), bad), "set_scaling: scale must be a finite positive number");
    EXPECT_ERROR(rebalance(ScaledTensor(x, 2.0f), bad), "rebalance: delta must be a finite positive number");
    EXPECT_ERROR(rebalance(ScaledTensor(x), bad), "rebalance: delta");  // even where it would be a no-op
    EXPECT_ERROR(set_scaling(Var(x, true), bad), "set_scaling: scale");
    EXPECT_ERROR(rebalance(Var(ScaledTensor(x, 2.0f), true), bad), "rebalance: delta");
  }
  // SPEC §2: scales are powers of two, which keeps set_scaling and rebalance exact.
  EXPECT_ERROR(set_scaling(ScaledTensor(x, 2.0f), 3.0f), "set_scaling: scale must be a power of two, got 3");
  EXPECT_ERROR(rebalance(ScaledTensor(x, 2.0f), 0.3f), "rebalance: delta must be a power of two");
  EXPECT_EQ(set_scaling(ScaledTensor(x, 2.0f), std::ldexp(1.0f, -140)).scalar_scale(), std::ldexp(1.0f, -140));  // subnormal: still 2^k
  EXPECT_EQ(ScaledTensor(x, 0.3f).scalar_scale(), 0.3f);  // quantisers' decode factors need not be 2^k
}

// The represented value in f64 (data * scale without f32's range limit).
std::vector<double> value_f64(const ScaledTensor& x) {
  std::vector<double> v = x.data.to_vector();
  for (double& e : v) e *= double(x.scalar_scale());
  return v;
}

// Scale products by exponent arithmetic: 2^127 * 2^-126 is 2^1 (f32 multiplication left to right
// gave inf); a product beyond f32's scale range is clamped, its rest moved into the data, and the
// represented value kept.
TEST(ScaleEdges, ScaleProductsAreExactAtTheF32Edge) {
  const Tensor a = Tensor::randn({8, 16}, 1), b = Tensor::randn({16, 4}, 2);
  const ScaledTensor big(a, std::ldexp(1.0f, 127)), tiny(b, std::ldexp(1.0f, -126));
  const ScaledTensor tiny_rows(Tensor::randn({8, 16}, 3), std::ldexp(1.0f, -126));
  EXPECT_EQ(scaled::mul(big, tiny_rows).scalar_scale(), 2.0f);
  EXPECT_EQ(scaled::matmul(big, tiny).scalar_scale(), 8.0f);  // r = pow2(sqrt 16) = 4: 4 * 2^127 * 2^-126
  EXPECT_EQ(scaled::div(big, ScaledTensor(a, std::ldexp(1.0f, 100))).scalar_scale(), std::ldexp(1.0f, 27));
  // Beyond the range: scale clamped to 2^-126, the remaining 2^-100 in the data, value exact.
  const ScaledTensor under = scaled::mul(ScaledTensor(a, std::ldexp(1.0f, -126)), ScaledTensor(a, std::ldexp(1.0f, -100)));
  EXPECT_EQ(under.scalar_scale(), std::ldexp(1.0f, -126));
  const std::vector<double> av = a.to_vector(), uv = value_f64(under);
  for (size_t i = 0; i < av.size(); ++i) ASSERT_EQ(uv[i], double(float(av[i] * av[i])) * std::ldexp(1.0, -226)) << i;
  // Over it: value() cannot be an f32 any more, and says so.
  const ScaledTensor over = scaled::mul(ScaledTensor(a, std::ldexp(1.0f, 127)), ScaledTensor(a, std::ldexp(1.0f, 100)));
  EXPECT_EQ(over.scalar_scale(), std::ldexp(1.0f, 127));
  EXPECT_ERROR(over.value(), "overflows f32");
  EXPECT_ERROR(ScaledTensor(Tensor::full({2}, 4.0f), std::ldexp(1.0f, 127)).value(), "overflows f32");
}

// sqrt, rsqrt and integer powers propagate the scale (Y_s = X_s^p) instead of folding it into the
// data: at an input scale of 2^60 the data stays O(1) (folded: sqrt gave 2e9, pow 2 gave 2e37).
TEST(ScaleEdges, PowersPropagateTheScale) {
  const Tensor d = ops::unary(ops::Unary::abs, Tensor::randn({64, 32}, 5));
  struct Case {
    const char* name;
    std::function<ScaledTensor(const ScaledTensor&)> f;
    double p;
  };
  const Case cases[] = {
      {"sqrt", [](auto& x) { return scaled::unary(ops::Unary::sqrt, x); }, 0.5},
      {"rsqrt", [](auto& x) { return scaled::unary(ops::Unary::rsqrt, x); }, -0.5},
      {"square", [](auto& x) { return scaled::unary(ops::Unary::square, x); }, 2},
      {"pow 2", [](auto& x) { return scaled::pow_scalar(x, 2); }, 2},
      {"pow 3", [](auto& x) { return scaled::pow_scalar(x, 3); }, 3},
      {"pow -1", [](auto& x) { return scaled::pow_scalar(x, -1); }, -1},
  };
  for (const Case& c : cases)
    for (int e : {60, 61, -60, -61, 0}) {
      const ScaledTensor y = c.f(ScaledTensor(d, std::ldexp(1.0f, e)));
      // Beyond f32's scale range (pow 3 at 2^60 is 2^180) the scale is clamped and the rest of it
      // is in the data: the value is still exact.
      const double want_scale = std::exp2(std::floor(c.p * e));
      const bool in_range = want_scale <= 0x1p127 && want_scale >= 0x1p-126;
      EXPECT_EQ(y.scalar_scale(), float(std::clamp(want_scale, 0x1p-126, 0x1p127))) << c.name << " at 2^" << e;
      const std::vector<double> dv = d.to_vector(), got = value_f64(y), data = y.data.to_vector();
      for (size_t i = 0; i < dv.size(); ++i) {
        const double want = std::pow(dv[i] * std::ldexp(1.0, e), c.p);
        ASSERT_NEAR(got[i] / want, 1.0, 4e-7) << c.name << " at 2^" << e << " element " << i;
        if (in_range) {
          ASSERT_LT(std::fabs(data[i]), 2 * std::pow(dv[i], c.p)) << c.name << ": the scale stays out of the data";
        }
      }
    }
}

// Their gradients propagate too, and every op's backward stays finite at large scales: the
// tanh-form GELU's derivative gave NaN from |x| = 2^64 (x^3 overflowed, inf * 0).
TEST(ScaleEdges, GradientsAtLargeScalesAreFiniteAndExact) {
  const Tensor d = ops::scale_shift(ops::unary(ops::Unary::abs, Tensor::randn({16, 8}, 6)), 1.0, 0.25);
  for (int e : {60, -60}) {
    for (double p : {0.5, -0.5, 2.0, 3.0}) {
      Var x(ScaledTensor(d, std::ldexp(1.0f, e)), true);
      Var y = p == 0.5 ? sqrt(x) : p == -0.5 ? rsqrt(x) : pow_scalar(x, p);
      y.backward(ScaledTensor(Tensor::ones(d.shape()), 1.0f));
      const ScaledTensor& g = x.scaled_grad();
      const std::vector<double> dv = d.to_vector(), gv = value_f64(g), gd = g.data.to_vector();
      for (size_t i = 0; i < dv.size(); ++i) {
        const double xv = dv[i] * std::ldexp(1.0, e), want = p * std::pow(xv, p - 1);
        ASSERT_NEAR(gv[i] / want, 1.0, 1e-6) << "p " << p << " at 2^" << e;
        ASSERT_LT(std::fabs(gd[i]), 1e3) << "p " << p << ": the gradient's scale stays out of its data";
      }
    }
  }
  for (int e : {64, 100, 127}) {
    const Tensor z = Tensor::randn({1024}, 7);
    Var x(ScaledTensor(z, std::ldexp(1.0f, e)), true);
    gelu(x).backward(ScaledTensor(Tensor::ones({1024}), 1.0f));
    const std::vector<double> zv = z.to_vector(), gv = x.grad().to_vector();
    for (size_t i = 0; i < zv.size(); ++i) ASSERT_EQ(gv[i], zv[i] > 0 ? 1.0 : 0.0) << "gelu' at 2^" << e << " x " << zv[i];
  }
}

// relu, gelu and silu are x g(x) with g(+inf) = 1, g(-inf) = 0: Y_d = X_d g(X_d X_s) is finite for
// every finite input, whatever the scale. At 2^100 and 2^127, X_d X_s overflowed to inf inside the
// map and gave inf (positive inputs) or NaN (inf * 0, negative ones); the gate saturates at these
// scales for data of order 1, so the exact results are X_d or 0, and the gradient's G_d or 0.
TEST(ScaleEdges, GatedActivationsStayFiniteAtTheF32Edge) {
  const Tensor z = Tensor::randn({4096}, 8);  // |z| >= 2^-20 here, so |z| 2^64 saturates every gate
  const std::vector<double> zv = z.to_vector();
  for (ops::Unary op : {ops::Unary::relu, ops::Unary::gelu_tanh, ops::Unary::gelu_erf, ops::Unary::silu})
    for (int e : {64, 100, 127}) {
      Var x(ScaledTensor(z, std::ldexp(1.0f, e)), true);
      const Var y = unary(op, x);
      EXPECT_EQ(y.scaled().scalar_scale(), std::ldexp(1.0f, e)) << ops::unary_name(op);
      const std::vector<double> yd = y.scaled().data.to_vector();
      y.backward(ScaledTensor(Tensor::ones({4096}), 1.0f));
      const std::vector<double> gd = x.scaled_grad().data.to_vector();
      for (size_t i = 0; i < zv.size(); ++i) {
        ASSERT_GE(std::fabs(zv[i]), 0x1p-20);
        ASSERT_EQ(yd[i], zv[i] > 0 ? zv[i] : 0.0) << ops::unary_name(op) << " at 2^" << e << ", x_d " << zv[i];
        ASSERT_EQ(gd[i], zv[i] > 0 ? 1.0 : 0.0) << ops::unary_name(op) << "' at 2^" << e << ", x_d " << zv[i];
      }
    }
}

// Ops that fold the scale into their input (log, softmax, log_softmax, cross-entropy) stay finite
// at the f32 edge wherever the true result is: data in [2, 2.5] at scale 2^127 overflows
// X_d X_s to inf, which gave inf (log) or NaN (inf - inf in the max-shifted exponentials).
TEST(ScaleEdges, FoldingOpsStayFiniteAtTheF32Edge) {
  std::vector<float> v(4 * 16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 2.0f + 0.5f * float((i * 7) % 16) / 15.0f;
  const Tensor d = Tensor::from_vector(v, {4, 16}), targets = Tensor::from_indices({3, 0, 15, 7}, {4});
  const double s = std::ldexp(1.0, 127);
  const ScaledTensor x(d, float(s));
  // References in double, where X_d X_s does not overflow.
  std::vector<double> lsm(v.size()), sm(v.size());
  double loss = 0;
  for (int r = 0; r < 4; ++r) {
    double top = -INFINITY, sum = 0;
    for (int j = 0; j < 16; ++j) top = std::max(top, s * v[size_t(r * 16 + j)]);
    for (int j = 0; j < 16; ++j) sum += std::exp(s * v[size_t(r * 16 + j)] - top);
    for (int j = 0; j < 16; ++j) {
      const size_t i = size_t(r * 16 + j);
      lsm[i] = s * v[i] - top - std::log(sum);
      sm[i] = std::exp(lsm[i]);
    }
    loss -= lsm[size_t(r * 16 + (r == 0 ? 3 : r == 1 ? 0 : r == 2 ? 15 : 7))] / 4;
  }
  const std::vector<double> got_lsm = value_f64(scaled::log_softmax(x, -1)), got_sm = value_f64(scaled::softmax(x, -1)),
                            got_log = value_f64(scaled::unary(ops::Unary::log, x));
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got_lsm[i]) && std::isfinite(got_sm[i]) && std::isfinite(got_log[i])) << i;
    ASSERT_NEAR(got_lsm[i], lsm[i], std::fabs(lsm[i]) * 1e-6 + 1e-6) << "log_softmax " << i;
    ASSERT_NEAR(got_sm[i], sm[i], 1e-6) << "softmax " << i;
    ASSERT_NEAR(got_log[i], std::log(double(v[i])) + 127 * std::log(2.0), 1e-5) << "log " << i;
  }
  // log's other edge: X_d X_s underflows to 0 (2^-30 at 2^-126), log X_d + log X_s = -156 ln 2.
  const std::vector<double> tiny_log =
      value_f64(scaled::unary(ops::Unary::log, ScaledTensor(Tensor::full({4}, std::ldexp(1.0, -30)), std::ldexp(1.0f, -126))));
  for (double t : tiny_log) EXPECT_NEAR(t, -156 * std::log(2.0), 1e-4);
  Var logits(x, true);
  const Var l = cross_entropy(logits, targets);
  EXPECT_NEAR(l.value().item(), loss, loss * 1e-6);
  l.backward();
  const std::vector<double> g = value_f64(logits.scaled_grad());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_TRUE(std::isfinite(g[i])) << "cross_entropy gradient " << i;
}

// Every op that claims a rule of scaled/scale_rules.hpp gives the scale the rule computes: the
// scaled ops, the SCALIFY linear layer forward and backward, the fused norm's affine.
TEST(ScaleRules, EveryRuleIsTheOneItsOpsApply) {
  namespace r = scaled::rules;
  const float sx = std::ldexp(1.0f, 5), sy = std::ldexp(1.0f, -3);
  // The second operand of add and ema at a larger scale than the first: a rule that kept the first
  // operand's scale would fail.
  const float sx2 = std::ldexp(1.0f, 7);
  const ScaledTensor x(Tensor::randn({12, 48}, 21), sx), y(Tensor::randn({48, 20}, 22), sy), x2(Tensor::randn({12, 48}, 23), sx2);
  EXPECT_EQ(r::reduction(48), 4.0f);  // sqrt 48 = 6.9, rounded down to a power of two
  EXPECT_EQ(r::reduction(64), 8.0f);
  EXPECT_EQ(r::reduction(0), 1.0f);
  EXPECT_EQ(r::weighted_sum(1.0, 1.0).scale, 1.0f);  // sqrt 2 rounded down
  EXPECT_EQ(r::ema(1.0, 1.0, 0.9).scale, 1.0f);      // sqrt(0.82) = 0.91 to the nearest power of two (down: 0.5)
  EXPECT_EQ(scaled::matmul(x, y).scalar_scale(), r::reduction(48) * sx * sy);
  EXPECT_EQ(scaled::sum(x, {1}).scalar_scale(), r::reduction(48) * sx);
  EXPECT_EQ(scaled::mean(x, {1}).scalar_scale(), sx / r::reduction(48));
  EXPECT_EQ(scaled::add(x, x2).scalar_scale(), r::weighted_sum(sx, sx2).scale);
  EXPECT_EQ(r::weighted_sum(sx, sx2).scale, sx2);
  EXPECT_EQ(scaled::ema(x, x2, 0.5).scalar_scale(), r::ema(sx, sx2, 0.5).scale);
  EXPECT_EQ(r::ema(sx, sx2, 0.5).scale, std::ldexp(1.0f, 6));  // sqrt(16^2 + 64^2) = 66 to the nearest: neither input's
  // SCALIFY's linear layer: the matmul rule over K forward, over N and over the rows backward.
  const quant::QLinear layer(quant::preset("scalify_fp8_3").linear);
  Var xv(x, true), wv(ScaledTensor(Tensor::randn({48, 20}, 24), sy), true);
  const Var out = layer(xv, wv);
  EXPECT_EQ(out.scaled().scalar_scale(), r::reduction(48) * sx * sy);
  const float sg = std::ldexp(1.0f, 2);
  out.backward(ScaledTensor(Tensor::randn({12, 20}, 25), sg));
  EXPECT_EQ(xv.scaled_grad().scalar_scale(), r::reduction(20) * sg * sy);
  EXPECT_EQ(wv.scaled_grad().scalar_scale(), r::reduction(12) * sx * sg);
  // The fused norm's affine w xhat + b: a weighted sum of W_s and B_s.
  const float sw = std::ldexp(1.0f, 1), sb = std::ldexp(1.0f, 4);  // the bias's scale wins: W_s kept would fail
  const Var ln =
      layer_norm(Var(x, true), Var(ScaledTensor(Tensor::randn({48}, 26), sw), true), Var(ScaledTensor(Tensor::randn({48}, 27), sb), true));
  EXPECT_EQ(ln.scaled().scalar_scale(), r::weighted_sum(sw, sb).scale);
}

// A linear layer's weight gradient over batched rows is one scaled matmul reducing over all
// B x T rows: it represents the unscaled gradient, with the matmul rule's scale over B x T.
TEST(ScaleRules, SharedWeightGradientRepresentsTheUnscaledOne) {
  const Tensor xd = Tensor::randn({4, 16, 48}, 41), wd = Tensor::randn({48, 32}, 42), gd = Tensor::randn({4, 16, 32}, 43);
  Var xs(ScaledTensor(xd, 32.0f), true), ws(ScaledTensor(wd, 0.125f), true);
  Var xu(ScaledTensor(xd, 32.0f).value(), true), wu(ScaledTensor(wd, 0.125f).value(), true);
  matmul(xs, ws).backward(ScaledTensor(gd, 4.0f));
  matmul(xu, wu).backward(ScaledTensor(gd, 4.0f).value());
  EXPECT_EQ(ws.scaled_grad().scalar_scale(), 8.0f * 32.0f * 4.0f);  // r = pow2(sqrt 64) = 8
  const std::vector<double> got = ws.grad().to_vector(), want = wu.grad().to_vector();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i]))) << i;
}

// maximum / minimum keep a NaN from either operand (no silent NaN loss), and route the gradient.
TEST(Scaled, MaximumMinimumPropagateNaNAndRouteGradients) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = Tensor::from_vector(std::vector<float>{nan, 1, 5, 2}, {4}),
               b = Tensor::from_vector(std::vector<float>{1, nan, 3, 2}, {4});
  for (bool scaled_in : {false, true}) {
    // The same represented values, scaled differently: a = a_d 4, b = b_d 2.
    const ScaledTensor sa = scaled_in ? ScaledTensor(ops::scale_shift(a, 0.25, 0), 4.0f) : ScaledTensor(a);
    const ScaledTensor sb = scaled_in ? ScaledTensor(ops::scale_shift(b, 0.5, 0), 2.0f) : ScaledTensor(b);
    for (bool take_max : {true, false}) {
      const std::vector<double> s = (take_max ? scaled::maximum(sa, sb) : scaled::minimum(sa, sb)).value().to_vector();
      Var va(sa, true), vb(sb, true);
      const Var out = take_max ? maximum(va, vb) : minimum(va, vb);
      const std::vector<double> v = out.value().to_vector();
      EXPECT_TRUE(std::isnan(s[0]) && std::isnan(s[1]) && std::isnan(v[0]) && std::isnan(v[1]));
      EXPECT_EQ(s[2], take_max ? 5 : 3);
      EXPECT_EQ(v[2], take_max ? 5 : 3);
      out.backward(ScaledTensor(Tensor::ones({4})));
      const std::vector<double> ga = va.grad().to_vector(), gb = vb.grad().to_vector();
      EXPECT_EQ(ga[2], take_max ? 1.0 : 0.0);  // 5 vs 3: max takes a, min takes b
      EXPECT_EQ(gb[2], take_max ? 0.0 : 1.0);
      EXPECT_EQ(ga[3], 1.0);  // a tie goes to the first operand
      EXPECT_EQ(gb[3], 0.0);
    }
  }
}

}  // namespace
}  // namespace scalify

namespace scalify {
namespace {

double rms_of(const Tensor& t) {
  double s = 0;
  const std::vector<double> v = t.to_vector();
  for (double x : v) s += x * x;
  return std::sqrt(s / double(v.size()));
}

// The fused attention on scaled qkv (f32 and f16 data) represents the unscaled computation on the
// represented values, forward and backward, and keeps its data in range: the output's data is a
// convex combination of the value data (no larger); backward, dq and dk are s^2 times smaller than
// dv and the gradient's scale sits between them (dQKV_s = g_s s), so at s = 2^-8 neither part of
// the f16 data is subnormal (with dQKV_s = g_s, dq_d and dk_d sat near 2^-16, all subnormal).
TEST(ScaleRules, FusedAttentionRepresentsTheUnscaledComputation) {
  const int64_t B = 2, T = 70, H = 2, D = 16;
  const Tensor xd = Tensor::randn({B, T, 3 * D}, 31), gd = Tensor::randn({B, T, D}, 32);
  for (float s : {0.25f, 4.0f, 0x1p-8f})
    for (DType storage : {DType::f32, DType::f16}) {
      const Tensor data = xd.to(storage);
      const Var scaled(ScaledTensor(data, s), true), plain(ops::scale_shift(data.to(DType::f32), s, 0.0), true);
      const Var ys = causal_self_attention(scaled, H), yp = causal_self_attention(plain, H);
      EXPECT_EQ(ys.scaled().scalar_scale(), s) << "Y_s = s";
      ys.backward(ScaledTensor(gd, 0.5f));
      yp.backward(ops::scale_shift(gd, 0.5, 0.0));
      const std::vector<double> a = ys.value().to_vector(), b = yp.value().to_vector();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-3 * (1 + std::fabs(b[i]))) << "s " << s << " at " << i;
      const std::vector<double> ga = scaled.grad().to_vector(), gb = plain.grad().to_vector();
      for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-3 * (1 + std::fabs(gb[i]))) << "s " << s << " grad at " << i;
      EXPECT_LE(
          ops::max(ops::unary(ops::Unary::abs, ys.scaled().data.to(DType::f32).reshape({-1})), 0).first.item(),
          ops::max(ops::unary(ops::Unary::abs, data.to(DType::f32).slice(2, 2 * D, 3 * D).contiguous().reshape({-1})), 0).first.item());
      EXPECT_EQ(scaled.scaled_grad().scalar_scale(), 0.5f * s) << "dQKV_s = g_s s";
      const Tensor grad_data = scaled.scaled_grad().data.to(DType::f32);
      const double dqk = rms_of(grad_data.slice(2, 0, 2 * D)), dv = rms_of(grad_data.slice(2, 2 * D, 3 * D));
      // dv_d = P^T g_d / s: of the incoming gradient's order over s (peaked attention leaves some keys unused).
      // Measured RMS: dv_d s 0.27-0.92, dq_d and dk_d / s 0.19-0.23 across these s (T = 70).
      EXPECT_GT(dv * s, 0.15) << "s " << s;
      EXPECT_LT(dv * s, 1.5) << "s " << s;
      EXPECT_GT(dqk / s, 0.1) << "s " << s;
      EXPECT_LT(dqk / s, 0.5) << "s " << s;
      if (storage == DType::f16 && s < 1) {
        // At s = 2^-8: measured 7.8 % of the data subnormal (the tail of dq and dk, whose RMS is
        // 2^-10 against dv's 2^6: the s^2 between them is the one scale's limit); under
        // dQKV_s = g_s it was every value of dq and dk, two thirds of the tensor.
        int64_t subnormal = 0;
        for (double v : grad_data.to_vector()) subnormal += v != 0 && std::fabs(v) < 0x1p-14;
        EXPECT_LT(double(subnormal) / double(grad_data.numel()), s == 0.25f ? 0.005 : 0.1) << "s " << s;
      }
    }
}

}  // namespace
}  // namespace scalify
