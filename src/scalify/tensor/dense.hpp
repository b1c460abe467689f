#pragma once
// Dense compute buffers for kernels: a tensor's values, broadcast to a shape, row-major, in f32
// or f64. Borrows the tensor's memory when it already is that buffer.

#include "scalify/tensor/buffer_pool.hpp"
#include "scalify/tensor/convert.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify {

template <class T>
constexpr DType dtype_for() {
  return sizeof(T) == 8 ? DType::f64 : DType::f32;
}

inline bool computes_in_f64(const Tensor& a) { return a.dtype() == DType::f64; }
inline bool computes_in_f64(const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::f64 || b.dtype() == DType::f64;
}

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

// Calls f.template operator()<T>() with T = double if any input is f64, else float.
template <class F>
auto dispatch_compute(bool f64, F&& f) {
  return f64 ? f.template operator()<double>() : f.template operator()<float>();
}

}  // namespace scalify
