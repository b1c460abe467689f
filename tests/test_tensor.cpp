// Tensor storage, views, dtypes and error messages.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "expect_error.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/scalar.hpp"
#include "scalify/tensor/buffer_pool.hpp"
#include "scalify/tensor/convert.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify {
namespace {

Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<size_t>(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return Tensor::from_vector(v, s);
}

TEST(Tensor, ViewsShareStorageAndCopyNothing) {
  const Tensor x = iota({2, 3, 4});
  const Tensor t = x.transpose(0, 2), p = x.permute({1, 2, 0}), s = x.slice(2, 1, 4, 2), e = x.slice(0, 0, 1).expand({5, 3, 4});
  for (const Tensor& v : {t, p, s, e, x.view({6, 4})}) EXPECT_TRUE(v.same_storage(x));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.at({3, 2, 1}), x.at({1, 2, 3}));
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.at({1, 2, 1}), x.at({1, 2, 3}));
  EXPECT_EQ(e.at({4, 2, 3}), x.at({0, 2, 3}));
  EXPECT_EQ(x.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  const Tensor c = t.contiguous();
  EXPECT_FALSE(c.same_storage(x));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), t.to_vector());
  EXPECT_TRUE(x.reshape({4, 6}).same_storage(x));  // contiguous: a view
  EXPECT_FALSE(t.reshape({24}).same_storage(x));   // not contiguous: a copy
  // Writing through a view changes the base.
  Tensor base = Tensor::zeros({3, 3});
  Tensor col = base.slice(1, 1, 2);
  col.fill_(7.0);
  EXPECT_EQ(base.at({2, 1}), 7.0);
  EXPECT_EQ(base.at({2, 2}), 0.0);
}

TEST(Tensor, LowPrecisionDtypesAreStoredForReal) {
  const Tensor x = Tensor::randn({1000}, 3, 10.0);
  for (DType dt : {DType::e4m3, DType::e5m2, DType::f16, DType::bf16, DType::e2m1}) {
    const Tensor q = x.to(dt);
    EXPECT_EQ(q.dtype(), dt);
    const std::vector<float> in = x.to_floats();
    const std::vector<double> back = q.to_vector();
    const Format f = *dtype_format(dt);
    for (size_t i = 0; i < in.size(); ++i)  // saturating round-to-nearest-even, decoded exactly
      ASSERT_EQ(back[i], decode(f, encode(f, in[i], {Overflow::saturate}))) << dtype_name(dt) << " " << in[i];
  }
  EXPECT_EQ(dtype_size(DType::e4m3), 1);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  // A strided FP8 view reads the right elements.
  const Tensor q = x.to(DType::e4m3).reshape({10, 100}).transpose(0, 1);
  EXPECT_EQ(q.at({7, 3}), decode(Format::e4m3, encode(Format::e4m3, x.to_floats()[307], {Overflow::saturate})));
}

// One-byte codes as bf16 GEMM operands, across several chunks: every code of every one-byte
// float format gives its exact value (NaN canonical, infinities kept).
TEST(Tensor, ByteCodesAsBf16MatchTheGeneralConversion) {
  for (const FormatInfo& f : kFormats) {
    if (f.storage_bytes() != 1 || !f.is_float()) continue;
    std::vector<uint8_t> all(17 * 4096 + 5);  // past the parallel threshold, a ragged last chunk
    for (size_t i = 0; i < all.size(); ++i) all[i] = uint8_t((i * 7) & ((1u << f.bits) - 1));
    Tensor codes = Tensor::empty({int64_t(all.size())}, dtype_of(f.id));
    std::memcpy(codes.raw_bytes(), all.data(), all.size());
    const Tensor fast = byte_codes_as_bf16(codes), general = codes.to(DType::f32).to(DType::bf16);
    const uint16_t *got = fast.data<uint16_t>(), *conv = general.data<uint16_t>();
    for (size_t i = 0; i < all.size(); ++i) {
      const float v = float(decode(f.id, all[i]));
      // The plain reference: the exact value's top half (its low half is zero). Finite values
      // also equal the general conversion, which saturates infinities.
      ASSERT_EQ(got[i], uint16_t(std::bit_cast<uint32_t>(v) >> 16)) << f.name << " code " << int(all[i]);
      if (std::isfinite(v)) {
        ASSERT_EQ(got[i], conv[i]) << f.name << " code " << int(all[i]);
      }
    }
  }
  EXPECT_THROW(byte_codes_as_bf16(Tensor::randn({4}, 1)), Error);
}

TEST(Tensor, SeedsMakeRandomTensorsReproducible) {
  EXPECT_EQ(Tensor::randn({64}, 5).to_vector(), Tensor::randn({64}, 5).to_vector());
  EXPECT_NE(Tensor::randn({64}, 5).to_vector(), Tensor::randn({64}, 6).to_vector());
  EXPECT_EQ(ops::dropout_mask({50}, 0.5, 1).to_vector(), ops::dropout_mask({50}, 0.5, 1).to_vector());
  const std::vector<double> r = Tensor::randn({1 << 16}, 9).to_vector();
  double m = 0, v = 0;
  for (double x : r) m += x;
  m /= double(r.size());
  for (double x : r) v += (x - m) * (x - m);
  v /= double(r.size());
  EXPECT_NEAR(m, 0.0, 5.0 / std::sqrt(double(r.size())));
  EXPECT_NEAR(v, 1.0, 5.0 * std::sqrt(2.0 / double(r.size())));
}

TEST(Tensor, LargeBuffersAreRecycled) {
  const Shape big{1024, 1024};  // 4 MB
  const size_t before = pooled_bytes();
  { Tensor t = Tensor::empty(big); }
  EXPECT_EQ(pooled_bytes(), before + 4u * 1024 * 1024);
  Tensor again = Tensor::zeros(big);  // reuses it, and zeros() really zeroes reused memory
  EXPECT_EQ(pooled_bytes(), before);
  EXPECT_EQ(ops::sum(ops::unary(ops::Unary::abs, again), {}).item(), 0.0);
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tensor, ShapeErrorsNameTheOpAndBothShapes) {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  std::string m = error_of([&] { ops::add(a, b); });
  EXPECT_NE(m.find("add"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  m = error_of([&] { ops::matmul(a, b); });
  EXPECT_NE(m.find("matmul"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 5]"), std::string::npos) << m;
  m = error_of([&] { ops::embedding(Tensor::zeros({3, 2}), Tensor::from_indices({0, 3}, {2})); });
  EXPECT_NE(m.find("index 3 is out of range [0, 3)"), std::string::npos) << m;
  m = error_of([&] { ops::cross_entropy(Tensor::zeros({2, 3}), Tensor::from_indices({0}, {1})); });
  EXPECT_NE(m.find("cross_entropy"), std::string::npos) << m;
  m = error_of([&] { a.view({4, 2}); });
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  m = error_of([&] { parse_dtype("fp9"); });
  EXPECT_NE(m.find("fp9"), std::string::npos) << m;
  EXPECT_NE(error_of([&] { a.item(); }), "(no error)");
  EXPECT_NE(error_of([&] { a.slice(1, 2, 1); }), "(no error)");
  EXPECT_NE(error_of([&] { a.permute({0, 0}); }), "(no error)");
  EXPECT_NE(error_of([&] { ops::sum(a, {2}); }), "(no error)");
  for (int i = 0; i <= int(ops::Unary::square); ++i) EXPECT_EQ(int(ops::parse_unary(ops::unary_name(ops::Unary(i)))), i);
  m = error_of([&] { ops::parse_unary("gelu"); });
  EXPECT_NE(m.find("unary: unknown op 'gelu' (neg, exp"), std::string::npos) << m;
  m = error_of([&] { ops::sum(a, {1, -1}); });  // summed once, as if named once
  EXPECT_NE(m.find("dimension 1 is named more than once"), std::string::npos) << m;
}

TEST(Tensor, HugeOrNegativeShapesAreErrors) {
  const int64_t big = int64_t(1) << 40;
  EXPECT_ERROR(numel_of({big, big}), "overflows int64");
  EXPECT_ERROR(Tensor::empty({big, big}), "too many elements");
  EXPECT_ERROR(Tensor::empty({int64_t(1) << 30, int64_t(1) << 30}), "2^48 bytes");
  EXPECT_ERROR(Tensor::empty({2, -3}), "negative size");
  EXPECT_ERROR(Tensor::zeros({-1}), "negative size");
}

TEST(Tensor, ReshapeRejectsNegativeAndAmbiguousSizes) {
  const Tensor x = iota({6});
  EXPECT_ERROR(x.reshape({-2, -3}), "negative");
  EXPECT_ERROR(x.reshape({-1, -1}), "more than one -1");
  EXPECT_ERROR(x.view({-1, -1, 6}), "more than one -1");
  EXPECT_EQ(x.reshape({-1, 3}).shape(), (Shape{2, 3}));
  const Tensor e = Tensor::zeros({0, 3});
  EXPECT_ERROR(e.reshape({-1, 0}), "ambiguous");  // any size fits: no -1 may stay in the shape
  EXPECT_EQ(e.reshape({3, 0}).shape(), (Shape{3, 0}));
  EXPECT_EQ(e.reshape({-1, 3}).shape(), (Shape{0, 3}));
}

TEST(Tensor, MatmulOverAnEmptyInnerDimensionIsZeros) {
  for (DType dt : {DType::f32, DType::f64}) {
    // Buffers come uninitialised from a pool: dirty it first so garbage would show.
    { Tensor dirty = Tensor::full({64, 64}, 7.0, dt); }
    const Tensor a = Tensor::zeros({4, 0}, dt), b = Tensor::zeros({0, 5}, dt);
    const Tensor at = Tensor::zeros({0, 4}, dt).transpose(0, 1), bt = Tensor::zeros({5, 0}, dt).transpose(0, 1);
    for (const Tensor& out : {ops::matmul(a, b), ops::matmul(at, b), ops::matmul(a, bt), ops::matmul(at, bt),
                              ops::matmul(Tensor::zeros({3, 4, 0}, dt), Tensor::zeros({3, 0, 5}, dt))}) {
      EXPECT_EQ(out.shape().back(), 5);
      EXPECT_EQ(out.size(-2), 4);
      for (double v : out.to_vector()) ASSERT_EQ(v, 0.0) << dtype_name(dt);
    }
  }
}
}  // namespace
}  // namespace scalify

namespace scalify {
namespace {

// Broadcast, transposed and strided views of number formats read through the SIMD codec on the
// span they cover; at() decodes element by element (the plain reference). They must agree.
TEST(Tensor, StridedViewsOfNumberFormatsReadLikeElementwiseDecoding) {
  for (DType dt : {DType::f16, DType::bf16, DType::e4m3, DType::e5m2}) {
    const Tensor x = Tensor::randn({6, 5}, 3, 2.0).to(dt);
    const Tensor bias = Tensor::randn({5}, 4, 0.01).to(dt);
    for (const Tensor& view : {x.transpose(0, 1), bias.expand({7, 5}), x.slice(0, 1, 6, 2), x.slice(1, 4, 5)}) {
      const std::vector<float> fast = view.to_floats();
      for (int64_t i = 0, k = 0; i < view.shape()[0]; ++i)
        for (int64_t j = 0; j < view.shape()[1]; ++j, ++k)
          ASSERT_EQ(fast[size_t(k)], float(view.at({i, j}))) << dtype_name(dt) << " view " << shape_str(view.shape());
    }
  }
}

TEST(Tensor, BorrowReadsForeignMemoryAndKeepsItsOwnerAlive) {
  auto memory = std::make_shared<std::vector<float>>(std::vector<float>{1, -2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = memory;
  Tensor sum;
  {
    const Tensor t = Tensor::borrow(memory->data(), {2, 3}, DType::f32, memory);
    memory.reset();  // the tensor alone keeps it
    EXPECT_FALSE(watch.expired());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.data<float>(), watch.lock()->data());  // no copy
    EXPECT_EQ(t.transpose(0, 1).contiguous().to_vector(), (std::vector<double>{1, 4, -2, 5, 3, 6}));
    sum = ops::add(t, t);  // a new tensor: owns its own buffer
  }
  EXPECT_TRUE(watch.expired());  // released with the last tensor over it
  EXPECT_EQ(sum.to_vector(), (std::vector<double>{2, -4, 6, 8, 10, 12}));
}

}  // namespace
}  // namespace scalify
