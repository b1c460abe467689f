#pragma once
// Reading and writing tensor elements of any dtype and layout as f32 or f64, row-major. Kernels
// use these to get dense compute buffers; FP8/FP6/FP4/f16/bf16 go through the formats library
// (decoding is exact; writing rounds to nearest even and saturates).
#include <cstdint>

#include "scalify/tensor/tensor.hpp"

namespace scalify {

void read_as(const Tensor& t, float* out);
void read_as(const Tensor& t, double* out);
void write_from(const float* in, Tensor& t);
void write_from(const double* in, Tensor& t);

// f32 values as bf16 operands of a bf16 dot product when every one of them is a bf16 value (its
// low 16 bits zero), as MX operands are (e4m3 codes times power-of-two block scales), and no
// non-zero one is below 2^-63 (those instructions flush subnormal products): the conversion is
// then exact truncation. An undefined tensor otherwise; the input must be contiguous f32.
Tensor exact_bf16(const Tensor& values);

// One-byte float codes (FP8, FP6, FP4, E8M0: every value a bf16 value) as bf16, exactly, in one
// pass: decoded by the format kernels a cache-sized chunk at a time, then truncated. For GEMM
// operands; the input must be contiguous.
Tensor byte_codes_as_bf16(const Tensor& codes);

// Calls fn(linear_index, element_offset) for every element in row-major order. The innermost
// dimension runs as a plain strided loop; the odometer only advances between rows.
template <class Fn>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t offset, Fn fn) {
  const int64_t n = numel_of(shape);
  if (n == 0) return;
  if (shape.empty()) {
    fn(0, offset);
    return;
  }
  const int nd = int(shape.size());
  const int64_t inner = shape.back(), inner_stride = strides.back(), rows = n / inner;
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t off = offset, i = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < inner; ++j) fn(i++, off + j * inner_stride);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[size_t(d)] < shape[size_t(d)]) {
        off += strides[size_t(d)];
        break;
      }
      off -= (shape[size_t(d)] - 1) * strides[size_t(d)];
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace scalify
