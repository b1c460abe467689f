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

// Calls fn(linear_index, element_offset) for every element in row-major order.
template <class Fn>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t offset, Fn fn) {
  const int nd = int(shape.size());
  const int64_t n = numel_of(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(size_t(nd), 0);
  int64_t off = offset;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, off);
    for (int d = nd - 1; d >= 0; --d) {
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
