#include "scalify/formats/snr.hpp"

#include <cmath>
#include <limits>

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

std::vector<SnrPoint> snr_sweep(std::span<const Format> formats, double lo, double hi, double step,
                                size_t samples, uint64_t seed) {
  if (!(step > 0) || hi < lo) throw Error("snr_sweep: need lo <= hi and step > 0");
  const std::vector<float> z = standard_normal(samples, seed);
  std::vector<float> x(samples);
  std::vector<SnrPoint> out;
  for (double l = lo; l <= hi + 1e-9; l += step) {
    const float sigma = float(std::exp2(l));
    for (size_t i = 0; i < samples; ++i) x[i] = z[i] * sigma;
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
