// The fused encoded step (fused_encoded_step.hpp) in AVX2 + F16C, 8 elements at a time: the
// AVX-512 form's operations (fused_encoded_step_avx512.cpp) at half the width: state_format.cpp's
// VectorDecoder and VectorEncoder (F16C's conversions for f16 codes), the subnormal encode
// branch-free. AVX2 has no cheap masks for bytes: a tail of fewer than 8 elements runs the same
// operations on zero-padded copies, its padding kept out of every amax.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "scalify/optim/fused_encoded_step.hpp"

namespace scalify::optim {

namespace {

// The lanes [0, count) set.
__m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::min<int64_t>(count, 8))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
int32_t reduce_max(__m256i x) {
  __m128i m = _mm_max_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xB1));
  return _mm_cvtsi128_si32(m);
}

// A moment's codes, 8 at a time, at a pointer (into the state, or a tail's padded copy).
struct Codes {
  const VectorCodec& c;
  std::byte* codes;
  int bytes;
  __m256i mag_mask, sign_mask, special_below, inf_mag, encode_sign_mask, max_code, exp_offset, normal_min, half;
  __m128i shift;
  __m256 decode_mul, units;
  explicit Codes(const FusedMoment& m)
      : c(m.codec),
        codes(m.state->codes.data()),
        bytes(c.f16 ? 2 : 1),
        mag_mask(_mm256_set1_epi32(c.mag_mask)),
        sign_mask(_mm256_set1_epi32(c.sign_mask)),
        special_below(_mm256_set1_epi32(c.special_below)),
        inf_mag(_mm256_set1_epi32(c.inf_mag)),
        encode_sign_mask(_mm256_set1_epi32(c.encode_sign_mask)),
        max_code(_mm256_set1_epi32(c.max_code)),
        exp_offset(_mm256_set1_epi32(c.exp_offset)),
        normal_min(_mm256_set1_epi32(c.normal_min_bits)),
        half(_mm256_set1_epi32((1 << (c.shift - 1)) - 1)),
        shift(_mm_cvtsi32_si128(c.shift)),
        decode_mul(_mm256_set1_ps(c.decode_mul)),
        units(_mm256_set1_ps(c.subnormal_units)) {}
  std::byte* at(int64_t i) const { return codes + i * bytes; }

  // The values of the 8 codes at p times scale.
  __m256 decode(const std::byte* p, __m256 scale) const {
    if (c.f16) return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), scale);
    const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_and_si256(code, mag_mask);
    const __m256i sign = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(code, sign_mask), _mm256_setzero_si256()),
                                             _mm256_set1_epi32(int32_t(0x80000000u)));
    const __m256i finite = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_sll_epi32(mag, shift)), decode_mul));
    const __m256i special = _mm256_cmpgt_epi32(mag, special_below);
    __m256i bits = _mm256_or_si256(sign, finite);
    if (!_mm256_testz_si256(special, special)) {  // infinities or NaNs: never written by the encoders
      const __m256i nonfinite =
          _mm256_blendv_epi8(_mm256_set1_epi32(0x7FC00000), _mm256_set1_epi32(0x7F800000), _mm256_cmpeq_epi32(mag, inf_mag));
      bits = _mm256_or_si256(sign, _mm256_blendv_epi8(finite, nonfinite, special));
    }
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), scale);
  }

  // The codes of x / div (divide false: x) at 2^exponent (mul) into the 8 codes at p.
  void encode(__m256 x, bool divide, __m256 div, __m256 mul, std::byte* p) const {
    const __m256 q = divide ? _mm256_div_ps(x, div) : x;
    const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32(0x7FFFFFFF))), mul);
    if (c.f16) {
      const __m128i mag = _mm_min_epu16(_mm256_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT), _mm_set1_epi16(int16_t(c.max_code)));
      const __m128i sign = _mm_and_si128(_mm256_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT), _mm_set1_epi16(int16_t(c.encode_sign_mask)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_or_si128(mag, sign));
      return;
    }
    const __m256i sign = _mm256_and_si256(_mm256_srai_epi32(_mm256_castps_si256(q), 31), encode_sign_mask);
    const __m256i f = _mm256_castps_si256(scaled);
    const __m256i below = _mm256_cmpgt_epi32(normal_min, f);
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(f, half), _mm256_and_si256(_mm256_srl_epi32(f, shift), _mm256_set1_epi32(1)));
    // Lanes below the codec's normals, without a branch (as the AVX-512 form).
    const __m256 two23 = _mm256_set1_ps(0x1p23f);
    const __m256 sub_in = _mm256_castsi256_ps(_mm256_blendv_epi8(normal_min, f, below));
    const __m256i subnormal = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(sub_in, units), two23), two23));
    const __m256i mag = _mm256_blendv_epi8(_mm256_sub_epi32(_mm256_srl_epi32(rounded, shift), exp_offset), subnormal, below);
    const __m256i code = _mm256_or_si256(sign, _mm256_min_epi32(mag, max_code));
    const __m128i codes16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(codes16, codes16));
  }
};

// x with its magnitude at most 2^127, sign kept (EncodedUpdate::saturate); its magnitude's bits in abs_bits.
__m256 saturate(__m256 x, __m256i& abs_bits) {
  const __m256i b = _mm256_castps_si256(x);
  abs_bits = _mm256_min_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F000000));
  return _mm256_castsi256_ps(_mm256_or_si256(abs_bits, _mm256_and_si256(b, _mm256_set1_epi32(int32_t(0x80000000u)))));
}

bool per_group(const FusedMoment& m) { return m.format->scaling == StateScaling::per_group; }

// The 8 weights at w (f32) or w16 (a scaled f16 master's data, times scale).
__m256 load_weights(const float* w, const uint16_t* w16, float scale) {
  if (!w16) return _mm256_loadu_ps(w);
  return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w16))), _mm256_set1_ps(scale));
}

// Encodes a finished group [gb, ge) of new moments x (its largest magnitude's bits hi_bits) with
// its new scale, as encode_state_range does.
void encode_group(const Codes& codes, const FusedMoment& m, const float* x, int64_t gb, int64_t ge, int32_t hi_bits) {
  EncodedState& s = *m.state;
  const int64_t g = gb / m.format->group_size;
  const float hi = std::bit_cast<float>(hi_bits);
  if (hi == 0) {  // +0's code is 0 in every codec
    s.scales[size_t(g)] = 1.0f;
    std::memset(codes.at(gb), 0, size_t((ge - gb) * codes.bytes));
    return;
  }
  const float scale = std::max(float(hi / m.codec.code_max), std::numeric_limits<float>::denorm_min());
  s.scales[size_t(g)] = scale;
  const __m256 div = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f);
  int64_t i = gb;
  for (; i + 8 <= ge; i += 8) codes.encode(_mm256_load_ps(x + (i - gb)), scale != 1.0f, div, one, codes.at(i));
  if (i < ge) {  // x has room for a whole vector
    std::byte out[16];
    codes.encode(_mm256_load_ps(x + (i - gb)), scale != 1.0f, div, one, out);
    std::memcpy(codes.at(i), out, size_t((ge - i) * codes.bytes));
  }
}

}  // namespace

void fused_update_pass_avx2(const PlainUpdate& u, float lr, float wd, const float* g, const WeightsIn& w, float* next, const FusedMoment& m,
                            const FusedMoment& v, int64_t begin, int64_t end, PassAmax& amax) {
  const Codes mc(m), vc(v);
  const __m256 b1 = _mm256_set1_ps(u.b1), b2 = _mm256_set1_ps(u.b2), c1 = _mm256_set1_ps(u.c1), c2 = _mm256_set1_ps(u.c2),
               ibc1 = _mm256_set1_ps(u.ibc1), ibc2 = _mm256_set1_ps(u.ibc2), eps = _mm256_set1_ps(u.eps), gm = _mm256_set1_ps(u.gm),
               vlr = _mm256_set1_ps(lr), vwd = _mm256_set1_ps(wd);
  const bool mg = per_group(m), vg = per_group(v);
  const int64_t group = mg ? m.format->group_size : vg ? v.format->group_size : end - begin;
  alignas(32) float mbuf[kMaxFusedGroup], vbuf[kMaxFusedGroup];  // a group's new moments (per-group formats)
  alignas(32) float unused[8];                                   // a per-tensor moment's (the second pass encodes it)
  const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i tensor_am = _mm256_setzero_si256(), tensor_av = _mm256_setzero_si256(), an = _mm256_setzero_si256();
  for (int64_t gb = begin; gb < end; gb += group) {
    const int64_t ge = std::min(end, gb + group);
    const __m256 sm = _mm256_set1_ps(m.state->scales[mg ? size_t(gb / group) : 0]);
    const __m256 sv = _mm256_set1_ps(v.state->scales[vg ? size_t(gb / group) : 0]);
    __m256i am = _mm256_setzero_si256(), av = _mm256_setzero_si256();
    // One vector from its inputs at these pointers; valid: the lanes that count in the amaxes.
    auto vector = [&](const std::byte* m_at, const std::byte* v_at, const float* g_at, const float* w_at, const uint16_t* w16_at, float* nw,
                      float* m_out, float* v_out, __m256i valid) {
      const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g_at), gm);
      __m256i ma, va;
      const __m256 mv = saturate(_mm256_add_ps(_mm256_mul_ps(b1, mc.decode(m_at, sm)), _mm256_mul_ps(c1, gi)), ma);
      const __m256 vv = saturate(_mm256_add_ps(_mm256_mul_ps(b2, vc.decode(v_at, sv)), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi)), va);
      am = _mm256_max_epi32(am, _mm256_and_si256(ma, valid));
      av = _mm256_max_epi32(av, _mm256_and_si256(va, valid));
      const __m256 wv = load_weights(w_at, w16_at, w.scale);
      const __m256 step = _mm256_div_ps(_mm256_mul_ps(mv, ibc1), _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vv, ibc2)), eps));
      const __m256 nwv = _mm256_sub_ps(wv, _mm256_mul_ps(vlr, _mm256_add_ps(step, _mm256_mul_ps(vwd, wv))));
      an = _mm256_max_epi32(an, _mm256_and_si256(_mm256_and_si256(_mm256_castps_si256(nwv), abs), valid));
      _mm256_storeu_ps(nw, nwv);
      _mm256_store_ps(m_out, mv);
      _mm256_store_ps(v_out, vv);
    };
    const __m256i all = _mm256_set1_epi32(-1);
    int64_t i = gb;
    for (; i + 8 <= ge; i += 8) {
      const int64_t o = i - begin;
      vector(mc.at(i), vc.at(i), g + o, w.f16 ? nullptr : w.f32 + o, w.f16 ? w.f16 + o : nullptr, next + o, mg ? mbuf + (i - gb) : unused,
             vg ? vbuf + (i - gb) : unused, all);
    }
    if (i < ge) {  // the tail through zero-padded copies
      const int64_t o = i - begin, count = ge - i;
      std::byte m_in[16] = {}, v_in[16] = {};
      alignas(32) float g_in[8] = {}, w_in[8] = {}, nw[8];
      uint16_t w16_in[8] = {};
      std::memcpy(m_in, mc.at(i), size_t(count * mc.bytes));
      std::memcpy(v_in, vc.at(i), size_t(count * vc.bytes));
      std::memcpy(g_in, g + o, size_t(count) * sizeof(float));
      if (w.f16)
        std::memcpy(w16_in, w.f16 + o, size_t(count) * sizeof(uint16_t));
      else
        std::memcpy(w_in, w.f32 + o, size_t(count) * sizeof(float));
      vector(m_in, v_in, g_in, w_in, w.f16 ? w16_in : nullptr, nw, mg ? mbuf + (i - gb) : unused, vg ? vbuf + (i - gb) : unused,
             first_lanes(count));
      std::memcpy(next + o, nw, size_t(count) * sizeof(float));
    }
    if (mg)
      encode_group(mc, m, mbuf, gb, ge, reduce_max(am));
    else
      tensor_am = _mm256_max_epi32(tensor_am, am);
    if (vg)
      encode_group(vc, v, vbuf, gb, ge, reduce_max(av));
    else
      tensor_av = _mm256_max_epi32(tensor_av, av);
  }
  amax.m = std::max(amax.m, reduce_max(tensor_am));
  amax.v = std::max(amax.v, reduce_max(tensor_av));
  amax.next = std::max(amax.next, reduce_max(an));
}

void fused_moments_pass_avx2(const PlainUpdate& u, const float* g, const FusedMoment& m, const FusedMoment& v, bool m_too, bool v_too,
                             int64_t begin, int64_t end) {
  const Codes mc(m), vc(v);
  const __m256 b1 = _mm256_set1_ps(u.b1), b2 = _mm256_set1_ps(u.b2), c1 = _mm256_set1_ps(u.c1), c2 = _mm256_set1_ps(u.c2),
               gm = _mm256_set1_ps(u.gm), sm = _mm256_set1_ps(m.state->scales[0]), sv = _mm256_set1_ps(v.state->scales[0]),
               one = _mm256_set1_ps(1.0f);
  const __m256 mul_m = _mm256_set1_ps(std::bit_cast<float>(uint32_t(127 + m.exponent) << 23)),
               mul_v = _mm256_set1_ps(std::bit_cast<float>(uint32_t(127 + v.exponent) << 23));
  // One vector: codes read and written at m_at, v_at; g at g_at.
  auto vector = [&](std::byte* m_at, std::byte* v_at, const float* g_at) {
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g_at), gm);
    __m256i unused;
    if (m_too)
      mc.encode(saturate(_mm256_add_ps(_mm256_mul_ps(b1, mc.decode(m_at, sm)), _mm256_mul_ps(c1, gi)), unused), false, one, mul_m, m_at);
    if (v_too)
      vc.encode(saturate(_mm256_add_ps(_mm256_mul_ps(b2, vc.decode(v_at, sv)), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi)), unused), false,
                one, mul_v, v_at);
  };
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) vector(mc.at(i), vc.at(i), g + (i - begin));
  if (i < end) {  // the tail through zero-padded copies
    const int64_t count = end - i;
    std::byte m_io[16] = {}, v_io[16] = {};
    alignas(32) float g_in[8] = {};
    std::memcpy(m_io, mc.at(i), size_t(count * mc.bytes));
    std::memcpy(v_io, vc.at(i), size_t(count * vc.bytes));
    std::memcpy(g_in, g + (i - begin), size_t(count) * sizeof(float));
    vector(m_io, v_io, g_in);
    if (m_too) std::memcpy(mc.at(i), m_io, size_t(count * mc.bytes));
    if (v_too) std::memcpy(vc.at(i), v_io, size_t(count * vc.bytes));
  }
}

}  // namespace scalify::optim
