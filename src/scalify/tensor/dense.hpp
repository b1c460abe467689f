#pragma once
// Dense compute buffers for kernels: a tensor's values, broadcast to a shape, row-major, in f32
// or f64. Borrows the tensor's memory when it already is that buffer.

#include <optional>
#include <span>
#include <type_traits>

#include "scalify/formats/bulk.hpp"
#include "scalify/tensor/buffer_pool.hpp"
#include "scalify/tensor/convert.hpp"
#include "scalify/tensor/storage_rounding.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify {

template <class T>
constexpr DType dtype_for() {
  return sizeof(T) == 8 ? DType::f64 : DType::f32;
}

inline bool computes_in_f64(const Tensor& a) { return a.dtype() == DType::f64; }
inline bool computes_in_f64(const Tensor& a, const Tensor& b) { return a.dtype() == DType::f64 || b.dtype() == DType::f64; }

template <class T>
class Dense {
 public:
  Dense(const Tensor& t, const Shape& shape) {
    if (t.shape() == shape && t.dtype() == dtype_for<T>() && t.is_contiguous()) {
      ptr_ = t.data<T>();
    } else {
      own_ = acquire_buffer(static_cast<size_t>(numel_of(shape)) * sizeof(T));  // uninitialised, pooled
      T* p = reinterpret_cast<T*>(own_.get());
      read_as(t.shape() == shape ? t : t.expand(shape), p);
      ptr_ = p;
    }
  }
  explicit Dense(const Tensor& t) : Dense(t, t.shape()) {}
  // A temporary tensor would die while its memory is borrowed: name it first.
  Dense(Tensor&&, const Shape&) = delete;
  explicit Dense(Tensor&&) = delete;
  const T* data() const { return ptr_; }
  const T& operator[](int64_t i) const { return ptr_[i]; }

 private:
  Buffer own_;
  const T* ptr_ = nullptr;
};

// A tensor's values read a chunk at a time by elementwise loops: contiguous low-precision data
// of the loop's shape (SCALIFY's f16 activations and gradients) is decoded per chunk into the
// caller's buffer, so no full-size f32 copy is written and read back; anything else (f32 in
// place, broadcast or strided views, f64 loops) comes from a Dense buffer.
template <class T>
class ChunkSource {
 public:
  ChunkSource(const Tensor& t, const Shape& shape) {
    const std::optional<Format> f = dtype_format(t.dtype());
    if (std::is_same_v<T, float> && f && t.dtype() != DType::f32 && info(*f).is_float() && t.shape() == shape && t.is_contiguous()) {
      format_ = *f;
      codes_ = t.raw_bytes();
      code_bytes_ = dtype_size(t.dtype());
    } else {
      dense_.emplace(t, shape);
    }
  }
  ChunkSource(Tensor&&, const Shape&) = delete;  // a temporary would die while it is read
  // Elements [begin, begin + len) as T: in place, or decoded into buf (room for len values).
  const T* read(int64_t begin, int64_t len, T* buf) const {
    if (dense_) return dense_->data() + begin;
    if constexpr (std::is_same_v<T, float>) {
      if (format_ == Format::f16 || format_ == Format::bf16)
        widen_for_compute(codes_ + begin * 2, len, dtype_of(format_), buf);
      else
        dequantize(std::span(codes_ + begin * code_bytes_, size_t(len * code_bytes_)), format_, 1.0f, std::span(buf, size_t(len)));
    }
    return buf;
  }

 private:
  std::optional<Dense<T>> dense_;
  Format format_ = Format::f32;
  const std::byte* codes_ = nullptr;
  int64_t code_bytes_ = 0;
};

// An elementwise loop's output written a chunk at a time: in place when the output holds the
// compute type, else (an op asked to store its output in f16 or bf16) computed into the caller's
// buffer and rounded into the storage from there, so the output is written once, at 2 bytes.
template <class T>
class ChunkSink {
 public:
  explicit ChunkSink(Tensor& out)
      : direct_(out.dtype() == dtype_for<T>() ? out.data<T>() : nullptr), storage_(out.dtype()), codes_(out.raw_bytes()) {}
  // Where to compute elements [begin, begin + len): the output itself, or buf (room for len).
  T* chunk(int64_t begin, T* buf) const { return direct_ ? direct_ + begin : buf; }
  // Elements [begin, begin + len) have been computed in what chunk(begin, buf) returned.
  void commit(int64_t begin, int64_t len, const T* buf) const {
    if constexpr (std::is_same_v<T, float>)
      if (!direct_) round_into_storage(buf, len, storage_, codes_ + begin * 2);
  }

 private:
  T* direct_;
  DType storage_;
  std::byte* codes_;
};

// Calls f.template operator()<T>() with T = double if any input is f64, else float.
template <class F>
auto dispatch_compute(bool f64, F&& f) {
  return f64 ? f.template operator()<double>() : f.template operator()<float>();
}

}  // namespace scalify
