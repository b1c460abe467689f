// Batched matmul with broadcasting of the batch dimensions. f32 operands whose matrices are
// row- or column-contiguous (e.g. a transposed view) go to the GEMM as they are; anything else
// (other layouts, FP8/f16/bf16 storage, which decodes exactly) is first made a dense f32 copy.
#include "scalify/error.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/gemm.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::ops {

namespace {

// One operand as seen by the GEMM: base pointer, transpose flag, leading dimension, batch strides.
template <class T>
struct Operand {
  Tensor keep;  // owns the memory
  const T* base = nullptr;
  bool trans = false;
  int64_t ld = 0;
  Shape batch_strides;
};

template <class T>
Operand<T> prepare(const Tensor& x, const Shape& batch, int64_t rows, int64_t cols) {
  Operand<T> op;
  Tensor t = x.expand([&] {
    Shape s = batch;
    s.push_back(rows);
    s.push_back(cols);
    return s;
  }());
  const int nd = t.dim();
  const int64_t s_row = t.strides()[size_t(nd - 2)], s_col = t.strides()[size_t(nd - 1)];
  const bool usable = t.dtype() == dtype_for<T>();
  if (usable && s_col == 1 && (s_row >= cols || rows == 1)) {
    op.ld = rows == 1 ? cols : s_row;
  } else if (usable && s_row == 1 && (s_col >= rows || cols == 1)) {
    op.trans = true;
    op.ld = cols == 1 ? rows : s_col;
  } else {
    Tensor dense = Tensor::empty(t.shape(), dtype_for<T>());
    dense.copy_(t);
    t = dense;
    op.ld = cols;
  }
  op.keep = t;
  op.base = reinterpret_cast<const T*>(t.raw_bytes());
  op.batch_strides.assign(t.strides().begin(), t.strides().end() - 2);
  return op;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, double alpha) {
  if (a.dim() < 2 || b.dim() < 2)
    throw Error("matmul: operands need at least 2 dimensions, got " + shape_str(a.shape()) + " and " + shape_str(b.shape()));
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  if (b.size(-2) != K) throw Error("matmul: inner dimensions differ: " + shape_str(a.shape()) + " @ " + shape_str(b.shape()));
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(batch_a, batch_b, "matmul (batch dimensions)");
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  return dispatch_compute(computes_in_f64(a, b), [&]<class T>() {
    Tensor out = Tensor::empty(out_shape, dtype_for<T>());
    // A 2-D right operand with a row-major left operand (decoded first if it is stored in a
    // number format): one GEMM over all batch rows.
    if (batch_b.empty() && a.is_contiguous()) {
      const Dense<T> a_rows(a);
      const T* A = a_rows.data();
      const Operand<T> B = prepare<T>(b, {}, K, N);
      const int64_t rows = numel_of(batch) * M;
      if constexpr (sizeof(T) == 4)
        gemm::sgemm(false, B.trans, rows, N, K, A, K, B.base, B.ld, 0.0f, out.data<T>(), N, float(alpha));
      else
        gemm::gemm_reference<T>(false, B.trans, rows, N, K, A, K, B.base, B.ld, T(0), out.data<T>(), N, T(alpha));
      return out;
    }
    const Operand<T> A = prepare<T>(a, batch, M, K), B = prepare<T>(b, batch, K, N);
    const int64_t nb = numel_of(batch);
    T* C = out.data<T>();
    for (int64_t i = 0; i < nb; ++i) {
      int64_t off_a = 0, off_b = 0, rem = i;
      for (int d = int(batch.size()) - 1; d >= 0; --d) {
        const int64_t idx = rem % batch[size_t(d)];
        rem /= batch[size_t(d)];
        off_a += idx * A.batch_strides[size_t(d)];
        off_b += idx * B.batch_strides[size_t(d)];
      }
      if constexpr (sizeof(T) == 4)
        gemm::sgemm(A.trans, B.trans, M, N, K, A.base + off_a, A.ld, B.base + off_b, B.ld, 0.0f, C + i * M * N, N, float(alpha));
      else
        gemm::gemm_reference<T>(A.trans, B.trans, M, N, K, A.base + off_a, A.ld, B.base + off_b, B.ld, T(0), C + i * M * N, N, T(alpha));
    }
    return out;
  });
}

}  // namespace scalify::ops
