#pragma once
// Signal-to-noise ratio of quantisers (SPEC §1): SNR = E[X^2] / E[(q(X) - X)^2].
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "scalify/formats/format.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify {

// SNR of `quantised` as an approximation of `x` (infinite when they are equal).
double snr(std::span<const float> x, std::span<const float> quantised);

// Quantise x into `fmt` with encode(x * scale) (saturating) and decode with 1/scale, then the SNR.
double quantisation_snr(std::span<const float> x, Format fmt, float scale = 1.0f, Rounding rounding = Rounding::nearest_even);

// N(0, 1) samples from a seeded generator (Box-Muller on a counter-based source).
std::vector<float> standard_normal(size_t n, uint64_t seed);

struct SnrPoint {
  double log2_sigma;
  Format format;
  double snr;
};
// SNR of N(0, sigma^2) samples, unscaled, for sigma = 2^lo .. 2^hi in `step` increments of log2.
// Throws scalify::Error unless lo <= hi lie in [-149, 127], step is finite and positive, there are
// at most kMaxSnrPoints points and 1 <= samples <= kMaxSnrSamples (check_snr_sweep).
inline constexpr double kMinLog2Sigma = -149, kMaxLog2Sigma = 127;
inline constexpr size_t kMaxSnrPoints = 10000;
inline constexpr size_t kMaxSnrSamples = size_t(1) << 24;
void check_snr_sweep(double lo, double hi, double step, size_t samples);
std::vector<SnrPoint> snr_sweep(std::span<const Format> formats, double lo, double hi, double step, size_t samples, uint64_t seed);

// Appendix D of the Unit Scaling paper: non-outliers ~ N(0,1), median outlier 60, max outlier
// 3 x 60. INT8 scaled so the max (or median) outlier maps to 127, and e4m3fnuz (max 240) unscaled;
// each rounded to nearest and toward zero. SNR on the non-outliers.
struct OutlierScenario {
  double int8_max_nearest, int8_max_toward_zero;
  double int8_median_nearest, int8_median_toward_zero;
  double e4m3fnuz_nearest, e4m3fnuz_toward_zero;
};
OutlierScenario outlier_scenario(size_t samples, uint64_t seed);

}  // namespace scalify
