#pragma once
// How an optimizer moment is stored: f32, bf16, scaled f16, or FP8 (E4M3 / E5M2) with a per-tensor
// power-of-two scale or per-group f32 scales, rounded to nearest or stochastically, optionally
// through COAT's per-group dynamic range expansion (arXiv 2410.19313).
//
// Non-negative moments (Adam's second moment) waste no bit on a sign: an 8-bit code spends the
// sign bit on one more mantissa bit, so E4M3 becomes an unsigned E4M4 (bias 7, top code 0xFF NaN,
// largest 480) and E5M2 an unsigned E5M3 (bias 15, IEEE specials, largest 61440). 16-bit codes keep
// their IEEE layout.
//
// Scales (the value of a code is decode(code) * scale):
//  - per tensor: scale = 2^-e with e = floor(log2(max_code / amax)) (MS-AMP's formula, margin 0):
//    the codes are exactly encode(x * 2^e), no rounding before the encode;
//  - per group of group_size consecutive elements: scale = amax / max_code (f32), codes
//    encode(x / scale) (COAT's per-group quantisation);
//  - expansion (per group, FP8 only): with M and m the largest and smallest non-zero |x| of the
//    group (f32) and c = sqrt(M m) (f32), k = floor(log2(max_code^2 / 2) / log2(M / m) * expand_min)
//    / expand_min as COAT's kernel, then y = sign(x) (|x| / c)^k, scale = (M / c)^k / max_code and
//    codes encode(y / scale); read back as sign(q) (|decode(q)| * scale)^(1/k) * c. Two deliberate
//    departures from NVlabs/COAT's kernel, which takes the minimum over every |x| plus 1e-20 and
//    max_code 448 for both moments: the group's range max / min (the paper's R_X) is taken over the
//    non-zero magnitudes, since with a zero it is infinite and the kernel's 1e-20 floor then gives a
//    group holding one zero k of about 1/4 (compressing it instead of expanding it; a zero's code
//    is 0 whatever k); and max_code is the codec's own largest value, 480 for the unsigned E4M4
//    that v uses (COAT stores v in signed E4M3, largest 448), so the expanded group fills the codes
//    it is stored in. The powers are
//    taken in f64 and rounded to f32, by the active vector math (tensor/vector_math.hpp: libm's
//    pow, or with AVX2 SLEEF's, within 1 f64 ulp of it: rarely a code moves by one across ISAs);
//    optim/expansion.hpp gives their results from certified approximations. k is clamped to [1/expand_min, 1024]: a
//    range wider than max_code^2 / 2 would floor k to 0, and M = m (or nearly) would make it infinite (or so large that an f32 read-back no
//    longer tells the codes apart); within the clamp every code decodes to an f32 that encodes back to it
//    (StateFormat.ExpansionInverseIsExactOnEveryCode).
// A zero group (or tensor) has scale 1 (and k = 1, c = 1). A non-zero one never has scale 0: a
// per-group scale is at least f32's smallest subnormal (amax / max_code underflows below ~6e-43
// for E4M3), a per-tensor exponent at most 149 (the codes then saturate at that scale).
// Decoding is arithmetic (no table): the code's magnitude bits shifted into f32's exponent and
// mantissa and multiplied by 2^(127 - bias), exact for normal and subnormal codes alike (with the
// CPU's denormals-are-zero flag set, as torch.set_flush_denormal(True) sets it, subnormal codes
// read as 0, as every f32 subnormal then does).
// Stochastic rounding draws its random bits as the format kernels do (kernels::random_bits of seed
// and element index): the same seed gives the same codes, so a resumed run repeats them.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "scalify/formats/format.hpp"
#include "scalify/formats/scalar.hpp"
#include "scalify/optim/expansion.hpp"

namespace scalify::optim {

enum class StateScaling : uint8_t {
  none,        // f32, bf16
  per_tensor,  // one power-of-two scale
  per_group,   // one f32 scale per group_size elements
};

struct StateFormat {
  Format storage = Format::f32;  // f32, bf16, f16, e4m3 or e5m2
  StateScaling scaling = StateScaling::none;
  int64_t group_size = 128;
  Rounding rounding = Rounding::nearest_even;  // nearest_even or stochastic
  bool non_negative = false;                   // values >= 0: 8-bit codes carry no sign bit
  bool expand = false;                         // COAT's dynamic range expansion (FP8, per_group)
  int expand_min = 16;                         // k is a multiple of 1 / expand_min

  bool is_plain_f32() const { return storage == Format::f32; }
  bool operator==(const StateFormat&) const = default;
};

// Throws scalify::Error naming `role` and the field: storage other than f32 / bf16 / f16 / e4m3 /
// e5m2; f32 or bf16 with a scale; f16 or FP8 without one; expansion without FP8 per-group scales;
// group_size or expand_min < 1; stochastic rounding into f32.
void validate(const StateFormat& f, const std::string& role);

// The largest finite value of the format's code (480 for non-negative E4M3).
float state_code_max(const StateFormat& f);

struct EncodedState {
  int64_t numel = 0;
  std::vector<std::byte> codes;         // numel codes, 1, 2 or 4 bytes each
  std::vector<float> scales;            // none: empty; per tensor: 1; per group: one per group
  std::vector<float> expand_k, centre;  // expansion: k and c per group
  // True bytes held: codes + scales + the expansion's k and c.
  int64_t bytes() const;
};

// Encodes x (finite; >= 0 when f.non_negative, else throws naming the value). seed feeds stochastic rounding.
EncodedState encode_state(std::span<const float> x, const StateFormat& f, uint64_t seed = 0);
// The values the codes hold in their format, before the scale and the expansion's inverse (what
// `scalify inspect` histograms against the format's range).
std::vector<float> code_values(const EncodedState& s, const StateFormat& f);
// Decodes into out (out.size() == s.numel).
void decode_state(const EncodedState& s, const StateFormat& f, std::span<float> out);

// Ranges of an encoded tensor, for a pass that updates the state a piece at a time in place
// (AdamW's fused step) and the whole-tensor calls above. s has its layout already (codes,
// scales, k and centres sized, as encode_state gives them); begin and end are multiples of
// f.group_size for per-group formats (end may be s.numel).
// Decodes elements [begin, end) into out[0, end - begin).
void decode_state_range(const EncodedState& s, const StateFormat& f, int64_t begin, int64_t end, float* out);
// Encodes x[0, end - begin) into elements [begin, end), the same codes as encode_state: per-group
// formats compute and store the groups' scales (and expansions); per-tensor formats encode at the
// scale 2^-exponent (state_tensor_exponent; the caller stores the scale). Values are not checked
// (finite, and >= 0 when f.non_negative: encode_state checks them).
void encode_state_range(const float* x, const StateFormat& f, int64_t begin, int64_t end, int exponent, uint64_t seed, EncodedState& s);
// The per-tensor scale 2^-e of a tensor with largest magnitude amax: e (0 when amax is 0).
int state_tensor_exponent(const StateFormat& f, float amax);

// The constants of the vector codecs behind decode_state_range and encode_state_range, for a
// kernel that decodes and encodes codes itself (optim/fused_encoded_step.hpp): codes of 8 bits, or f16
// (F16C's conversions), rounded to nearest even, without the expansion.
struct VectorCodec {
  bool f16 = false;  // f16 codes: the others are 8-bit
  // Decoding: mag = code & mag_mask; value = (sign | bits(mag << shift) * decode_mul) * scale, with
  // the sign where code & sign_mask; magnitudes above special_below are inf (inf_mag) or NaN.
  int32_t sign_mask, mag_mask, shift, special_below, inf_mag;
  float decode_mul;
  // Encoding of x / div at 2^exponent (|exponent| <= kMaxExponent): f = bits(|x / div| * 2^exponent);
  // below normal_min_bits f * subnormal_units rounded to an integer, else f rounded at bit `shift`
  // less exp_offset; at most max_code, or'ed with encode_sign_mask where x is negative (0 for
  // non-negative codes, which drop the sign).
  int32_t encode_sign_mask, max_code, exp_offset, normal_min_bits;
  float subnormal_units;
  double code_max;  // state_code_max
  static constexpr int kMaxExponent = 100;
};
// f's vector codec, or false where f's codes are not those (f32, bf16, stochastic rounding, the expansion).
bool vector_codec(const StateFormat& f, VectorCodec& out);

}  // namespace scalify::optim
