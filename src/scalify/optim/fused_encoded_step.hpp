#pragma once
// AdamW's encoded step (AdamW::step_encoded) over a chunk of one parameter in one AVX-512 or AVX2 pass:
// a group's codes decoded, its moments and weights updated, and the group encoded back while its
// new moments are in L1, instead of a pass each over L1 buffers (decode_state_range, the update,
// encode_state_range). The same f32 operations in the same order, so the same codes, scales and
// weights bit for bit (AdamWState.FusedEncodedStepEqualsTheReference); compiled with
// -ffp-contract=off, so no product and sum are fused into an FMA the reference does not make.
#include <cmath>
#include <cstdint>

#include "scalify/optim/state_format.hpp"

namespace scalify::optim {

// AdamW's update of one element in f32 arithmetic (as PyTorch's), the rule every pass follows.
struct PlainUpdate {
  float b1, b2, c1, c2, ibc1, ibc2, eps, gm;
  float moments(float g, float& m, float& v) const {  // returns g times the multiplier
    const float gi = g * gm;
    m = b1 * m + c1 * gi;
    v = b2 * v + c2 * gi * gi;
    return gi;
  }
  float weight(float w, float m, float v, float lr, float wd) const { return w - lr * ((m * ibc1) / (std::sqrt(v * ibc2) + eps) + wd * w); }
};

// One moment in a fused pass.
struct FusedMoment {
  const StateFormat* format;
  EncodedState* state;
  VectorCodec codec;
  int exponent = 0;  // the second pass of a per-tensor format: the new scale is 2^-exponent
};

// The weights a pass reads: f32, or a scaled f16 master's data and scale (AdamWConfig::
// scaled_masters), read as the bulk dequantize reads it (f16 value times scale).
struct WeightsIn {
  const float* f32 = nullptr;
  const uint16_t* f16 = nullptr;
  float scale = 1;
};

// The largest group the fused passes take (their per-group buffers are on the stack).
inline constexpr int64_t kMaxFusedGroup = 2048;

// Whether the fused passes take moments in m and v (never off x86, where the passes are not built):
// the active format-kernel ISA is AVX2 or AVX-512, both have a vector codec (into m_codec and
// v_codec where given), and per-group ones have the same group_size, a multiple of 16 of at most
// kMaxFusedGroup.
bool fused_step_applies(const StateFormat& m, const StateFormat& v, VectorCodec* m_codec = nullptr, VectorCodec* v_codec = nullptr);

// The largest magnitudes (their bits, the order of non-negative floats) of a pass's new values.
struct PassAmax {
  int32_t m = 0, v = 0, next = 0;
};

// The update pass over elements [begin, end) of one parameter (whole groups; g, w and next point at
// element begin): the moments and the new weights (EncodedUpdate's saturation included);
// per-group moments are encoded with their new scales, per-tensor ones keep their codes; the
// largest magnitudes of the new moments and weights are max'ed into amax.
void fused_update_pass(const PlainUpdate& u, float lr, float wd, const float* g, const WeightsIn& w, float* next, const FusedMoment& m,
                       const FusedMoment& v, int64_t begin, int64_t end, PassAmax& amax);

// The second pass of the per-tensor moments among m and v (m_too, v_too): the same moments
// recomputed from their codes and g (pointing at element begin) and encoded at 2^exponent
// (|exponent| <= VectorCodec::kMaxExponent).
void fused_moments_pass(const PlainUpdate& u, const float* g, const FusedMoment& m, const FusedMoment& v, bool m_too, bool v_too,
                        int64_t begin, int64_t end);

}  // namespace scalify::optim
