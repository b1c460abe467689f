// Every scaling strategy against the formulas of SPEC §4-§5 on hand-built tensors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/quant/quantizer.hpp"

namespace scalify::quant {
namespace {

Tensor vec(std::vector<float> v) {
  const int64_t n = int64_t(v.size());
  return Tensor::from_vector(v, {n});
}

QuantizerConfig cfg(Scaling s, Format f = Format::e4m3) {
  QuantizerConfig c;
  c.scaling = s;
  c.format = f;
  return c;
}

TEST(Quantizer, CurrentScalingMapsAmaxOntoTheFormatMax) {
  Quantizer q(cfg(Scaling::current));
  const Quantized out = q.quantize(vec({4.0f, -1.0f, 0.5f, 0.0f}));  // amax 4 = 2^2
  EXPECT_FLOAT_EQ(q.last().scale, 4.0f / 448.0f);
  EXPECT_EQ(q.last().amax, 4.0f);
  EXPECT_EQ(out.per_tensor.data.at({0}), 448.0);  // the amax element lands on max exactly
  EXPECT_EQ(out.dequantize().to_vector()[0], 4.0);
  QuantizerConfig m = cfg(Scaling::current);
  m.margin = 1;
  Quantizer qm(m);
  EXPECT_EQ(qm.quantize(vec({4.0f})).per_tensor.data.at({0}), 224.0);  // (F / amax) / 2^1
}

// With counting off (the trainer's unrecorded steps) the codes and scales are the same and the
// underflow/clip counts keep their last values; on again, they are counted.
TEST(Quantizer, StatisticsSwitchLeavesCodesAndScalesAlone) {
  Quantizer a(cfg(Scaling::current)), b(cfg(Scaling::current));
  const Tensor x = vec({4.0f, 1e-6f, -1.0f, 0.0f});  // 1e-6 underflows e4m3 at scale 448/4
  const Quantized qa = a.quantize(x);
  set_collect_statistics(false);
  const Quantized qb = b.quantize(x);
  set_collect_statistics(true);
  EXPECT_EQ(qa.per_tensor.data.to_vector(), qb.per_tensor.data.to_vector());
  EXPECT_EQ(a.last().scale, b.last().scale);
  EXPECT_GT(a.last().underflow, 0.3);
  EXPECT_EQ(b.last().underflow, 0.0) << "not counted while off";
  b.quantize(x);
  EXPECT_EQ(b.last().underflow, a.last().underflow);
}

// The flushed values' share of the squared norm, worked by hand: at scale 448/4, e4m3's smallest
// subnormal 2^-9 halves to an underflow limit of 2^-10 * 4/448 = 8.7e-6, so 1e-6 and 5e-6 flush and
// 2e-5 survives: (1e-12 + 25e-12) / (16 + 1 + 1e-12 + 25e-12 + 4e-10). Block quantisation counts the same way.
TEST(Quantizer, UnderflowEnergyIsTheFlushedValuesShareOfTheSquaredNorm) {
  Quantizer q(cfg(Scaling::current));
  q.quantize(vec({4.0f, 1e-6f, -1.0f, 5e-6f, 2e-5f, 0.0f}));
  const double e = double(1e-6f) * double(1e-6f) + double(5e-6f) * double(5e-6f);
  const double all = 16.0 + 1.0 + e + double(2e-5f) * double(2e-5f);
  EXPECT_NEAR(q.last().underflow, 2.0 / 5.0, 1e-15);
  EXPECT_NEAR(q.last().underflow_energy, e / all, 1e-6 * e / all);
  QuantizerConfig mx = cfg(Scaling::mx);
  Quantizer b(mx);
  std::vector<float> row(32, 0.0f);
  row[0] = 4.0f;   // the block's amax: scale 2^(2-8) = 2^-6, smallest subnormal 2^-15
  row[1] = 1e-6f;  // below 2^-16: flushed
  row[2] = 0.25f;  // kept
  b.quantize(Tensor::from_vector(row, {1, 32}));
  EXPECT_NEAR(b.last().underflow, 1.0 / 3.0, 1e-15);
  const double e1 = double(1e-6f) * double(1e-6f);
  EXPECT_NEAR(b.last().underflow_energy, e1 / (16.0 + 0.0625 + e1), 1e-6 * e1 / 16);
}

// The quantiser encodes in chunks (f16 data decoded a chunk at a time, statistics counted per
// chunk, in parallel): codes, amax and statistics must equal one whole-tensor quantize_amax of the
// same values, for f32 and f16 inputs, nearest and stochastic rounding (each chunk draws its bits
// at its global offset), on a size that ends in a partial chunk. A NaN into FP4 is an error.
// Stochastic rounding draws fresh bits at every quantisation step (its seed is the quantiser's
// step count), and a quantiser restored from a checkpoint's state draws the same bits again.
TEST(Quantizer, StochasticRoundingDrawsFreshBitsPerStepAndRepeatsThemOnResume) {
  const Tensor x = Tensor::randn({4096}, 31, 0.1);
  QuantizerConfig c = cfg(Scaling::current);
  c.rounding = Rounding::stochastic;
  Quantizer q(c);
  const std::vector<float> first = q.quantize(x).per_tensor.data.to_floats();
  const QuantizerState after_one = q.state();
  const std::vector<float> second = q.quantize(x).per_tensor.data.to_floats();
  EXPECT_NE(first, second) << "the same bits twice: stochastic rounding's noise would not average out over steps";
  Quantizer resumed(c);
  resumed.load_state(after_one);
  EXPECT_EQ(resumed.quantize(x).per_tensor.data.to_floats(), second);
}

TEST(Quantizer, ChunkedEncodeEqualsOneWholeTensorCall) {
  const int64_t n = 300007;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::ldexp(float((i * 7919) % 2001 - 1000) / 1000.0f, int(i % 36) - 24);
  const Tensor x32 = Tensor::from_vector(v, {n});
  for (const Tensor& x : {x32, x32.to(DType::f16)}) {
    const std::vector<float> exact = x.to_floats();  // the values the quantiser sees
    for (Rounding rounding : {Rounding::nearest_even, Rounding::stochastic}) {
      QuantizerConfig c = cfg(Scaling::constant_bias);
      c.bias = 3;
      c.rounding = rounding;
      Quantizer q(c);
      const Quantized out = q.quantize(x);
      std::vector<std::byte> want(static_cast<size_t>(n));
      QuantizeOptions opt;
      opt.rounding = rounding;
      opt.seed = uint64_t(q.steps());  // stochastic rounding draws its bits from the quantiser's step count
      const float amax = quantize_amax(exact, Format::e4m3, 8.0f, want, opt);
      const std::vector<float> got = out.per_tensor.data.to_floats();
      std::vector<float> want_values(static_cast<size_t>(n));
      dequantize(want, Format::e4m3, 1.0f, want_values);
      ASSERT_EQ(got, want_values) << dtype_name(x.dtype()) << (rounding == Rounding::stochastic ? " stochastic" : "");
      EXPECT_EQ(q.last().amax, amax);
      int64_t nonzero = 0, under = 0, clip = 0;
      for (float e : exact) {
        const float a = std::fabs(e) * 8.0f;
        nonzero += a != 0;
        under += a != 0 && a <= 0.5f * std::ldexp(1.0f, -9);
        clip += a > 448.0f;
      }
      ASSERT_GT(under, 0);
      ASSERT_GT(clip, 0);
      EXPECT_DOUBLE_EQ(q.last().underflow, double(under) / double(nonzero));
      EXPECT_DOUBLE_EQ(q.last().clipped, double(clip) / double(n));
    }
  }
  std::vector<float> with_nan = v;
  with_nan[200000] = std::numeric_limits<float>::quiet_NaN();
  Quantizer fp4(cfg(Scaling::none, Format::e2m1));
  EXPECT_THROW(fp4.quantize(Tensor::from_vector(with_nan, {n})), Error);
}

// as_values (an f32 GEMM's operands): the codes' values, bit for bit, with the same scales and
// statistics, for every per-tensor strategy; overflow to inf (non-saturating e5m2) and NaN kept.
TEST(Quantizer, ValuesEqualTheDecodedCodes) {
  const int64_t n = 20011;
  std::vector<float> v = Tensor::randn({n}, 3, 40.0).to_floats();
  v[17] = std::numeric_limits<float>::quiet_NaN();
  v[18] = 1e6f;
  const Tensor x32 = Tensor::from_vector(v, {n});
  for (const Tensor& x : {x32, x32.to(DType::f16)})
    for (Scaling scaling :
         {Scaling::none, Scaling::scalify, Scaling::current, Scaling::delayed, Scaling::amax_bias, Scaling::constant_bias})
      for (const bool saturate : {true, false})
        for (Rounding rounding : {Rounding::nearest_even, Rounding::stochastic}) {
          QuantizerConfig c = cfg(scaling, Format::e5m2);
          c.saturate = saturate;
          c.rounding = rounding;
          Quantizer codes(c), values(c);
          for (int step = 0; step < 2; ++step) {  // delayed: the second step uses the history
            const ScaledTensor in(x, 0.5f);
            const Quantized a = codes.quantize(in), b = values.quantize(in, true);
            const std::string what = std::string(scaling_name(scaling)) + (saturate ? "" : ", not saturating") + ", " +
                                     std::string(dtype_name(x.dtype())) + ", step " + std::to_string(step);
            ASSERT_EQ(b.per_tensor.data.dtype(), DType::f32) << what;
            ASSERT_EQ(a.per_tensor.scalar_scale(), b.per_tensor.scalar_scale()) << what;
            const std::vector<float> want = a.per_tensor.data.to_floats(), got = b.per_tensor.data.to_floats();
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << what << " element " << i;
            EXPECT_EQ(std::bit_cast<uint32_t>(codes.last().amax), std::bit_cast<uint32_t>(values.last().amax)) << what;
            EXPECT_EQ(codes.last().clipped, values.last().clipped) << what;
            EXPECT_EQ(codes.last().underflow, values.last().underflow) << what;
          }
        }
}

TEST(Quantizer, ZeroOrNonFiniteAmaxKeepsThePreviousScale) {
  Quantizer q(cfg(Scaling::current));
  q.quantize(vec({0.0f, 0.0f}));
  EXPECT_EQ(q.last().scale, 1.0f);  // nothing to scale by: the initial scale 1
  q.quantize(vec({1.0f, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(q.last().scale, 1.0f);
  const Quantized nan = q.quantize(vec({1.0f, std::nanf("")}));
  EXPECT_EQ(q.last().scale, 1.0f);
  EXPECT_TRUE(std::isnan(nan.dequantize().to_vector()[1]));  // e4m3 carries the NaN through
}

TEST(Quantizer, DelayedScalingUsesTheHistoryOfPastSteps) {
  QuantizerConfig c = cfg(Scaling::delayed);
  c.history = 2;
  Quantizer q(c);
  const float F = 448;
  // Step 1 quantises with the initial scale 1 and records amax 1.
  q.quantize(vec({1.0f}));
  EXPECT_EQ(q.last().scale, 1.0f);
  EXPECT_EQ(q.delayed_scale(), F / 1);
  // Step 2: amax 8 is recorded while quantising with the scale from amax 1: 8 * 448 clips.
  q.quantize(vec({8.0f, 0.5f}));
  EXPECT_EQ(q.last().scale, 1.0f / F);
  EXPECT_EQ(q.last().clipped, 0.5);
  EXPECT_EQ(q.delayed_scale(), F / 8);  // max of {1, 8}
  q.quantize(vec({2.0f}));
  EXPECT_EQ(q.delayed_scale(), F / 8);  // max of {8, 2}: the window holds 8 still
  q.quantize(vec({4.0f}));
  EXPECT_EQ(q.delayed_scale(), F / 4);  // {2, 4}: 8 has rolled out
  q.quantize(vec({0.0f}));
  EXPECT_EQ(q.delayed_scale(), F / 4);  // {4, 0}: max 4

  QuantizerConfig r = c;
  r.reduce = HistoryReduce::most_recent;
  Quantizer qr(r);
  for (float a : {1.0f, 8.0f, 2.0f}) qr.quantize(vec({a}));
  EXPECT_EQ(qr.delayed_scale(), F / 2);
  qr.quantize(vec({0.0f}));
  EXPECT_EQ(qr.delayed_scale(), F / 2);  // most recent amax 0: keep the previous scale
  qr.quantize(vec({std::nanf("")}));
  EXPECT_EQ(qr.delayed_scale(), F / 2);  // not finite: keep

  QuantizerConfig u = c;
  u.update_interval = 2;
  Quantizer qu(u);
  qu.quantize(vec({1.0f}));
  EXPECT_EQ(qu.delayed_scale(), 1.0f);  // not yet: every second step
  qu.quantize(vec({2.0f}));
  EXPECT_EQ(qu.delayed_scale(), F / 2);
}

TEST(Quantizer, ScalingBiasFromAmaxAndConstant) {
  QuantizerConfig c = cfg(Scaling::amax_bias);
  Quantizer q(c);
  q.quantize(vec({3.0f, 1.0f}));  // F / amax = 149.3: b = floor(log2 149.3) = 7
  EXPECT_EQ(q.last().bias, 7);
  EXPECT_EQ(q.last().scale, std::ldexp(1.0f, -7));
  const Quantized exact = q.quantize(vec({56.0f}));  // F / 56 = 8 exactly: b = 3, 56 -> 448
  EXPECT_EQ(q.last().bias, 3);
  EXPECT_EQ(exact.per_tensor.data.at({0}), 448.0);
  c.margin = 2;  // gradients: extra headroom
  Quantizer qm(c);
  qm.quantize(vec({3.0f}));
  EXPECT_EQ(qm.last().bias, 5);
  QuantizerConfig k = cfg(Scaling::constant_bias, Format::e5m2);
  k.bias = -2;
  Quantizer qk(k);
  const Quantized out = qk.quantize(vec({96.0f, 1e-5f}));
  EXPECT_EQ(out.per_tensor.data.at({0}), 24.0);
  EXPECT_EQ(qk.last().bias, -2);
  EXPECT_EQ(qk.last().underflow, 0.5);  // 1e-5 / 4 is below e5m2's smallest subnormal / 2
}

TEST(Quantizer, ScalifyCastsTheDataAndKeepsTheScale) {
  Quantizer q(cfg(Scaling::scalify));
  const ScaledTensor x(vec({1.3f, -0.7f}), 8.0f);
  const Quantized out = q.quantize(x);
  EXPECT_EQ(out.per_tensor.scalar_scale(), 8.0f);
  EXPECT_EQ(out.per_tensor.data.dtype(), DType::e4m3);
  EXPECT_EQ(out.dequantize().to_vector(), (std::vector<double>{1.25 * 8, -0.6875 * 8}));
}

TEST(Quantizer, BlockAndMxQuantiseAlongRows) {
  const Tensor x = Tensor::randn({4, 256}, 3, 5.0);
  Quantizer mx(cfg(Scaling::mx));
  QuantizerConfig b = cfg(Scaling::block);
  Quantizer blk(b);
  // e4m3 rounding: relative error <= 2^-4; MX's floor rule may also clip the top binade
  // (448 of up to 512: 12.5 %).
  for (auto [q, rel] : {std::pair{&mx, 1.0 / 8}, std::pair{&blk, 1.0 / 16}}) {
    const Quantized out = q->quantize(x);
    ASSERT_TRUE(out.blockwise);
    const std::vector<double> back = out.dequantize().to_vector(), in = x.to_vector();
    for (size_t i = 0; i < in.size(); ++i) ASSERT_NEAR(back[i], in[i], std::fabs(in[i]) * rel + 1e-3);
  }
  EXPECT_EQ(mx.quantize(x).blocks.block.cols, 32u);
  EXPECT_THROW(mx.quantize(Tensor::zeros({2, 2, 2})), Error);
}

TEST(Quantizer, MxWithFp6AndFp4Elements) {
  // MX element formats other than FP8: e3m2 / e2m3 (FP6) and e2m1 (FP4). Each element is within
  // half a quantum of its block's grid or clipped by the floor rule's partial top binade:
  // |error| <= 2^-(M+1) |x| + (top-binade clip) + half the smallest subnormal times the scale.
  const Tensor x = Tensor::randn({8, 64}, 9, 2.0);
  for (Format f : {Format::e3m2, Format::e2m3, Format::e2m1}) {
    Quantizer q(cfg(Scaling::mx, f));
    const Quantized out = q.quantize(x);
    const std::vector<double> back = out.dequantize().to_vector(), in = x.to_vector();
    const double rel = std::ldexp(1.0, -(info(f).man_bits + 1)) + (1 - max_value(f) / std::ldexp(1.0, info(f).emax() + 1));
    for (size_t i = 0; i < in.size(); ++i) {
      const double scale = out.blocks.scales[(i / 64) * out.blocks.scale_cols() + (i % 64) / 32];
      ASSERT_LE(std::fabs(back[i] - in[i]), rel * std::fabs(in[i]) + 0.5 * min_subnormal(f) * scale + 1e-12)
          << format_name(f) << " element " << i;
    }
    EXPECT_EQ(out.blocks.element, f);
  }
}

// The block quantisers' statistics (counted as each row or block row is written, in parallel) against the
// plain count over the whole dequantised tensor: amax (NaN when one is), underflow (non-zero finite
// inputs decoded as 0), clipped (beyond the block's largest value, with the 2^-20 allowance), their
// energy. MX rows and columns, NVFP4 with its tensor scale, f32 blocks; NaN, inf, zeros,
// subnormals and values far below their block; tensors below and above the parallel threshold.
TEST(Quantizer, BlockStatisticsMatchThePlainCount) {
  struct Reference {
    float amax = 0;
    int64_t nonzero = 0, underflow = 0, clipped = 0;
    double energy = 0, under_energy = 0;
  };
  auto plain = [](const std::vector<float>& x, const BlockQuantized& q) {
    const std::vector<double> back = [&] {
      std::vector<float> f(x.size());
      dequantize_blocks(q, f);
      return std::vector<double>(f.begin(), f.end());
    }();
    Reference r;
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = std::fabs(x[i]);
      r.amax = std::isnan(v) || std::isnan(r.amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(r.amax, v);
      if (v == 0 || !std::isfinite(v)) continue;
      ++r.nonzero;
      r.underflow += back[i] == 0;
      r.energy += double(v) * v;
      r.under_energy += back[i] == 0 ? double(v) * v : 0.0;
      const size_t row = i / q.cols, col = i % q.cols;
      const double top = max_value(q.element) * q.scales[(row / q.block.rows) * q.scale_cols() + col / q.block.cols] * q.tensor_scale;
      r.clipped += top > 0 && v > top * (1 + 0x1p-20);
    }
    return r;
  };
  struct Case {
    int64_t rows, cols;
    QuantizerConfig config;
  };
  QuantizerConfig mx_cols = cfg(Scaling::mx), mx_e5m2 = cfg(Scaling::mx, Format::e5m2), nv = cfg(Scaling::block, Format::e2m1),
                  nv_rows = nv, f32_blocks = cfg(Scaling::block);
  mx_cols.block = {32, 1, BlockScaleRule::mx_floor};
  nv.block = {16, 16, BlockScaleRule::nvfp4};
  nv_rows.block = {1, 16, BlockScaleRule::nvfp4};
  const Case cases[] = {{7, 70, cfg(Scaling::mx)}, {300, 200, cfg(Scaling::mx)}, {300, 200, mx_cols}, {257, 130, mx_e5m2}, {70, 48, nv},
                        {300, 200, nv_rows},       {260, 130, f32_blocks}};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Case& c : cases)
    for (int special = 0; special < 2; ++special) {
      std::vector<float> x(size_t(c.rows * c.cols));
      for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, int(i % 31) * 2 - 30);
      x[5] = 0.0f;
      x[6] = -0.0f;
      x[7] = 1e-41f;    // subnormal
      x[40] = 3000.0f;  // its block's smaller values underflow
      x[100] = -1e30f;  // far beyond the rest
      if (special) {
        x[x.size() / 2] = std::numeric_limits<float>::infinity();
        x[x.size() - 3] = std::numeric_limits<float>::quiet_NaN();
      }
      const Tensor xt = Tensor::from_vector(x, {c.rows, c.cols});
      Quantizer q(c.config);
      const Quantized out = q.quantize(xt);
      const Reference r = plain(x, out.blocks);
      const std::string what = std::string(scaling_name(c.config.scaling)) + " " + std::string(format_name(c.config.format)) + " " +
                               std::to_string(c.rows) + "x" + std::to_string(c.cols) + (special ? " with inf and NaN" : "");
      if (std::isnan(r.amax)) {
        EXPECT_TRUE(std::isnan(q.last().amax)) << what;
      } else {
        EXPECT_EQ(q.last().amax, r.amax) << what;
      }
      EXPECT_EQ(q.last().underflow, double(r.underflow) / double(r.nonzero)) << what;
      EXPECT_EQ(q.last().clipped, double(r.clipped) / double(r.nonzero)) << what;
      EXPECT_GT(r.underflow, 0) << what << ": the case tests nothing";
      if (c.config.scaling == Scaling::mx) {
        EXPECT_GT(r.clipped, 0) << what << ": the floor rule clips no top binade";
      }
      // The same sums in another order.
      EXPECT_NEAR(q.last().underflow_energy, r.under_energy / r.energy, 1e-12 * (r.under_energy / r.energy)) << what;
    }
}

TEST(Quantizer, NamesParseAndBadConfigIsAnError) {
  EXPECT_EQ(parse_scaling("delayed"), Scaling::delayed);
  EXPECT_THROW(parse_scaling("later"), Error);
  QuantizerConfig c;
  c.history = 0;
  EXPECT_THROW(Quantizer{c}, Error);
}

TEST(Quantizer, EmptyTensorsUnderBlockAndMxScaling) {
  for (Scaling s : {Scaling::block, Scaling::mx})
    for (const Shape& shape : {Shape{0, 32}, Shape{4, 0}}) {
      Quantizer q(cfg(s));
      const Quantized out = q.quantize(Tensor::zeros(shape));
      EXPECT_TRUE(out.blockwise);
      EXPECT_EQ(out.dequantize().shape(), shape);
      EXPECT_EQ(q.last().scale, 1.0f);
    }
}

TEST(Quantizer, OutOfRangeMarginBiasOrBlockIsAnErrorAtConstruction) {
  QuantizerConfig c = cfg(Scaling::constant_bias);
  c.bias = std::numeric_limits<int>::min();  // -bias would overflow
  EXPECT_ERROR(Quantizer{c}, "bias must be in [-64, 64]");
  c.bias = 65;
  EXPECT_ERROR(Quantizer{c}, "bias must be in [-64, 64]");
  c = cfg(Scaling::current);
  c.margin = 1000;
  EXPECT_ERROR(Quantizer{c}, "margin must be in [-64, 64]");
  c = cfg(Scaling::block);
  c.block.cols = 0;
  EXPECT_ERROR(Quantizer{c}, "block must be [rows, cols]");
  c.bias = 64;
  c.margin = -64;
  c.block.cols = 4096;
  EXPECT_NO_THROW(Quantizer{c});
}

TEST(Quantizer, AllSubnormalInputSaturatesTheScaleToTheLargestPowerOfTwo) {
  // amax 1e-45 asks for a scale of 448 / 1e-45, beyond f32: the scale saturates at 2^127
  // (decode 2^-127), as TransformerEngine does, instead of becoming inf.
  const Tensor x = Tensor::full({4, 8}, 1e-45);
  for (Scaling s : {Scaling::current, Scaling::amax_bias, Scaling::delayed}) {
    Quantizer q(cfg(s));
    Quantized out;
    ASSERT_NO_THROW(out = q.quantize(x)) << scaling_name(s);
    ASSERT_NO_THROW(out = q.quantize(x)) << scaling_name(s);  // delayed: now from the history
    EXPECT_EQ(q.last().scale, std::ldexp(1.0f, -127)) << scaling_name(s);
    for (double v : out.dequantize().to_vector()) ASSERT_TRUE(std::isfinite(v));
  }
  // f16 keeps the tiny values: 1e-45 * 2^127 is well inside its range.
  Quantizer q(cfg(Scaling::current, Format::f16));
  EXPECT_FLOAT_EQ(float(q.quantize(x).dequantize().to_vector()[0]), 1e-45f);
}

}  // namespace
}  // namespace scalify::quant
