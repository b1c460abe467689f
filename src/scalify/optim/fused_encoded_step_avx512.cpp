// The fused encoded step (fused_encoded_step.hpp) in AVX-512, 16 elements at a time, the tail
// masked: the operations of state_format.cpp's VectorDecoder, AdamW's EncodedUpdate and
// VectorEncoder (F16C's conversions for f16 codes), in the same order.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "scalify/optim/fused_encoded_step.hpp"

// GCC 12 warns of its own header's _mm512_undefined_epi32 ((maybe-)uninitialized) when an AVX-512
// shift or conversion is inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace scalify::optim {

namespace {

__mmask16 lanes(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// Loads and stores of 16 lanes, or of the lanes k of a tail (Full false): masked loads are about
// twice as slow on Zen 4, so whole vectors go without a mask.
template <bool Full>
__m512 load(const float* p, __mmask16 k) {
  if constexpr (Full) return _mm512_loadu_ps(p);
  return _mm512_maskz_loadu_ps(k, p);
}
template <bool Full>
void store(float* p, __mmask16 k, __m512 x) {
  if constexpr (Full) return _mm512_storeu_ps(p, x);
  _mm512_mask_storeu_ps(p, k, x);
}

// A moment's codes, 16 at a time.
struct Codes {
  const VectorCodec& c;
  std::byte* codes;
  __m512i mag_mask, sign_mask, special_below, inf_mag, encode_sign_mask, max_code, exp_offset, normal_min, half;
  __m128i shift;
  __m512 decode_mul, units;
  explicit Codes(const FusedMoment& m)
      : c(m.codec),
        codes(m.state->codes.data()),
        mag_mask(_mm512_set1_epi32(c.mag_mask)),
        sign_mask(_mm512_set1_epi32(c.sign_mask)),
        special_below(_mm512_set1_epi32(c.special_below)),
        inf_mag(_mm512_set1_epi32(c.inf_mag)),
        encode_sign_mask(_mm512_set1_epi32(c.encode_sign_mask)),
        max_code(_mm512_set1_epi32(c.max_code)),
        exp_offset(_mm512_set1_epi32(c.exp_offset)),
        normal_min(_mm512_set1_epi32(c.normal_min_bits)),
        half(_mm512_set1_epi32((1 << (c.shift - 1)) - 1)),
        shift(_mm_cvtsi32_si128(c.shift)),
        decode_mul(_mm512_set1_ps(c.decode_mul)),
        units(_mm512_set1_ps(c.subnormal_units)) {}

  // The values of codes [i, i + 16) (lanes k) times scale.
  template <bool Full>
  __m512 decode(int64_t i, __mmask16 k, __m512 scale) const {
    if (c.f16) {
      const __m256i h =
          Full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 2 * i)) : _mm256_maskz_loadu_epi16(k, codes + 2 * i);
      return _mm512_mul_ps(_mm512_cvtph_ps(h), scale);
    }
    const __m512i code =
        _mm512_cvtepu8_epi32(Full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)) : _mm_maskz_loadu_epi8(k, codes + i));
    const __m512i mag = _mm512_and_si512(code, mag_mask);
    const __m512i sign = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(code, sign_mask), _mm512_set1_epi32(int32_t(0x80000000u)));
    const __m512i finite = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_sll_epi32(mag, shift)), decode_mul));
    const __mmask16 special = _mm512_cmpgt_epi32_mask(mag, special_below);
    __m512i bits = _mm512_or_si512(sign, finite);
    if (special) {  // infinities or NaNs: never written by the encoders
      const __m512i nonfinite =
          _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(mag, inf_mag), _mm512_set1_epi32(0x7FC00000), _mm512_set1_epi32(0x7F800000));
      bits = _mm512_or_si512(sign, _mm512_mask_blend_epi32(special, finite, nonfinite));
    }
    return _mm512_mul_ps(_mm512_castsi512_ps(bits), scale);
  }

  // The codes of x / div (div 1: no division) at 2^exponent (mul) into [i, i + 16) (lanes k).
  template <bool Full>
  void encode(__m512 x, bool divide, __m512 div, __m512 mul, int64_t i, __mmask16 k) const {
    const __m512 q = divide ? _mm512_div_ps(x, div) : x;
    const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(q), _mm512_set1_epi32(0x7FFFFFFF))), mul);
    if (c.f16) {
      const __m256i mag = _mm256_min_epu16(_mm512_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT), _mm256_set1_epi16(int16_t(c.max_code)));
      const __m256i sign = _mm256_and_si256(_mm512_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT), _mm256_set1_epi16(int16_t(c.encode_sign_mask)));
      if constexpr (Full)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 2 * i), _mm256_or_si256(mag, sign));
      else
        _mm256_mask_storeu_epi16(codes + 2 * i, k, _mm256_or_si256(mag, sign));
      return;
    }
    const __m512i sign = _mm512_and_si512(_mm512_srai_epi32(_mm512_castps_si512(q), 31), encode_sign_mask);
    const __m512i f = _mm512_castps_si512(scaled);
    const __mmask16 below = _mm512_cmpgt_epi32_mask(normal_min, f);
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(f, half), _mm512_and_si512(_mm512_srl_epi32(f, shift), _mm512_set1_epi32(1)));
    // Lanes below the codec's normals, without a branch: a group's small moments take it often
    // enough (a fifth of v's vectors with Gaussian gradients) that a branch's mispredictions cost more.
    const __m512 two23 = _mm512_set1_ps(0x1p23f);
    const __m512 sub_in = _mm512_castsi512_ps(_mm512_mask_blend_epi32(below, normal_min, f));
    const __m512i subnormal = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(sub_in, units), two23), two23));
    const __m512i mag = _mm512_mask_blend_epi32(below, _mm512_sub_epi32(_mm512_srl_epi32(rounded, shift), exp_offset), subnormal);
    const __m512i code = _mm512_or_si512(sign, _mm512_min_epi32(mag, max_code));
    if constexpr (Full)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
    else
      _mm512_mask_cvtepi32_storeu_epi8(codes + i, k, code);
  }
};

// x with its magnitude at most 2^127, sign kept (EncodedUpdate::saturate); its magnitude's bits in abs_bits.
__m512 saturate(__m512 x, __m512i& abs_bits) {
  const __m512i b = _mm512_castps_si512(x);
  abs_bits = _mm512_min_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F000000));
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(abs_bits, b, _mm512_set1_epi32(int32_t(0x80000000u)), 0xF8));  // a | (b & c)
}

bool per_group(const FusedMoment& m) { return m.format->scaling == StateScaling::per_group; }

// Encodes a finished group [gb, ge) of new moments x (its largest magnitude's bits hi_bits) with
// its new scale, as encode_state_range does.
void encode_group(const Codes& codes, const FusedMoment& m, const float* x, int64_t gb, int64_t ge, int32_t hi_bits) {
  EncodedState& s = *m.state;
  const int64_t g = gb / m.format->group_size;
  const float hi = std::bit_cast<float>(hi_bits);
  if (hi == 0) {  // +0's code is 0 in every codec
    s.scales[size_t(g)] = 1.0f;
    std::memset(s.codes.data() + size_t(gb) * (m.codec.f16 ? 2 : 1), 0, size_t(ge - gb) * (m.codec.f16 ? 2 : 1));
    return;
  }
  const float scale = std::max(float(hi / m.codec.code_max), std::numeric_limits<float>::denorm_min());
  s.scales[size_t(g)] = scale;
  const __m512 div = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
  int64_t i = gb;
  for (; i + 16 <= ge; i += 16) codes.encode<true>(_mm512_load_ps(x + (i - gb)), scale != 1.0f, div, one, i, 0xFFFF);
  if (i < ge) codes.encode<false>(_mm512_load_ps(x + (i - gb)), scale != 1.0f, div, one, i, lanes(ge - i));
}

}  // namespace

void fused_update_pass_avx512(const PlainUpdate& u, float lr, float wd, const float* g, const WeightsIn& w, float* next,
                              const FusedMoment& m, const FusedMoment& v, int64_t begin, int64_t end, PassAmax& amax) {
  const Codes mc(m), vc(v);
  const __m512 b1 = _mm512_set1_ps(u.b1), b2 = _mm512_set1_ps(u.b2), c1 = _mm512_set1_ps(u.c1), c2 = _mm512_set1_ps(u.c2),
               ibc1 = _mm512_set1_ps(u.ibc1), ibc2 = _mm512_set1_ps(u.ibc2), eps = _mm512_set1_ps(u.eps), gm = _mm512_set1_ps(u.gm),
               vlr = _mm512_set1_ps(lr), vwd = _mm512_set1_ps(wd);
  const bool mg = per_group(m), vg = per_group(v);
  const int64_t group = mg ? m.format->group_size : vg ? v.format->group_size : end - begin;
  alignas(64) float mbuf[kMaxFusedGroup], vbuf[kMaxFusedGroup];  // a group's new moments (per-group formats)
  const __m512 w_scale = _mm512_set1_ps(w.scale);
  auto weights = [&]<bool Full>(int64_t o, __mmask16 k) {
    if (!w.f16) return load<Full>(w.f32 + o, k);
    const __m256i h = Full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.f16 + o)) : _mm256_maskz_loadu_epi16(k, w.f16 + o);
    return _mm512_mul_ps(_mm512_cvtph_ps(h), w_scale);
  };
  const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i tensor_am = _mm512_setzero_si512(), tensor_av = _mm512_setzero_si512(), an = _mm512_setzero_si512();
  for (int64_t gb = begin; gb < end; gb += group) {
    const int64_t ge = std::min(end, gb + group);
    const __m512 sm = _mm512_set1_ps(m.state->scales[mg ? size_t(gb / group) : 0]);
    const __m512 sv = _mm512_set1_ps(v.state->scales[vg ? size_t(gb / group) : 0]);
    __m512i am = _mm512_setzero_si512(), av = _mm512_setzero_si512();
    auto piece = [&]<bool Full>(int64_t i, __mmask16 k) {
      const int64_t o = i - begin;
      const __m512 gi = _mm512_mul_ps(load<Full>(g + o, k), gm);
      __m512 mv = _mm512_add_ps(_mm512_mul_ps(b1, mc.decode<Full>(i, k, sm)), _mm512_mul_ps(c1, gi));
      __m512 vv = _mm512_add_ps(_mm512_mul_ps(b2, vc.decode<Full>(i, k, sv)), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
      __m512i ma, va;
      mv = saturate(mv, ma);
      vv = saturate(vv, va);
      // Lanes k only: a tail's masked-off lanes (zero loads) are not always 0 here (0 / (sqrt(0) + eps)
      // is NaN where eps is below f32's range).
      am = _mm512_mask_max_epi32(am, k, am, ma);
      av = _mm512_mask_max_epi32(av, k, av, va);
      const __m512 wv = weights.template operator()<Full>(o, k);
      const __m512 step = _mm512_div_ps(_mm512_mul_ps(mv, ibc1), _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vv, ibc2)), eps));
      const __m512 nw = _mm512_sub_ps(wv, _mm512_mul_ps(vlr, _mm512_add_ps(step, _mm512_mul_ps(vwd, wv))));
      an = _mm512_mask_max_epi32(an, k, an, _mm512_and_si512(_mm512_castps_si512(nw), abs));
      store<Full>(next + o, k, nw);
      if (mg) _mm512_store_ps(mbuf + (i - gb), mv);
      if (vg) _mm512_store_ps(vbuf + (i - gb), vv);
    };
    int64_t i = gb;
    for (; i + 16 <= ge; i += 16) piece.template operator()<true>(i, 0xFFFF);
    if (i < ge) piece.template operator()<false>(i, lanes(ge - i));
    if (mg)
      encode_group(mc, m, mbuf, gb, ge, _mm512_reduce_max_epi32(am));
    else
      tensor_am = _mm512_max_epi32(tensor_am, am);
    if (vg)
      encode_group(vc, v, vbuf, gb, ge, _mm512_reduce_max_epi32(av));
    else
      tensor_av = _mm512_max_epi32(tensor_av, av);
  }
  amax.m = std::max(amax.m, int32_t(_mm512_reduce_max_epi32(tensor_am)));
  amax.v = std::max(amax.v, int32_t(_mm512_reduce_max_epi32(tensor_av)));
  amax.next = std::max(amax.next, int32_t(_mm512_reduce_max_epi32(an)));
}

void fused_moments_pass_avx512(const PlainUpdate& u, const float* g, const FusedMoment& m, const FusedMoment& v, bool m_too, bool v_too,
                               int64_t begin, int64_t end) {
  const Codes mc(m), vc(v);
  const __m512 b1 = _mm512_set1_ps(u.b1), b2 = _mm512_set1_ps(u.b2), c1 = _mm512_set1_ps(u.c1), c2 = _mm512_set1_ps(u.c2),
               gm = _mm512_set1_ps(u.gm), sm = _mm512_set1_ps(m.state->scales[0]), sv = _mm512_set1_ps(v.state->scales[0]),
               one = _mm512_set1_ps(1.0f);
  const __m512 mul_m = _mm512_set1_ps(std::bit_cast<float>(uint32_t(127 + m.exponent) << 23)),
               mul_v = _mm512_set1_ps(std::bit_cast<float>(uint32_t(127 + v.exponent) << 23));
  auto piece = [&]<bool Full>(int64_t i, __mmask16 k) {
    const __m512 gi = _mm512_mul_ps(load<Full>(g + (i - begin), k), gm);
    __m512i unused;
    if (m_too) {
      const __m512 mv = saturate(_mm512_add_ps(_mm512_mul_ps(b1, mc.decode<Full>(i, k, sm)), _mm512_mul_ps(c1, gi)), unused);
      mc.encode<Full>(mv, false, one, mul_m, i, k);
    }
    if (v_too) {
      const __m512 vv =
          saturate(_mm512_add_ps(_mm512_mul_ps(b2, vc.decode<Full>(i, k, sv)), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi)), unused);
      vc.encode<Full>(vv, false, one, mul_v, i, k);
    }
  };
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) piece.template operator()<true>(i, 0xFFFF);
  if (i < end) piece.template operator()<false>(i, lanes(end - i));
}

}  // namespace scalify::optim
