#pragma once
// Inputs that exercise every path of the codec: every value of the format and its neighbours,
// midpoints, ±0, f32 subnormals, max, overflow, ±inf, NaNs, and random bit patterns.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "scalify/formats/scalar.hpp"

namespace scalify::testing {

inline std::vector<float> edge_inputs(Format fmt, size_t n_random = 20000, uint32_t seed = 1) {
  std::vector<float> v;
  const FormatInfo& f = info(fmt);
  const uint32_t ncodes = f.bits <= 16 ? 1u << f.bits : 0;
  auto add_with_neighbours = [&](float x) {
    const uint32_t b = std::bit_cast<uint32_t>(x);
    for (int d = -2; d <= 2; ++d) v.push_back(std::bit_cast<float>(b + uint32_t(d)));
  };
  std::vector<float> values;
  for (uint32_t c = 0; c < ncodes; ++c) {
    const float x = decode(fmt, c);
    if (std::isfinite(x)) values.push_back(x);
  }
  std::sort(values.begin(), values.end());
  for (size_t i = 0; i < values.size(); ++i) {
    add_with_neighbours(values[i]);
    if (i + 1 < values.size()) add_with_neighbours(0.5f * (values[i] + values[i + 1]));
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::bit_cast<float>(0x007FFFFFu),
                            std::bit_cast<float>(0x00400001u)};
  for (float s : specials) v.push_back(s);
  if (f.has_nan()) {
    for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFBFFFFFu, 0x7FFFFFFFu}) v.push_back(std::bit_cast<float>(nan));
  }
  const double mx = max_value(fmt);
  for (double k : {1.0, 1.0 + 1.0 / 64, 2.0, 4.0, 1e4}) add_with_neighbours(float(mx * k));
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n_random; ++i) {
    float x = std::bit_cast<float>(uint32_t(rng()));
    if (!f.has_nan() && std::isnan(x)) x = 1.0f;
    v.push_back(x);
    const int e = int(rng() % 60) - 40;  // log-uniform around the format's range
    v.push_back(std::ldexp(float(rng()) / 4294967296.0f, e) * ((rng() & 1) ? -1.0f : 1.0f));
  }
  return v;
}

}  // namespace scalify::testing
