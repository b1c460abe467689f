#pragma once
// Number formats: one constexpr descriptor per format (SPEC §1), everything else derived from it.
//
// A descriptor says how codes are laid out (exponent and mantissa widths, bias) and which special
// values the format has. Encoding, decoding, the printed table and the MX block rule all read the
// same descriptor, so there is exactly one place that says what "e4m3" is.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace scalify {

enum class Format : uint8_t {
  f32,
  bf16,
  f16,
  e4m3,
  e5m2,
  e4m3fnuz,
  e5m2fnuz,
  e4m3b11fnuz,
  e8m0,
  e2m3,
  e3m2,
  e2m1,
  int8,
};

// Which special values a format has; decides overflow, NaN and signed-zero behaviour.
enum class Specials : uint8_t {
  ieee,     // all-ones exponent: zero mantissa = ±inf, otherwise NaN (f32, bf16, f16, e5m2)
  fn,       // no inf; NaN only at S.1111.111, the top mantissa code of the top exponent (e4m3)
  fnuz,     // no inf, no -0: the single NaN sits at the -0 code 0x80 (Graphcore/AMD formats)
  e8m0,     // unsigned powers of two 2^-127..2^127, no zero; 0xFF is NaN (OCP MX scale)
  finite,   // no inf, no NaN (MX FP6/FP4): out-of-range always saturates
  integer,  // symmetric two's-complement integer, ±127 (for comparison, not a float)
};

struct FormatInfo {
  Format id;
  std::string_view name;     // canonical
  std::string_view aliases;  // comma-separated
  int bits;                  // code width
  int exp_bits;
  int man_bits;
  int bias;
  Specials specials;
  std::string_view note;

  constexpr bool is_float() const { return specials != Specials::integer; }
  constexpr bool has_sign() const { return specials != Specials::e8m0; }
  constexpr bool has_inf() const { return specials == Specials::ieee; }
  constexpr bool has_nan() const { return specials != Specials::finite && specials != Specials::integer; }
  constexpr bool has_negative_zero() const {
    return specials == Specials::ieee || specials == Specials::fn || specials == Specials::finite;
  }
  constexpr bool has_subnormals() const { return man_bits > 0 && is_float(); }
  // Bytes one code occupies in memory: sub-byte formats use one byte per code (low bits).
  constexpr int storage_bytes() const { return bits <= 8 ? 1 : bits <= 16 ? 2 : 4; }
  constexpr uint32_t sign_mask() const { return has_sign() ? 1u << (bits - 1) : 0u; }
  constexpr uint32_t exp_field_max() const { return (1u << exp_bits) - 1; }

  // Magnitude code (sign bit clear) of the largest finite value.
  constexpr uint32_t max_code() const {
    const uint32_t all_man = (1u << man_bits) - 1;
    switch (specials) {
      case Specials::ieee: return ((exp_field_max() - 1) << man_bits) | all_man;
      case Specials::fn: return (exp_field_max() << man_bits) | (all_man - 1);
      case Specials::fnuz: return (exp_field_max() << man_bits) | all_man;
      case Specials::e8m0: return 0xFE;
      case Specials::finite: return (1u << (bits - 1)) - 1;
      case Specials::integer: return 127;
    }
    return 0;
  }
  // Code of a quiet NaN with positive sign (fnuz/e8m0: the only NaN). Meaningless if !has_nan().
  constexpr uint32_t nan_code() const {
    switch (specials) {
      case Specials::ieee: return (exp_field_max() << man_bits) | (1u << (man_bits - 1));
      case Specials::fn: return (exp_field_max() << man_bits) | ((1u << man_bits) - 1);
      case Specials::fnuz: return 0x80;
      case Specials::e8m0: return 0xFF;
      default: return 0;
    }
  }
  constexpr uint32_t inf_code() const { return exp_field_max() << man_bits; }  // ieee only

  // Exponent of the largest binade (OCP MX "emax_elem"), and of the smallest normal binade.
  constexpr int emax() const { return is_float() ? int(max_code() >> man_bits) - bias : 6; }
  constexpr int emin() const { return specials == Specials::e8m0 ? -127 : 1 - bias; }
};

// Every format of SPEC §1 (plus e4m3b11fnuz, which the reference vectors cover).
inline constexpr std::array<FormatInfo, 13> kFormats{{
    {Format::f32, "f32", "float32,fp32,float", 32, 8, 23, 127, Specials::ieee, "IEEE binary32"},
    {Format::bf16, "bf16", "bfloat16", 16, 8, 7, 127, Specials::ieee, "bfloat16"},
    {Format::f16, "f16", "float16,fp16,half", 16, 5, 10, 15, Specials::ieee, "IEEE binary16"},
    {Format::e4m3, "e4m3", "fp8_e4m3fn,e4m3fn,float8_e4m3fn,fp8_e4m3", 8, 4, 3, 7, Specials::fn, "OCP FP8 E4M3"},
    {Format::e5m2, "e5m2", "fp8_e5m2,float8_e5m2", 8, 5, 2, 15, Specials::ieee, "OCP FP8 E5M2"},
    {Format::e4m3fnuz, "e4m3fnuz", "fp8_e4m3fnuz,float8_e4m3fnuz,graphcore_e4", 8, 4, 3, 8, Specials::fnuz, "Graphcore E4 (bias 8)"},
    {Format::e5m2fnuz, "e5m2fnuz", "fp8_e5m2fnuz,float8_e5m2fnuz,graphcore_e5", 8, 5, 2, 16, Specials::fnuz, "Graphcore E5 (bias 16)"},
    {Format::e4m3b11fnuz, "e4m3b11fnuz", "fp8_e4m3b11fnuz,float8_e4m3b11fnuz,e4m3b11", 8, 4, 3, 11, Specials::fnuz,
     "legacy XLA E4M3, bias 11"},
    {Format::e8m0, "e8m0", "e8m0fnu,float8_e8m0fnu,fp8_e8m0", 8, 8, 0, 127, Specials::e8m0, "OCP MX scale"},
    {Format::e2m3, "e2m3", "fp6_e2m3,e2m3fn,float6_e2m3fn", 6, 2, 3, 1, Specials::finite, "OCP MX FP6"},
    {Format::e3m2, "e3m2", "fp6_e3m2,e3m2fn,float6_e3m2fn", 6, 3, 2, 3, Specials::finite, "OCP MX FP6"},
    {Format::e2m1, "e2m1", "fp4_e2m1,e2m1fn,float4_e2m1fn,fp4", 4, 2, 1, 1, Specials::finite, "OCP MX FP4"},
    {Format::int8, "int8", "i8", 8, 0, 7, 0, Specials::integer, "symmetric integer ±127"},
}};

// info() indexes the table by the enum: every format has its row, in the enum's order.
constexpr bool formats_in_enum_order() {
  for (size_t i = 0; i < kFormats.size(); ++i)
    if (static_cast<size_t>(kFormats[i].id) != i) return false;
  return kFormats.size() == static_cast<size_t>(Format::int8) + 1;
}
static_assert(formats_in_enum_order(), "kFormats must hold one row per Format, in the enum's order");

constexpr const FormatInfo& info(Format f) { return kFormats[static_cast<size_t>(f)]; }

// Value of the largest finite number, the smallest normal and the smallest subnormal (0 if none).
double max_value(Format f);
double min_normal(Format f);
double min_subnormal(Format f);

// Lookup by canonical name or alias, case-insensitive. Throws scalify::Error listing the valid
// names when `name` is unknown.
Format parse_format(std::string_view name);
std::string_view format_name(Format f);
std::string valid_format_names();

}  // namespace scalify
