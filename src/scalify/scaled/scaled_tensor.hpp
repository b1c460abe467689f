#pragma once
// ScaledTensor (SPEC §2, seed 000): a tensor represented as data * scale, where the scale is an
// exact power of two held in f32 (E8M0 semantics) — a scalar, or a tensor broadcastable to the
// data for per-block scales. An unscaled tensor behaves as scale 1; a tensor whose value ignores
// its scale (all zeros, ±inf, NaN) carries the special scale ANY.
#include <cstdint>

#include "scalify/formats/format.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify {

enum class Pow2Rounding : uint8_t { down, nearest, up };

// The power of two nearest to x in log2 by the given mode (down = 2^floor(log2 x), the paper's
// default). x must be finite and positive; throws scalify::Error otherwise.
float pow2_round(double x, Pow2Rounding mode = Pow2Rounding::down);

struct ScaledTensor {
  Tensor data;
  Tensor scale;            // undefined: unscaled (scale 1); else f32 powers of two
  bool any_scale = false;  // the value ignores the scale (constant zeros, ±inf, NaN)

  ScaledTensor() = default;
  explicit ScaledTensor(Tensor unscaled) : data(std::move(unscaled)) {}
  ScaledTensor(Tensor d, Tensor s) : data(std::move(d)), scale(std::move(s)) {}
  // s must be finite and positive (throws scalify::Error naming it otherwise).
  ScaledTensor(Tensor d, float s);

  bool is_scaled() const { return scale.defined() || any_scale; }
  // One scalar scale: scaled, not ANY, not per block.
  bool has_single_scale() const { return !any_scale && scale.defined() && scale.numel() == 1; }
  const Shape& shape() const { return data.shape(); }
  // The scalar scale (1 when unscaled or ANY); throws if the scale is a per-block tensor.
  float scalar_scale() const;
  // The represented value data * scale (f32, or f64 for f64 data). Throws scalify::Error when a
  // finite value would overflow f32 (|data| * scale > 3.4e38: the value needs the scaled form).
  Tensor value() const;
};

// A constant whose value ignores scale (zeros, ±inf, NaN): combining with it keeps the other
// operand's scale (e.g. the 0 of select(c, 0, x) in logsumexp).
ScaledTensor any_scale_constant(const Tensor& value);
// An unscaled broadcast scalar split exactly into mantissa and exponent: c = m * 2^e, 1 <= |m| < 2.
ScaledTensor scaled_scalar(double c);

// A scaled tensor whose scale was computed exactly in double (a product or quotient of power-of-two
// scales: exponent arithmetic, never an f32 product that overflows). Inside f32's normal range
// [2^-126, 2^127] the scale is kept as is; beyond it the scale is clamped to the nearer edge and the
// remaining power of two moves into the data (one exact rescale, as rebalance), so the represented
// value is kept and no scale silently becomes inf or 0. A non-positive or NaN scale throws.
ScaledTensor with_exact_scale(Tensor data, double scale);
// Whether with_exact_scale keeps `scale` as is (its data untouched): inside [2^-126, 2^127].
inline bool scale_kept_exactly(double scale) { return scale >= 0x1p-126 && scale <= 0x1p127; }

// Quantising a full-precision tensor into scaled form: the scale is rms(x) rounded to a power of
// two (down by default), so E[X_d^2] ~ 1; data is x / scale stored in `dtype`. An all-zero or
// non-finite x gets scale 1.
ScaledTensor as_scaled(const Tensor& x, DType dtype = DType::f32, Pow2Rounding rounding = Pow2Rounding::down);

// Bundling and unbundling (all no-ops on the represented value):
// set_scaling: data rescaled to the new scale; an unscaled input becomes scaled. The scale must be
// a finite positive power of two (SPEC §2), which keeps the rescale exact.
ScaledTensor set_scaling(const ScaledTensor& x, float scale);
// get_data_and_scale: (data, scale); an unscaled input gives (x, 1).
std::pair<Tensor, float> get_data_and_scale(const ScaledTensor& x);
// rebalance: scale * delta, data / delta. No-op on unscaled tensors. delta: a finite positive
// power of two, as for set_scaling.
ScaledTensor rebalance(const ScaledTensor& x, float delta);
// Dynamic rescaling (Algorithm 4): rebalance by pow2_round(rms(data)) or pow2_round(amax(data)).
ScaledTensor dynamic_rescale_l2(const ScaledTensor& x);
ScaledTensor dynamic_rescale_max(const ScaledTensor& x);

// How many tensor statistics (RMS or amax reductions) have chosen a scale on this thread: every
// dynamic rescale, and every amax-based quantisation (quant/). The trainer reports the count per
// step: SCALIFY's claim is 2 per transformer layer against per-tensor FP8's one per operand.
int64_t scale_statistics();
void count_scale_statistic();

// Quantises the data into `fmt` (round-to-nearest-even, saturating), keeping the scale.
ScaledTensor cast_data(const ScaledTensor& x, Format fmt);

}  // namespace scalify
