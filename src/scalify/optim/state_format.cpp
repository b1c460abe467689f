#include "scalify/optim/state_format.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"

namespace scalify::optim {

namespace {
bool is_fp8(Format f) { return f == Format::e4m3 || f == Format::e5m2; }

// The code layout: the storage format, or for non-negative 8-bit codes the same exponent field
// with the sign bit spent on one more mantissa bit (the sign mask moves to bit 8, never set).
FormatInfo codec(const StateFormat& f) {
  FormatInfo c = info(f.storage);
  if (f.non_negative && c.bits == 8) {
    c.bits = 9;
    c.man_bits += 1;
  }
  return c;
}

void put_code(std::vector<std::byte>& codes, int bytes, int64_t i, uint32_t code) {
  std::memcpy(codes.data() + size_t(i) * size_t(bytes), &code, size_t(bytes));  // little-endian low bytes
}

// Round-to-nearest-even encoding of a finite f32 times 2^shift into the codec, saturating: the f32
// bits rounded at the codec's mantissa width (the carry moves into the exponent), subnormals
// through an exact f64 product. The same codes as detail::encode_bits (test_state_format checks
// them against an independent reference), a few integer operations instead of its general path.
struct NearestEncoder {
  FormatInfo c;
  int shift;
  double normal_min, to_subnormal_units;  // 2^emin, 2^(m - emin)
  float mul;                              // 2^shift where f32 holds it (|shift| <= 100), else 0
  NearestEncoder(const FormatInfo& codec, int shift_)
      : c(codec),
        shift(shift_),
        normal_min(std::ldexp(1.0, codec.emin())),
        to_subnormal_units(std::ldexp(1.0, codec.man_bits - codec.emin())),
        mul(shift_ >= -100 && shift_ <= 100 ? std::bit_cast<float>(uint32_t(127 + shift_) << 23) : 0.0f) {}
  uint32_t operator()(float x) const {
    const uint32_t sign = std::bit_cast<uint32_t>(x) >> 31 ? c.sign_mask() : 0u;
    // |x| 2^shift: an f32 product where it stays normal (exact), else f64.
    float af = std::fabs(x) * mul;
    double a = af;
    if (mul == 0 || (af < FLT_MIN && af != 0)) {
      a = std::ldexp(double(std::fabs(x)), shift);
      af = float(a);
    }
    uint32_t mag;
    if (a < normal_min) {
      mag = uint32_t(std::nearbyint(a * to_subnormal_units));  // 2^m (rounded up) is the first normal code
    } else if (a > double(FLT_MAX)) {
      mag = c.max_code();
    } else {
      const uint32_t f = std::bit_cast<uint32_t>(af);  // exact: a power-of-two multiple of an f32, in f32's normal range
      const int cut = 23 - c.man_bits;
      const uint32_t r = f + ((1u << (cut - 1)) - 1) + ((f >> cut) & 1u);
      mag = (r >> cut) - (uint32_t(127 - c.bias) << c.man_bits);
    }
    return sign | std::min(mag, c.max_code());
  }
};

// NearestEncoder's arithmetic in f32 alone and without branches, so the compiler vectorises it
// over a piece: the same codes where it applies (applies()): 2^shift an f32 normal, and every
// product below f32's normal range too small to reach half the codec's smallest subnormal (so
// NearestEncoder's f64 path gives 0 there too) — 8-bit codecs and f16, not bf16.
struct VectorEncoder {
  int32_t sign_mask, max_code, exp_offset, cut;  // sign_mask 0 for non-negative codes (the sign is dropped)
  int32_t normal_min_bits;                       // 2^emin's f32 bits
  float mul, subnormal_units;
  static bool applies(const FormatInfo& c, int shift) {
    return std::abs(shift) <= VectorCodec::kMaxExponent && c.man_bits - c.emin() < 125;
  }
  VectorEncoder(const FormatInfo& c, int shift, bool non_negative)
      : sign_mask(non_negative ? 0 : int32_t(c.sign_mask())),
        max_code(int32_t(c.max_code())),
        exp_offset(int32_t(uint32_t(127 - c.bias) << c.man_bits)),
        cut(23 - c.man_bits),
        normal_min_bits(int32_t(uint32_t(127 + c.emin()) << 23)),
        mul(std::bit_cast<float>(uint32_t(127 + shift) << 23)),
        subnormal_units(float(std::ldexp(1.0, c.man_bits - c.emin()))) {}
  // out[i] = the code of x[i] / div (div = 1 divides exactly, and is not taken: a vector division
  // costs as much as the rest of the loop).
  template <class Code>
  [[gnu::always_inline]] void encode(const float* x, float div, Code* out, int64_t n) const {
    if (div == 1)
      encode_divided<false>(x, div, out, n);
    else
      encode_divided<true>(x, div, out, n);
  }
  template <bool kDivide, class Code>
  [[gnu::always_inline]] void encode_divided(const float* x, float div, Code* out, int64_t n) const {
    // Locals: stores through a byte pointer could alias the members, which would be reloaded.
    const int32_t sign_mask = this->sign_mask, max_code = this->max_code, exp_offset = this->exp_offset, cut = this->cut,
                  normal_min_bits = this->normal_min_bits;
    const float mul = this->mul, subnormal_units = this->subnormal_units;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float v = kDivide ? x[i] / div : x[i];
      const int32_t sign = int32_t(std::bit_cast<uint32_t>(v) >> 31) * sign_mask;
      const float af = std::fabs(v) * mul;
      // Selections by masks of the bits' order (that of non-negative floats): a float comparison
      // or a conditional would stop the vectoriser under -ftrapping-math.
      const auto f = int32_t(std::bit_cast<uint32_t>(af));  // inf rounds past max_code: saturates below
      const int32_t below_normals = -int32_t(f < normal_min_bits);
      // Below the codec's normals: af x 2^(m - emin) is exact, rounded to an integer (half to even) by 2^23's spacing.
      const float sub_in = std::bit_cast<float>((f & below_normals) | (normal_min_bits & ~below_normals));
      const auto subnormal = int32_t((sub_in * subnormal_units + 0x1p23f) - 0x1p23f);
      // Unsigned: a NaN's bits plus the rounding carry may pass 2^31 (it then saturates, as inf).
      const auto u = uint32_t(f);
      const int32_t normal = int32_t((u + uint32_t((1 << (cut - 1)) - 1) + ((u >> cut) & 1u)) >> cut) - exp_offset;
      out[i] = Code(sign | std::min((subnormal & below_normals) | (normal & ~below_normals), max_code));
    }
  }
};

// Decoding by arithmetic, no table: a code's magnitude bits shifted into f32's exponent and
// mantissa position read as the f32 2^(bias - 127) times the code's value, for normal and
// subnormal codes alike (an f32 subnormal times 2^(127 - bias) is exact), so the product by
// 2^(127 - bias) is the value; the sign goes to bit 31. Infinities and NaNs are selected by the
// magnitude, as detail::decode_bits gives them (test_state_format checks every code of every layout).
// Needs f32 subnormals read as such (no denormals-are-zero; Scalify never sets it).
struct VectorDecoder {
  int32_t sign_mask, mag_mask, shift;
  int32_t special_min, inf_mag;  // the first magnitude that is not finite (INT32_MAX: none); the one that is inf (-1: none)
  float mul;
  explicit VectorDecoder(const FormatInfo& c)
      : sign_mask(int32_t(c.sign_mask())),
        mag_mask(int32_t(c.sign_mask() - 1)),
        shift(23 - c.man_bits),
        special_min(c.specials == Specials::ieee ? int32_t(c.inf_code())
                    : c.specials == Specials::fn ? int32_t(c.nan_code())
                                                 : INT32_MAX),
        inf_mag(c.specials == Specials::ieee ? int32_t(c.inf_code()) : -1),
        mul(std::bit_cast<float>(uint32_t(127 + 127 - c.bias) << 23)) {}
  // out[i] = the value of code[i] times scale.
  template <class Code>
  [[gnu::always_inline]] void decode(const Code* code, float scale, float* out, int64_t n) const {
    const int32_t sign_mask = this->sign_mask, mag_mask = this->mag_mask, shift = this->shift, special_min = this->special_min,
                  inf_mag = this->inf_mag;
    const float mul = this->mul;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const auto c = int32_t(code[i]);
      const int32_t mag = c & mag_mask;
      const int32_t sign = -int32_t((c & sign_mask) != 0) & int32_t(0x80000000u);
      const int32_t finite = int32_t(std::bit_cast<uint32_t>(std::bit_cast<float>(mag << shift) * mul));
      const int32_t special = -int32_t(mag >= special_min);
      const int32_t is_inf = -int32_t(mag == inf_mag);
      const int32_t nonfinite = (is_inf & 0x7F800000) | (~is_inf & 0x7FC00000);
      out[i] = std::bit_cast<float>(sign | (finite & ~special) | (nonfinite & special)) * scale;
    }
  }
};

}  // namespace

bool vector_codec(const StateFormat& f, VectorCodec& out) {
  const FormatInfo c = codec(f);
  if (!(is_fp8(f.storage) || f.storage == Format::f16) || f.rounding != Rounding::nearest_even || f.expand || !VectorEncoder::applies(c, 0))
    return false;
  const VectorDecoder d(c);
  const VectorEncoder e(c, 0, f.non_negative);
  out = {.f16 = f.storage == Format::f16,
         .sign_mask = d.sign_mask,
         .mag_mask = d.mag_mask,
         .shift = d.shift,
         .special_below = d.special_min == INT32_MAX ? INT32_MAX : d.special_min - 1,
         .inf_mag = d.inf_mag,
         .decode_mul = d.mul,
         .encode_sign_mask = e.sign_mask,
         .max_code = e.max_code,
         .exp_offset = e.exp_offset,
         .normal_min_bits = e.normal_min_bits,
         .subnormal_units = e.subnormal_units,
         .code_max = state_code_max(f)};
  return true;
}

namespace {

// The largest and smallest non-zero magnitudes of n values, by their bits (the order of
// non-negative floats; VectorEncoder says why not by float comparisons); lo is INT32_MAX's float
// where every value is zero.
[[gnu::always_inline]] inline std::pair<float, float> magnitude_range(const float* x, int64_t n) {
  int32_t hi_bits = 0, lo_bits = INT32_MAX;
#pragma omp simd reduction(max : hi_bits) reduction(min : lo_bits)
  for (int64_t i = 0; i < n; ++i) {
    const auto a = int32_t(std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
    const int32_t nonzero = -int32_t(a != 0);
    hi_bits = std::max(hi_bits, a);
    lo_bits = std::min(lo_bits, (a & nonzero) | (INT32_MAX & ~nonzero));
  }
  return {std::bit_cast<float>(hi_bits), std::bit_cast<float>(lo_bits)};
}

// The loops above, compiled for AVX2 and AVX-512 too where the format kernels run them (the
// build's target is SSE2): the path of the formats the fused step does not take (the expansion,
// stochastic rounding) and of whole-tensor encodes and decodes. The same operations, so the same
// codes (AVX-512 brings FMA: the one product and sum, a subnormal's units, is exact either way).
#if SCALIFY_HAVE_X86_SIMD
#define SCALIFY_STATE_LOOPS(NAME, ATTRIBUTE)                                                                       \
  template <class Code>                                                                                            \
  [[ATTRIBUTE]] void encode_##NAME(const VectorEncoder& e, const float* x, float div, Code* out, int64_t n) {      \
    e.encode(x, div, out, n);                                                                                      \
  }                                                                                                                \
  template <class Code>                                                                                            \
  [[ATTRIBUTE]] void decode_##NAME(const VectorDecoder& d, const Code* code, float scale, float* out, int64_t n) { \
    d.decode(code, scale, out, n);                                                                                 \
  }                                                                                                                \
  [[ATTRIBUTE]] std::pair<float, float> magnitude_range_##NAME(const float* x, int64_t n) { return magnitude_range(x, n); }
SCALIFY_STATE_LOOPS(avx2, gnu::target("avx2"))
SCALIFY_STATE_LOOPS(avx512, gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx2,prefer-vector-width=512"))
#undef SCALIFY_STATE_LOOPS
#endif
kernels::Isa isa() { return kernels::active_isa(); }
template <class Code>
void encode_codes(const VectorEncoder& e, const float* x, float div, Code* out, int64_t n) {
#if SCALIFY_HAVE_X86_SIMD
  if (isa() == kernels::Isa::avx512) return encode_avx512(e, x, div, out, n);
  if (isa() == kernels::Isa::avx2) return encode_avx2(e, x, div, out, n);
#endif
  e.encode(x, div, out, n);
}
template <class Code>
void decode_values(const VectorDecoder& d, const Code* code, float scale, float* out, int64_t n) {
#if SCALIFY_HAVE_X86_SIMD
  if (isa() == kernels::Isa::avx512) return decode_avx512(d, code, scale, out, n);
  if (isa() == kernels::Isa::avx2) return decode_avx2(d, code, scale, out, n);
#endif
  d.decode(code, scale, out, n);
}
std::pair<float, float> group_range(const float* x, int64_t n) {
#if SCALIFY_HAVE_X86_SIMD
  if (isa() == kernels::Isa::avx512) return magnitude_range_avx512(x, n);
  if (isa() == kernels::Isa::avx2) return magnitude_range_avx2(x, n);
#endif
  return magnitude_range(x, n);
}

using Code16 [[gnu::may_alias]] = uint16_t;  // 16-bit codes read in place from the byte storage
// The values of codes [begin, end) of an 8- or 16-bit state times scale into out.
void decode_codes(const EncodedState& s, const StateFormat& f, int64_t begin, int64_t end, float scale, float* out) {
  const VectorDecoder d(codec(f));
  if (info(f.storage).storage_bytes() == 1)
    decode_values(d, reinterpret_cast<const uint8_t*>(s.codes.data()) + begin, scale, out, end - begin);
  else
    decode_values(d, reinterpret_cast<const Code16*>(s.codes.data()) + begin, scale, out, end - begin);  // little-endian, as put_code
}

// The largest e with amax * 2^e <= max (amax > 0): the per-tensor power-of-two scale is 2^-e.
int power_of_two_exponent(double max, double amax) {
  int e = std::ilogb(max) - std::ilogb(amax);
  while (std::ldexp(amax, e) > max) --e;
  while (std::ldexp(amax, e + 1) <= max) ++e;
  return e;
}
}  // namespace

void validate(const StateFormat& f, const std::string& role) {
  auto fail = [&](const std::string& what) { throw Error(role + ": " + what); };
  if (f.storage != Format::f32 && f.storage != Format::bf16 && f.storage != Format::f16 && !is_fp8(f.storage))
    fail("storage must be one of f32, bf16, f16, e4m3, e5m2, got " + std::string(format_name(f.storage)));
  const bool scaled = f.scaling != StateScaling::none;
  if ((f.storage == Format::f32 || f.storage == Format::bf16) && scaled)
    fail(std::string(format_name(f.storage)) + " storage takes no scale (scaling must be none)");
  if ((f.storage == Format::f16 || is_fp8(f.storage)) && !scaled)
    fail(std::string(format_name(f.storage)) + " storage needs a scale (scaling per_tensor or per_group)");
  if (f.group_size < 1) fail("group_size must be >= 1, got " + std::to_string(f.group_size));
  if (f.expand_min < 1) fail("expand_min must be >= 1, got " + std::to_string(f.expand_min));
  if (f.expand && !(is_fp8(f.storage) && f.scaling == StateScaling::per_group))
    fail("the dynamic range expansion needs e4m3 or e5m2 storage with per_group scaling");
  if (f.rounding != Rounding::nearest_even && f.rounding != Rounding::stochastic) fail("rounding must be nearest_even or stochastic");
  if (f.storage == Format::f32 && f.rounding != Rounding::nearest_even) fail("f32 storage is not rounded (rounding must be nearest_even)");
}

float state_code_max(const StateFormat& f) {
  const FormatInfo c = codec(f);
  return std::bit_cast<float>(detail::decode_bits(c, c.max_code()));
}

int64_t EncodedState::bytes() const {
  return int64_t(codes.size()) + int64_t(sizeof(float) * (scales.size() + expand_k.size() + centre.size()));
}

// At most 149: 2^-e is then at least f32's smallest subnormal, never a zero scale (amax below
// ~max 2^-149 only).
int state_tensor_exponent(const StateFormat& f, float amax) {
  return amax > 0 ? std::min(149, power_of_two_exponent(state_code_max(f), amax)) : 0;
}

void encode_state_range(const float* x, const StateFormat& f, int64_t begin, int64_t end, int exponent, uint64_t seed, EncodedState& s) {
  if (f.storage == Format::f32) {
    std::memcpy(s.codes.data() + size_t(begin) * sizeof(float), x, size_t(end - begin) * sizeof(float));
    return;
  }
  const FormatInfo c = codec(f);
  const int bytes = info(f.storage).storage_bytes();
  const double max = state_code_max(f);
  // One element: v (its sign kept, -0 as +0 in non-negative codes) times 2^shift, rounded.
  auto encode_one = [&](float v, const NearestEncoder& enc, int64_t i) {
    uint32_t b = std::bit_cast<uint32_t>(v);
    if (f.non_negative) b &= 0x7FFFFFFFu;
    const uint32_t code = f.rounding == Rounding::stochastic ? detail::encode_bits(c, b, enc.shift, Overflow::saturate, f.rounding,
                                                                                   kernels::random_bits(seed, uint64_t(i)))
                                                             : enc(std::bit_cast<float>(b));
    if (bytes == 1)
      s.codes[size_t(i)] = std::byte(code);
    else
      put_code(s.codes, bytes, i, code);
  };
  // A piece of count values v[j] / div into elements [first, first + count): vectorised where it applies.
  const int shift = f.scaling == StateScaling::per_tensor ? exponent : 0;
  const bool vectorised = f.rounding == Rounding::nearest_even && VectorEncoder::applies(c, shift);
  const NearestEncoder enc(c, shift);
  const VectorEncoder venc(c, shift, f.non_negative);
  auto encode_piece = [&](const float* v, float div, int64_t first, int64_t count) {
    if (vectorised && bytes == 1)
      encode_codes(venc, v, div, reinterpret_cast<uint8_t*>(s.codes.data()) + first, count);
    else if (vectorised) {
      uint16_t codes[256];
      for (int64_t j = 0; j < count; j += 256) {
        const int64_t len = std::min<int64_t>(256, count - j);
        encode_codes(venc, v + j, div, codes, len);
        std::memcpy(s.codes.data() + 2 * (first + j), codes, size_t(len) * 2);  // little-endian, as put_code
      }
    } else
      for (int64_t j = 0; j < count; ++j) encode_one(v[j] / div, enc, first + j);
  };
  if (f.scaling != StateScaling::per_group) {
    encode_piece(x, 1.0f, begin, end - begin);
    return;
  }
  for (int64_t gb = begin; gb < end; gb += f.group_size) {
    const int64_t g = gb / f.group_size, ge = std::min(end, gb + f.group_size);
    const float* xg = x + (gb - begin);
    const auto [hi, lo] = group_range(xg, ge - gb);  // lo is used only where hi > 0
    s.scales[size_t(g)] = 1.0f;
    if (f.expand) s.expand_k[size_t(g)] = s.centre[size_t(g)] = 1.0f;
    if (hi == 0) {  // +0's code is 0 in every codec
      std::memset(s.codes.data() + size_t(gb) * size_t(bytes), 0, size_t(ge - gb) * size_t(bytes));
      continue;
    }
    if (!f.expand) {
      // At least f32's smallest subnormal: hi / max underflows to 0 for hi below ~max 2^-150, and a
      // zero scale would read every code back as 0 (the codes saturate at that scale instead).
      const float scale = std::max(float(hi / max), std::numeric_limits<float>::denorm_min());
      s.scales[size_t(g)] = scale;
      encode_piece(xg, scale, gb, ge - gb);
      continue;
    }
    const Expansion e = expansion_for(hi, lo, max, f.expand_min);
    s.expand_k[size_t(g)] = e.k;
    s.centre[size_t(g)] = e.centre;
    s.scales[size_t(g)] = e.scale;
    for (int64_t j = gb; j < ge; j += 256) {
      float lo_y[256], hi_y[256];
      uint8_t hi_codes[256];
      const int64_t len = std::min<int64_t>(256, ge - j);
      const float* xj = xg + (j - gb);
      e.forward_bracket(xj, lo_y, hi_y, len);
      encode_piece(hi_y, 1.0f, j, len);
      std::memcpy(hi_codes, s.codes.data() + j, size_t(len));  // FP8: one byte a code
      encode_piece(lo_y, 1.0f, j, len);
      // Encoding is monotone: where the bracket's ends take one code it is the exact y's; elsewhere the pow decides.
      if (std::memcmp(hi_codes, s.codes.data() + j, size_t(len)) == 0) continue;
      for (int64_t i = 0; i < len; ++i)
        if (std::to_integer<uint8_t>(s.codes[size_t(j + i)]) != hi_codes[i]) {
          const float y = e.forward(xj[i]);
          encode_piece(&y, 1.0f, j + i, 1);
        }
    }
  }
}

EncodedState encode_state(std::span<const float> x, const StateFormat& f, uint64_t seed) {
  validate(f, "optimizer state");
  const auto n = int64_t(x.size());
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[size_t(i)])) throw Error("optimizer state: non-finite value at element " + std::to_string(i));
    if (f.non_negative && x[size_t(i)] < 0)
      throw Error("optimizer state: negative value " + std::to_string(x[size_t(i)]) + " at element " + std::to_string(i) +
                  " in a non-negative state");
    amax = std::max(amax, std::fabs(x[size_t(i)]));
  }
  EncodedState s;
  s.numel = n;
  s.codes.resize(size_t(n) * size_t(info(f.storage).storage_bytes()));
  int exponent = 0;
  if (f.scaling == StateScaling::per_tensor) {
    exponent = state_tensor_exponent(f, amax);
    s.scales.push_back(float(std::ldexp(1.0, -exponent)));
  }
  // Pieces of whole groups, so one tensor's encode runs on every thread.
  const int64_t group = f.scaling == StateScaling::per_group ? f.group_size : 1;
  const int64_t piece = std::max<int64_t>(1, 65536 / group) * group;
  if (f.scaling == StateScaling::per_group) {
    const int64_t groups = (n + group - 1) / group;
    s.scales.assign(size_t(groups), 1.0f);
    if (f.expand) {
      s.expand_k.assign(size_t(groups), 1.0f);
      s.centre.assign(size_t(groups), 1.0f);
    }
  }
  const int64_t pieces = (n + piece - 1) / piece;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pieces; ++p)
    encode_state_range(x.data() + p * piece, f, p * piece, std::min(n, (p + 1) * piece), exponent, seed, s);
  return s;
}

std::vector<float> code_values(const EncodedState& s, const StateFormat& f) {
  std::vector<float> out(size_t(s.numel));
  if (f.storage == Format::f32) {
    std::memcpy(out.data(), s.codes.data(), s.codes.size());
    return out;
  }
  decode_codes(s, f, 0, s.numel, 1.0f, out.data());
  return out;
}

void decode_state_range(const EncodedState& s, const StateFormat& f, int64_t begin, int64_t end, float* out) {
  if (f.storage == Format::f32) {
    std::memcpy(out, s.codes.data() + size_t(begin) * sizeof(float), size_t(end - begin) * sizeof(float));
    return;
  }
  const int64_t group = f.scaling == StateScaling::per_group ? f.group_size : std::max<int64_t>(s.numel, 1);
  for (int64_t gb = begin; gb < end; gb = (gb / group + 1) * group) {
    const int64_t g = gb / group, ge = std::min(end, (g + 1) * group);
    const float scale = s.scales.empty() ? 1.0f : s.scales[size_t(g)];
    float* o = out + (gb - begin);
    if (f.expand) {  // read through the group's inverse
      decode_codes(s, f, gb, ge, 1.0f, o);
      Expansion{s.expand_k[size_t(g)], s.centre[size_t(g)], scale}.inverse(o, o, ge - gb);
    } else
      decode_codes(s, f, gb, ge, scale, o);
  }
}

void decode_state(const EncodedState& s, const StateFormat& f, std::span<float> out) {
  if (int64_t(out.size()) != s.numel)
    throw Error("optimizer state: decoding " + std::to_string(s.numel) + " values into " + std::to_string(out.size()));
  const int64_t n = s.numel;
  const int64_t group = f.scaling == StateScaling::per_group ? f.group_size : 1;
  // Pieces of at most 64K elements (whole groups), so one tensor's decode runs on every thread.
  const int64_t piece = std::max<int64_t>(1, 65536 / group) * group;
  const int64_t pieces = (n + piece - 1) / piece;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pieces; ++p) decode_state_range(s, f, p * piece, std::min(n, (p + 1) * piece), out.data() + p * piece);
}

}  // namespace scalify::optim
