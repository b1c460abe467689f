// SNR figures: the Unit Scaling paper's Appendix D scenario and the shape of its Figure 2.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <cmath>
#include <vector>

#include "expect_error.hpp"
#include "scalify/formats/snr.hpp"

namespace scalify {
namespace {

double db(double x) { return 10 * std::log10(x); }

TEST(Snr, AppendixDIntegerFiguresMatchThePaperWithRoundTowardZero) {
  const OutlierScenario s = outlier_scenario(size_t(1) << 21, 7);
  EXPECT_NEAR(s.int8_max_toward_zero, 2.03, 0.05 * 2.03);
  EXPECT_NEAR(s.int8_median_toward_zero, 14.8, 0.05 * 14.8);
  // Round-to-nearest does not reproduce them: the convention matters (2.9x and 3.6x higher).
  EXPECT_GT(s.int8_max_nearest, 2.5 * 2.03);
  EXPECT_GT(s.int8_median_nearest, 3.0 * 14.8);
  // FP8 E4 unscaled: round-to-nearest gives 1.42e3 against the paper's 1.29e3 (a 10% gap that
  // docs/RESULTS.md discusses); toward zero gives 3.8e2. Both far above INT8.
  EXPECT_NEAR(s.e4m3fnuz_nearest, 1.29e3, 0.15 * 1.29e3);
  EXPECT_GT(s.e4m3fnuz_toward_zero, 100 * s.int8_max_toward_zero);
}

TEST(Snr, EachMantissaBitIsWorthSixDecibelsInTheNormalRange) {
  // Relative rounding error scales with 2^-M, so SNR differs by 20 log10(2) = 6.02 dB per bit.
  const Format formats[] = {Format::f16, Format::bf16, Format::e4m3, Format::e5m2};
  const auto pts = snr_sweep(formats, 0, 0, 1, 1 << 18, 3);
  ASSERT_EQ(pts.size(), 4u);
  const double per_bit = 20 * std::log10(2.0);
  EXPECT_NEAR(db(pts[0].snr) - db(pts[1].snr), 3 * per_bit, 0.3);  // f16 (10) vs bf16 (7)
  EXPECT_NEAR(db(pts[2].snr) - db(pts[3].snr), 1 * per_bit, 0.3);  // e4m3 (3) vs e5m2 (2)
  EXPECT_NEAR(db(pts[0].snr) - db(pts[2].snr), 7 * per_bit, 0.3);  // f16 vs e4m3
}

TEST(Snr, FallsOffOutsideTheFormatsRange) {
  const Format e4m3[] = {Format::e4m3};
  const auto pts = snr_sweep(e4m3, -16, 14, 2, 1 << 14, 4);
  double best = 0;
  for (const SnrPoint& p : pts) best = std::max(best, p.snr);
  EXPECT_LT(pts.front().snr, 1.5);  // sigma = 2^-16: nearly everything underflows to 0
  EXPECT_LT(pts.back().snr, 1.5);   // sigma = 2^14: saturated at 448
  EXPECT_GT(best, 1000.0);
  // bf16 has f32's exponent range: flat across the sweep.
  const Format bf16[] = {Format::bf16};
  const auto flat = snr_sweep(bf16, -30, 20, 10, 1 << 14, 5);
  for (const SnrPoint& p : flat) EXPECT_NEAR(db(p.snr), db(flat[0].snr), 0.5);
}

TEST(Snr, ExactReproductionIsInfinite) {
  const std::vector<float> x = {1, 2, 3};
  EXPECT_TRUE(std::isinf(snr(x, x)));
}

TEST(Snr, SweepRejectsUnboundedOrNonFiniteRanges) {
  const Format f[] = {Format::e4m3};
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_ERROR(snr_sweep(f, 0, inf, 1, 64, 1), "to (log2 sigma) must be a finite number");
  EXPECT_ERROR(snr_sweep(f, -inf, 0, 1, 64, 1), "from (log2 sigma) must be a finite number");
  EXPECT_ERROR(snr_sweep(f, std::strtod("1e400", nullptr), 0, 1, 64, 1), "from (log2 sigma)");
  EXPECT_ERROR(snr_sweep(f, nan, 0, 1, 64, 1), "from (log2 sigma)");
  EXPECT_ERROR(snr_sweep(f, 1e17, 1.00000000000001e17, 1, 64, 1), "in [-149, 127]");  // l += 1 never advanced
  EXPECT_ERROR(snr_sweep(f, -30, 20, 1e-9, 64, 1), "exceeds 10000 points");
  EXPECT_ERROR(snr_sweep(f, -30, 20, 0, 64, 1), "step must be a finite number > 0");
  EXPECT_ERROR(snr_sweep(f, -30, 20, nan, 64, 1), "step must be a finite number > 0");
  EXPECT_ERROR(snr_sweep(f, 4, -4, 1, 64, 1), "to (-4) must be >= from (4)");
  EXPECT_ERROR(snr_sweep(f, -4, 4, 1, size_t(1) << 28, 1), "samples must be in [1, 16777216]");
}

TEST(Snr, SweepPointsAreComputedByIndex) {
  const Format f[] = {Format::e4m3};
  const auto pts = snr_sweep(f, -4, 4, 0.1, 64, 1);
  ASSERT_EQ(pts.size(), 81u);  // accumulating 0.1 eighty times drifts; lo + i * step does not
  for (size_t i = 0; i < pts.size(); ++i) EXPECT_EQ(pts[i].log2_sigma, -4 + double(i) * 0.1);
  EXPECT_EQ(snr_sweep(f, 3, 3, 1e-300, 64, 1).size(), 1u);
}

}  // namespace
}  // namespace scalify
