// Stochastic rounding is unbiased and never rounds past the two neighbours of the input.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "scalify/formats/bulk.hpp"

namespace scalify {
namespace {

struct Case {
  Format format;
  float x;
};

// For x between neighbours lo < x < hi, SR picks hi with probability p = (x - lo) / (hi - lo),
// so the sample mean of N draws has standard deviation (hi - lo) * sqrt(p (1 - p) / N). The test
// allows 5 standard deviations (a false alarm rate below 1e-6 per case) plus the 2^-31 quantum
// resolution of the random bits.
TEST(StochasticRounding, UnbiasedAndBetweenNeighbours) {
  const Case cases[] = {
      {Format::e4m3, 1.3f},     {Format::e4m3, -0.7f},  {Format::e4m3, 300.0f},    {Format::e4m3, 0.0031f},  // subnormal range
      {Format::e4m3, 1e-5f},  // far below the smallest subnormal: rounds to 0 or 2^-9
      {Format::e5m2, 0.33f},    {Format::e5m2, 3e-6f},  {Format::e4m3fnuz, 17.3f}, {Format::f16, 0.1f},
      {Format::bf16, 3.14159f}, {Format::e2m1, 2.6f},   {Format::e3m2, -0.07f},    {Format::e2m3, 5.1f},
      {Format::e8m0, 1.3f},     {Format::e8m0, 7e-39f}, {Format::int8, 12.25f},
  };
  const size_t n = size_t(1) << 18;
  for (const Case& c : cases) {
    const Format f = c.format;
    std::vector<float> x(n, c.x), back(n);
    std::vector<std::byte> codes(n * size_t(info(f).storage_bytes()));
    QuantizeOptions opt;
    opt.rounding = Rounding::stochastic;
    opt.seed = 2024;
    quantize(x, f, 1.0f, codes, opt);
    dequantize(codes, f, 1.0f, back);
    // Neighbours from the deterministic modes.
    const float lo_code = decode(f, encode(f, c.x, {Overflow::saturate, Rounding::toward_zero}));
    float lo = lo_code, hi = lo_code;
    double sum = 0;
    for (float v : back) {
      sum += v;
      if (v != lo) hi = (hi == lo) ? v : hi;
      ASSERT_TRUE(v == lo || v == hi) << format_name(f) << " x=" << c.x << " got " << v << " besides " << lo << " and " << hi;
    }
    ASSERT_NE(hi, lo) << format_name(f) << " x=" << c.x << ": never rounded away from " << lo;
    const double p = (double(c.x) - lo) / (double(hi) - lo);
    ASSERT_GT(p, 0.0);
    ASSERT_LT(p, 1.0);
    const double mean = sum / double(n);
    const double bound = std::fabs(double(hi) - lo) * (5.0 * std::sqrt(p * (1 - p) / double(n)) + 1e-9);
    EXPECT_NEAR(mean, double(c.x), bound) << format_name(f) << " x=" << c.x << " lo=" << lo << " hi=" << hi;
  }
}

TEST(StochasticRounding, DifferentSeedsDrawDifferentBits) {
  std::vector<float> x(4096, 1.3f);
  std::vector<std::byte> a(x.size()), b(x.size());
  QuantizeOptions opt;
  opt.rounding = Rounding::stochastic;
  opt.seed = 1;
  quantize(x, Format::e4m3, 1.0f, a, opt);
  opt.seed = 2;
  quantize(x, Format::e4m3, 1.0f, b, opt);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace scalify
