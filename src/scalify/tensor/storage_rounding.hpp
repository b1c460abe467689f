#pragma once
// 16-bit float storage (f16, bf16) of an op's data. The one rounding of f32 values into it that SPEC §2's data
// precision applies to an op's output: round to nearest even, finite values saturating at the
// format's largest, infinities kept (a mask's -inf fill), NaN kept. `to_storage` rounds whole
// tensors with it; kernels asked to store their output so (`store_as`) round each chunk they
// compute with it, so an f16 output is written once instead of as f32 and again as f16.
#include <cstddef>
#include <cstdint>

#include "scalify/formats/format.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify {

// Whether `storage` is a dtype these functions round into (f16 or bf16).
bool is_rounded_storage(DType storage);

// in[0, n) rounded into `storage` at out (n codes of 2 bytes), on the calling thread.
void round_into_storage(const float* in, int64_t n, DType storage, std::byte* out);

// n values of 16-bit float storage (is_rounded_storage) widened to f32 for computing: exact, a
// NaN stays a NaN (its payload is not made canonical, as the format codec's decode does: no
// computation can tell). Half the time of the checked `dequantize`, for the elementwise loops
// that read f16 data a chunk at a time.
void widen_for_compute(const std::byte* codes, int64_t n, DType storage, float* out);

// After the format codec's saturating encode of in[0, n) into codes (which turns infinities into
// the largest finite value): infinities put back where the format has them, as storage needs
// (a mask's -inf fill stays infinite). Any code width.
void restore_infinities(const float* in, int64_t n, Format f, std::byte* codes);

// A contiguous f32 tensor rounded into `storage` (is_rounded_storage), in parallel for large ones.
Tensor round_to_storage(const Tensor& values, DType storage);

// The dtype a kernel computing in T writes for a `store_as` request: the request where it is a
// rounded storage and the kernel computes in f32, else the compute dtype (f64 kernels stay f64;
// other requests are left to to_storage).
template <class T>
DType kernel_output_dtype(DType store_as) {
  return sizeof(T) == 4 && is_rounded_storage(store_as) ? store_as : sizeof(T) == 8 ? DType::f64 : DType::f32;
}

}  // namespace scalify
