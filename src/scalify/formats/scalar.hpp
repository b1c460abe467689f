#pragma once
// Scalar encode (f32 / f16 / bf16 -> any format) and decode (any format -> f32).
//
// Encoding rounds once, on the exact input value, then checks overflow (SPEC §1): e4m3 464 -> 448,
// e5m2 61440 -> inf. These functions are the plain reference that the bulk SIMD kernels are
// tested against, and they agree bit for bit with the ml_dtypes reference vectors.
#include <cstdint>

#include "scalify/formats/format.hpp"

namespace scalify {

enum class Rounding : uint8_t {
  nearest_even,  // IEEE round-to-nearest, ties to even (e8m0: ties up, as OCP/ml_dtypes)
  stochastic,    // add uniform random bits below the target LSB, then truncate
  toward_zero,   // truncate the magnitude
};

enum class Overflow : uint8_t {
  saturate,        // clamp to ±max finite; ±inf clamps too (OCP SAT); what training casts use
  non_saturating,  // inf where the format has one, else NaN (a plain numeric cast; FP6/FP4 and
                   // int8 have neither, so they saturate either way)
};

// The one default for both the scalar and the bulk API: what training casts use. A plain
// numeric cast (ml_dtypes' astype, the reference vectors) is Overflow::non_saturating, named.
inline constexpr Overflow kDefaultOverflow = Overflow::saturate;

struct EncodeOptions {
  Overflow overflow = kDefaultOverflow;
  Rounding rounding = Rounding::nearest_even;
  uint32_t random_bits = 0;  // only for Rounding::stochastic: 32 uniform random bits
};

// Encode a value. NaN into a format without NaN (FP6/FP4, int8) throws scalify::Error: a NaN must
// never silently become a number.
uint32_t encode(Format fmt, float x, EncodeOptions opt = {});
uint32_t encode_from_f16(Format fmt, uint16_t h, EncodeOptions opt = {});
uint32_t encode_from_bf16(Format fmt, uint16_t b, EncodeOptions opt = {});

// Decode a code to f32 (exact: every value of every format here is an f32). NaN codes give a quiet
// NaN carrying the code's sign; the fnuz NaN 0x80 decodes negative, as in ml_dtypes. A code with
// bits above the format's width (0xFF for 4-bit e2m1) throws scalify::Error.
// e8m0 has no zero and no sign: in saturating mode zeros, negatives and values below 2^-127 encode
// to 0x00 (2^-127, its smallest value); non-saturating, zeros and negatives give NaN (0xFF).
float decode(Format fmt, uint32_t code);

// Exact f16 / bf16 <-> f32 helpers (bit patterns).
float f16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t b);

namespace detail {
// Splits a finite non-zero magnitude (f32 bits, sign clear) into a 24-bit significand with bit 23
// set and an unbiased exponent; f32 subnormals are normalised, never flushed.
void normalise(uint32_t abs_bits, uint32_t& sig, int& e);
// The encoding core on f32 bits, with the value first multiplied by 2^exp_shift exactly (no
// intermediate rounding, no f32 overflow), which is how power-of-two scales are applied.
// A NaN into a format without NaN returns +0; callers check NaN themselves.
uint32_t encode_bits(const FormatInfo& f, uint32_t x_bits, int exp_shift, Overflow ov, Rounding rm, uint32_t random_bits);
uint32_t decode_bits(const FormatInfo& f, uint32_t code);
}  // namespace detail

}  // namespace scalify
