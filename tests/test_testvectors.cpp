// Bit-exact agreement of the scalar codec with every reference vector file (ml_dtypes).
// Each check stops at the first mismatch and prints the input, the expected and the actual code.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "scalify/error.hpp"
#include "scalify/formats/scalar.hpp"
#include "testvectors.hpp"

namespace scalify {
namespace {

// The reference vectors are ml_dtypes' plain casts: overflow gives inf or NaN, not the maximum.
constexpr EncodeOptions kPlainCast{Overflow::non_saturating};

using namespace scalify::testing;

class TestVectors : public ::testing::TestWithParam<VectorFormat> {};

std::string Name(const ::testing::TestParamInfo<VectorFormat>& p) { return std::string(format_name(p.param.format)); }

// Checks one f32 input against its reference code, applying the two documented exemptions.
// Returns false (after reporting) on mismatch.
bool check_f32(Format f, uint32_t in, uint32_t expected, const char* file) {
  const float x = std::bit_cast<float>(in);
  if (nan_into_nanless(f, in)) {
    EXPECT_THROW(encode(f, x, kPlainCast), Error) << file << ": NaN input " << hex(in);
    return true;
  }
  if (e8m0_quirk_input(f, in)) expected = 0x00;  // exemption 1: nearest is 2^-127
  const uint32_t got = encode(f, x, kPlainCast);
  if (got != expected) {
    ADD_FAILURE() << file << ": input f32 " << hex(in) << " (" << x << ") expected code " << hex(expected) << " got " << hex(got);
    return false;
  }
  return true;
}

TEST_P(TestVectors, Decode) {
  const Format f = GetParam().format;
  const std::string file = std::string("decode__") + GetParam().stem + ".f32le.bin";
  const auto data = read_testvector(file);
  ASSERT_EQ(data.size(), (size_t(1) << info(f).bits) * 4);
  for (uint32_t code = 0; code < (1u << info(f).bits); ++code) {
    const uint32_t expected = load_le(&data[code * 4], 4);
    const uint32_t got = std::bit_cast<uint32_t>(decode(f, code));
    const bool exp_nan = std::isnan(std::bit_cast<float>(expected));
    // NaN payloads differ between references (see the README); NaN-ness and sign must agree.
    const bool ok = exp_nan ? std::isnan(std::bit_cast<float>(got)) && (got >> 31) == (expected >> 31) : got == expected;
    ASSERT_TRUE(ok) << file << ": code " << hex(code) << " expected " << hex(expected) << " got " << hex(got);
  }
}

TEST_P(TestVectors, SweepAllF32WithLow8BitsZero) {
  const Format f = GetParam().format;
  const std::string file = std::string("sweep_f32__") + GetParam().stem + "." + code_suffix(f) + ".bin.gz";
  const auto data = read_testvector(file);
  const int cb = info(f).storage_bytes();
  ASSERT_EQ(data.size(), (size_t(1) << 24) * cb);
  for (uint32_t i = 0; i < (1u << 24); ++i)
    if (!check_f32(f, i << 8, load_le(&data[size_t(i) * cb], cb), file.c_str())) return;
}

TEST_P(TestVectors, Boundary) {
  const Format f = GetParam().format;
  const std::string file = std::string("boundary_f32__") + GetParam().stem + ".rec8.bin.gz";
  const auto data = read_testvector(file);
  ASSERT_EQ(data.size(), 200000u * 8);
  for (size_t r = 0; r < 200000; ++r)
    if (!check_f32(f, load_le(&data[r * 8], 4), load_le(&data[r * 8 + 4], 4), file.c_str())) return;
}

// From every f16 and every bf16 bit pattern. Identity conversions have no file.
void check_from_16bit(Format f, bool from_f16, const char* stem) {
  const Format src = from_f16 ? Format::f16 : Format::bf16;
  if (f == src) return;
  const std::string file = std::string(from_f16 ? "from_f16__" : "from_bf16__") + stem + "." + code_suffix(f) + ".bin";
  const auto data = read_testvector(file);
  const int cb = info(f).storage_bytes();
  ASSERT_EQ(data.size(), 65536u * cb);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = uint16_t(h);
    const float x = from_f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    const uint32_t in32 = std::bit_cast<uint32_t>(x);
    if (nan_into_nanless(f, in32)) {
      EXPECT_THROW(from_f16 ? encode_from_f16(f, bits, kPlainCast) : encode_from_bf16(f, bits, kPlainCast), Error);
      continue;
    }
    uint32_t expected = load_le(&data[h * cb], cb);
    if (!from_f16 && e8m0_quirk_input(f, in32)) expected = 0x00;
    const uint32_t got = from_f16 ? encode_from_f16(f, bits, kPlainCast) : encode_from_bf16(f, bits, kPlainCast);
    ASSERT_EQ(got, expected) << file << ": input " << hex(h) << " (" << x << ")";
  }
}

TEST_P(TestVectors, FromF16) { check_from_16bit(GetParam().format, true, GetParam().stem); }
TEST_P(TestVectors, FromBF16) { check_from_16bit(GetParam().format, false, GetParam().stem); }

INSTANTIATE_TEST_SUITE_P(AllFormats, TestVectors, ::testing::ValuesIn(vector_formats()), Name);

// The exemptions are behaviour of our own: pin them down explicitly.
TEST(TestVectorExemptions, E8m0RoundsToNearestJustAbove2PowMinus127) {
  EXPECT_EQ(encode(Format::e8m0, std::bit_cast<float>(0x00400001u)), 0x00u);
  EXPECT_EQ(encode(Format::e8m0, std::bit_cast<float>(0x005FFFFFu)), 0x00u);
  EXPECT_EQ(encode(Format::e8m0, std::bit_cast<float>(0x00600000u)), 0x01u);  // tie goes up
}

TEST(TestVectorExemptions, NanIntoFp6Fp4IsAnError) {
  for (Format f : {Format::e2m3, Format::e3m2, Format::e2m1, Format::int8}) {
    EXPECT_THROW(encode(f, std::nanf("")), Error) << format_name(f);
    EXPECT_THROW(encode(f, -std::nanf("")), Error) << format_name(f);
  }
}

}  // namespace
}  // namespace scalify
