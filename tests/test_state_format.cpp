// Optimizer state formats (optim/state_format): codes, scales and the COAT expansion against a
// scalar reference written here from the formats' bit layouts, independent of scalify's encoder.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/optim/state_format.hpp"
#include "scalify/tensor/vector_math.hpp"

namespace scalify::optim {
namespace {

// A floating-point code layout: magnitude codes 0..max_mag; with a sign bit at sign_bit (0: none).
struct Layout {
  int exp_bits, man_bits, bias;
  uint32_t max_mag, sign_bit;
  double value(uint32_t mag) const {  // by hand: subnormal m 2^(1-bias-M), normal (1 + m/2^M) 2^(e-bias)
    const uint32_t e = mag >> man_bits, m = mag & ((1u << man_bits) - 1);
    const double frac = double(m) / double(1u << man_bits);
    return e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1 + frac, int(e) - bias);
  }
  // Round-to-nearest, ties to the even code, saturating at max_mag.
  uint32_t encode(double x) const {
    const double a = std::fabs(x);
    uint32_t lo = 0, hi = max_mag;  // the largest magnitude code with value <= a
    if (a >= value(max_mag)) return (x < 0 ? sign_bit : 0) | max_mag;
    while (lo < hi) {
      const uint32_t mid = (lo + hi + 1) / 2;
      if (value(mid) <= a)
        lo = mid;
      else
        hi = mid - 1;
    }
    uint32_t mag = lo;
    if (value(lo) != a) {
      const double down = a - value(lo), up = value(lo + 1) - a;
      if (up < down || (up == down && (lo & 1))) mag = lo + 1;
    }
    return (std::signbit(x) && sign_bit ? sign_bit : 0) | mag;
  }
  double decode(uint32_t code) const { return (code & sign_bit ? -1 : 1) * value(code & ~sign_bit); }
};
// The layouts (OCP FP8, IEEE f16, bf16), and the non-negative 8-bit ones: sign bit as mantissa bit.
const Layout kE4M3{4, 3, 7, 0x7E, 0x80}, kE5M2{5, 2, 15, 0x7B, 0x80}, kF16{5, 10, 15, 0x7BFF, 0x8000}, kBF16{8, 7, 127, 0x7F7F, 0x8000},
    kE4M4{4, 4, 7, 0xFE, 0}, kE5M3{5, 3, 15, 0xF7, 0};

uint32_t code_at(const EncodedState& s, int bytes, size_t i) {
  uint32_t c = 0;
  std::memcpy(&c, s.codes.data() + i * size_t(bytes), size_t(bytes));
  return c;
}

// Moment-like data: magnitudes over several decades, both signs (or none), some zeros.
std::vector<float> moments(size_t n, bool non_negative, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> z(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = z(rng) * std::pow(10.0f, -3.0f + 2.0f * z(rng));
    x[i] = i % 17 == 5 ? 0.0f : non_negative ? std::fabs(v) : v;
  }
  return x;
}

struct Case {
  StateFormat format;
  Layout layout;
};
// Every per-tensor layout (and bf16, which takes no scale).
std::vector<Case> per_tensor_cases(bool with_bf16 = true) {
  std::vector<Case> cases = {Case{{Format::e4m3, StateScaling::per_tensor}, kE4M3}, Case{{Format::e5m2, StateScaling::per_tensor}, kE5M2},
                             Case{{Format::f16, StateScaling::per_tensor}, kF16},
                             Case{{.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .non_negative = true}, kE4M4},
                             Case{{.storage = Format::e5m2, .scaling = StateScaling::per_tensor, .non_negative = true}, kE5M3}};
  if (with_bf16) cases.push_back(Case{{Format::bf16, StateScaling::none}, kBF16});
  return cases;
}

// Per-tensor scale 2^-e, e the largest with amax 2^e <= the code's max; codes encode(x 2^e).
TEST(StateFormat, PerTensorMatchesScalarReference) {
  for (const Case& c : per_tensor_cases()) {
    const StateFormat& f = c.format;
    SCOPED_TRACE(std::string(format_name(f.storage)) + (f.non_negative ? " non-negative" : ""));
    const std::vector<float> x = moments(1000, f.non_negative, 7);
    const EncodedState s = encode_state(x, f);
    double amax = 0;
    for (float v : x) amax = std::max(amax, double(std::fabs(v)));
    int e = 0;
    if (f.scaling == StateScaling::per_tensor) {
      e = -200;
      while (amax * std::ldexp(1.0, e + 1) <= c.layout.value(c.layout.max_mag)) ++e;
      ASSERT_EQ(s.scales.size(), 1u);
      EXPECT_EQ(s.scales[0], std::ldexp(1.0, -e));
    }
    EXPECT_FLOAT_EQ(state_code_max(f), float(c.layout.value(c.layout.max_mag)));
    const int bytes = f.storage == Format::f16 || f.storage == Format::bf16 ? 2 : 1;
    ASSERT_EQ(s.codes.size(), x.size() * size_t(bytes));
    std::vector<float> back(x.size());
    decode_state(s, f, back);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t want = c.layout.encode(std::ldexp(double(x[i]), e));
      ASSERT_EQ(code_at(s, bytes, i), want) << "element " << i << " = " << x[i];
      ASSERT_EQ(back[i], float(std::ldexp(c.layout.decode(want), -e))) << "element " << i;
    }
  }
}

// Every code's value, every midpoint between neighbours (ties go to the even code) and the f32s
// either side of it, both signs where the code has one; the largest value is in the data, so the
// per-tensor scale is 1.
TEST(StateFormat, NearestRoundingOfEveryCodeAndTie) {
  for (const Case& c : per_tensor_cases(/*with_bf16=*/false)) {
    std::vector<float> x;
    for (uint32_t m = 0; m <= c.layout.max_mag; ++m) {
      x.push_back(float(c.layout.value(m)));
      if (m == c.layout.max_mag) break;
      const auto mid = float((c.layout.value(m) + c.layout.value(m + 1)) / 2);
      ASSERT_EQ(double(mid), (c.layout.value(m) + c.layout.value(m + 1)) / 2);
      for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) x.push_back(v);
    }
    if (!c.format.non_negative)
      for (size_t i = 0, n = x.size(); i < n; ++i) x.push_back(-x[i]);
    const EncodedState s = encode_state(x, c.format);
    ASSERT_EQ(s.scales[0], 1.0f);
    const int bytes = c.format.storage == Format::f16 ? 2 : 1;
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(code_at(s, bytes, i), c.layout.encode(x[i])) << format_name(c.format.storage) << " " << x[i];
  }
}

// Per-group scales amax / max (f32), codes encode(x / scale) in f32; the last group is partial.
TEST(StateFormat, PerGroupMatchesScalarReference) {
  for (const Case& c : {Case{{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 128}, kE4M3},
                        Case{{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 64, .non_negative = true}, kE4M4},
                        Case{{.storage = Format::e5m2, .scaling = StateScaling::per_group, .group_size = 128}, kE5M2}}) {
    const StateFormat& f = c.format;
    const std::vector<float> x = moments(300, f.non_negative, 11);
    const EncodedState s = encode_state(x, f);
    const size_t groups = (x.size() + size_t(f.group_size) - 1) / size_t(f.group_size);
    ASSERT_EQ(s.scales.size(), groups);
    std::vector<float> back(x.size());
    decode_state(s, f, back);
    for (size_t g = 0; g < groups; ++g) {
      const size_t begin = g * size_t(f.group_size), end = std::min(x.size(), begin + size_t(f.group_size));
      float amax = 0;
      for (size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      const auto scale = float(double(amax) / c.layout.value(c.layout.max_mag));
      ASSERT_EQ(s.scales[g], scale) << "group " << g;
      for (size_t i = begin; i < end; ++i) {
        const uint32_t want = c.layout.encode(x[i] / scale);
        ASSERT_EQ(code_at(s, 1, i), want) << "element " << i;
        ASSERT_EQ(back[i], float(c.layout.decode(want)) * scale) << "element " << i;
      }
    }
    EXPECT_EQ(s.bytes(), int64_t(x.size() + 4 * groups));  // codes + one f32 scale per group
  }
}

// Per-group codes of values whose quotient by the group's scale lies on or within a few f32 ulps
// of a midpoint between two codes (every midpoint, normal and subnormal codes, both signs): the
// same codes as the f32 quotient rounded by the reference, so a faster division may not move them.
TEST(StateFormat, PerGroupCodesNearEveryMidpoint) {
  for (const Case& c :
       {Case{{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 4096}, kE4M3},
        Case{{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 4096, .non_negative = true}, kE4M4},
        Case{{.storage = Format::e5m2, .scaling = StateScaling::per_group, .group_size = 4096}, kE5M2}}) {
    const StateFormat& f = c.format;
    for (const double ratio : {0.7, 0.3, 1.9}) {  // scales whose reciprocal is inexact
      const auto hi = float(c.layout.value(c.layout.max_mag) * ratio);
      std::vector<float> x = {hi};
      const float scale = float(double(hi) / c.layout.value(c.layout.max_mag));  // the scale the encoder picks, as the other tests
      for (uint32_t mag = 0; mag < c.layout.max_mag; ++mag) {
        const auto mid = float((c.layout.value(mag) + c.layout.value(mag + 1)) / 2 * scale);
        float below = mid, above = mid;
        x.push_back(mid);
        for (int step = 0; step < 3; ++step) {
          below = std::nextafter(below, 0.0f);
          above = std::nextafter(above, INFINITY);
          x.push_back(below);
          x.push_back(above);
        }
      }
      if (!f.non_negative)
        for (size_t i = 1, n = x.size(); i < n; i += 2) x.push_back(-x[i]);
      const EncodedState s = encode_state(x, f);
      ASSERT_EQ(s.scales[0], scale);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(code_at(s, 1, i), c.layout.encode(x[i] / scale)) << "element " << i << " " << x[i];
    }
  }
}

// COAT: per group k = floor(log2(max^2 / 2) / log2(hi / lo) * 16) / 16 over the non-zero
// magnitudes, centre sqrt(hi lo), scale (hi / centre)^k / max, codes encode(sign (|x| / centre)^k / scale).
TEST(StateFormat, ExpansionMatchesScalarReference) {
  for (const Case& c : {Case{{.storage = Format::e4m3, .scaling = StateScaling::per_group, .expand = true}, kE4M3},
                        Case{{.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true, .expand = true}, kE4M4}}) {
    const StateFormat& f = c.format;
    const std::vector<float> x = moments(256 + 40, f.non_negative, 5);
    const EncodedState s = encode_state(x, f);
    std::vector<float> back(x.size());
    decode_state(s, f, back);
    const double max = c.layout.value(c.layout.max_mag);
    EXPECT_EQ(s.bytes(), int64_t(x.size() + 3 * 4 * 3));  // codes + scale, k and centre for 3 groups
    for (size_t g = 0; g < 3; ++g) {
      const size_t begin = g * 128, end = std::min(x.size(), begin + 128);
      float hi = 0, lo = 1e30f;
      for (size_t i = begin; i < end; ++i)
        if (x[i] != 0) hi = std::max(hi, std::fabs(x[i])), lo = std::min(lo, std::fabs(x[i]));
      const double k = std::floor(std::log2(max * max / 2) / std::log2(double(hi) / lo) * 16) / 16;
      ASSERT_GE(k, 1.0 / 16);  // the data's range needs no clamp
      const auto centre = float(std::sqrt(double(hi) * lo));
      const auto scale = float(std::pow(double(hi) / centre, k) / max);
      ASSERT_EQ(s.expand_k[g], float(k));
      ASSERT_EQ(s.centre[g], centre);
      ASSERT_EQ(s.scales[g], scale);
      for (size_t i = begin; i < end; ++i) {
        const auto y = float(std::pow(std::fabs(double(x[i])) / centre, k));
        const uint32_t want = c.layout.encode(std::copysign(y / scale, x[i]));
        ASSERT_EQ(code_at(s, 1, i), want) << "element " << i;
        const double q = c.layout.decode(want);
        ASSERT_EQ(back[i], std::copysign(float(std::pow(std::fabs(q) * scale, 1 / k) * centre), float(q))) << "element " << i;
      }
    }
  }
}

// Every code read back through a group's inverse and expanded again gives the code back, for
// groups from narrow (k at its cap) to wider than E4M3 (k at its floor 1/16); codes whose
// read-back would be an f32 subnormal or zero (only below a wide group's smallest value) are out.
TEST(StateFormat, ExpansionInverseIsExactOnEveryCode) {
  for (const Layout& layout : {kE4M3, kE4M4}) {
    const double max = layout.value(layout.max_mag);
    for (const auto& [hi, lo] : std::vector<std::pair<float, float>>{
             {1.0f, 1.0f}, {1.0f, 0.999f}, {2.0f, 1.0f}, {3e-3f, 1e-5f}, {1.0f, 1e-4f}, {1e10f, 1e-10f}, {1e30f, 1e-30f}}) {
      const Expansion e = expansion_for(hi, lo, max, 16);
      SCOPED_TRACE("hi " + std::to_string(hi) + " lo " + std::to_string(lo) + " k " + std::to_string(e.k));
      int checked = 0;
      for (uint32_t code = 0; code <= (layout.sign_bit | layout.max_mag); ++code) {
        if ((code & ~layout.sign_bit) > layout.max_mag) continue;  // NaN codes
        const float x = e.inverse(float(layout.decode(code)));
        if (code & ~layout.sign_bit && !std::isnormal(x)) continue;
        ASSERT_EQ(layout.encode(e.forward(x)), code) << "code " << code << " reads back as " << x;
        ++checked;
      }
      if (e.k >= 1) {
        EXPECT_EQ(checked, layout.sign_bit ? 2 * int(layout.max_mag) + 2 : int(layout.max_mag) + 1);
      }
    }
  }
}

// The expansion's results as optim/expansion.hpp defines them: the active vector math's pow, one
// element at a time.
double active_pow(double base, double e) {
  double y;
  vecmath::active().pow_f64(&base, e, &y, 1);
  return y;
}
float forward_by_pow(const Expansion& e, float x) {
  return std::copysign(float(active_pow(std::fabs(double(x)) / double(e.centre), e.k)) / e.scale, x);
}
float inverse_by_pow(const Expansion& e, float y) {
  return std::copysign(float(active_pow(std::fabs(double(y)) * double(e.scale), 1 / double(e.k)) * double(e.centre)), y);
}

// Groups from narrow (k at its cap 1024) to wider than the codes (k at its floor 1/16), and random
// ones with centres over 50 octaves and ranges up to 2^30.
std::vector<Expansion> test_expansions(double code_max, int random_count) {
  std::vector<Expansion> out;
  for (const auto& [hi, lo] : std::vector<std::pair<float, float>>{
           {1.0f, 1.0f}, {1.0f, 0.999f}, {2.0f, 1.0f}, {3e-3f, 1e-5f}, {1.0f, 1e-4f}, {1e10f, 1e-10f}, {1e30f, 1e-30f}})
    out.push_back(expansion_for(hi, lo, code_max, 16));
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> log_centre(-40, 10), log_range(0, 30);
  for (int i = 0; i < random_count; ++i) {
    const double centre = std::exp2(log_centre(rng)), half_range = std::exp2(log_range(rng) / 2);
    out.push_back(expansion_for(float(centre * half_range), float(centre / half_range), code_max, 16));
  }
  return out;
}

// The inverse's bracket holds the exact value (long double) within 2^-36 of it (1 / k up to 16
// scales its error), and the inverse equals the pow's result on every code of every 8-bit layout.
TEST(StateFormat, ExpansionInverseEqualsThePowOnEveryCode) {
  for (const Layout& layout : {kE4M3, kE4M4, kE5M2, kE5M3}) {
    std::vector<float> y;
    for (uint32_t code = 0; code <= (layout.sign_bit | layout.max_mag); ++code)
      if ((code & ~layout.sign_bit) <= layout.max_mag) y.push_back(float(layout.decode(code)));
    const auto n = int64_t(y.size());
    std::vector<float> x(y.size());
    std::vector<double> lo(y.size()), hi(y.size());
    int64_t certified = 0, total = 0;
    for (const Expansion& e : test_expansions(layout.value(layout.max_mag), 2000)) {
      SCOPED_TRACE("k " + std::to_string(e.k) + " centre " + std::to_string(e.centre) + " scale " + std::to_string(e.scale));
      e.inverse(y.data(), x.data(), n);
      e.inverse_bracket(y.data(), lo.data(), hi.data(), n);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(inverse_by_pow(e, y[i]))) << "code value " << y[i];
        const long double exact = std::pow(std::fabs((long double)y[i]) * e.scale, (long double)(1 / double(e.k))) * e.centre;
        ASSERT_LE(lo[i], exact) << "code value " << y[i];
        ASSERT_GE(hi[i], exact) << "code value " << y[i];
        ASSERT_LE(hi[i] - lo[i], 0x1p-36 * exact) << "code value " << y[i];
        certified += float(lo[i]) == float(hi[i]);
        ++total;
      }
    }
    EXPECT_GE(certified, total - total / 1000);  // the pow takes at most 1 in 1000 (measured: none here)
  }
  // Centres that put some results within the bracket of an f32 rounding boundary, where its ends
  // round apart and the pow decides.
  std::vector<float> y(kE4M4.max_mag), x(y.size());
  std::vector<double> lo(y.size()), hi(y.size());
  for (uint32_t mag = 1; mag <= kE4M4.max_mag; ++mag) y[mag - 1] = float(kE4M4.value(mag));
  int straddled = 0;
  float centre = 1.0f;
  for (int i = 0; i < 100000; ++i, centre = std::nextafter(centre, 2.0f)) {
    const Expansion e{.k = 3, .centre = centre, .scale = 1};
    e.inverse_bracket(y.data(), lo.data(), hi.data(), int64_t(y.size()));
    e.inverse(y.data(), x.data(), int64_t(y.size()));
    for (size_t j = 0; j < y.size(); ++j)
      if (float(lo[j]) != float(hi[j])) {
        ++straddled;
        ASSERT_EQ(x[j], inverse_by_pow(e, y[j])) << "centre " << centre << " code value " << y[j];
      }
  }
  EXPECT_GE(straddled, 10);
  // Out of reach: NaN, infinities, and values with more than 4 mantissa bits take the pow.
  const Expansion e = expansion_for(3e-3f, 1e-5f, 448, 16);
  y = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -0.0f, 1.0f + 0x1p-20f};
  e.inverse(y.data(), x.data(), int64_t(y.size()));
  EXPECT_TRUE(std::isnan(x[0]));
  EXPECT_EQ(x[1], inverse_by_pow(e, y[1]));
  EXPECT_TRUE(x[2] == 0 && std::signbit(x[2]));
  EXPECT_EQ(x[3], inverse_by_pow(e, y[3]));
}

// The forward bracket holds the pow's result and the exact one (long double), within 2^-13 of them
// (k / 8 times that past k = 8: the base's f32 rounding error is raised to the power k).
TEST(StateFormat, ExpansionForwardBracketHoldsThePow) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> where(-0.25, 1.25);  // past the group's own range on both sides
  for (const Expansion& e : test_expansions(448, 500)) {
    SCOPED_TRACE("k " + std::to_string(e.k) + " centre " + std::to_string(e.centre) + " scale " + std::to_string(e.scale));
    const double hi_log = std::log2(double(e.scale) * 448) / e.k;  // log2(hi / centre)
    std::vector<float> x(300), lo(x.size()), hi(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i % 2 ? -1 : 1) * e.centre * std::exp2(hi_log * (2 * where(rng) - 1)));
    e.forward_bracket(x.data(), lo.data(), hi.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isnormal(x[i])) continue;
      const float y = forward_by_pow(e, x[i]);
      const auto exact = float(float(std::pow(std::fabs((long double)x[i]) / e.centre, (long double)e.k)) / e.scale);
      ASSERT_EQ(std::signbit(lo[i]), std::signbit(x[i]));
      ASSERT_EQ(std::signbit(hi[i]), std::signbit(x[i]));
      ASSERT_LE(std::fabs(lo[i]), std::fabs(y)) << "x " << x[i];
      ASSERT_GE(std::fabs(hi[i]), std::fabs(y)) << "x " << x[i];
      ASSERT_LE(std::fabs(lo[i]), exact) << "x " << x[i];
      ASSERT_GE(std::fabs(hi[i]), exact) << "x " << x[i];
      ASSERT_LE(std::fabs(hi[i]) - std::fabs(lo[i]), 0x1p-13f * std::max(1.0f, e.k / 8) * std::fabs(y) + FLT_MIN) << "x " << x[i];
    }
  }
  // Zero is exact; NaN and infinity are out of reach (0 to inf).
  const Expansion e = expansion_for(3e-3f, 1e-5f, 448, 16);
  const std::vector<float> x = {-0.0f, 0.0f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()};
  std::vector<float> lo(x.size()), hi(x.size());
  e.forward_bracket(x.data(), lo.data(), hi.data(), int64_t(x.size()));
  EXPECT_TRUE(lo[0] == 0 && hi[0] == 0 && std::signbit(lo[0]) && std::signbit(hi[0]));
  EXPECT_TRUE(lo[1] == 0 && hi[1] == 0 && !std::signbit(hi[1]));
  EXPECT_TRUE(lo[2] == 0 && std::isinf(hi[2]));
  EXPECT_TRUE(lo[3] == 0 && std::isinf(hi[3]) && std::signbit(hi[3]));
}

// Moments within a few f32 ulps of every code boundary, where the bracket's ends straddle it: the
// codes are the pow's (the encode takes it there), with k in steps of 1, 1/16 and 1/64, rounded
// to nearest or stochastically (then against the same encoder's codes of the pow's values).
TEST(StateFormat, ExpansionCodesEqualThePowNearEveryCodeBoundary) {
  for (const Rounding rounding : {Rounding::nearest_even, Rounding::stochastic})
    for (const int expand_min : {1, 16, 64})
      for (const Layout& layout : {kE4M3, kE4M4}) {
        const StateFormat f{.storage = Format::e4m3,
                            .scaling = StateScaling::per_group,
                            .rounding = rounding,
                            .non_negative = layout.sign_bit == 0,
                            .expand = true,
                            .expand_min = expand_min};
        SCOPED_TRACE("expand_min " + std::to_string(expand_min) + (f.non_negative ? " e4m4" : " e4m3") +
                     (rounding == Rounding::stochastic ? " stochastic" : ""));
        const double max = layout.value(layout.max_mag);
        int64_t straddled = 0, total = 0;
        for (const auto& [group_hi, group_lo] : std::vector<std::pair<float, float>>{{3e-3f, 1e-5f}, {1.0f, 0.25f}, {2e-8f, 1e-13f}}) {
          const Expansion e = expansion_for(group_hi, group_lo, max, expand_min);
          // x near each midpoint between neighbouring code values, mapped back through the expansion.
          std::vector<float> candidates;
          for (uint32_t mag = 0; mag < layout.max_mag; ++mag) {
            const long double mid = (layout.value(mag) + layout.value(mag + 1)) / 2;
            const auto x = float(e.centre * std::pow(mid * e.scale, 1 / (long double)e.k));
            float below = x, above = x;
            for (int step = 0; step < 3; ++step) {
              for (float v : {below, above})
                if (v > group_lo && v < group_hi) candidates.push_back(layout.sign_bit && candidates.size() % 2 ? -v : v);
              below = std::nextafter(below, 0.0f);
              above = std::nextafter(above, INFINITY);
            }
          }
          // Groups of 128 holding the group's largest and smallest magnitudes, so each has expansion e.
          std::vector<float> x;
          for (size_t i = 0; i < candidates.size(); ++i) {
            if (x.size() % 128 == 0) x.insert(x.end(), {group_hi, group_lo});
            x.push_back(candidates[i]);
          }
          const auto n = int64_t(x.size());
          const EncodedState s = encode_state(x, f, 7);
          // The pow's values, encoded at scale 1 (a per-tensor exponent 0) by the same encoder,
          // with the same random bits of the same elements.
          std::vector<float> y(x.size());
          for (size_t i = 0; i < x.size(); ++i) y[i] = forward_by_pow(e, x[i]);
          StateFormat unexpanded = f;
          unexpanded.scaling = StateScaling::per_tensor, unexpanded.expand = false;
          EncodedState want;
          want.numel = n;
          want.codes.resize(x.size());
          encode_state_range(y.data(), unexpanded, 0, n, 0, 7, want);
          std::vector<float> lo(x.size()), hi(x.size());
          e.forward_bracket(x.data(), lo.data(), hi.data(), n);
          for (size_t i = 0; i < x.size(); ++i) {
            ASSERT_EQ(s.expand_k[i / 128], e.k);
            ASSERT_EQ(code_at(s, 1, i), code_at(want, 1, i)) << "x " << x[i];
            if (rounding == Rounding::nearest_even) {
              ASSERT_EQ(code_at(s, 1, i), layout.encode(y[i])) << "x " << x[i];
            }
            straddled += layout.encode(lo[i]) != layout.encode(hi[i]);
            ++total;
          }
        }
        EXPECT_GE(straddled, total / 10);  // most elements are near a boundary: the pow's path is taken
      }
}

// Groups and values at the approximations' reach and past it: k from 1/16 to 1024, f32-subnormal
// and huge scales and centres, y of every exponent with 4 mantissa bits, x of every exponent.
// Both brackets hold the pow's result and the exact one (long double) wherever they are finite,
// and the inverse equals the pow's result.
TEST(StateFormat, ExpansionBracketsHoldAtTheirReach) {
  std::vector<Expansion> groups = {{.k = 1.0f / 16, .centre = 0x1.022838p+63f, .scale = 0x1.9bb366p-100f},
                                   {.k = 1.0f / 16, .centre = 0x1.b6bd78p-38f, .scale = 0x1.72e21cp+102f},
                                   {.k = 1.0f / 16, .centre = 0x1.772de6p-78f, .scale = 0x1.4p-146f},
                                   {.k = 1.0f / 16, .centre = FLT_MAX, .scale = 1}};
  for (const float k : {1.0f / 16, 0.375f, 1.0f, 7.0f, 253.0f, 1024.0f})
    for (const float centre : {0x1.3p-120f, 0x1.b6bd78p-38f, 1.0f, 0x1.022838p+63f})
      for (const float scale : {0x1.4p-146f, 0x1.9bb366p-100f, 0x1.8p-9f, 1.0f, 0x1.72e21cp+102f}) groups.push_back({k, centre, scale});
  std::vector<float> y, x;
  for (int exponent = -126; exponent <= 127; ++exponent)
    for (int j = 0; j < 16; ++j) {
      y.push_back(std::ldexp(1 + j / 16.0f, exponent) * (j % 2 ? -1 : 1));
      x.push_back(std::ldexp(1 + (j * 0x9E3779B9u % 0x800000u) / float(0x800000), exponent) * (j % 3 ? 1 : -1));
    }
  const auto n = int64_t(y.size());
  std::vector<float> inverse(y.size()), lo(y.size()), hi(y.size());
  std::vector<double> lo64(y.size()), hi64(y.size());
  for (const Expansion& e : groups) {
    SCOPED_TRACE("k " + std::to_string(e.k) + " centre " + std::to_string(e.centre) + " scale " + std::to_string(e.scale));
    e.inverse(y.data(), inverse.data(), n);
    e.inverse_bracket(y.data(), lo64.data(), hi64.data(), n);
    e.forward_bracket(x.data(), lo.data(), hi.data(), n);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(inverse[i]), std::bit_cast<uint32_t>(inverse_by_pow(e, y[i]))) << "y " << y[i];
      const long double exact = std::pow(std::fabs((long double)y[i]) * e.scale, (long double)(1 / double(e.k))) * e.centre;
      if (std::isfinite(hi64[i])) {
        ASSERT_LE(lo64[i], exact) << "y " << y[i];
        ASSERT_GE(hi64[i], exact) << "y " << y[i];
      }
      if (!std::isnormal(x[i])) continue;
      const float want = forward_by_pow(e, x[i]);
      const auto exact_y = float(float(std::pow(std::fabs((long double)x[i]) / e.centre, (long double)e.k)) / e.scale);
      ASSERT_LE(std::fabs(lo[i]), std::fabs(want)) << "x " << x[i];
      ASSERT_LE(std::fabs(lo[i]), exact_y) << "x " << x[i];
      if (std::isfinite(hi[i])) {
        ASSERT_GE(std::fabs(hi[i]), std::fabs(want)) << "x " << x[i];
        ASSERT_GE(std::fabs(hi[i]), exact_y) << "x " << x[i];
      }
    }
  }
}

// A group whose k, centre or scale is not finite or positive (expansion_for of a non-finite
// moment) has nothing in reach, zeros included: its results are the pow's (NaN for every code,
// as before the approximations).
TEST(StateFormat, ExpansionOfANonFiniteGroupTakesThePow) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const Expansion& e :
       {expansion_for(nan, 1e-3f, 448, 16), expansion_for(inf, 1e-3f, 448, 16), Expansion{.k = 1, .centre = 1, .scale = 0}}) {
    const std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f};
    std::vector<float> out(v.size()), lo(v.size()), hi(v.size());
    e.inverse(v.data(), out.data(), int64_t(v.size()));
    e.forward_bracket(v.data(), lo.data(), hi.data(), int64_t(v.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = inverse_by_pow(e, v[i]);  // NaN: the payload is the vector math's, not compared
      EXPECT_TRUE(std::isnan(want) ? std::isnan(out[i]) : std::bit_cast<uint32_t>(out[i]) == std::bit_cast<uint32_t>(want)) << v[i];
      EXPECT_TRUE(lo[i] == 0 && std::isinf(hi[i])) << v[i];
    }
  }
}

// A NaN of any payload (encode_state_range takes values unchecked) encodes as the largest code,
// as inf does: its bits plus the rounding carry pass 2^31, which a signed sum overflowed.
TEST(StateFormat, EncodeRangeSaturatesEveryNaN) {
  for (const Case& c : per_tensor_cases(false)) {
    if (c.format.storage == Format::f16) continue;  // F16C's conversion keeps NaN
    SCOPED_TRACE(std::string(format_name(c.format.storage)) + (c.format.non_negative ? " non-negative" : ""));
    const std::vector<float> x = {std::bit_cast<float>(0x7FFFFFFFu), std::bit_cast<float>(0x7FC00000u),
                                  std::numeric_limits<float>::infinity()};
    EncodedState s;
    s.numel = int64_t(x.size());
    s.codes.resize(x.size());
    encode_state_range(x.data(), c.format, 0, s.numel, 0, 0, s);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(code_at(s, 1, i), c.layout.max_mag) << std::bit_cast<uint32_t>(x[i]);
  }
}

// Encoding leaves the x87 unit usable: GCC 12 once moved a value of the SSE2 build's group range
// through an MMX register without EMMS, and every long double operation after it gave NaN (the
// build now has -mno-mmx). The plain loops run under SCALIFY_ISA=scalar (test_state_format_scalar).
TEST(StateFormat, EncodingLeavesLongDoubleArithmeticIntact) {
  const StateFormat f{.storage = Format::e4m3, .scaling = StateScaling::per_group, .expand = true};
  const EncodedState s = encode_state(moments(1000, false, 3), f);
  volatile long double one = 1;
  EXPECT_EQ(one + one, 2.0L);
  EXPECT_EQ(s.numel, 1000);
}

TEST(StateFormat, StochasticRoundingPicksANeighbourAndRepeatsWithTheSeed) {
  const StateFormat f{.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .rounding = Rounding::stochastic};
  const std::vector<float> x = moments(4096, false, 3);
  const EncodedState a = encode_state(x, f, 42), b = encode_state(x, f, 42), other = encode_state(x, f, 43);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_NE(a.codes, other.codes);
  const int e = -std::ilogb(a.scales[0]);
  int not_nearest = 0, inexact = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = std::ldexp(double(x[i]), e), got = kE4M3.decode(code_at(a, 1, i));
    const double nearest = kE4M3.decode(kE4M3.encode(v));
    if (got == v) continue;
    ++inexact;
    ASSERT_EQ(std::signbit(got), std::signbit(v)) << i;
    const uint32_t mag = kE4M3.encode(std::fabs(v)), down = kE4M3.value(mag) <= std::fabs(v) ? mag : mag - 1;
    ASSERT_TRUE(std::fabs(got) == kE4M3.value(down) || std::fabs(got) == kE4M3.value(down + 1))
        << "element " << i << ": " << v << " -> " << got;
    not_nearest += got != nearest;
  }
  EXPECT_GT(inexact, 1000);
  EXPECT_GT(not_nearest, inexact / 10);  // not round-to-nearest
}

// Every code of every layout decodes (arithmetically, no table) to its value by hand, times the
// scale; magnitudes past the largest finite one are IEEE infinities and NaNs (e5m2, e5m3, f16,
// bf16: the first is inf) or NaN (e4m3, e4m4), with the code's sign. Every ISA up to the native one.
TEST(StateFormat, DecodesEveryCodeOfEveryLayout) {
  const kernels::Isa native = kernels::active_isa();
  for (const kernels::Isa isa : {kernels::Isa::scalar, kernels::Isa::avx2, kernels::Isa::avx512}) {
    if (isa > native) continue;
    kernels::set_isa(isa);
    for (const Case& c : per_tensor_cases()) {
      const StateFormat& f = c.format;
      const bool wide = f.storage == Format::f16 || f.storage == Format::bf16, ieee = f.storage != Format::e4m3;
      const uint32_t codes = wide ? 65536 : 256;
      for (const float scale : {1.0f, 0.125f}) {
        EncodedState s;
        s.numel = codes;
        s.codes.resize(size_t(codes) * (wide ? 2 : 1));
        for (uint32_t code = 0; code < codes; ++code) std::memcpy(s.codes.data() + code * (wide ? 2 : 1), &code, wide ? 2 : 1);
        if (f.scaling == StateScaling::per_tensor) s.scales = {scale};
        const float applied = f.scaling == StateScaling::per_tensor ? scale : 1.0f;
        std::vector<float> out(codes);
        decode_state(s, f, out);
        for (uint32_t code = 0; code < codes; ++code) {
          const uint32_t mag = code & ~c.layout.sign_bit;
          const bool negative = c.layout.sign_bit && (code & c.layout.sign_bit);
          SCOPED_TRACE("isa " + std::string(kernels::isa_name(isa)) + " " + std::string(format_name(f.storage)) + " code " +
                       std::to_string(code));
          if (mag <= c.layout.max_mag) {
            ASSERT_EQ(out[code], float(c.layout.decode(code) * applied));
            ASSERT_EQ(std::signbit(out[code]), negative);
          } else if (ieee && mag == c.layout.max_mag + 1) {
            ASSERT_EQ(out[code], negative ? -INFINITY : INFINITY);
          } else {
            ASSERT_TRUE(std::isnan(out[code]));
            ASSERT_EQ(std::signbit(out[code]), negative);
          }
        }
      }
    }
  }
  kernels::set_isa(native);
}

// Groups and tensors of f32 subnormals: amax / max (per group) or 2^-e (per tensor) would
// underflow to a zero scale, reading every code back as 0; the scale stays at least f32's smallest
// subnormal, so the values (integer multiples of 2^-149 here) come back to within the format's
// rounding (half its spacing: 2^-(mantissa bits + 1) relative).
TEST(StateFormat, TinyValuesKeepANonZeroScale) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> x;
  for (const int units : {71, -50, 33, 0, -7, 12}) x.push_back(float(units) * tiny);
  std::vector<float> magnitudes;
  for (const float v : x) magnitudes.push_back(std::fabs(v));
  for (const auto& [f, mantissa_bits] :
       {std::pair{StateFormat{.storage = Format::e4m3, .scaling = StateScaling::per_group}, 3},
        std::pair{StateFormat{.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true}, 4},
        std::pair{StateFormat{.storage = Format::e5m2, .scaling = StateScaling::per_group}, 2},
        std::pair{StateFormat{.storage = Format::e4m3, .scaling = StateScaling::per_tensor}, 3},
        std::pair{StateFormat{.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true}, 10}}) {
    const std::vector<float>& in = f.non_negative ? magnitudes : x;
    const EncodedState s = encode_state(in, f);
    SCOPED_TRACE(std::string(format_name(f.storage)) + (f.scaling == StateScaling::per_group ? " per group" : " per tensor"));
    ASSERT_GT(s.scales[0], 0.0f);
    std::vector<float> back(in.size());
    decode_state(s, f, back);
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_LE(std::fabs(double(back[i]) - double(in[i])), std::ldexp(std::fabs(double(in[i])), -mantissa_bits - 1))
          << "element " << i << ": " << back[i];
      EXPECT_EQ(back[i] == 0, in[i] == 0) << "element " << i;
    }
  }
}

TEST(StateFormat, RejectsBadFormatsAndValues) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { validate({Format::e4m3, StateScaling::none}, "m"); }).find("needs a scale"), std::string::npos);
  EXPECT_NE(message([] { validate({Format::bf16, StateScaling::per_tensor}, "m"); }).find("takes no scale"), std::string::npos);
  EXPECT_NE(message([] { validate({Format::e2m1, StateScaling::per_tensor}, "v"); }).find("storage must be one of"), std::string::npos);
  EXPECT_NE(
      message([] { validate({.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .expand = true}, "v"); }).find("expansion"),
      std::string::npos);
  EXPECT_NE(
      message([] { validate({.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 0}, "v"); }).find("group_size"),
      std::string::npos);
  const std::vector<float> negative{1.0f, -2.0f};
  EXPECT_NE(message([&] {
              encode_state(negative, {.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .non_negative = true});
            }).find("negative value"),
            std::string::npos);
}

}  // namespace
}  // namespace scalify::optim
