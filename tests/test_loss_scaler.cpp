// Loss scaling: static divides gradients back; dynamic skips exactly the steps with overflow,
// halves on overflow and doubles after N clean steps.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "expect_error.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/quant/loss_scaler.hpp"

namespace scalify::quant {
namespace {

TEST(LossScaler, StaticScaleIsUndoneOnTheGradients) {
  LossScalerConfig c;
  c.kind = LossScalerConfig::Kind::fixed;
  c.scale = 1024;
  LossScaler s(c);
  Var w(Tensor::from_vector(std::vector<float>{1.5f, -2.0f}, {2}), true);
  s.scale_loss(sum(w * w)).backward();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{3.0 * 1024, -4.0 * 1024}));
  EXPECT_TRUE(s.unscale({w}));
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{3.0, -4.0}));
  EXPECT_EQ(s.scale(), 1024);
}

TEST(LossScaler, DynamicSkipsExactlyTheOverflowStepsAndRecovers) {
  LossScalerConfig c;  // dynamic, start 2^15
  c.growth_interval = 3;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 32768);
  Var w(Tensor::ones({4}), true);
  const float inf = std::numeric_limits<float>::infinity();
  // Steps 3 and 4 overflow (an inf in the gradient); the others are clean.
  const bool overflow[] = {false, false, true, true, false, false, false, false};
  std::vector<double> scales;
  std::vector<bool> applied;
  for (bool o : overflow) {
    Var x(Tensor::from_vector(std::vector<float>{1, 2, o ? inf : 3.0f, 4}, {4}));
    s.scale_loss(sum(w * x)).backward();
    applied.push_back(s.unscale({w}));
    scales.push_back(s.scale());
    if (applied.back())
      EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{1, 2, 3, 4}));
    else
      EXPECT_FALSE(w.grad().defined());
    w.zero_grad();
  }
  EXPECT_EQ(applied, (std::vector<bool>{true, true, false, false, true, true, true, true}));
  EXPECT_EQ(s.skipped_steps(), 2);
  // Halved at each overflow; doubled after 3 clean steps in a row.
  EXPECT_EQ(scales, (std::vector<double>{32768, 32768, 16384, 8192, 8192, 8192, 16384, 16384}));
}

TEST(LossScaler, BadConfigIsAnError) {
  LossScalerConfig c;
  c.scale = 0;
  EXPECT_THROW(LossScaler{c}, Error);
}

TEST(LossScaler, BadConfigurationIsAnErrorNamingTheField) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {nan, 0.0, -0.5, 1.5, inf}) {
    LossScalerConfig c;
    c.backoff = bad;
    EXPECT_ERROR(LossScaler{c}, "backoff must be in (0, 1]");
  }
  for (double bad : {nan, 0.0, 0.5, inf}) {
    LossScalerConfig c;
    c.growth = bad;
    EXPECT_ERROR(LossScaler{c}, "growth must be finite and >= 1");
  }
  LossScalerConfig c;
  c.scale = nan;
  EXPECT_ERROR(LossScaler{c}, "scale must be finite and positive");
}

TEST(LossScaler, GrowthStopsShortOfInfinity) {
  LossScalerConfig c;
  c.scale = 1e300;
  c.growth_interval = 1;
  c.growth = 1e10;
  LossScaler s(c);
  Var w(Tensor::from_vector(std::vector<float>{1.0f}, {1}), true);
  for (int i = 0; i < 3; ++i) {
    w.set_grad(ScaledTensor(Tensor::from_vector(std::vector<float>{0.0f}, {1})));
    ASSERT_TRUE(s.unscale({w}));
    EXPECT_TRUE(std::isfinite(s.scale()));
  }
}

}  // namespace
}  // namespace scalify::quant
