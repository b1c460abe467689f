#include "scalify/scaled/scaled_tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "scalify/error.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/tensor/storage_rounding.hpp"

namespace scalify {

float pow2_round(double x, Pow2Rounding mode) {
  if (!(x > 0) || !std::isfinite(x)) throw Error("pow2_round: needs a finite positive value, got " + std::to_string(x));
  int e;
  const double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  int k = e - 1;                       // 2^k <= x < 2^(k+1)
  if (mode == Pow2Rounding::up && m != 0.5) k += 1;
  if (mode == Pow2Rounding::nearest && m * 2 > std::sqrt(2.0)) k += 1;  // nearest in log2
  return std::ldexp(1.0f, std::clamp(k, -126, 127));
}

namespace {
std::string float_str(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(x));
  return buf;
}
// A scale argument must be finite and positive; a zero, negative, inf or NaN scale makes every
// represented value garbage.
void check_scale(float s, const char* what) {
  if (!(s > 0) || !std::isfinite(s)) throw Error(std::string(what) + " must be a finite positive number, got " + float_str(s));
}
// set_scaling and rebalance also need a power of two (SPEC §2): rescaling the data is then exact,
// so they stay no-ops on the represented value.
void check_pow2_scale(float s, const char* what) {
  check_scale(s, what);
  int e;
  if (std::frexp(s, &e) != 0.5f) throw Error(std::string(what) + " must be a power of two, got " + float_str(s));
}
}  // namespace

ScaledTensor::ScaledTensor(Tensor d, float s) : data(std::move(d)) {
  check_scale(s, "ScaledTensor: scale");
  scale = Tensor::scalar(s);
}

float ScaledTensor::scalar_scale() const {
  if (!scale.defined()) return 1.0f;
  if (scale.numel() != 1) throw Error("scalar_scale: the scale has shape " + shape_str(scale.shape()) + " (per-block scales)");
  return float(scale.item());
}

Tensor ScaledTensor::value() const {
  const bool unit = !scale.defined() || (scale.numel() == 1 && scale.item() == 1.0);
  if (unit) return data.dtype() == DType::f64 ? data : data.to(DType::f32);
  Tensor v = ops::mul(data, scale);
  if (v.dtype() == DType::f32 && data.numel() > 0) {
    const double top = ops::max(scale.reshape({-1}), 0).first.item();
    const std::optional<Format> f = dtype_format(data.dtype());
    const double data_max = f ? max_value(*f) : double(std::numeric_limits<float>::max());
    if (top * data_max > double(std::numeric_limits<float>::max())) {  // else no finite data can overflow (f16 below 2^111)
      const double amax_data = ops::max(ops::unary(ops::Unary::abs, data).reshape({-1}), 0).first.item();
      if (std::isfinite(amax_data) && amax_data * top > double(std::numeric_limits<float>::max()))
        throw Error("ScaledTensor::value: data * scale overflows f32 (|data| up to " + std::to_string(amax_data) + " times scale 2^" +
                    std::to_string(std::ilogb(top)) + "); keep the scaled form");
    }
  }
  return v;
}

ScaledTensor with_exact_scale(Tensor data, double scale) {
  if (!(scale > 0) || std::isinf(scale))
    throw Error("with_exact_scale: scale must be a finite positive number, got " + std::to_string(scale));
  const double kept = std::clamp(scale, 0x1p-126, 0x1p127);             // the range of scale_kept_exactly
  if (kept != scale) data = ops::scale_shift(data, scale / kept, 0.0);  // exact for power-of-two ratios
  return ScaledTensor(std::move(data), float(kept));
}

ScaledTensor any_scale_constant(const Tensor& value) {
  ScaledTensor s(value);
  s.any_scale = true;
  return s;
}

ScaledTensor scaled_scalar(double c) {
  if (c == 0 || !std::isfinite(c)) return any_scale_constant(Tensor::scalar(c));
  int e;
  const double m = std::frexp(c, &e);  // |m| in [0.5, 1)
  return ScaledTensor(Tensor::scalar(m * 2), std::ldexp(1.0f, e - 1));
}

namespace {
double rms_of(const Tensor& x) { return std::sqrt(ops::sum_squares(x) / double(std::max<int64_t>(x.numel(), 1))); }
double amax_of(const Tensor& x) { return ops::max(ops::unary(ops::Unary::abs, x).reshape({-1}), 0).first.item(); }
// A statistic usable as a scale: finite and positive, else 1 (no rescale).
double usable(double s) { return s > 0 && std::isfinite(s) ? s : 1.0; }
}  // namespace

ScaledTensor as_scaled(const Tensor& x, DType dtype, Pow2Rounding rounding) {
  const float s = x.numel() ? pow2_round(usable(rms_of(x)), rounding) : 1.0f;
  return ScaledTensor(ops::scale_shift(x, 1.0 / s, 0.0).to(dtype), s);
}

ScaledTensor set_scaling(const ScaledTensor& x, float scale) {
  check_pow2_scale(scale, "set_scaling: scale");
  const float old = x.scalar_scale();
  ScaledTensor out(x.data, scale);
  if (old != scale) out.data = ops::scale_shift(x.data, double(old) / double(scale), 0.0).to(x.data.dtype());
  return out;
}

std::pair<Tensor, float> get_data_and_scale(const ScaledTensor& x) { return {x.data, x.scalar_scale()}; }

ScaledTensor rebalance(const ScaledTensor& x, float delta) {
  check_pow2_scale(delta, "rebalance: delta");
  if (!x.scale.defined() || delta == 1.0f) return x;  // as set_scaling: nothing moves
  // f16/bf16 data is written in its storage by the one pass (infinities stay infinite, as in
  // every rounding into storage); other dtypes are converted after it.
  const DType dt = x.data.dtype();
  const Tensor data = ops::scale_shift(x.data, 1.0 / double(delta), 0.0, is_rounded_storage(dt) ? dt : DType::f32);
  return ScaledTensor(data.dtype() == dt ? data : data.to(dt), ops::scale_shift(x.scale, delta, 0.0));
}

namespace {
thread_local int64_t statistics_count = 0;
}  // namespace
int64_t scale_statistics() { return statistics_count; }
void count_scale_statistic() { ++statistics_count; }

ScaledTensor dynamic_rescale_l2(const ScaledTensor& x) {
  count_scale_statistic();
  return rebalance(x, pow2_round(usable(rms_of(x.data))));
}

ScaledTensor dynamic_rescale_max(const ScaledTensor& x) {
  count_scale_statistic();
  return rebalance(x, pow2_round(usable(amax_of(x.data))));
}

ScaledTensor cast_data(const ScaledTensor& x, Format fmt) {
  ScaledTensor out = x;
  out.data = x.data.to(dtype_of(fmt));
  return out;
}

}  // namespace scalify
