// The checked bulk API: scale semantics, thread-count independence, and clear errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify {
namespace {

std::vector<float> gaussian(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<std::byte> codes_for(size_t n, Format f) { return std::vector<std::byte>(n * size_t(info(f).storage_bytes())); }

TEST(BulkApi, PowerOfTwoScaleEqualsEncodingTheExactProduct) {
  const auto x = gaussian(10000, 3.0f, 1);
  for (Format f : {Format::e4m3, Format::e5m2, Format::f16, Format::bf16, Format::e2m1}) {
    for (int k : {-12, -3, 0, 5}) {
      const float scale = std::ldexp(1.0f, k);
      auto codes = codes_for(x.size(), f);
      quantize(x, f, scale, codes);
      const uint8_t* c = reinterpret_cast<const uint8_t*>(codes.data());
      for (size_t i = 0; i < x.size(); ++i) {
        uint32_t got = c[i * info(f).storage_bytes()];
        if (info(f).storage_bytes() == 2) got |= uint32_t(c[i * 2 + 1]) << 8;
        ASSERT_EQ(got, encode(f, x[i] * scale, {Overflow::saturate})) << format_name(f) << " x=" << x[i] << " scale=2^" << k;
      }
    }
  }
}

TEST(BulkApi, PowerOfTwoScaleIsExactBeyondTheF32Range) {
  // 3 * 2^100 scaled by 2^-100 and an f32 subnormal scaled up by 2^140: no f32 intermediate.
  const float in[] = {std::ldexp(3.0f, 100), std::ldexp(1.0f, -140)};
  auto codes = codes_for(1, Format::e4m3);
  quantize(std::span(in, 1), Format::e4m3, std::ldexp(1.0f, -100), codes);
  EXPECT_EQ(decode(Format::e4m3, uint32_t(codes[0])), 3.0f);
  quantize(std::span(in + 1, 1), Format::e4m3, std::ldexp(1.0f, 127), codes);  // 2^-13
  EXPECT_EQ(decode(Format::e4m3, uint32_t(codes[0])), 0.0f);                   // below e4m3's 2^-9 / 2
}

TEST(BulkApi, RoundTripWithScaleAndAmax) {
  const auto x = gaussian(100001, 1e-3f, 2);
  auto codes = codes_for(x.size(), Format::e4m3);
  const float m = quantize_amax(x, Format::e4m3, 1.0f / 1e-3f, codes);
  EXPECT_EQ(m, amax(x));
  float ref = 0;
  for (float v : x) ref = std::max(ref, std::fabs(v));
  EXPECT_EQ(m, ref);
  std::vector<float> back(x.size());
  dequantize(codes, Format::e4m3, 1e-3f, back);
  double err = 0, sig = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += double(back[i] - x[i]) * (back[i] - x[i]);
    sig += double(x[i]) * x[i];
  }
  // e4m3 has 3 mantissa bits: relative RMS error about 2^-4/sqrt(3) ≈ 0.036 for normal values.
  EXPECT_LT(std::sqrt(err / sig), 0.05);
  EXPECT_GT(std::sqrt(err / sig), 0.01);  // two-sided: not "too exact" either
}

TEST(BulkApi, ResultsDoNotDependOnThreadsOrIsa) {
  // Just past the size where conversions split across threads (2^18), with a ragged last chunk.
  for (const size_t n : {(size_t(1) << 18) + 4097, size_t(1) << 20}) {
    const auto y = gaussian(n, 1.0f, 5);
    QuantizeOptions sr;
    sr.rounding = Rounding::stochastic;
    sr.seed = 7;
    auto serial = codes_for(n, Format::e4m3), parallel = serial;
    set_num_threads(1);
    quantize(y, Format::e4m3, 2.0f, serial, sr);
    set_num_threads(2);
    quantize(y, Format::e4m3, 2.0f, parallel, sr);
    EXPECT_EQ(serial, parallel) << n << " elements";
  }
  const auto x = gaussian(size_t(1) << 20, 1.0f, 3);
  QuantizeOptions opt;
  opt.rounding = Rounding::stochastic;
  opt.seed = 99;
  auto one = codes_for(x.size(), Format::e5m2), two = one;
  set_num_threads(1);
  quantize(x, Format::e5m2, 4.0f, one, opt);
  set_num_threads(2);
  quantize(x, Format::e5m2, 4.0f, two, opt);
  EXPECT_EQ(one, two);
  const kernels::Isa was = kernels::active_isa();
  kernels::set_isa(kernels::Isa::scalar);
  auto scalar = one;
  quantize(x, Format::e5m2, 4.0f, scalar, opt);
  kernels::set_isa(was);
  set_num_threads(0);
  EXPECT_EQ(one, scalar);
  // A piece quantised with its offset draws the same bits as inside the whole tensor.
  auto piece = codes_for(1000, Format::e5m2);
  QuantizeOptions at = opt;
  at.offset = 5000;
  quantize(std::span(x).subspan(5000, 1000), Format::e5m2, 4.0f, piece, at);
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), one.begin() + 5000));
}

TEST(BulkApi, ClearErrors) {
  std::vector<float> x(10, 1.0f);
  auto codes = codes_for(9, Format::e4m3);
  try {
    quantize(x, Format::e4m3, 1.0f, codes);
    FAIL() << "size mismatch not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need 10 bytes"), std::string::npos) << e.what();
  }
  codes = codes_for(10, Format::e4m3);
  EXPECT_THROW(quantize(x, Format::e4m3, 0.0f, codes), Error);
  EXPECT_THROW(quantize(x, Format::e4m3, -1.0f, codes), Error);
  EXPECT_THROW(quantize(x, Format::e4m3, std::nanf(""), codes), Error);
  x[7] = std::nanf("");
  try {
    quantize(x, Format::e2m1, 1.0f, codes);
    FAIL() << "NaN into e2m1 not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(quantize(x, Format::e4m3, 1.0f, codes));  // e4m3 has a NaN
  EXPECT_EQ(uint8_t(codes[7]), 0x7F);
}

TEST(FormatLookup, NamesAndAliases) {
  EXPECT_EQ(parse_format("e4m3"), Format::e4m3);
  EXPECT_EQ(parse_format("fp8_e4m3fn"), Format::e4m3);
  EXPECT_EQ(parse_format("FLOAT8_E5M2"), Format::e5m2);
  EXPECT_EQ(parse_format("bfloat16"), Format::bf16);
  EXPECT_EQ(parse_format("graphcore_e4"), Format::e4m3fnuz);
  try {
    parse_format("e4m4");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("e4m4"), std::string::npos);
    EXPECT_NE(msg.find("e5m2fnuz"), std::string::npos);  // lists the valid ones
  }
}

TEST(FormatTable, DerivedValuesMatchSpec) {
  EXPECT_EQ(max_value(Format::e4m3), 448.0);
  EXPECT_EQ(max_value(Format::e5m2), 57344.0);
  EXPECT_EQ(max_value(Format::e4m3fnuz), 240.0);
  EXPECT_EQ(max_value(Format::e5m2fnuz), 57344.0);
  EXPECT_EQ(max_value(Format::f16), 65504.0);
  EXPECT_EQ(max_value(Format::e2m3), 7.5);
  EXPECT_EQ(max_value(Format::e3m2), 28.0);
  EXPECT_EQ(max_value(Format::e2m1), 6.0);
  EXPECT_EQ(max_value(Format::int8), 127.0);
  EXPECT_EQ(max_value(Format::e8m0), std::ldexp(1.0, 127));
  EXPECT_EQ(min_normal(Format::e4m3), std::ldexp(1.0, -6));
  EXPECT_EQ(min_subnormal(Format::e4m3), std::ldexp(1.0, -9));
  EXPECT_EQ(min_subnormal(Format::e5m2fnuz), std::ldexp(1.0, -17));
  EXPECT_EQ(min_subnormal(Format::bf16), std::ldexp(1.0, -133));
  EXPECT_EQ(min_normal(Format::e8m0), std::ldexp(1.0, -127));
  EXPECT_EQ(info(Format::e4m3).emax(), 8);
  EXPECT_EQ(info(Format::e5m2).emax(), 15);
  EXPECT_EQ(info(Format::e2m1).emax(), 2);
  EXPECT_EQ(info(Format::e3m2).emax(), 4);
  EXPECT_EQ(info(Format::e2m3).emax(), 2);
}

// One API, one set of rules: the scalar and bulk encoders share their default (saturate), both
// directions reject scales that make every value garbage, a code wider than its format is an
// error, and a NaN into a NaN-less format is rejected before a code is written.
TEST(FormatApi, ScalarAndBulkAgreeOnDefaultsAndBadInput) {
  EXPECT_EQ(EncodeOptions{}.overflow, QuantizeOptions{}.overflow);
  EXPECT_EQ(EncodeOptions{}.overflow, Overflow::saturate);
  EXPECT_EQ(decode(Format::e4m3, encode(Format::e4m3, 1e6f)), 448.0f);  // both saturate by default
  std::vector<std::byte> codes(4);
  const std::vector<float> x = {1, 2, 3, 1e6f};
  quantize(x, Format::e4m3, 1.0f, codes);
  EXPECT_EQ(decode(Format::e4m3, uint32_t(codes[3])), 448.0f);

  std::vector<float> out(4);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    EXPECT_THROW(quantize(x, Format::e4m3, bad, codes), Error) << bad;
    EXPECT_THROW(dequantize(codes, Format::e4m3, bad, out), Error) << bad;
  }

  EXPECT_EQ(decode(Format::e2m1, 0x0F), -6.0f);
  EXPECT_THROW(decode(Format::e2m1, 0xFF), Error);  // was -6: the high bits were ignored
  EXPECT_THROW(decode(Format::e4m3, 0x100), Error);
  EXPECT_THROW(decode(Format::f16, 0x10000), Error);

  for (Format f : {Format::e2m1, Format::e3m2, Format::e2m3, Format::int8}) {
    std::vector<std::byte> buf(8 * size_t(info(f).storage_bytes()), std::byte{0xAB});
    const std::vector<float> with_nan = {1, 2, 3, 4, 5, std::nanf(""), 7, 8};
    EXPECT_THROW(quantize(with_nan, f, 1.0f, buf), Error) << format_name(f);
    for (std::byte b : buf) ASSERT_EQ(b, std::byte{0xAB}) << format_name(f) << ": no code written before the error";
  }

  // e8m0 has no zero and no sign (documented): saturating maps them to its smallest value.
  for (float z : {0.0f, -1.0f, -1e30f}) {
    EXPECT_EQ(encode(Format::e8m0, z), 0x00u) << z;
    EXPECT_EQ(encode(Format::e8m0, z, {Overflow::non_saturating}), 0xFFu) << z;
  }
}

}  // namespace
}  // namespace scalify
