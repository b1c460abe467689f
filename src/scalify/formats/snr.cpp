#include "scalify/formats/snr.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"

namespace scalify {

double snr(std::span<const float> x, std::span<const float> q) {
  if (x.size() != q.size()) throw Error("snr: sizes differ");
  double signal = 0, noise = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double(q[i]) - double(x[i]);
    signal += double(x[i]) * x[i];
    noise += d * d;
  }
  return noise == 0 ? std::numeric_limits<double>::infinity() : signal / noise;
}

double quantisation_snr(std::span<const float> x, Format fmt, float scale, Rounding rounding) {
  std::vector<std::byte> codes(x.size() * size_t(info(fmt).storage_bytes()));
  std::vector<float> back(x.size());
  QuantizeOptions opt;
  opt.rounding = rounding;
  quantize(x, fmt, scale, codes, opt);
  dequantize(codes, fmt, 1.0f / scale, back);
  return snr(x, back);
}

std::vector<float> standard_normal(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  constexpr double two_pi = 6.283185307179586;
  for (size_t i = 0; i < n; i += 2) {
    // Two uniforms in (0, 1] from the counter-based generator, then Box-Muller.
    const double u1 = (double(kernels::random_bits(seed, i)) + 1.0) / 4294967296.0;
    const double u2 = double(kernels::random_bits(seed, i + 1)) / 4294967296.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[i] = float(r * std::cos(two_pi * u2));
    if (i + 1 < n) v[i + 1] = float(r * std::sin(two_pi * u2));
  }
  return v;
}

void check_snr_sweep(double lo, double hi, double step, size_t samples) {
  auto str = [](double x) {  // %g: 1e-09, not 0.000000
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", x);
    return std::string(buf);
  };
  // log2(sigma) outside f32's range makes sigma 0 or inf, and the SNR meaningless.
  for (const auto& [name, v] : {std::pair{"from", lo}, std::pair{"to", hi}})
    if (!(v >= kMinLog2Sigma && v <= kMaxLog2Sigma))
      throw Error(std::string("snr sweep: ") + name + " (log2 sigma) must be a finite number in [-149, 127], got " + str(v));
  if (hi < lo) throw Error("snr sweep: to (" + str(hi) + ") must be >= from (" + str(lo) + ")");
  if (!(step > 0) || !std::isfinite(step)) throw Error("snr sweep: step must be a finite number > 0, got " + str(step));
  if ((hi - lo) / step >= double(kMaxSnrPoints))
    throw Error("snr sweep: from " + str(lo) + " to " + str(hi) + " in steps of " + str(step) + " exceeds " +
                std::to_string(kMaxSnrPoints) + " points; use a larger step");
  if (samples < 1 || samples > kMaxSnrSamples)
    throw Error("snr sweep: samples must be in [1, " + std::to_string(kMaxSnrSamples) + "], got " + std::to_string(samples));
}

std::vector<SnrPoint> snr_sweep(std::span<const Format> formats, double lo, double hi, double step, size_t samples, uint64_t seed) {
  check_snr_sweep(lo, hi, step, samples);
  // Points by index, not by accumulation: l += step can stall (l + step == l) or drift.
  const size_t points = size_t(std::floor((hi - lo + 1e-9) / step)) + 1;
  const std::vector<float> z = standard_normal(samples, seed);
  std::vector<float> x(samples);
  std::vector<SnrPoint> out;
  for (size_t i = 0; i < points; ++i) {
    const double l = lo + double(i) * step;
    const float sigma = float(std::exp2(l));
    for (size_t k = 0; k < samples; ++k) x[k] = z[k] * sigma;
    for (Format f : formats) out.push_back({l, f, quantisation_snr(x, f)});
  }
  return out;
}

OutlierScenario outlier_scenario(size_t samples, uint64_t seed) {
  const std::vector<float> x = standard_normal(samples, seed);
  const float median_outlier = 60.0f, max_outlier = 3.0f * median_outlier;
  const float to_max = 127.0f / max_outlier, to_median = 127.0f / median_outlier;
  OutlierScenario s{};
  s.int8_max_nearest = quantisation_snr(x, Format::int8, to_max, Rounding::nearest_even);
  s.int8_max_toward_zero = quantisation_snr(x, Format::int8, to_max, Rounding::toward_zero);
  s.int8_median_nearest = quantisation_snr(x, Format::int8, to_median, Rounding::nearest_even);
  s.int8_median_toward_zero = quantisation_snr(x, Format::int8, to_median, Rounding::toward_zero);
  s.e4m3fnuz_nearest = quantisation_snr(x, Format::e4m3fnuz, 1.0f, Rounding::nearest_even);
  s.e4m3fnuz_toward_zero = quantisation_snr(x, Format::e4m3fnuz, 1.0f, Rounding::toward_zero);
  return s;
}

}  // namespace scalify
