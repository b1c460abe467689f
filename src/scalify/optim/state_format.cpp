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
#include "scalify/tensor/vector_math.hpp"

#if SCALIFY_HAVE_X86_SIMD
#include <immintrin.h>
#endif

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
  bool avx2 = kernels::active_isa() != kernels::Isa::scalar;  // the loop compiled for AVX2 (the build's target is SSE2)
  bool avx512 = kernels::active_isa() == kernels::Isa::avx512;
  // out[i] = the code of x[i] / div (div = 1 divides exactly).
  template <class Code>
  void operator()(const float* x, float div, Code* out, int64_t n) const;
  template <class Code>
  [[gnu::always_inline]] void encode(const float* x, float div, Code* out, int64_t n) const {
    // Locals: stores through a byte pointer could alias the members, which would be reloaded.
    const int32_t sign_mask = this->sign_mask, max_code = this->max_code, exp_offset = this->exp_offset, cut = this->cut,
                  normal_min_bits = this->normal_min_bits;
    const float mul = this->mul, subnormal_units = this->subnormal_units;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i] / div;
      const int32_t sign = int32_t(std::bit_cast<uint32_t>(v) >> 31) * sign_mask;
      const float af = std::fabs(v) * mul;
      // Selections by masks of the bits' order (that of non-negative floats): a float comparison
      // or a conditional would stop the vectoriser under -ftrapping-math.
      const auto f = int32_t(std::bit_cast<uint32_t>(af));  // inf rounds past max_code: saturates below
      const int32_t below_normals = -int32_t(f < normal_min_bits);
      // Below the codec's normals: af x 2^(m - emin) is exact, rounded to an integer (half to even) by 2^23's spacing.
      const float sub_in = std::bit_cast<float>((f & below_normals) | (normal_min_bits & ~below_normals));
      const auto subnormal = int32_t((sub_in * subnormal_units + 0x1p23f) - 0x1p23f);
      const int32_t normal = ((f + ((1 << (cut - 1)) - 1) + ((f >> cut) & 1)) >> cut) - exp_offset;
      out[i] = Code(sign | std::min((subnormal & below_normals) | (normal & ~below_normals), max_code));
    }
  }
};

#if SCALIFY_HAVE_X86_SIMD
// encode in AVX2 intrinsics, 8 values at a time (the compiler vectorises the 8-bit codes' loop
// with 128-bit vectors only), the same operations; the tail by encode.
// div == 1 (per-tensor scales) does not divide. (A product by 1 / div with a division only for
// quotients near a midpoint between two codes gives the same codes but measured slower here: the
// check costs more instructions than the division saves.)
template <class Code>
[[gnu::target("avx2")]] void encode_avx2(const VectorEncoder& e, const float* x, float div, Code* out, int64_t n) {
  const __m256 vdiv = _mm256_set1_ps(div), mul = _mm256_set1_ps(e.mul), units = _mm256_set1_ps(e.subnormal_units),
               two23 = _mm256_set1_ps(0x1p23f);
  const __m256i sign_mask = _mm256_set1_epi32(e.sign_mask), max_code = _mm256_set1_epi32(e.max_code),
                exp_offset = _mm256_set1_epi32(e.exp_offset), normal_min = _mm256_set1_epi32(e.normal_min_bits),
                half = _mm256_set1_epi32((1 << (e.cut - 1)) - 1), one = _mm256_set1_epi32(1), abs = _mm256_set1_epi32(0x7FFFFFFF);
  const __m128i cut = _mm_cvtsi32_si128(e.cut);
  const bool divide = div != 1.0f;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_castps_si256(divide ? _mm256_div_ps(_mm256_loadu_ps(x + i), vdiv) : _mm256_loadu_ps(x + i));
    const __m256i sign = _mm256_and_si256(_mm256_srai_epi32(v, 31), sign_mask);
    const __m256i f = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(v, abs)), mul));
    const __m256i below = _mm256_cmpgt_epi32(normal_min, f);
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(f, half), _mm256_and_si256(_mm256_srl_epi32(f, cut), one));
    __m256i mag = _mm256_sub_epi32(_mm256_srl_epi32(rounded, cut), exp_offset);
    if (!_mm256_testz_si256(below, below)) {  // some lanes below the codec's normals (rare in a group scaled to its amax)
      const __m256 sub_in = _mm256_castsi256_ps(_mm256_blendv_epi8(normal_min, f, below));
      const __m256i subnormal = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(sub_in, units), two23), two23));
      mag = _mm256_blendv_epi8(mag, subnormal, below);
    }
    const __m256i code = _mm256_or_si256(sign, _mm256_min_epi32(mag, max_code));
    const __m128i codes16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    if constexpr (sizeof(Code) == 1)
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(codes16, codes16));
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), codes16);
  }
  e.encode(x + i, div, out + i, n - i);
}
#endif

#if SCALIFY_HAVE_X86_SIMD
// f16 codes (the only 16-bit codes VectorEncoder takes: bf16's subnormals are out of its reach)
// by F16C's conversion, which rounds to nearest even as encode does, subnormals included; only
// its overflow to infinity is clamped to the largest code, as encode saturates.
[[gnu::target("avx2,f16c")]] void encode_f16c(const VectorEncoder& e, const float* x, float div, uint16_t* out, int64_t n) {
  const __m256 vdiv = _mm256_set1_ps(div), mul = _mm256_set1_ps(e.mul), abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m128i max_code = _mm_set1_epi16(int16_t(e.max_code)), sign_mask = _mm_set1_epi16(int16_t(e.sign_mask));
  const bool divide = div != 1.0f;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = divide ? _mm256_div_ps(_mm256_loadu_ps(x + i), vdiv) : _mm256_loadu_ps(x + i);
    const __m128i mag = _mm_min_epu16(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_and_ps(v, abs), mul), _MM_FROUND_TO_NEAREST_INT), max_code);
    const __m128i sign = _mm_and_si128(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT), sign_mask);  // the sign survives any rounding
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_or_si128(mag, sign));
  }
  e.encode(x + i, div, out + i, n - i);
}
#endif

#if SCALIFY_HAVE_X86_SIMD
// GCC 12 warns of its own header's _mm512_undefined_epi32 (maybe-uninitialized) when an
// AVX-512 shift is inlined into a target("avx512f") function: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// encode_avx2's operations on 16 values at a time with AVX-512 (half the instructions), 8-bit codes.
// (AVX-512F has FMA: the compiler may fuse sub_in * units + 2^23, which changes nothing, the
// product being exact.)
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq")]] void encode_avx512(const VectorEncoder& e, const float* x, float div, uint8_t* out,
                                                                         int64_t n) {
  const __m512 vdiv = _mm512_set1_ps(div), mul = _mm512_set1_ps(e.mul), units = _mm512_set1_ps(e.subnormal_units),
               two23 = _mm512_set1_ps(0x1p23f);
  const __m512i sign_mask = _mm512_set1_epi32(e.sign_mask), max_code = _mm512_set1_epi32(e.max_code),
                exp_offset = _mm512_set1_epi32(e.exp_offset), normal_min = _mm512_set1_epi32(e.normal_min_bits),
                half = _mm512_set1_epi32((1 << (e.cut - 1)) - 1), one = _mm512_set1_epi32(1), abs = _mm512_set1_epi32(0x7FFFFFFF);
  const __m128i cut = _mm_cvtsi32_si128(e.cut);
  const bool divide = div != 1.0f;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_castps_si512(divide ? _mm512_div_ps(_mm512_loadu_ps(x + i), vdiv) : _mm512_loadu_ps(x + i));
    const __m512i sign = _mm512_and_si512(_mm512_srai_epi32(v, 31), sign_mask);
    const __m512i f = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(v, abs)), mul));
    const __mmask16 below = _mm512_cmpgt_epi32_mask(normal_min, f);
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(f, half), _mm512_and_si512(_mm512_srl_epi32(f, cut), one));
    __m512i mag = _mm512_sub_epi32(_mm512_srl_epi32(rounded, cut), exp_offset);
    if (below) {  // some lanes below the codec's normals
      const __m512 sub_in = _mm512_castsi512_ps(_mm512_mask_blend_epi32(below, normal_min, f));
      const __m512i subnormal = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(sub_in, units), two23), two23));
      mag = _mm512_mask_blend_epi32(below, mag, subnormal);
    }
    const __m512i code = _mm512_or_si512(sign, _mm512_min_epi32(mag, max_code));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(code));
  }
  e.encode(x + i, div, out + i, n - i);
}
#pragma GCC diagnostic pop
#endif

template <class Code>
void VectorEncoder::operator()(const float* x, float div, Code* out, int64_t n) const {
#if SCALIFY_HAVE_X86_SIMD
  if constexpr (sizeof(Code) == 2)
    if (avx2) return encode_f16c(*this, x, div, out, n);
  if constexpr (sizeof(Code) == 1)
    if (avx512) return encode_avx512(*this, x, div, out, n);
  if (avx2) return encode_avx2(*this, x, div, out, n);
#endif
  encode(x, div, out, n);
}

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
  bool avx2 = kernels::active_isa() != kernels::Isa::scalar, avx512 = kernels::active_isa() == kernels::Isa::avx512;
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
  void operator()(const Code* code, float scale, float* out, int64_t n) const;
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

#if SCALIFY_HAVE_X86_SIMD
// decode in AVX2 intrinsics, 8 codes at a time (as encode_avx2), the same operations.
template <class Code>
[[gnu::target("avx2")]] void decode_avx2(const VectorDecoder& d, const Code* code, float scale, float* out, int64_t n) {
  const __m256i mag_mask = _mm256_set1_epi32(d.mag_mask), sign_mask = _mm256_set1_epi32(d.sign_mask),
                special_below = _mm256_set1_epi32(d.special_min == INT32_MAX ? INT32_MAX : d.special_min - 1),
                inf_mag = _mm256_set1_epi32(d.inf_mag), inf = _mm256_set1_epi32(0x7F800000), nan = _mm256_set1_epi32(0x7FC00000),
                zero = _mm256_setzero_si256(), sign_bit = _mm256_set1_epi32(int32_t(0x80000000u));
  const __m128i shift = _mm_cvtsi32_si128(d.shift);
  const __m256 mul = _mm256_set1_ps(d.mul), vscale = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i c = sizeof(Code) == 1 ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + i)))
                                        : _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code + i)));
    const __m256i mag = _mm256_and_si256(c, mag_mask);
    const __m256i sign = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(c, sign_mask), zero), sign_bit);
    const __m256i finite = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_sll_epi32(mag, shift)), mul));
    const __m256i special = _mm256_cmpgt_epi32(mag, special_below);
    __m256i bits = _mm256_or_si256(sign, finite);
    if (!_mm256_testz_si256(special, special)) {  // infinities or NaNs: never written by the encoders
      const __m256i nonfinite = _mm256_blendv_epi8(nan, inf, _mm256_cmpeq_epi32(mag, inf_mag));
      bits = _mm256_or_si256(sign, _mm256_blendv_epi8(finite, nonfinite, special));
    }
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_castsi256_ps(bits), vscale));
  }
  d.decode(code + i, scale, out + i, n - i);
}
#endif

#if SCALIFY_HAVE_X86_SIMD
// f16 codes by F16C's conversion (exact; a NaN keeps its payload, quieted).
[[gnu::target("avx2,f16c")]] void decode_f16c(const VectorDecoder& d, const uint16_t* code, float scale, float* out, int64_t n) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code + i))), vscale));
  d.decode(code + i, scale, out + i, n - i);
}
#endif

#if SCALIFY_HAVE_X86_SIMD
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // as encode_avx512
// decode_avx2's operations on 16 codes at a time with AVX-512, 8-bit codes.
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq")]] void decode_avx512(const VectorDecoder& d, const uint8_t* code, float scale,
                                                                         float* out, int64_t n) {
  const __m512i mag_mask = _mm512_set1_epi32(d.mag_mask), sign_mask = _mm512_set1_epi32(d.sign_mask),
                special_below = _mm512_set1_epi32(d.special_min == INT32_MAX ? INT32_MAX : d.special_min - 1),
                inf_mag = _mm512_set1_epi32(d.inf_mag), inf = _mm512_set1_epi32(0x7F800000), nan = _mm512_set1_epi32(0x7FC00000),
                sign_bit = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m128i shift = _mm_cvtsi32_si128(d.shift);
  const __m512 mul = _mm512_set1_ps(d.mul), vscale = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code + i)));
    const __m512i mag = _mm512_and_si512(c, mag_mask);
    const __m512i sign = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(c, sign_mask), sign_bit);
    const __m512i finite = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_sll_epi32(mag, shift)), mul));
    const __mmask16 special = _mm512_cmpgt_epi32_mask(mag, special_below);
    __m512i bits = _mm512_or_si512(sign, finite);
    if (special) {  // infinities or NaNs: never written by the encoders
      const __m512i nonfinite = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(mag, inf_mag), nan, inf);
      bits = _mm512_or_si512(sign, _mm512_mask_blend_epi32(special, finite, nonfinite));
    }
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_castsi512_ps(bits), vscale));
  }
  d.decode(code + i, scale, out + i, n - i);
}
#pragma GCC diagnostic pop
#endif

template <class Code>
void VectorDecoder::operator()(const Code* code, float scale, float* out, int64_t n) const {
#if SCALIFY_HAVE_X86_SIMD
  if constexpr (sizeof(Code) == 1)
    if (avx512) return decode_avx512(*this, code, scale, out, n);
  if constexpr (sizeof(Code) == 2)
    if (avx2 && shift == 13 && sign_mask == 0x8000) return decode_f16c(*this, code, scale, out, n);  // f16's layout
  if (avx2) return decode_avx2(*this, code, scale, out, n);
#endif
  decode(code, scale, out, n);
}

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
#if SCALIFY_HAVE_X86_SIMD
[[gnu::target("avx2")]] std::pair<float, float> magnitude_range_avx2(const float* x, int64_t n) { return magnitude_range(x, n); }
#endif
std::pair<float, float> group_range(const float* x, int64_t n, bool avx2) {
#if SCALIFY_HAVE_X86_SIMD
  if (avx2) return magnitude_range_avx2(x, n);
#endif
  return magnitude_range(x, n);
}

using Code16 [[gnu::may_alias]] = uint16_t;  // 16-bit codes read in place from the byte storage
// The values of codes [begin, end) of an 8- or 16-bit state times scale into out.
void decode_codes(const EncodedState& s, const StateFormat& f, int64_t begin, int64_t end, float scale, float* out) {
  const VectorDecoder d(codec(f));
  if (info(f.storage).storage_bytes() == 1)
    d(reinterpret_cast<const uint8_t*>(s.codes.data()) + begin, scale, out, end - begin);
  else
    d(reinterpret_cast<const Code16*>(s.codes.data()) + begin, scale, out, end - begin);  // little-endian, as put_code
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

void Expansion::forward(const float* x, float* y, int64_t n) const {
  constexpr int64_t kPiece = 256;
  double base[kPiece], power[kPiece];
  for (int64_t b = 0; b < n; b += kPiece) {
    const int64_t len = std::min(kPiece, n - b);
    for (int64_t i = 0; i < len; ++i) base[i] = double(std::fabs(x[b + i])) / double(centre);
    vecmath::active().pow_f64(base, double(k), power, len);
    for (int64_t i = 0; i < len; ++i) y[b + i] = std::copysign(float(power[i]) / scale, x[b + i]);
  }
}
void Expansion::inverse(const float* y, float* x, int64_t n) const {
  constexpr int64_t kPiece = 256;
  double base[kPiece], power[kPiece];
  for (int64_t b = 0; b < n; b += kPiece) {
    const int64_t len = std::min(kPiece, n - b);
    for (int64_t i = 0; i < len; ++i) base[i] = double(std::fabs(y[b + i])) * double(scale);
    vecmath::active().pow_f64(base, 1.0 / double(k), power, len);
    for (int64_t i = 0; i < len; ++i) x[b + i] = std::copysign(float(power[i] * double(centre)), y[b + i]);
  }
}
float Expansion::forward(float x) const {
  float y;
  forward(&x, &y, 1);
  return y;
}
float Expansion::inverse(float y) const {
  float x;
  inverse(&y, &x, 1);
  return x;
}

Expansion expansion_for(float hi, float lo, double code_max, int expand_min) {
  const double ratio = double(hi) / double(lo);
  const double k = ratio == 1 ? kMaxExpansion : std::floor(std::log2(code_max * code_max / 2) / std::log2(ratio) * expand_min) / expand_min;
  Expansion e;
  e.k = float(std::clamp(k, 1.0 / expand_min, kMaxExpansion));
  e.centre = float(std::sqrt(double(hi) * double(lo)));
  e.scale = float(std::pow(double(hi) / double(e.centre), double(e.k)) / code_max);
  return e;
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
      venc(v, div, reinterpret_cast<uint8_t*>(s.codes.data()) + first, count);
    else if (vectorised) {
      uint16_t codes[256];
      for (int64_t j = 0; j < count; j += 256) {
        const int64_t len = std::min<int64_t>(256, count - j);
        venc(v + j, div, codes, len);
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
    const auto [hi, lo] = group_range(xg, ge - gb, venc.avx2);  // lo is used only where hi > 0
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
      float y[256];
      const int64_t len = std::min<int64_t>(256, ge - j);
      e.forward(xg + (j - gb), y, len);
      encode_piece(y, 1.0f, j, len);
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
