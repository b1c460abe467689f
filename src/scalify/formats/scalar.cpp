#include "scalify/formats/scalar.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "scalify/error.hpp"

namespace scalify {

namespace {

constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QuietNan = 0x7FC00000u;

// The integer codec treats int8 as a sign-magnitude format whose values all sit in one
// "subnormal" binade with quantum 1: 7 mantissa bits, smallest normal exponent 7.
int codec_man_bits(const FormatInfo& f) { return f.man_bits; }
int codec_emin(const FormatInfo& f) { return f.is_float() ? f.emin() : 7; }

// Round sig / 2^shift to an integer by the given mode. sig < 2^24.
uint32_t round_shift(uint32_t sig, int shift, Rounding rm, uint32_t random_bits) {
  if (shift <= 0) return sig;
  switch (rm) {
    case Rounding::nearest_even: {
      shift = std::min(shift, 25);  // sig < 2^24: any larger shift rounds to 0 as well
      const uint32_t lsb = (sig >> shift) & 1u;
      return (sig + (1u << (shift - 1)) - 1u + lsb) >> shift;
    }
    case Rounding::toward_zero: return shift >= 32 ? 0u : sig >> shift;
    case Rounding::stochastic: {
      // At most 31 random bits fit below the target LSB; for deeper shifts the bits of sig that
      // fall below them are dropped first (probability error < 2^-31 of one quantum).
      const int used = std::min(shift, 31);
      const int drop = std::min(shift - used, 31);
      const uint32_t s = sig >> drop;
      return (s + (random_bits & ((1u << used) - 1u))) >> used;
    }
  }
  return 0;
}

uint32_t encode_e8m0(uint32_t x, int exp_shift, Overflow ov, Rounding rm, uint32_t rnd) {
  const uint32_t a = x & 0x7FFFFFFFu;
  const bool sat = ov == Overflow::saturate;
  if (a > kF32Inf) return 0xFF;
  if ((x >> 31) != 0 || a == 0) return sat ? 0x00 : 0xFF;  // no zero, no negatives
  if (a == kF32Inf) return sat ? 0xFE : 0xFF;
  uint32_t sig;
  int e;
  detail::normalise(a, sig, e);
  e = std::clamp(e + exp_shift, -1000, 1000);
  const int up = int(round_shift(sig, 23, rm, rnd)) - 1;  // 0 or 1: stay in this binade or go up
  const int code = e + 127 + up;
  if (code > 254) return sat ? 0xFE : 0xFF;
  return uint32_t(std::max(code, 0));  // below 2^-127 the nearest value is 2^-127 itself
}

}  // namespace

namespace detail {

void normalise(uint32_t a, uint32_t& sig, int& e) {
  const uint32_t ef = a >> 23, mant = a & 0x7FFFFFu;
  if (ef == 0) {
    const int lz = std::countl_zero(mant) - 8;
    sig = mant << lz;
    e = -126 - lz;
  } else {
    sig = mant | 0x800000u;
    e = int(ef) - 127;
  }
}

uint32_t encode_bits(const FormatInfo& f, uint32_t x, int exp_shift, Overflow ov, Rounding rm, uint32_t rnd) {
  if (f.specials == Specials::e8m0) return encode_e8m0(x, exp_shift, ov, rm, rnd);
  const uint32_t sign = x >> 31, a = x & 0x7FFFFFFFu;
  if (a > kF32Inf) {  // NaN
    switch (f.specials) {
      case Specials::ieee:
      case Specials::fn: return f.nan_code() | (sign ? f.sign_mask() : 0u);
      case Specials::fnuz: return f.nan_code();
      default: return 0;  // no NaN in the format: the caller reports it
    }
  }
  const uint32_t max_code = f.max_code();
  uint32_t mag;
  if (a == kF32Inf) {
    mag = max_code + 1;  // overflows below
  } else if (a == 0) {
    mag = 0;
  } else {
    uint32_t sig;
    int e;
    normalise(a, sig, e);
    e = std::clamp(e + exp_shift, -1000, 1000);
    const int M = codec_man_bits(f), emin = codec_emin(f);
    const int shift = (23 - M) + std::max(0, emin - e);
    const int binade = std::max(e - emin, 0);
    mag = binade > 280 ? max_code + 1 : round_shift(sig, shift, rm, rnd) + (uint32_t(binade) << M);
  }
  if (mag > max_code) {
    if (ov == Overflow::saturate || f.specials == Specials::finite || f.specials == Specials::integer)
      mag = max_code;
    else if (f.specials == Specials::ieee)
      mag = f.inf_code();
    else if (f.specials == Specials::fnuz)
      return f.nan_code();
    else  // fn
      mag = f.nan_code();
  }
  if (f.specials == Specials::integer) return sign ? (256u - mag) & 0xFFu : mag;
  if (f.specials == Specials::fnuz && mag == 0) return 0;  // no -0
  return mag | (sign ? f.sign_mask() : 0u);
}

uint32_t decode_bits(const FormatInfo& f, uint32_t c) {
  const uint32_t quiet_nan_neg = kF32QuietNan | 0x80000000u;
  switch (f.specials) {
    case Specials::e8m0:
      if (c == 0xFF) return kF32QuietNan;
      return c == 0 ? 0x00400000u : c << 23;  // 2^-127 is an f32 subnormal
    case Specials::integer: {
      const float v = float(int8_t(uint8_t(c)));
      return std::bit_cast<uint32_t>(v);
    }
    case Specials::fnuz:
      if (c == 0x80) return quiet_nan_neg;
      break;
    default: break;
  }
  const int M = f.man_bits;
  const uint32_t sign = (c & f.sign_mask()) ? 0x80000000u : 0u;
  const uint32_t mag = c & (f.sign_mask() - 1u);
  const uint32_t ef = mag >> M, m = mag & ((1u << M) - 1u);
  if (f.specials == Specials::ieee && ef == f.exp_field_max()) return sign | (m == 0 ? kF32Inf : kF32QuietNan);
  if (f.specials == Specials::fn && mag == f.nan_code()) return sign | kF32QuietNan;
  if (ef == 0 && f.exp_bits < 8) {  // subnormal: m * 2^(emin - M), an f32 normal (or zero)
    if (m == 0) return sign;
    const int lead = 31 - std::countl_zero(m);  // normalise m to 1.xxx
    const uint32_t frac = (m << (23 - lead)) & 0x7FFFFFu;
    return sign | (uint32_t(f.emin() - M + lead + 127) << 23) | frac;
  }
  return sign | ((ef + 127u - uint32_t(f.bias)) << 23) | (m << (23 - M));
}

}  // namespace detail

float f16_to_f32(uint16_t h) { return std::bit_cast<float>(detail::decode_bits(info(Format::f16), h)); }

float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

namespace {
void reject_nan(Format fmt) {
  throw Error("cannot encode NaN as " + std::string(format_name(fmt)) +
              ": the format has no NaN (a NaN must not silently become a number)");
}
}  // namespace

uint32_t encode(Format fmt, float x, EncodeOptions opt) {
  const FormatInfo& f = info(fmt);
  if (!f.has_nan() && x != x) reject_nan(fmt);
  return detail::encode_bits(f, std::bit_cast<uint32_t>(x), 0, opt.overflow, opt.rounding, opt.random_bits);
}

uint32_t encode_from_f16(Format fmt, uint16_t h, EncodeOptions opt) {
  // e5m2 is the top byte of f16: a NaN keeps its top payload bits (forced quiet), as ml_dtypes.
  if (fmt == Format::e5m2 && (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) return (h >> 8) | 0x02u;
  return encode(fmt, f16_to_f32(h), opt);
}

uint32_t encode_from_bf16(Format fmt, uint16_t b, EncodeOptions opt) { return encode(fmt, bf16_to_f32(b), opt); }

float decode(Format fmt, uint32_t code) {
  const FormatInfo& f = info(fmt);
  if (f.bits < 32 && code >> f.bits)
    throw Error("decode: code " + std::to_string(code) + " does not fit " + std::string(f.name) + "'s " + std::to_string(f.bits) + " bits");
  return std::bit_cast<float>(detail::decode_bits(f, code));
}

}  // namespace scalify
