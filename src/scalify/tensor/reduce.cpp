// Reductions: sum and mean over any set of dimensions, max over one dimension.
#include <algorithm>
#include <limits>
#include <span>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::ops {

namespace {

struct ReducePlan {
  Tensor moved;      // reduced dims permuted to the end
  Shape out_shape;   // with or without the reduced dims
  int64_t rows = 1;  // kept elements
  int64_t cols = 1;  // reduced elements per kept element
};

ReducePlan plan(const Tensor& x, std::vector<int> dims, bool keepdim, const char* op) {
  const int nd = x.dim();
  if (dims.empty())
    for (int d = 0; d < nd; ++d) dims.push_back(d);
  std::vector<bool> reduced(size_t(nd), false);
  for (int& d : dims) {
    if (d < -nd || d >= nd)
      throw Error(std::string(op) + ": dimension " + std::to_string(d) + " out of range for shape " + shape_str(x.shape()));
    if (d < 0) d += nd;
    if (reduced[size_t(d)]) throw Error(std::string(op) + ": dimension " + std::to_string(d) + " is named more than once");
    reduced[size_t(d)] = true;
  }
  ReducePlan p;
  std::vector<int> perm;
  for (int d = 0; d < nd; ++d)
    if (!reduced[size_t(d)]) {
      perm.push_back(d);
      p.rows *= x.shape()[size_t(d)];
      p.out_shape.push_back(x.shape()[size_t(d)]);
    } else if (keepdim) {
      p.out_shape.push_back(1);
    }
  for (int d = 0; d < nd; ++d)
    if (reduced[size_t(d)]) {
      perm.push_back(d);
      p.cols *= x.shape()[size_t(d)];
    }
  p.moved = x.permute(perm);
  return p;
}

}  // namespace

// Sum over the leading `lead` dimensions of a contiguous tensor: column sums, no transpose
// (the bias gradient of every linear layer). Work is split into fixed tiles of rows x columns,
// not per thread, and each tile's partial sums are added in row order, so the result does not
// depend on the thread count; narrow tensors (d = 128: one column block) still use every thread.
// Low-precision input (SCALIFY's f16 gradients) is widened a row segment at a time.
template <class T>
Tensor sum_leading(const Tensor& x, int64_t rows, int64_t cols, const Shape& out_shape) {
  const ChunkSource<T> in(x, x.shape());
  Tensor out = Tensor::empty(out_shape, dtype_for<T>());
  T* o = out.data<T>();
  constexpr int64_t kBlock = 256, kRows = 256;
  const int64_t blocks = (cols + kBlock - 1) / kBlock, row_tiles = (rows + kRows - 1) / kRows;
  std::vector<double> partial(size_t(row_tiles * cols));
#pragma omp parallel for collapse(2) if (rows * cols > platform::kParallelGrain)
  for (int64_t t = 0; t < row_tiles; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kBlock, c1 = std::min(cols, c0 + kBlock);
      double* acc = partial.data() + t * cols + c0;
      T buf[kBlock];
      for (int64_t r = t * kRows; r < std::min(rows, (t + 1) * kRows); ++r) {
        const T* seg = in.read(r * cols + c0, c1 - c0, buf);
        for (int64_t c = 0; c < c1 - c0; ++c) acc[c] += double(seg[c]);
      }
    }
#pragma omp parallel for if (rows * cols > platform::kParallelGrain)
  for (int64_t c = 0; c < cols; ++c) {
    double acc = 0;
    for (int64_t t = 0; t < row_tiles; ++t) acc += partial[size_t(t * cols + c)];
    o[c] = T(acc);
  }
  return out;
}

Tensor sum(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  const ReducePlan p = plan(x, dims, keepdim, "sum");
  // Reduced dimensions exactly the leading ones of a contiguous tensor: sum columns in place.
  bool leading = x.is_contiguous() && !dims.empty();
  for (int d : dims) leading = leading && (d < 0 ? d + x.dim() : d) < int(dims.size());
  if (leading) return dispatch_compute(computes_in_f64(x), [&]<class T>() { return sum_leading<T>(x, p.cols, p.rows, p.out_shape); });
  return dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const Dense<T> in(p.moved);
    Tensor out = Tensor::empty(p.out_shape, dtype_for<T>());
    T* o = out.data<T>();
    if (p.rows < 4 && p.cols > (1 << 16)) {  // few long rows (a whole-tensor sum): fixed parts in parallel
      constexpr int64_t kPart = 1 << 14;
      const int64_t parts = (p.cols + kPart - 1) / kPart;
      std::vector<double> partial(static_cast<size_t>(parts));
      for (int64_t r = 0; r < p.rows; ++r) {
        const T* row = in.data() + r * p.cols;
#pragma omp parallel for
        for (int64_t q = 0; q < parts; ++q) {
          double acc = 0;
          for (int64_t c = q * kPart; c < std::min(p.cols, (q + 1) * kPart); ++c) acc += double(row[c]);
          partial[size_t(q)] = acc;
        }
        double acc = 0;
        for (double v : partial) acc += v;  // in part order: independent of the thread count
        o[r] = T(acc);
      }
      return out;
    }
#pragma omp parallel for if (p.rows * p.cols > platform::kParallelGrain)
    for (int64_t r = 0; r < p.rows; ++r) {
      // Accumulate in double: reductions are where f32 sums lose the most.
      double acc = 0;
      const T* row = in.data() + r * p.cols;
      for (int64_t c = 0; c < p.cols; ++c) acc += double(row[c]);
      o[r] = T(acc);
    }
    return out;
  });
}

double sum_squares(std::span<const float> x) {
  // Eight running sums, so the f64 adds are not one dependency chain (and vectorise); added in a
  // fixed order, so a given span always gives the same result.
  double acc[8] = {};
  const size_t n = x.size(), whole = n / 8 * 8;
  for (size_t i = 0; i < whole; i += 8)
    for (size_t k = 0; k < 8; ++k) acc[k] += double(x[i + k]) * double(x[i + k]);
  for (size_t i = whole; i < n; ++i) acc[i - whole] += double(x[i]) * double(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double sum_squares(const Tensor& x) {
  if (x.dtype() == DType::f64) {
    const Dense<double> in(x);
    double acc = 0;
    for (int64_t i = 0; i < x.numel(); ++i) acc += in[i] * in[i];
    return acc;
  }
  // f32 and low-precision data (decoded a chunk at a time): chunk sums in parallel, added in
  // chunk order, so the result does not depend on the thread count.
  constexpr int64_t kChunk = 4096;
  const ChunkSource<float> in(x, x.shape());
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for if (n > platform::kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    float buf[kChunk];
    const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
    partial[size_t(c)] = sum_squares(std::span(in.read(begin, len, buf), size_t(len)));
  }
  double acc = 0;
  for (double v : partial) acc += v;
  return acc;
}

Tensor mean(const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  const ReducePlan p = plan(x, dims, keepdim, "mean");
  if (p.cols == 0) throw Error("mean: reducing over an empty dimension of shape " + shape_str(x.shape()));
  return scale_shift(sum(x, dims, keepdim), 1.0 / double(p.cols), 0.0);
}

std::pair<Tensor, Tensor> max(const Tensor& x, int dim, bool keepdim) {
  const ReducePlan p = plan(x, {dim}, keepdim, "max");
  if (p.cols == 0) throw Error("max: reducing over an empty dimension of shape " + shape_str(x.shape()));
  return dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const Dense<T> in(p.moved);
    Tensor values = Tensor::empty(p.out_shape, dtype_for<T>());
    Tensor index = Tensor::empty(p.out_shape, DType::i64);
    T* v = values.data<T>();
    int64_t* ix = index.data<int64_t>();
    for (int64_t r = 0; r < p.rows; ++r) {
      const T* row = in.data() + r * p.cols;
      int64_t best = 0;
      for (int64_t c = 1; c < p.cols; ++c)
        if (row[c] > row[best] || (row[c] != row[c] && row[best] == row[best])) best = c;  // NaN wins
      v[r] = row[best];
      ix[r] = best;
    }
    return std::pair{values, index};
  });
}

}  // namespace scalify::ops
