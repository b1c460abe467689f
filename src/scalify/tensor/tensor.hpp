#pragma once
// Tensor: a strided view (shape, strides, offset) of shared storage holding elements of one
// dtype. Views (reshape of contiguous data, permute/transpose, slice, expand) share storage and
// copy nothing; contiguous() copies when a kernel needs dense memory. Low-precision dtypes are
// stored for real; kernels read them, compute in f32 (f64 for f64 tensors) and write back.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "scalify/tensor/dtype.hpp"

namespace scalify {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t numel_of(const Shape& s);
// Shape of broadcasting a and b (numpy rules); throws naming `op` and both shapes if impossible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor (defined() == false)

  static Tensor empty(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32) { return full(shape, 1.0, dtype); }
  static Tensor scalar(double value, DType dtype = DType::f32) { return full({}, value, dtype); }
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);
  static Tensor from_vector(const std::vector<double>& v, const Shape& shape);    // f64
  static Tensor from_indices(const std::vector<int64_t>& v, const Shape& shape);  // i64
  // A contiguous tensor over memory it does not own: another framework's buffer handed over
  // without a copy (DLPack). `owner` is kept alive while any tensor uses the memory; the memory is
  // only read and must not change meanwhile.
  static Tensor borrow(const void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner);
  // Seeded N(mean, std^2) and U[lo, hi): the same seed gives the same values.
  static Tensor randn(const Shape& shape, uint64_t seed, double std = 1.0, DType dtype = DType::f32);
  static Tensor rand(const Shape& shape, uint64_t seed, double lo = 0.0, double hi = 1.0, DType dtype = DType::f32);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return numel_of(shape_); }
  bool is_contiguous() const;
  bool same_storage(const Tensor& o) const { return storage_ == o.storage_; }

  // Views: no copy.
  Tensor view(const Shape& shape) const;  // contiguous tensors only; one -1 is inferred
  Tensor permute(const std::vector<int>& dims) const;
  Tensor transpose(int d0, int d1) const;
  Tensor slice(int d, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor expand(const Shape& shape) const;  // broadcast to `shape` (stride 0)
  Tensor unsqueeze(int d) const;
  Tensor squeeze(int d) const;
  // reshape: a view when contiguous, else a contiguous copy.
  Tensor reshape(const Shape& shape) const;

  Tensor contiguous() const;  // this if already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;  // conversion: round-to-nearest-even, saturating for FP8

  // Element access (slow paths, for tests and small tensors).
  double item() const;  // single-element tensors
  double at(const std::vector<int64_t>& index) const;
  std::vector<double> to_vector() const;  // row-major values, any dtype
  std::vector<float> to_floats() const;

  // Raw data of a contiguous tensor (throws when not contiguous or of another element size).
  template <class T>
  T* data() const {
    check_data(sizeof(T));
    return reinterpret_cast<T*>(raw()) + offset_;
  }
  std::byte* raw_bytes() const { return raw() + offset_ * dtype_size(dtype_); }
  void fill_(double value);
  void copy_(const Tensor& src);  // same shape (src broadcast allowed), any dtypes

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::f32;
  Shape shape_, strides_;
  int64_t offset_ = 0;

  std::byte* raw() const;
  void check_data(size_t elem_size) const;
  int wrap_dim(int d, int ndim_plus = 0) const;
};

// Contiguous row-major strides of a shape.
Shape contiguous_strides(const Shape& shape);

}  // namespace scalify
