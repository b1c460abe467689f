#include "scalify/tensor/convert.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/scalar.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/dense.hpp"

namespace scalify {

namespace {

template <class T>
T load_element(const std::byte* base, int64_t off, DType dt) {
  switch (dt) {
    case DType::f32: {
      float v;
      std::memcpy(&v, base + off * 4, 4);
      return T(v);
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, base + off * 8, 8);
      return T(v);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, base + off * 4, 4);
      return T(v);
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, base + off * 8, 8);
      return T(v);
    }
    case DType::u8: return T(std::to_integer<uint8_t>(base[off]));
    default: {
      const int es = dtype_size(dt);
      uint32_t code = 0;
      std::memcpy(&code, base + off * es, size_t(es));
      return T(decode(*dtype_format(dt), code));
    }
  }
}

template <class T>
void store_element(std::byte* base, int64_t off, DType dt, T v) {
  switch (dt) {
    case DType::f32: {
      const float f = float(v);
      std::memcpy(base + off * 4, &f, 4);
      return;
    }
    case DType::f64: {
      const double d = double(v);
      std::memcpy(base + off * 8, &d, 8);
      return;
    }
    case DType::i32: {
      const int32_t i = int32_t(std::llround(double(v)));
      std::memcpy(base + off * 4, &i, 4);
      return;
    }
    case DType::i64: {
      const int64_t i = std::llround(double(v));
      std::memcpy(base + off * 8, &i, 8);
      return;
    }
    case DType::u8: base[off] = std::byte(uint8_t(std::clamp<long long>(std::llround(double(v)), 0, 255))); return;
    default: {
      const Format f = *dtype_format(dt);
      // f64 values round once to f32 first; that is exact for every value an f32 tensor holds.
      const uint32_t code = encode(f, float(v), {Overflow::saturate});
      std::memcpy(base + off * dtype_size(dt), &code, size_t(dtype_size(dt)));
      return;
    }
  }
}

// Contiguous fast paths, the same for reading and writing: a plain copy when the tensor already
// holds the compute type, the SIMD bulk codec when it holds a number format (f32 compute only).
template <class T>
void read_impl(const Tensor& t, T* out) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const auto fmt = dtype_format(t.dtype());
  if (t.is_contiguous()) {
    if (t.dtype() == dtype_for<T>()) {
      std::memcpy(out, t.raw_bytes(), size_t(n) * sizeof(T));
      return;
    }
    if constexpr (sizeof(T) == 4) {
      if (fmt) {
        dequantize(std::span(t.raw_bytes(), size_t(n * dtype_size(t.dtype()))), *fmt, 1.0f, std::span(out, size_t(n)));
        return;
      }
    }
  }
  if constexpr (sizeof(T) == 4) {
    // A broadcast or transposed view of a number format (an f16 bias expanded over the rows, a
    // weight read transposed): decode the storage it spans once with the SIMD codec, then gather
    // floats, instead of decoding element by element (what made f16 master weights cost 2x).
    int64_t last = 0;  // the view's largest offset from its first element
    bool forward = true;
    for (size_t d = 0; d < t.shape().size(); ++d) {
      forward = forward && t.strides()[d] >= 0;
      last += (t.shape()[d] - 1) * t.strides()[d];
    }
    if (fmt && forward && last < 4 * n) {
      std::vector<float> span(size_t(last + 1));
      dequantize(std::span(t.raw_bytes(), span.size() * size_t(dtype_size(t.dtype()))), *fmt, 1.0f, std::span(span));
      for_each_offset(t.shape(), t.strides(), 0, [&](int64_t i, int64_t off) { out[i] = span[size_t(off)]; });
      return;
    }
  }
  const std::byte* base = t.raw_bytes() - t.offset() * dtype_size(t.dtype());
  if (t.dtype() == DType::f32 || t.dtype() == DType::f64) {  // strided views of compute types
    auto gather = [&](const auto* src) {
      for_each_offset(t.shape(), t.strides(), t.offset(), [&](int64_t i, int64_t off) { out[i] = T(src[off]); });
    };
    if (t.dtype() == DType::f32)
      gather(reinterpret_cast<const float*>(base));
    else
      gather(reinterpret_cast<const double*>(base));
    return;
  }
  for_each_offset(t.shape(), t.strides(), t.offset(), [&](int64_t i, int64_t off) { out[i] = load_element<T>(base, off, t.dtype()); });
}

template <class T>
void write_impl(const T* in, Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const auto fmt = dtype_format(t.dtype());
  if (t.is_contiguous()) {
    if (t.dtype() == dtype_for<T>()) {
      std::memcpy(t.raw_bytes(), in, size_t(n) * sizeof(T));
      return;
    }
    if constexpr (sizeof(T) == 4) {
      if (fmt) {  // rounds to nearest even, saturates; a NaN into FP6/FP4 throws, as per element
        quantize(std::span(in, size_t(n)), *fmt, 1.0f, std::span(t.raw_bytes(), size_t(n * dtype_size(t.dtype()))));
        return;
      }
    }
  }
  std::byte* base = t.raw_bytes() - t.offset() * dtype_size(t.dtype());
  for_each_offset(t.shape(), t.strides(), t.offset(), [&](int64_t i, int64_t off) { store_element<T>(base, off, t.dtype(), in[i]); });
}

}  // namespace

void read_as(const Tensor& t, float* out) { read_impl(t, out); }
void read_as(const Tensor& t, double* out) { read_impl(t, out); }
void write_from(const float* in, Tensor& t) { write_impl(in, t); }
void write_from(const double* in, Tensor& t) { write_impl(in, t); }

Tensor exact_bf16(const Tensor& values) {
  if (values.dtype() != DType::f32 || !values.is_contiguous()) throw Error("exact_bf16: needs contiguous f32 values");
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = values.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float* in = values.data<float>();
  Tensor out = Tensor::empty(values.shape(), DType::bf16);
  uint16_t* o = out.data<uint16_t>();
  bool exact = true;
#pragma omp parallel for reduction(&& : exact) if (n > platform::kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
    exact = truncate_to_bf16_exact(std::span(in + begin, size_t(len)), std::span(o + begin, size_t(len))) && exact;
  }
  return exact ? out : Tensor();
}

Tensor byte_codes_as_bf16(const Tensor& codes) {
  const std::optional<Format> f = dtype_format(codes.dtype());
  if (!f || info(*f).storage_bytes() != 1 || !info(*f).is_float() || !codes.is_contiguous())
    throw Error("byte_codes_as_bf16: needs contiguous one-byte float codes, got " + std::string(dtype_name(codes.dtype())));
  Tensor out = Tensor::empty(codes.shape(), DType::bf16);
  const size_t n = size_t(codes.numel());
  codes_to_bf16(std::span(codes.raw_bytes(), n), *f, std::span(out.data<uint16_t>(), n));
  return out;
}

}  // namespace scalify
