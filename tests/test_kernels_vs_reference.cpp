// Fast kernels against plain references on random shapes, odd sizes and non-contiguous views.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "scalify/tensor/gemm.hpp"
#include "scalify/autograd/data_precision.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/tensor/vector_math.hpp"

namespace scalify {
namespace {

// C = A B in f64 from the f32 values, and the bound sum_k |a_ik||b_kj| for the error estimate.
void reference_matmul(const Tensor& a, const Tensor& b, std::vector<double>& c, std::vector<double>& absc) {
  const Tensor A = a.contiguous(), B = b.contiguous();
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const std::vector<double> av = A.to_vector(), bv = B.to_vector();
  c.assign(size_t(M * N), 0.0);
  absc.assign(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) {
        c[size_t(i * N + j)] += av[size_t(i * K + k)] * bv[size_t(k * N + j)];
        absc[size_t(i * N + j)] += std::fabs(av[size_t(i * K + k)] * bv[size_t(k * N + j)]);
      }
}

TEST(KernelsVsReference, MatmulOnRandomShapesAndLayouts) {
  std::mt19937 rng(1);
  const double u = std::numeric_limits<float>::epsilon() / 2;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t M = 1 + rng() % 70, K = 1 + rng() % 90, N = 1 + rng() % 60;
    const int layout = trial % 4;  // plain, transposed A, transposed B, sliced (strided) views
    Tensor a = Tensor::randn({M, K}, 100 + trial), b = Tensor::randn({K, N}, 200 + trial);
    if (layout == 1) a = Tensor::randn({K, M}, 100 + trial).transpose(0, 1);
    if (layout == 2) b = Tensor::randn({N, K}, 200 + trial).transpose(0, 1);
    if (layout == 3) {
      a = Tensor::randn({M, 2 * K + 1}, 100 + trial).slice(1, 1, 2 * K + 1, 2);
      b = Tensor::randn({K + 3, N}, 200 + trial).slice(0, 3, K + 3);
    }
    const Tensor c = ops::matmul(a, b);
    std::vector<double> ref, bound;
    reference_matmul(a, b, ref, bound);
    const std::vector<double> got = c.to_vector();
    // Any summation order of K products in f32: |error| <= gamma_K * sum|a||b|, gamma_K = K u / (1 - K u).
    const double gamma = double(K + 1) * u / (1 - double(K + 1) * u);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - ref[i]), gamma * bound[i] + 1e-30)
          << "M=" << M << " K=" << K << " N=" << N << " layout " << layout << " element " << i;
  }
}

TEST(KernelsVsReference, BatchedMatmulEqualsPerBatch2d) {
  const Tensor a = Tensor::randn({3, 5, 7}, 1), b = Tensor::randn({7, 4}, 2), bb = Tensor::randn({3, 7, 4}, 3);
  const Tensor c1 = ops::matmul(a, b), c2 = ops::matmul(a, bb), c3 = ops::matmul(a, bb.transpose(1, 2).contiguous().transpose(1, 2));
  for (int64_t i = 0; i < 3; ++i) {
    const Tensor ai = a.slice(0, i, i + 1).squeeze(0);
    EXPECT_EQ(c1.slice(0, i, i + 1).squeeze(0).to_vector(), ops::matmul(ai, b).to_vector());
    EXPECT_EQ(c2.slice(0, i, i + 1).squeeze(0).to_vector(), ops::matmul(ai, bb.slice(0, i, i + 1).squeeze(0)).to_vector());
  }
  // The transposed-operand path sums in another order: equal within 2 gamma_K sum |a||b|.
  const std::vector<double> v2 = c2.to_vector(), v3 = c3.to_vector(),
                            bound = ops::matmul(ops::unary(ops::Unary::abs, a), ops::unary(ops::Unary::abs, bb)).to_vector();
  const double gamma = 8 * std::numeric_limits<float>::epsilon() / 2;
  for (size_t i = 0; i < v2.size(); ++i) EXPECT_LE(std::fabs(v2[i] - v3[i]), 2 * gamma * bound[i]);
}

TEST(KernelsVsReference, Fp8OperandsDecodeExactlyBeforeTheGemm) {
  const Tensor a = Tensor::randn({9, 33}, 4, 3.0).to(DType::e4m3), b = Tensor::randn({33, 5}, 5).to(DType::e5m2);
  const Tensor c = ops::matmul(a, b);
  const Tensor c32 = ops::matmul(a.to(DType::f32), b.to(DType::f32));
  EXPECT_EQ(c.to_vector(), c32.to_vector());
  // A batched f16 left operand with a shared 2-D right one (SCALIFY's output head) is decoded and
  // takes the one GEMM over all rows, as the f32 operand does.
  const Tensor x = Tensor::randn({4, 9, 33}, 6).to(DType::f16), w = Tensor::randn({5, 33}, 7).transpose(0, 1);
  EXPECT_EQ(ops::matmul(x, w).to_vector(), ops::matmul(x.to(DType::f32), w).to_vector());
}

// Large sums split into fixed tiles (column sums: a bias gradient, over two column blocks and
// ragged row tiles; a whole-tensor sum over fixed parts): in f64, so a summation order that
// followed the thread count would change the bits, the same bits on 1, 2 and 3 threads, and the
// plain row-order loop within rounding.
TEST(KernelsVsReference, TiledSumsMatchThePlainLoopOnAnyThreadCount) {
  const int64_t C = 300;
  const Tensor x = Tensor::randn({1000, 3, C}, 9, 2.0).to(DType::f64);
  const std::vector<double> xv = x.to_vector();
  std::vector<double> col(size_t(C), 0.0);
  double all = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    col[i % size_t(C)] += xv[i];
    all += xv[i];
  }
  const int threads = omp_get_max_threads();
  std::vector<std::vector<double>> runs;
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    std::vector<double> r = ops::sum(x, {0, 1}).to_vector();
    r.push_back(ops::sum(x, {}).item());
    runs.push_back(r);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  for (size_t j = 0; j < size_t(C); ++j) EXPECT_NEAR(runs[0][j], col[j], 1e-9 * (1 + std::fabs(col[j]))) << j;
  EXPECT_NEAR(runs[0].back(), all, 1e-9 * (1 + std::fabs(all)));
}

TEST(KernelsVsReference, BroadcastingBinaryOpsOnStridedViews) {
  const Tensor a = Tensor::randn({5, 8, 3}, 7).permute({1, 0, 2});         // [8, 5, 3], not contiguous
  const Tensor b = Tensor::randn({3, 5}, 8).transpose(0, 1).unsqueeze(0);  // [1, 5, 3]
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  const std::vector<double> sum = ops::add(a, b).to_vector(), prod = ops::mul(a, b).to_vector(), quot = ops::div(a, b).to_vector();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 15; ++j) {
      const size_t k = size_t(i * 15 + j);
      EXPECT_EQ(sum[k], float(av[k] + bv[size_t(j)]));
      EXPECT_EQ(prod[k], float(av[k] * bv[size_t(j)]));
      EXPECT_EQ(quot[k], float(float(av[k]) / float(bv[size_t(j)])));
    }
}

TEST(KernelsVsReference, SoftmaxNormsAndReductions) {
  const Tensor x = Tensor::randn({6, 37}, 6, 3.0).slice(1, 1, 37, 2);  // non-contiguous rows
  const std::vector<double> xv = x.to_vector();
  const int64_t R = 6, D = 18;
  const std::vector<double> sm = ops::softmax(x).to_vector(), ln = ops::layer_norm(x, 1e-5).y.to_vector(),
                            s0 = ops::sum(x, {0}).to_vector();
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300, z = 0, mean = 0, var = 0;
    for (int64_t j = 0; j < D; ++j) mx = std::max(mx, xv[size_t(r * D + j)]);
    for (int64_t j = 0; j < D; ++j) z += std::exp(xv[size_t(r * D + j)] - mx);
    for (int64_t j = 0; j < D; ++j) mean += xv[size_t(r * D + j)] / double(D);
    for (int64_t j = 0; j < D; ++j) var += std::pow(xv[size_t(r * D + j)] - mean, 2) / double(D);
    for (int64_t j = 0; j < D; ++j) {
      const size_t i = size_t(r * D + j);
      EXPECT_NEAR(sm[i], std::exp(xv[i] - mx) / z, 1e-6);
      EXPECT_NEAR(ln[i], (xv[i] - mean) / std::sqrt(var + 1e-5), 1e-5);
    }
  }
  for (int64_t j = 0; j < D; ++j) {
    double s = 0;
    for (int64_t r = 0; r < R; ++r) s += xv[size_t(r * D + j)];
    EXPECT_NEAR(s0[size_t(j)], s, 1e-5);
  }
}

// The one-pass norm backward (rstd applied inside the row loop) against the unfused composition
// it replaced, bit for bit: per row, double sums of g and g * xhat over D, then
// float(g - mean(g) - xhat * mean(g xhat)) times rstd in f32. Above the parallel threshold, with a
// transposed (non-contiguous) gradient; a wrong rstd count is refused.
TEST(KernelsVsReference, NormBackwardMatchesTheUnfusedComposition) {
  const int64_t R = 300, D = 130;
  const Tensor x = Tensor::randn({R, D}, 21, 2.0);
  const Tensor g = Tensor::randn({D, R}, 22, 1.5).transpose(0, 1);
  const std::vector<float> gv = g.to_floats();
  for (bool center : {true, false}) {
    const ops::NormResult r = center ? ops::layer_norm(x, 1e-5) : ops::rms_norm(x, 1e-5);
    const std::vector<float> xh = r.xhat.to_floats(), rs = r.rstd.to_floats();
    const std::vector<float> dx = (center ? ops::layer_norm_backward(r, g) : ops::rms_norm_backward(r, g)).to_floats();
    ASSERT_EQ(dx.size(), size_t(R * D));
    for (int64_t row = 0; row < R; ++row) {
      double mg = 0, mgx = 0;
      for (int64_t i = 0; i < D; ++i) {
        mg += gv[size_t(row * D + i)];
        mgx += double(gv[size_t(row * D + i)]) * xh[size_t(row * D + i)];
      }
      mg /= double(D);
      mgx /= double(D);
      for (int64_t i = 0; i < D; ++i) {
        const size_t k = size_t(row * D + i);
        const float want = float(gv[k] - (center ? mg : 0.0) - xh[k] * mgx) * rs[size_t(row)];
        ASSERT_EQ(dx[k], want) << (center ? "layer" : "rms") << " norm, row " << row << ", column " << i;
      }
    }
    ops::NormResult bad = r;
    bad.rstd = r.rstd.slice(0, 0, R - 1);
    EXPECT_THROW(ops::layer_norm_backward(bad, g), Error);
  }
}

// Elementwise ops read f16 (and bf16) data a chunk at a time instead of through a full f32 copy:
// bit for bit the op on the f32 copy, above the parallel threshold with a partial last chunk, for
// same-shape operands, a row operand cycling across chunk edges (period 130 does not divide the
// 4096-element chunk), and mixed f16 / f32 operands.
TEST(KernelsVsReference, ElementwiseOpsOnF16DataMatchTheirF32Copies) {
  const Shape shape{300, 130};
  for (DType low : {DType::f16, DType::bf16}) {
    const Tensor a = Tensor::randn(shape, 31, 2.0).to(low), b = Tensor::randn(shape, 32, 1.0).to(low);
    const Tensor bias = Tensor::randn({130}, 33, 1.0).to(low);
    const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32), bias32 = bias.to(DType::f32);
    const char* name = low == DType::f16 ? "f16" : "bf16";
    auto same = [&](const Tensor& got, const Tensor& want, const char* what) {
      EXPECT_EQ(got.dtype(), DType::f32) << what;
      EXPECT_EQ(got.to_floats(), want.to_floats()) << name << " " << what;
    };
    same(ops::unary(ops::Unary::gelu_tanh, a, 0.5, 2.0), ops::unary(ops::Unary::gelu_tanh, a32, 0.5, 2.0), "gelu");
    same(ops::unary(ops::Unary::tanh, a, 0.5, 2.0), ops::unary(ops::Unary::tanh, a32, 0.5, 2.0), "tanh");
    same(ops::unary(ops::Unary::square, a), ops::unary(ops::Unary::square, a32), "square");
    const Tensor y = ops::unary(ops::Unary::tanh, a), y32 = y.to(DType::f32);
    same(ops::unary_backward(ops::Unary::gelu_tanh, a, a, b, 0.5), ops::unary_backward(ops::Unary::gelu_tanh, a32, a32, b32, 0.5),
         "gelu backward");
    same(ops::unary_backward(ops::Unary::tanh, a, y, b), ops::unary_backward(ops::Unary::tanh, a32, y32, b32), "tanh backward");
    same(ops::binary(ops::Binary::add, a, b), ops::binary(ops::Binary::add, a32, b32), "add");
    same(ops::binary(ops::Binary::mul, a, b, 0.25, 4.0), ops::binary(ops::Binary::mul, a32, b32, 0.25, 4.0), "scaled mul");
    same(ops::binary(ops::Binary::add, a, bias), ops::binary(ops::Binary::add, a32, bias32), "row add");
    same(ops::binary(ops::Binary::div, a, bias32), ops::binary(ops::Binary::div, a32, bias32), "row div, mixed");
    same(ops::binary(ops::Binary::sub, a32, b), ops::binary(ops::Binary::sub, a32, b32), "mixed sub");
    same(ops::scale_shift(a, 3.0, -1.0), ops::scale_shift(a32, 3.0, -1.0), "scale_shift");
  }
}

// The SLEEF-backed AVX2 GELU and exponential, and the libm loops, against f64 over a wide range
// of inputs (the |x| > 30 limit, exact zeros) and every tail length. GELU's 1 + tanh cancels for
// negative x in f32 whichever tanh is used, so its bound grows with |x| (both forms must meet it).
TEST(KernelsVsReference, VectorMathMatchesF64) {
  if (!kernels::isa_supported(kernels::Isa::avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  const double c = 0.7978845608028654, k3 = 0.044715;
  auto gelu = [&](double v) { return 0.5 * v * (1 + std::tanh(c * (v + k3 * v * v * v))); };
  auto dgelu = [&](double v) {
    if (std::fabs(v) > 30) return v > 0 ? 1.0 : 0.0;
    const double t = std::tanh(c * (v + k3 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * k3 * v * v);
  };
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<const vecmath::Table*> tables = {&vecmath::avx2(), &vecmath::reference()};
  if (kernels::isa_supported(kernels::Isa::avx512)) tables.push_back(&vecmath::avx512());
  for (const vecmath::Table* table : tables) {
    for (int64_t n : {1, 7, 8, 9, 31, 1000}) {
      std::vector<float> x(static_cast<size_t>(n)), g(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (auto& v : x) v = normal(rng);
      for (auto& v : g) v = normal(rng);
      x[0] = n > 2 ? -40.0f : 0.0f;
      if (n > 2) x[1] = 35.0f;
      const char* which = table == &vecmath::reference() ? "reference" : table == &vecmath::avx2() ? "avx2" : "avx512";
      table->gelu_tanh(x.data(), y.data(), n, 0.5f, 2.0f);
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = 0.5 * double(x[i]);
        EXPECT_NEAR(y[i], 2 * gelu(v), 6e-7 * (1 + std::fabs(v) * std::fabs(v))) << which << " gelu x=" << x[i];
      }
      table->gelu_tanh_backward(x.data(), g.data(), y.data(), n, 1.0f);
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i];
        EXPECT_NEAR(y[i], g[i] * dgelu(v), 1e-6 * std::fabs(g[i]) * (1 + v * v * v * v)) << which << " dgelu x=" << x[i];
      }
      const float sum = table->exp_shifted_sum(x.data(), y.data(), n, 0.7f, 2.0f);
      double want_sum = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double e = std::exp(0.7 * double(x[i]) - 2.0);
        want_sum += e;
        EXPECT_NEAR(y[i], e, 2e-6 * e * (1 + std::fabs(x[i]))) << which << " exp x=" << x[i];
      }
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << which << " exp sum n=" << n;
      // COAT's expansion powers (optim/state_format): bases across its range, exponents that
      // are multiples of 1/16 and their inverses; within 1 f64 ulp of libm's pow.
      std::uniform_real_distribution<double> log_base(-20, 20);
      std::vector<double> base(static_cast<size_t>(n)), power(static_cast<size_t>(n));
      for (auto& b : base) b = std::exp(log_base(rng));
      base[0] = 0;
      for (const double e : {1.0 / 16, 0.5, 1.3125, 7.0, 16.0625, 1 / 7.0, 1 / 1.3125}) {
        table->pow_f64(base.data(), e, power.data(), n);
        for (size_t i = 0; i < base.size(); ++i) {
          const double want = std::pow(base[i], e);
          EXPECT_LE(std::fabs(power[i] - want), std::nextafter(want, INFINITY) - want) << which << " pow " << base[i] << "^" << e;
        }
      }
    }
  }
}

// A trailing-row operand (bias, gain) takes the in-place cycling path; a column does not.
TEST(KernelsVsReference, RowAndColumnBroadcastsMatchExpandedOperands) {
  const Tensor x = Tensor::randn({4, 3, 10}, 11);
  for (const Shape& bs : {Shape{10}, Shape{1, 1, 10}, Shape{3, 10}, Shape{4, 3, 1}, Shape{1, 3, 1}}) {
    const Tensor b = Tensor::randn(bs, 12);
    const Tensor be = b.expand(x.shape()).contiguous();
    for (auto op : {ops::Binary::add, ops::Binary::mul, ops::Binary::maximum}) {
      const std::vector<double> got = ops::binary(op, x, b, 2.0, 0.5).to_vector(), want = ops::binary(op, x, be, 2.0, 0.5).to_vector();
      EXPECT_EQ(got, want) << "b " << shape_str(bs);
      // A row in another dtype than the computation (an f16 master bias under f32; f32 under
      // f64): converted at its own size, the same values.
      for (const auto& [xt, bt] : {std::pair{x, b.to(DType::f16)}, std::pair{x.to(DType::f64), b}}) {
        EXPECT_EQ(ops::binary(op, xt, bt, 2.0, 0.5).to_vector(),
                  ops::binary(op, xt, bt.expand(x.shape()).contiguous(), 2.0, 0.5).to_vector())
            << "b " << shape_str(bs) << " " << dtype_name(bt.dtype());
      }
    }
  }
}

// The fused attention against the composition it replaces (slice, permute, q k^T / sqrt(hd),
// causal mask, softmax, P v), forward and gradient, in f32 with several heads: T = 13 is one block
// of query rows, T = 150 three (the last partial), which exercises the skipped upper triangle.
TEST(KernelsVsReference, FusedCausalAttentionMatchesTheComposedOps) {
  for (const int64_t T : {13, 150}) {
    const int64_t B = 3, H = 4, D = 24, hd = D / H;
    const Tensor x = Tensor::randn({B, T, 3 * D}, 21, 1.5), gy = Tensor::randn({B, T, D}, 22);
    const Var a(x, true), c(x, true);
    const Var fused = causal_self_attention(a, H);
    auto heads = [&](int64_t part) { return permute(reshape(slice(c, 2, part * D, (part + 1) * D), {B, T, H, hd}), {0, 2, 1, 3}); };
    const Var scores = mul_scalar(matmul(heads(0), transpose(heads(1), -1, -2)), 1 / std::sqrt(double(hd)));
    const Var composed = reshape(permute(matmul(softmax(causal_mask(scores)), heads(2)), {0, 2, 1, 3}), {B, T, D});
    fused.backward(gy);
    composed.backward(gy);
    const std::vector<double> fy = fused.value().to_vector(), cy = composed.value().to_vector();
    const std::vector<double> fg = a.grad().to_vector(), cg = c.grad().to_vector();
    ASSERT_EQ(fy.size(), cy.size());
    for (size_t i = 0; i < fy.size(); ++i) EXPECT_NEAR(fy[i], cy[i], 1e-5 * (1 + std::fabs(cy[i]))) << i;
    ASSERT_EQ(fg.size(), cg.size());
    for (size_t i = 0; i < fg.size(); ++i) EXPECT_NEAR(fg[i], cg[i], 1e-5 * (1 + std::fabs(cg[i]))) << i;
  }
  EXPECT_THROW(causal_self_attention(Var(Tensor::randn({2, 3, 10}, 1), true), 2), Error);  // 3D = 10
  EXPECT_THROW(causal_self_attention(Var(Tensor::from_indices(std::vector<int64_t>(72, 1), {2, 3, 12})), 2), Error);
}

// f16 and bf16 qkv are widened one head at a time inside the attention kernels: the same result,
// bit for bit, as attention on the f32 copy (forward and backward), with T past a row block.
TEST(KernelsVsReference, AttentionOn16BitQkvEqualsItsF32Copy) {
  const int64_t B = 2, T = 70, H = 3, D = 24;
  for (const DType storage : {DType::f16, DType::bf16}) {
    const Tensor qkv = Tensor::randn({B, T, 3 * D}, 31, 1.5).to(storage), wide = qkv.to(DType::f32);
    const Tensor gy = Tensor::randn({B, T, D}, 32);
    const ops::AttentionResult a = ops::causal_attention(qkv, H, 0.3), b = ops::causal_attention(wide, H, 0.3);
    EXPECT_EQ(a.y.to_vector(), b.y.to_vector()) << dtype_name(storage);
    EXPECT_EQ(a.probs.to_vector(), b.probs.to_vector()) << dtype_name(storage);
    const Tensor da = ops::causal_attention_backward(qkv, a.probs, gy, H, 0.3);
    const Tensor db = ops::causal_attention_backward(wide, b.probs, gy, H, 0.3);
    EXPECT_EQ(da.dtype(), DType::f32);
    EXPECT_EQ(da.to_vector(), db.to_vector()) << dtype_name(storage);
  }
}

// LayerNorm / RMSNorm with the affine fused into the row loop, against the composition
// layer_norm(x) * w + b. Unscaled f32: bit for bit, output and all three gradients, above the
// parallel threshold and with rows wider than the backward's stack buffer. Scaled f16 data
// (SCALIFY's activations and master weights): the composition's output and gradient scales
// exactly, values within f16 rounding (the fused op does not round xhat * w into storage).
TEST(KernelsVsReference, FusedNormAffineMatchesTheComposedOps) {
  for (const bool center : {true, false})
    for (const int64_t D : {int64_t(48), int64_t(1100)}) {
      const int64_t R = 70;
      for (const bool scaled : {false, true}) {
        const DType dt = scaled ? DType::f16 : DType::f32;
        auto make = [&](const Tensor& t, float scale) { return scaled ? ScaledTensor(t.to(dt), scale) : ScaledTensor(t); };
        const ScaledTensor x0 = make(Tensor::randn({R, D}, 31, 2.0), 8.0f), w0 = make(Tensor::randn({D}, 32), 0.5f),
                           b0 = make(Tensor::randn({D}, 33), 0.0625f), g0 = make(Tensor::randn({R, D}, 34), 0x1p-6f);
        const Var xf(x0, true), wf(w0, true), bf(b0, true), xc(x0, true), wc(w0, true), bc(b0, true);
        const Var fused = center ? layer_norm(xf, wf, bf) : rms_norm(xf, wf);
        const Var composed = center ? layer_norm(xc) * wc + bc : rms_norm(xc) * wc;
        fused.backward(g0);
        composed.backward(g0);
        const double tol = scaled ? 4e-3 : 0.0;  // f16: a few roundings of 2^-11 relative
        // Gradients of w and b are sums over rows that cancel: their error is relative to the
        // largest element, not to each (small) sum.
        auto same = [&](const ScaledTensor& a, const ScaledTensor& b, const char* what, double floor = 1e-2) {
          ASSERT_EQ(a.is_scaled(), b.is_scaled()) << what;
          if (a.is_scaled()) {
            ASSERT_EQ(a.scalar_scale(), b.scalar_scale()) << what;
          }
          const std::vector<double> av = a.value().to_vector(), bv = b.value().to_vector();
          ASSERT_EQ(av.size(), bv.size()) << what;
          double top = 0;
          for (double v : bv) top = std::max(top, std::fabs(v));
          for (size_t i = 0; i < av.size(); ++i) {
            if (tol == 0) {
              ASSERT_EQ(av[i], bv[i]) << what << " element " << i;
            } else {
              ASSERT_NEAR(av[i], bv[i], tol * (std::fabs(bv[i]) + floor * top)) << what << " element " << i << " largest " << top;
            }
          }
        };
        const std::string where =
            std::string(center ? "layer" : "rms") + " norm, D " + std::to_string(D) + (scaled ? ", scaled f16" : ", f32");
        SCOPED_TRACE(where);
        same(fused.scaled(), composed.scaled(), "output");
        same(xf.scaled_grad(), xc.scaled_grad(), "dx");
        same(wf.scaled_grad(), wc.scaled_grad(), "dw", 0.25);
        if (center) same(bf.scaled_grad(), bc.scaled_grad(), "db", 0.25);
      }
    }
}

// The vectorised f32 AdamW against the textbook update in f64 over three steps: bias correction,
// decoupled weight decay on one parameter only, a gradient multiplier (clipping). The first
// parameter spans several chunks of the all-parameter pass (optim/param_chunks), so it runs on
// every thread.
TEST(KernelsVsReference, AdamWMatchesTheF64Update) {
  const optim::AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<Var> params = {Var(Tensor::randn({700, 33}, 41), true), Var(Tensor::randn({5}, 42), true)};
  optim::AdamW opt(params, c, {1.0, 0.5}, {true, false});
  std::vector<std::vector<double>> w, m, v;
  for (const Var& p : params) {
    w.push_back(p.value().to_vector());
    m.emplace_back(w.back().size(), 0.0);
    v.emplace_back(w.back().size(), 0.0);
  }
  for (int t = 1; t <= 3; ++t) {
    const double multiplier = t == 2 ? 0.25 : 1.0;
    for (size_t k = 0; k < params.size(); ++k) {
      const Tensor g = Tensor::randn(params[k].shape(), 50 + 10 * t + k);
      params[k].set_grad(ScaledTensor(g));
      const std::vector<double> gv = g.to_vector();
      const double lr = c.lr * (k == 0 ? 1.0 : 0.5), wd = k == 0 ? c.weight_decay : 0.0;
      for (size_t i = 0; i < gv.size(); ++i) {
        const double gi = gv[i] * multiplier;
        m[k][i] = c.beta1 * m[k][i] + (1 - c.beta1) * gi;
        v[k][i] = c.beta2 * v[k][i] + (1 - c.beta2) * gi * gi;
        const double mhat = m[k][i] / (1 - std::pow(c.beta1, t)), vhat = v[k][i] / (1 - std::pow(c.beta2, t));
        w[k][i] -= lr * (mhat / (std::sqrt(vhat) + c.eps) + wd * w[k][i]);
      }
    }
    opt.step(multiplier);
    for (size_t k = 0; k < params.size(); ++k) {
      const std::vector<double> got = params[k].value().to_vector();
      for (size_t i = 0; i < got.size(); ++i)  // updates are ~lr: f32 arithmetic errs by ~1e-7 of them
        ASSERT_NEAR(got[i], w[k][i], 1e-6 * (1 + std::fabs(w[k][i]))) << "step " << t << " parameter " << k << " element " << i;
    }
  }
}

// SCALIFY's AdamW: the fused one-pass step against the composed scaled ops it replaces, bit for
// bit (data and scales of parameters and moments), with f32 and f16 storage, weight decay on one
// parameter, gradient multipliers that are and are not powers of two, over four steps (the first
// runs composed in both: the moments start as ANY-scale zeros). The first parameter spans several
// chunks of the all-parameter pass, and pieces within them.
TEST(KernelsVsReference, FusedScaledAdamWIsBitIdentical) {
  for (DType storage : {DType::f32, DType::f16}) {
    auto make = [&] {
      return std::vector<Var>{Var(ScaledTensor(Tensor::randn({330, 70}, 61).to(storage), 0.125f), true),
                              Var(ScaledTensor(Tensor::randn({70}, 62).to(storage), 4.0f), true)};
    };
    std::vector<Var> a = make(), b = make();
    const optim::AdamWConfig base{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .state_dtype = storage};
    optim::AdamWConfig composed = base;
    composed.fused = false;
    optim::AdamW fast(a, base, {1.0, 0.5}, {true, false}), ref(b, composed, {1.0, 0.5}, {true, false});
    const double multipliers[] = {1.0, 0.3, 0.5, 1.0};
    for (int t = 0; t < 4; ++t) {
      for (size_t k = 0; k < a.size(); ++k) {
        const ScaledTensor g(Tensor::randn(a[k].shape(), 70 + 10 * t + k, 1.0 + t).to(storage), std::ldexp(1.0f, -10 - t));
        a[k].set_grad(g);
        b[k].set_grad(g);
      }
      fast.step(multipliers[t]);
      ref.step(multipliers[t]);
      auto same = [&](const ScaledTensor& x, const ScaledTensor& y, const char* what, size_t k) {
        ASSERT_EQ(x.scalar_scale(), y.scalar_scale()) << what << " " << k << " step " << t;
        ASSERT_EQ(x.data.dtype(), y.data.dtype());
        const std::vector<double> xv = x.data.to_vector(), yv = y.data.to_vector();
        for (size_t i = 0; i < xv.size(); ++i)
          ASSERT_EQ(xv[i], yv[i]) << what << " " << k << " step " << t << " element " << i << " storage " << dtype_name(storage);
      };
      for (size_t k = 0; k < a.size(); ++k) {
        same(a[k].scaled(), b[k].scaled(), "parameter", k);
        same(fast.first_moment(k), ref.first_moment(k), "m", k);
        same(fast.second_moment(k), ref.second_moment(k), "v", k);
      }
    }
  }
}

// The one-pass F16C cast into f16 storage against the bulk encoder plus the infinity fix-up (the
// path under SCALIFY_ISA=scalar), byte for byte: ties, the saturation edge, infinities (kept),
// NaNs with payloads, subnormals, and a wide random sweep of magnitudes.
TEST(KernelsVsReference, F16StorageCastMatchesTheEncoderPlusInfinityFixUp) {
  if (!kernels::isa_supported(kernels::Isa::avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          1e10f,
                          -1e10f,
                          inf,
                          -inf,
                          std::bit_cast<float>(0x7FC00001u),
                          std::bit_cast<float>(0xFF812345u),
                          2.98e-8f,
                          5.96e-8f,
                          -8.9e-8f,
                          1e-45f,
                          6.1e-5f,
                          1.0009765625f,
                          1.00048828125f};
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  for (int i = 0; i < 4000; ++i)
    v.push_back(std::ldexp(1.0f + float(rng() % 4096) / 4096.0f, int(exponent(rng))) * ((rng() & 1) ? 1.0f : -1.0f));
  const Tensor x = Tensor::from_vector(v, {int64_t(v.size())});
  const kernels::Isa native = kernels::active_isa();
  kernels::set_isa(kernels::Isa::avx2);
  const Tensor fast = to_storage(x, DType::f16, "test");
  kernels::set_isa(kernels::Isa::scalar);
  const Tensor ref = to_storage(x, DType::f16, "test");
  kernels::set_isa(native);
  const uint16_t *a = fast.data<uint16_t>(), *b = ref.data<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(a[i], b[i]) << "input " << v[i] << " bits " << std::bit_cast<uint32_t>(v[i]);
}

}  // namespace
}  // namespace scalify
