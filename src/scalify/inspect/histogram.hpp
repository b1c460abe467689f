#pragma once
// Exponent histograms: how a tensor's magnitudes spread over binades, and where they fall in a
// number format's range (Unit Scaling, Figures 1 and A.4-A.7). Bins are floor(log2 |x|), so a
// value and its exponent field agree; zeros and non-finite values have their own counts.
#include <cstdint>
#include <vector>

#include "scalify/formats/format.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::inspect {

// Where a format's values lie, as powers of two: values of magnitude at most underflow_below
// round to zero (round-to-nearest-even), [min_subnormal, min_normal) are subnormal, values above
// max clip (saturate) or overflow.
struct FormatRange {
  Format format;
  double underflow_below, min_subnormal, min_normal, max;
};
FormatRange format_range(Format f);

struct ExponentHistogram {
  // Bins cover every finite f32 and more; magnitudes beyond fall into the edge bins.
  static constexpr int kMinExponent = -160, kMaxExponent = 130;
  std::vector<int64_t> bins = std::vector<int64_t>(size_t(kMaxExponent - kMinExponent + 1), 0);
  int64_t count = 0, zeros = 0, nonfinite = 0;
  double sum_squares = 0;  // of the finite values
  // The finite non-zero values against the format's range (they sum to count - zeros - nonfinite).
  int64_t underflow = 0, subnormal = 0, normal = 0, clipped = 0;

  int64_t at(int exponent) const;  // values with floor(log2 |x|) == exponent (0 outside the bins)
  // Smallest and largest occupied exponent; lowest > highest when no finite non-zero value.
  int lowest() const;
  int highest() const;
  void add(double x, const FormatRange& range);
};

// The histogram of a tensor's values (any dtype; for a scaled tensor pass its data component),
// classified against a format's range or any other (an optimizer moment's code layout).
ExponentHistogram exponent_histogram(const Tensor& t, Format format);
ExponentHistogram exponent_histogram(const Tensor& t, const FormatRange& range);

}  // namespace scalify::inspect
