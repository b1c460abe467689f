// Kernels asked to store their output in f16 or bf16 (`store_as`) write exactly what the f32
// kernel followed by to_storage writes, bit for bit: rounding, saturation, infinities, NaN,
// underflow, over several chunks and on the parallel path. And the statistics kernels that
// SCALIFY's rescaling uses: sum_squares against f64, the same on any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "scalify/autograd/data_precision.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/tensor/storage_rounding.hpp"

namespace scalify {
namespace {

// Random values spread over f16's whole range and past it, with the special values placed.
Tensor awkward(const Shape& shape, uint64_t seed) {
  std::vector<float> v = Tensor::randn(shape, seed).to_floats();
  for (size_t i = 0; i < v.size(); ++i) {
    switch (i % 97) {
      case 3: v[i] = std::numeric_limits<float>::infinity(); break;
      case 5: v[i] = -std::numeric_limits<float>::infinity(); break;
      case 7: v[i] = std::numeric_limits<float>::quiet_NaN(); break;
      case 11: v[i] *= 1e5f; break;   // saturates in f16
      case 13: v[i] *= 1e-8f; break;  // underflows in f16
      case 17: v[i] *= 3e-6f; break;  // f16 subnormal
      default: v[i] *= 40.0f;
    }
  }
  return Tensor::from_vector(v, shape);
}

void expect_same_bits(const Tensor& direct, const Tensor& computed, DType storage, const std::string& what) {
  const Tensor expected = to_storage(computed, storage, what);
  ASSERT_EQ(direct.dtype(), storage) << what;
  ASSERT_EQ(direct.shape(), expected.shape()) << what;
  const int64_t n = direct.numel();
  const auto* a = reinterpret_cast<const uint16_t*>(direct.raw_bytes());
  const auto* b = reinterpret_cast<const uint16_t*>(expected.raw_bytes());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << what << ": element " << i << " of " << n;
}

const DType kStorages[] = {DType::f16, DType::bf16};
// Several 4096-value chunks with a ragged end; and a size on the parallel path.
const Shape kShapes[] = {{3, 4133}, {70, 1100}};

TEST(StoreAs, ElementwiseKernelsEqualTheF32KernelThenToStorage) {
  for (DType st : kStorages)
    for (const Shape& shape : kShapes) {
      const std::string where = std::string(dtype_name(st)) + " " + shape_str(shape);
      const Tensor x = awkward(shape, 1), y = awkward(shape, 2), g = awkward(shape, 3);
      const Tensor x16 = x.to(DType::f16);  // an f16 input, read a chunk at a time
      const Tensor row = awkward({shape.back()}, 4);
      for (ops::Unary op : {ops::Unary::gelu_tanh, ops::Unary::relu, ops::Unary::exp, ops::Unary::square}) {
        const std::string name = where + " " + ops::unary_name(op);
        expect_same_bits(ops::unary(op, x, 0.5, 4.0, st), ops::unary(op, x, 0.5, 4.0), st, name);
        expect_same_bits(ops::unary(op, x16, 1.0, 1.0, st), ops::unary(op, x16), st, name + " f16 in");
        const Tensor out = ops::unary(op, x);
        expect_same_bits(ops::unary_backward(op, x, out, g, 0.5, st), ops::unary_backward(op, x, out, g, 0.5), st, name + " backward");
      }
      expect_same_bits(ops::scale_shift(x16, 0.25, 3.0, st), ops::scale_shift(x16, 0.25, 3.0), st, where + " scale_shift");
      for (ops::Binary op : {ops::Binary::add, ops::Binary::mul, ops::Binary::maximum}) {
        expect_same_bits(ops::binary(op, x, y, 0.25, 2.0, st), ops::binary(op, x, y, 0.25, 2.0), st, where + " binary");
        expect_same_bits(ops::binary(op, x16, row, 1.0, 1.0, st), ops::binary(op, x16, row), st, where + " binary, row operand");
      }
    }
}

TEST(StoreAs, NormKernelsEqualTheF32KernelThenToStorage) {
  for (DType st : kStorages)
    for (const Shape& shape : kShapes)
      for (const bool center : {true, false}) {
        const std::string where = std::string(dtype_name(st)) + " " + shape_str(shape) + (center ? " layer" : " rms");
        const int64_t D = shape.back();
        const Tensor x = Tensor::randn(shape, 5, 3.0).to(DType::f16), g = awkward(shape, 6);
        const ops::Affine a{Tensor::randn({D}, 7, 2e3), center ? Tensor::randn({D}, 8) : Tensor(), 0.5, 2.0};
        const ops::NormResult direct = ops::norm_affine(x, 1e-5, center, a, st), plain = ops::norm_affine(x, 1e-5, center, a);
        expect_same_bits(direct.y, plain.y, st, where + " forward");
        ASSERT_EQ(direct.xhat.dtype(), DType::f32) << where;  // kept for the weight's gradient
        expect_same_bits(ops::norm_affine_backward(plain, g, center, a.weight, 0.5, st),
                         ops::norm_affine_backward(plain, g, center, a.weight, 0.5), st, where + " backward");
      }
}

// The backward keeps an op's output only where the derivative is written with it: without the
// output, the derivative still matches central differences of the op in f64 (so an op wrongly
// listed as not needing it would fail here), and an op that needs it refuses to run without it.
TEST(StoreAs, UnaryBackwardReadsItsOutputOnlyWhereTheDerivativeUsesIt) {
  const Tensor x = Tensor::rand({3, 5000}, 12, 0.2, 2.0), ones = Tensor::ones({3, 5000});
  const Tensor x64 = x.to(DType::f64);
  using U = ops::Unary;
  for (U op :
       {U::neg, U::exp, U::log, U::sqrt, U::rsqrt, U::abs, U::relu, U::gelu_tanh, U::gelu_erf, U::silu, U::sigmoid, U::tanh, U::square}) {
    const Tensor y = ops::unary(op, x);
    if (ops::derivative_uses_output(op)) {
      EXPECT_THROW(ops::unary_backward(op, x, Tensor(), ones), Error) << ops::unary_name(op);
      continue;
    }
    const double h = 1e-6;
    const std::vector<double> up = ops::unary(op, ops::scale_shift(x64, 1.0, h)).to_vector(),
                              down = ops::unary(op, ops::scale_shift(x64, 1.0, -h)).to_vector(),
                              got = ops::unary_backward(op, x, Tensor(), ones).to_vector();
    for (size_t i = 0; i < got.size(); ++i) {
      const double want = (up[i] - down[i]) / (2 * h);
      ASSERT_NEAR(got[i], want, 1e-5 * (1 + std::fabs(want))) << ops::unary_name(op) << " at " << x64.to_vector()[i];
    }
  }
}

// f32 requests, f64 kernels and storages these kernels do not round into give the plain output.
TEST(StoreAs, OtherRequestsLeaveTheComputeDType) {
  const Tensor x = Tensor::randn({4, 5}, 9);
  EXPECT_EQ(ops::unary(ops::Unary::relu, x, 1.0, 1.0, DType::e4m3).dtype(), DType::f32);
  EXPECT_EQ(ops::unary(ops::Unary::relu, x.to(DType::f64), 1.0, 1.0, DType::f16).dtype(), DType::f64);
  EXPECT_EQ(ops::binary(ops::Binary::add, x, x, 1.0, 1.0, DType::f32).dtype(), DType::f32);
}

// An f16 graph's ops store their outputs directly, and a StorageCastRecorder still sees every
// rounding it counts (it asks for f32 outputs while it is alive).
TEST(StoreAs, F16GraphCountsItsCastsWhileRecording) {
  const Var x(ScaledTensor(Tensor::randn({64, 300}, 10).to(DType::f16), 4.0f), true);
  const Var y = gelu(x + x);
  EXPECT_EQ(y.scaled().data.dtype(), DType::f16);
  StorageCastRecorder recorder;
  const Var z = gelu(x + x);
  EXPECT_EQ(z.scaled().data.dtype(), DType::f16);
  EXPECT_EQ(recorder.stats().at("add").values, 64 * 300);
  EXPECT_EQ(recorder.stats().at("gelu_tanh").values, 64 * 300);
  for (int64_t i = 0; i < y.scaled().data.numel(); ++i)
    ASSERT_EQ(reinterpret_cast<const uint16_t*>(y.scaled().data.raw_bytes())[i],
              reinterpret_cast<const uint16_t*>(z.scaled().data.raw_bytes())[i]);
}

// The recorder's counts for f16: 1e-9 underflows to 0, 1e-6 becomes a subnormal (below 2^-14),
// 1e6 saturates at 65504, 1 and 0 are neither; the counts add up across casts of one name.
TEST(StoreAs, RecorderCountsUnderflowSubnormalsAndSaturation) {
  StorageCastRecorder recorder;
  const Tensor x = Tensor::from_vector(std::vector<float>{1e-9f, 1e-6f, -1e-6f, 1.0f, 0.0f, 1e6f}, {6});
  to_storage(x, DType::f16, "x");
  to_storage(x, DType::f16, "x");
  const StorageCastStats& st = recorder.stats().at("x");
  EXPECT_EQ(st.values, 12);
  EXPECT_EQ(st.underflowed, 2);
  EXPECT_EQ(st.subnormal, 4);
  EXPECT_EQ(st.saturated, 2);
  EXPECT_DOUBLE_EQ(st.subnormal_fraction(), 4.0 / 12);
  EXPECT_EQ(recorder.total().subnormal, 4);
}

// Reading 16-bit storage for computing: every code widens to its exact value (checked against
// the format codec's decode); NaN codes to a NaN.
TEST(StoreAs, WideningForComputeIsExactForEveryCode) {
  for (DType st : kStorages) {
    std::vector<uint16_t> codes(65536 + 5);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint16_t(i);
    std::vector<float> got(codes.size()), want(codes.size());
    const auto* bytes = reinterpret_cast<const std::byte*>(codes.data());
    widen_for_compute(bytes, int64_t(codes.size()), st, got.data());
    dequantize(std::span(bytes, codes.size() * 2), *dtype_format(st), 1.0f, std::span(want));
    for (size_t i = 0; i < codes.size(); ++i) {
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << dtype_name(st) << " code " << i;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << dtype_name(st) << " code " << i;
      }
    }
  }
}

TEST(SumSquares, MatchesF64AndIsTheSameOnAnyThreadCount) {
  const Tensor x = Tensor::randn({300, 1001}, 11, 3.0);
  const std::vector<double> v = x.to_vector();
  double expected = 0;
  for (double a : v) expected += a * a;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = ops::sum_squares(x), one16 = ops::sum_squares(x.to(DType::f16));
  omp_set_num_threads(std::max(threads, 2));
  EXPECT_EQ(ops::sum_squares(x), one);
  EXPECT_EQ(ops::sum_squares(x.to(DType::f16)), one16);
  omp_set_num_threads(threads);
  EXPECT_NEAR(one, expected, 1e-12 * expected);
  EXPECT_NEAR(one16, expected, 2e-3 * expected);  // f16 rounding of each value
  EXPECT_EQ(ops::sum_squares(Tensor::zeros({0})), 0.0);
  EXPECT_TRUE(std::isnan(ops::sum_squares(Tensor::from_vector(std::vector<float>{1.0f, NAN}, {2}))));
}

}  // namespace
}  // namespace scalify
