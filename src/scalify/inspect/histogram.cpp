#include "scalify/inspect/histogram.hpp"

#include <algorithm>
#include <cmath>

namespace scalify::inspect {

FormatRange format_range(Format f) {
  const double sub = min_subnormal(f), normal = min_normal(f);
  return {f, (sub > 0 ? sub : normal) / 2, sub > 0 ? sub : normal, normal, max_value(f)};
}

int64_t ExponentHistogram::at(int exponent) const {
  return exponent < kMinExponent || exponent > kMaxExponent ? 0 : bins[size_t(exponent - kMinExponent)];
}

int ExponentHistogram::lowest() const {
  for (size_t i = 0; i < bins.size(); ++i)
    if (bins[i]) return int(i) + kMinExponent;
  return kMaxExponent + 1;
}

int ExponentHistogram::highest() const {
  for (size_t i = bins.size(); i-- > 0;)
    if (bins[i]) return int(i) + kMinExponent;
  return kMinExponent - 1;
}

void ExponentHistogram::add(double x, const FormatRange& range) {
  ++count;
  if (!std::isfinite(x)) {
    ++nonfinite;
    return;
  }
  sum_squares += x * x;
  const double a = std::fabs(x);
  if (a == 0) {
    ++zeros;
    return;
  }
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
  ++bins[size_t(std::clamp(e - 1, kMinExponent, kMaxExponent) - kMinExponent)];
  if (a <= range.underflow_below)
    ++underflow;
  else if (a < range.min_normal)
    ++subnormal;
  else if (a <= range.max)
    ++normal;
  else
    ++clipped;
}

ExponentHistogram exponent_histogram(const Tensor& t, Format format) { return exponent_histogram(t, format_range(format)); }

ExponentHistogram exponent_histogram(const Tensor& t, const FormatRange& range) {
  ExponentHistogram h;
  if (t.dtype() == DType::f64) {
    const Tensor c = t.contiguous();
    const double* p = c.data<double>();
    for (int64_t i = 0; i < c.numel(); ++i) h.add(p[i], range);
  } else {
    for (float v : t.to_floats()) h.add(v, range);
  }
  return h;
}

}  // namespace scalify::inspect
