#include "scalify/tensor/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/tensor/buffer_pool.hpp"
#include "scalify/tensor/convert.hpp"

namespace scalify {

// Uninitialised on allocation (kernels overwrite every element; Tensor::zeros fills explicitly)
// and recycled through the buffer pool.
struct Tensor::Storage {
  explicit Storage(size_t n) : bytes(acquire_buffer(n)), base(bytes.get()) {}
  Storage(const void* borrowed, std::shared_ptr<const void> keep_alive)
      : base(static_cast<std::byte*>(const_cast<void*>(borrowed))), owner(std::move(keep_alive)) {}
  Buffer bytes;                       // owned memory (empty when borrowed)
  std::byte* base;                    // where the elements are
  std::shared_ptr<const void> owner;  // what keeps borrowed memory alive
};

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    // A negative size or a product past int64 would size buffers and loops with garbage.
    if (d < 0) throw Error("tensor shape " + shape_str(s) + " has a negative size");
    if (__builtin_mul_overflow(n, d, &n)) throw Error("tensor shape " + shape_str(s) + " has too many elements (overflows int64)");
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[size_t(i)] = s;
    s *= shape[size_t(i)];
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw Error(std::string(op) + ": shapes " + shape_str(a) + " and " + shape_str(b) + " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor Tensor::borrow(const void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner) {
  Tensor t;
  numel_of(shape);  // throws on negative sizes and int64 overflow
  t.storage_ = std::make_shared<Storage>(data, std::move(owner));
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  const int64_t n = numel_of(shape);  // throws on negative sizes and int64 overflow
  // Beyond 2^48 bytes (256 TiB) no allocation can succeed; say so instead of std::bad_alloc.
  constexpr int64_t kMaxBytes = int64_t(1) << 48;
  if (n > kMaxBytes / dtype_size(dtype))
    throw Error("tensor shape " + shape_str(shape) + " needs more than 2^48 bytes of " + std::string(dtype_name(dtype)));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(size_t(n) * size_t(dtype_size(dtype)));
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_(value);
  return t;
}

namespace {
template <class T>
Tensor from_values(const std::vector<T>& v, const Shape& shape, DType dtype, const char* what) {
  if (int64_t(v.size()) != numel_of(shape))
    throw Error(std::string(what) + ": " + std::to_string(v.size()) + " values for shape " + shape_str(shape));
  Tensor t = Tensor::empty(shape, dtype);
  if (!v.empty()) std::memcpy(t.raw_bytes(), v.data(), v.size() * sizeof(T));
  return t;
}
}  // namespace

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) { return from_values(v, shape, DType::f32, "from_vector"); }
Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& shape) { return from_values(v, shape, DType::f64, "from_vector"); }
Tensor Tensor::from_indices(const std::vector<int64_t>& v, const Shape& shape) { return from_values(v, shape, DType::i64, "from_indices"); }

namespace {
double uniform01(uint64_t seed, uint64_t i) {
  return (double(kernels::random_bits(seed, 2 * i)) + double(kernels::random_bits(seed, 2 * i + 1)) / 4294967296.0) / 4294967296.0;
}
}  // namespace

Tensor Tensor::randn(const Shape& shape, uint64_t seed, double std, DType dtype) {
  const int64_t n = numel_of(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller on counter-based uniforms
    const double u1 = 1.0 - uniform01(seed, uint64_t(i)), u2 = uniform01(seed, uint64_t(i + 1));
    const double r = std::sqrt(-2.0 * std::log(u1)) * std;
    v[size_t(i)] = r * std::cos(6.283185307179586 * u2);
    if (i + 1 < n) v[size_t(i + 1)] = r * std::sin(6.283185307179586 * u2);
  }
  return Tensor::from_vector(v, shape).to(dtype);
}

Tensor Tensor::rand(const Shape& shape, uint64_t seed, double lo, double hi, DType dtype) {
  const int64_t n = numel_of(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = lo + (hi - lo) * uniform01(seed, uint64_t(i));
  return Tensor::from_vector(v, shape).to(dtype);
}

int Tensor::wrap_dim(int d, int ndim_plus) const {
  const int n = dim() + ndim_plus;
  if (d < -n || d >= std::max(n, 1))
    throw Error("dimension " + std::to_string(d) + " is out of range for a tensor of shape " + shape_str(shape_));
  return d < 0 ? d + n : d;
}

int64_t Tensor::size(int d) const { return shape_[size_t(wrap_dim(d))]; }

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[size_t(i)] != 1 && strides_[size_t(i)] != s) return false;
    s *= shape_[size_t(i)];
  }
  return true;
}

std::byte* Tensor::raw() const {
  if (!storage_) throw Error("use of an undefined tensor");
  return storage_->base;
}

void Tensor::check_data(size_t elem_size) const {
  if (!is_contiguous()) throw Error("data(): tensor of shape " + shape_str(shape_) + " is not contiguous");
  if (size_t(dtype_size(dtype_)) != elem_size) throw Error("data(): element type does not match dtype " + std::string(dtype_name(dtype_)));
}

Tensor Tensor::view(const Shape& shape) const {
  if (!is_contiguous()) throw Error("view: tensor of shape " + shape_str(shape_) + " is not contiguous; use reshape");
  Shape s = shape;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw Error("view: more than one -1 in " + shape_str(shape));
      infer = int(i);
    } else if (s[i] < 0) {
      throw Error("view: size " + std::to_string(s[i]) + " in " + shape_str(shape) + " is negative (only -1, inferred, is allowed)");
    }
  }
  if (infer >= 0) {
    s[size_t(infer)] = 1;
    const int64_t known = numel_of(s);
    // With zero known elements any size fits the -1: refuse to guess.
    if (known == 0)
      throw Error("view: the -1 in " + shape_str(shape) + " is ambiguous for shape " + shape_str(shape_) + " (other sizes multiply to 0)");
    s[size_t(infer)] = numel() / known;
  }
  if (numel_of(s) != numel()) throw Error("view: cannot view shape " + shape_str(shape_) + " as " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const { return is_contiguous() ? view(shape) : contiguous().view(shape); }

Tensor Tensor::permute(const std::vector<int>& dims) const {
  if (int(dims.size()) != dim()) throw Error("permute: " + std::to_string(dims.size()) + " dims given for shape " + shape_str(shape_));
  std::vector<bool> seen(dims.size(), false);
  Tensor t = *this;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int d = wrap_dim(dims[i]);
    if (seen[size_t(d)]) throw Error("permute: dimension " + std::to_string(d) + " repeated");
    seen[size_t(d)] = true;
    t.shape_[i] = shape_[size_t(d)];
    t.strides_[i] = strides_[size_t(d)];
  }
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  std::vector<int> p(static_cast<size_t>(dim()));
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[size_t(wrap_dim(d0))], p[size_t(wrap_dim(d1))]);
  return permute(p);
}

Tensor Tensor::slice(int d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d);
  const int64_t n = shape_[size_t(d)];
  if (start < 0) start += n;
  if (end < 0) end += n;
  end = std::min(end, n);
  if (step <= 0 || start < 0 || start > end)
    throw Error("slice: [" + std::to_string(start) + ":" + std::to_string(end) + ":" + std::to_string(step) +
                "] is invalid for dimension " + std::to_string(d) + " of shape " + shape_str(shape_));
  Tensor t = *this;
  t.offset_ += start * strides_[size_t(d)];
  t.shape_[size_t(d)] = (end - start + step - 1) / step;
  t.strides_[size_t(d)] *= step;
  return t;
}

Tensor Tensor::expand(const Shape& shape) const {
  if (shape.size() < shape_.size()) throw Error("expand: cannot expand shape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  const size_t lead = shape.size() - shape_.size();
  t.shape_ = shape;
  t.strides_.assign(shape.size(), 0);
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] == shape[lead + i]) {
      t.strides_[lead + i] = strides_[i];
    } else if (shape_[i] != 1) {
      throw Error("expand: cannot expand shape " + shape_str(shape_) + " to " + shape_str(shape));
    }
  }
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  d = wrap_dim(d, 1);
  Tensor t = *this;
  const int64_t stride = d < dim() ? shape_[size_t(d)] * strides_[size_t(d)] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, stride);
  return t;
}

Tensor Tensor::squeeze(int d) const {
  d = wrap_dim(d);
  if (shape_[size_t(d)] != 1) throw Error("squeeze: dimension " + std::to_string(d) + " of shape " + shape_str(shape_) + " is not 1");
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype);
  t.copy_(*this);
  return t;
}

void Tensor::copy_(const Tensor& src) {
  const Tensor s = src.shape_ == shape_ ? src : src.expand(shape_);
  const bool wide = is_integer(dtype_) || is_integer(s.dtype_) || dtype_ == DType::f64 || s.dtype_ == DType::f64;
  if (!wide && is_contiguous() && !same_storage(s)) {  // no staging buffer: decode or encode in place
    if (dtype_ == DType::f32) return read_as(s, data<float>());
    if (s.dtype_ == DType::f32 && s.is_contiguous()) return write_from(s.data<float>(), *this);
  }
  // Staged through f32 or f64 in a pooled buffer: read_as writes every element, so it is not zeroed.
  auto staged = [&]<class T>() {
    const Buffer b = acquire_buffer(size_t(numel()) * sizeof(T));
    T* v = reinterpret_cast<T*>(b.get());
    read_as(s, v);
    write_from(v, *this);
  };
  if (wide) {
    staged.template operator()<double>();
  } else {
    staged.template operator()<float>();
  }
}

void Tensor::fill_(double value) {
  if (numel() == 0) return;
  Tensor one = empty({}, dtype_);
  const double v[1] = {value};
  write_from(v, one);
  const int es = dtype_size(dtype_);
  if (is_contiguous()) {
    std::byte* p = raw_bytes();
    const int64_t n = numel();
    auto fill_as = [&](auto word) {  // the element's bytes as one word: a plain, vectorised fill
      std::memcpy(&word, one.raw_bytes(), sizeof(word));
      std::fill_n(reinterpret_cast<decltype(word)*>(p), n, word);
    };
    if (es == 1)
      fill_as(uint8_t{});
    else if (es == 2)
      fill_as(uint16_t{});
    else if (es == 4)
      fill_as(uint32_t{});
    else if (es == 8)
      fill_as(uint64_t{});
    else
      for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * es, one.raw_bytes(), size_t(es));
  } else {
    copy_(one);
  }
}

double Tensor::item() const {
  if (numel() != 1) throw Error("item(): tensor of shape " + shape_str(shape_) + " has " + std::to_string(numel()) + " elements");
  return to_vector()[0];
}

double Tensor::at(const std::vector<int64_t>& index) const {
  if (int(index.size()) != dim()) throw Error("at(): index rank does not match shape " + shape_str(shape_));
  Tensor t = *this;
  for (int d = dim() - 1; d >= 0; --d) {
    const int64_t i = index[size_t(d)];
    if (i < 0 || i >= shape_[size_t(d)]) throw Error("at(): index out of range for shape " + shape_str(shape_));
    t = t.slice(d, i, i + 1);
  }
  return t.to_vector()[0];
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  read_as(*this, v.data());
  return v;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  read_as(*this, v.data());
  return v;
}

}  // namespace scalify
