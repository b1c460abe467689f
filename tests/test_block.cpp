// MX and generic block quantisation against SPEC §5 on hand-built blocks.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"

namespace scalify {
namespace {

std::vector<float> dequant(const BlockQuantized& q) {
  std::vector<float> out(q.rows * q.cols);
  dequantize_blocks(q, out);
  return out;
}

TEST(MxBlocks, AmaxAtAPowerOfTwo) {
  // amax = 32 = 2^5 in e4m3 (emax 8): X = 2^(5-8) = 2^-3, so 32 -> 256, exactly representable.
  std::vector<float> x(32, 1.0f);
  x[3] = -32.0f;
  for (BlockScaleRule rule : {BlockScaleRule::mx_floor, BlockScaleRule::mx_ceil}) {
    const BlockQuantized q = quantize_blocks(x, 1, 32, Format::e4m3, mx_blocks(1, rule));
    ASSERT_EQ(q.scales.size(), 1u);
    EXPECT_EQ(q.scales[0], 0.125f);
    EXPECT_EQ(q.e8m0_scales()[0], 127 - 3);
    EXPECT_EQ(decode(Format::e4m3, uint32_t(q.codes[3])), -256.0f);
    EXPECT_EQ(dequant(q), x);  // 1 and 32 are exact after scaling
  }
}

TEST(MxBlocks, AllZeroBlockGetsTheSmallestScale) {
  std::vector<float> x(64, 0.0f);
  const BlockQuantized q = quantize_blocks(x, 2, 32, Format::e2m1, mx_blocks(1));
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_EQ(q.scales[0], std::ldexp(1.0f, -127));
  EXPECT_EQ(q.e8m0_scales()[0], 0);
  for (std::byte c : q.codes) EXPECT_EQ(uint8_t(c), 0);
  EXPECT_EQ(dequant(q), x);
}

TEST(MxBlocks, NanOrInfInABlockMakesItsScaleNan) {
  std::vector<float> x(64, 0.5f);
  x[5] = std::nanf("");
  x[40] = INFINITY;
  const BlockQuantized q = quantize_blocks(x, 1, 64, Format::e2m1, mx_blocks(1));
  EXPECT_TRUE(std::isnan(q.scales[0]));
  EXPECT_TRUE(std::isnan(q.scales[1]));
  EXPECT_EQ(q.e8m0_scales()[0], 0xFF);
  for (float v : dequant(q)) EXPECT_TRUE(std::isnan(v));  // every element of a NaN block
  x[40] = 0.5f;
  const BlockQuantized q2 = quantize_blocks(x, 1, 64, Format::e2m1, mx_blocks(1));
  const auto back = dequant(q2);
  EXPECT_TRUE(std::isnan(back[0]));
  EXPECT_EQ(back[40], 0.5f);  // the clean block is untouched
}

TEST(MxBlocks, FloorRuleClipsTheTopBinadeRoundUpRuleDoesNot) {
  // e4m3 amax 500: floor(log2 500) = 8 = emax, X = 1, 500 -> 448 (saturated).
  std::vector<float> x(32, 1.0f);
  x[0] = 500.0f;
  const BlockQuantized floor_q = quantize_blocks(x, 1, 32, Format::e4m3, mx_blocks(1));
  EXPECT_EQ(floor_q.scales[0], 1.0f);
  EXPECT_EQ(dequant(floor_q)[0], 448.0f);
  // Round-up: the smallest 2^k with 500 / 2^k <= 448 is k = 1; 250 rounds to 256 in e4m3.
  const BlockQuantized ceil_q = quantize_blocks(x, 1, 32, Format::e4m3, mx_blocks(1, BlockScaleRule::mx_ceil));
  EXPECT_EQ(ceil_q.scales[0], 2.0f);
  EXPECT_EQ(dequant(ceil_q)[0], 512.0f);  // no clipping
  // e2m1 amax 7: floor gives X = 1 and 7 -> 6; round-up gives X = 2 and 3.5 -> 4 (RNE) -> 8.
  std::vector<float> y(32, 0.0f);
  y[0] = 7.0f;
  EXPECT_EQ(dequant(quantize_blocks(y, 1, 32, Format::e2m1, mx_blocks(1)))[0], 6.0f);
  EXPECT_EQ(dequant(quantize_blocks(y, 1, 32, Format::e2m1, mx_blocks(1, BlockScaleRule::mx_ceil)))[0], 8.0f);
}

TEST(MxBlocks, ScaleExponentClampsToE8m0Range) {
  std::vector<float> x(32, std::ldexp(1.0f, -140));  // f32 subnormal amax
  const BlockQuantized q = quantize_blocks(x, 1, 32, Format::e4m3, mx_blocks(1));
  EXPECT_EQ(q.scales[0], std::ldexp(1.0f, -127));  // -140 - 8 clamps to -127
  // 2^-140 / 2^-127 = 2^-13 is below e4m3's smallest subnormal (2^-9): flushes to zero.
  EXPECT_EQ(decode(Format::e4m3, uint32_t(q.codes[0])), 0.0f);
}

// Column blocks take their own path (no transpose): it must give exactly the codes and scales of
// row blocks on the transpose, for MX and f32-amax scales, both FP8 formats, and the edges: a
// NaN column, an all-zero column, values 2^-120 below their block's amax, a huge column.
TEST(MxBlocks, ColumnWiseEqualsRowWiseOfTheTranspose) {
  const size_t R = 70, C = 45;  // partial blocks both ways
  std::mt19937 rng(5);
  std::lognormal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(R * C), xt(R * C);
  for (size_t i = 0; i < R * C; ++i) x[i] = d(rng) * ((rng() & 1) ? 1.0f : -1.0f);
  for (size_t r = 0; r < R; ++r) {
    x[r * C + 3] = 0.0f;                               // an all-zero column
    x[r * C + 5] = r == 40 ? 1e30f : 1e-10f * d(rng);  // tiny values under one huge amax
    x[r * C + 7] = r % 9 == 0 ? -3e38f : 2e38f * float(r % 2);
  }
  x[10 * C + 9] = std::numeric_limits<float>::quiet_NaN();  // one NaN block in column 9
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c < C; ++c) xt[c * R + r] = x[r * C + c];
  for (Format f : {Format::e4m3, Format::e5m2})
    for (BlockScaleRule rule : {BlockScaleRule::mx_floor, BlockScaleRule::mx_ceil, BlockScaleRule::f32_amax}) {
      const BlockSpec spec{32, 1, rule};
      const BlockQuantized col = quantize_blocks(x, R, C, f, spec);
      const BlockQuantized row = quantize_blocks(xt, C, R, f, {1, 32, rule});
      ASSERT_EQ(col.scale_rows(), 3u);
      ASSERT_EQ(col.scale_cols(), C);
      const size_t cb = 1;
      for (size_t r = 0; r < R; ++r)
        for (size_t c = 0; c < C; ++c)
          ASSERT_EQ(col.codes[(r * C + c) * cb], row.codes[(c * R + r) * cb]) << format_name(f) << " " << r << "," << c;
      for (size_t br = 0; br < 3; ++br)
        for (size_t c = 0; c < C; ++c) {
          const float a = col.scales[br * C + c], b = row.scales[c * 3 + br];
          ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << br << "," << c;
        }
    }
}

TEST(MxBlocks, EveryElementIsWithinHalfAQuantumOfItsBlockScale) {
  // Round-to-nearest: |x - q| <= 2^-(M+1) * 2^floor(log2|x|) for unclipped elements.
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(128 * 96);
  for (float& v : x) v = d(rng) * std::exp2(float(int(rng() % 20) - 10));
  for (Format f : {Format::e4m3, Format::e5m2, Format::e3m2, Format::e2m3}) {
    const BlockQuantized q = quantize_blocks(x, 128, 96, f, mx_blocks(1, BlockScaleRule::mx_ceil));
    const auto back = dequant(q);
    for (size_t i = 0; i < x.size(); ++i) {
      const float s = q.scales[(i / 96) * q.scale_cols() + (i % 96) / 32];
      const double quantum = std::max(std::ldexp(1.0, std::ilogb(std::fabs(x[i])) - info(f).man_bits), min_subnormal(f) * s);
      ASSERT_LE(std::fabs(double(back[i]) - x[i]), 0.5 * quantum) << format_name(f) << " " << i;
    }
  }
}

TEST(GenericBlocks, F32ScaleMapsBlockAmaxOntoTheElementMax) {
  const size_t R = 256, C = 256;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(R * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = d(rng) * (1.0f + float(i % C) / 8.0f);
  for (BlockSpec spec : {BlockSpec{1, 128, BlockScaleRule::f32_amax}, BlockSpec{128, 128, BlockScaleRule::f32_amax}}) {
    const BlockQuantized q = quantize_blocks(x, R, C, Format::e4m3, spec);
    EXPECT_EQ(q.scales.size(), (R / spec.rows) * (C / spec.cols));
    const auto back = dequant(q);
    for (size_t br = 0; br < q.scale_rows(); ++br)
      for (size_t bc = 0; bc < q.scale_cols(); ++bc) {
        float amax = 0, err = 0;
        for (size_t r = br * spec.rows; r < (br + 1) * spec.rows; ++r)
          for (size_t c = bc * spec.cols; c < (bc + 1) * spec.cols; ++c) {
            amax = std::max(amax, std::fabs(x[r * C + c]));
            err = std::max(err, std::fabs(back[r * C + c] - x[r * C + c]));
          }
        EXPECT_FLOAT_EQ(q.scales[br * q.scale_cols() + bc], amax / 448.0f);
        // e4m3's top binade has quantum 32 of 448: error <= 16/448 of the block amax (+ f32 eps).
        EXPECT_LE(err, amax * (16.0f / 448.0f) * 1.0001f);
      }
  }
  const BlockQuantized f32q = quantize_blocks(x, R, C, Format::e4m3, {1, 128, BlockScaleRule::f32_amax});
  EXPECT_THROW(f32q.e8m0_scales(), Error) << "f32 scales are not powers of two";
}

TEST(GenericBlocks, BadInputIsAClearError) {
  std::vector<float> x(10);
  EXPECT_THROW(quantize_blocks(x, 3, 4, Format::e4m3, mx_blocks(1)), Error);
  EXPECT_THROW(quantize_blocks(x, 2, 5, Format::e4m3, BlockSpec{0, 4}), Error);
  EXPECT_THROW(mx_blocks(2), Error);
  EXPECT_THROW(quantize_blocks(x, 2, 5, Format::e8m0, mx_blocks(1)), Error);
}

TEST(Block, EmptyTensorsQuantizeToNothing) {
  const std::vector<float> none;
  for (const BlockSpec& spec :
       {mx_blocks(1), mx_blocks(0), BlockSpec{1, 128, BlockScaleRule::f32_amax}, BlockSpec{128, 128, BlockScaleRule::f32_amax}})
    for (auto [rows, cols] : {std::pair<size_t, size_t>{0, 32}, {4, 0}, {0, 0}}) {
      const BlockQuantized q = quantize_blocks(none, rows, cols, Format::e4m3, spec);
      EXPECT_TRUE(q.codes.empty());
      EXPECT_TRUE(q.scales.empty());
      std::vector<float> out;
      dequantize_blocks(q, out);
    }
}

TEST(Block, DequantizeRejectsBlocksThatDoNotMatchTheirShape) {
  std::vector<float> x(4 * 64, 1.5f);
  const BlockQuantized good = quantize_blocks(x, 4, 64, Format::e4m3, mx_blocks(1));
  std::vector<float> out(x.size());
  dequantize_blocks(good, out);
  EXPECT_EQ(out[0], 1.5f);
  BlockQuantized q = good;
  q.scales.pop_back();
  EXPECT_ERROR(dequantize_blocks(q, out), "scales, expected 4 x 2");
  q = good;
  q.rows = 400;  // codes and scales for 4 rows only
  std::vector<float> big(400 * 64);
  EXPECT_ERROR(dequantize_blocks(q, big), "bytes of codes");
  q = good;
  q.codes.resize(10);
  EXPECT_ERROR(dequantize_blocks(q, out), "bytes of codes");
  q = good;
  q.block.cols = 0;
  EXPECT_ERROR(dequantize_blocks(q, out), "block size");
  q = good;
  q.rows = q.cols = size_t(1) << 40;
  EXPECT_ERROR(dequantize_blocks(q, out), "too large");
}

// The whole-row quantiser against the plain definition: for every block, its scale from the
// block's amax and the scalar reference kernel called on each of the block's row segments with
// that scale (mul, then an exact power of two; the element's global index for stochastic
// rounding). Codes must agree bit for bit, for row, column and 2-D blocks, partial edges, every
// scale rule and rounding mode, and blocks holding zeros only, a NaN, or values far below amax.
TEST(Block, WholeRowQuantiserMatchesPerBlockReferenceCalls) {
  // 37 x 70 on one thread; 300 x 130 above the parallel threshold (rows on several threads).
  for (auto [R, C] : {std::pair<size_t, size_t>{37, 70}, std::pair<size_t, size_t>{300, 130}}) {
    std::mt19937 rng(9);
    std::lognormal_distribution<float> d(0.0f, 4.0f);
    std::vector<float> x(R * C);
    for (size_t i = 0; i < R * C; ++i) x[i] = d(rng) * ((rng() & 1) ? 1.0f : -1.0f);
    for (size_t c = 0; c < 8; ++c) x[c] = 0.0f;  // a zero block in the first row
    x[5 * C + 40] = std::numeric_limits<float>::quiet_NaN();
    x[9 * C + 13] = 1e30f;
    x[9 * C + 14] = -1e-12f;
    const kernels::KernelTable& ref = kernels::kernels_for(kernels::Isa::scalar);
    for (const BlockSpec& shape : {BlockSpec{1, 32}, BlockSpec{32, 1}, BlockSpec{4, 8}, BlockSpec{16, 16}})
      for (BlockScaleRule rule : {BlockScaleRule::mx_floor, BlockScaleRule::mx_ceil, BlockScaleRule::f32_amax})
        for (Rounding rounding : {Rounding::nearest_even, Rounding::stochastic})
          for (Format f : {Format::e4m3, Format::e5m2, Format::e2m1}) {
            const BlockSpec spec{shape.rows, shape.cols, rule};
            const BlockQuantized q = quantize_blocks(x, R, C, f, spec, rounding);
            std::vector<std::byte> want(R * C, std::byte{0});
            for (size_t br = 0; br < q.scale_rows(); ++br)
              for (size_t bc = 0; bc < q.scale_cols(); ++bc) {
                const size_t r0 = br * spec.rows, r1 = std::min(R, r0 + spec.rows);
                const size_t c0 = bc * spec.cols, c1 = std::min(C, c0 + spec.cols);
                float amax = 0;
                bool nan = false;
                for (size_t r = r0; r < r1; ++r)
                  for (size_t c = c0; c < c1; ++c) {
                    nan = nan || std::isnan(x[r * C + c]);
                    amax = std::max(amax, std::fabs(x[r * C + c]));
                  }
                const float scale = block_scale(nan ? std::numeric_limits<float>::quiet_NaN() : amax, f, rule);
                ASSERT_TRUE(q.scales[br * q.scale_cols() + bc] == scale || (nan && std::isnan(q.scales[br * q.scale_cols() + bc])));
                if (nan) continue;
                kernels::QuantizeArgs a{};
                a.format = &info(f);
                if (rule == BlockScaleRule::f32_amax) {
                  split_scale(1.0f / scale, a.mul, a.exp_shift);
                } else {
                  a.mul = 1.0f;
                  a.exp_shift = -std::ilogb(scale);
                }
                a.overflow = Overflow::saturate;
                a.rounding = rounding;
                for (size_t r = r0; r < r1; ++r) {
                  a.offset = r * C + c0;
                  ref.quantize(&x[r * C + c0], c1 - c0, &want[r * C + c0], a);
                }
              }
            for (size_t i = 0; i < R * C; ++i)
              ASSERT_EQ(q.codes[i], want[i]) << format_name(f) << " block " << spec.rows << "x" << spec.cols << " rule " << int(rule)
                                             << " rounding " << int(rounding) << " element " << i << " of " << R << "x" << C;
          }
  }
}

}  // namespace
}  // namespace scalify

namespace scalify {
namespace {

// dequantize_blocks decodes whole rows with the SIMD kernel, then applies each block's scale; the
// plain reference decodes each code and multiplies by its block's scale in f32.
TEST(Block, DequantizeMatchesElementwiseDecodeTimesTheBlockScale) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    size_t rows, cols;
    Format element;
    BlockSpec spec;
  };
  const Case cases[] = {{3, 70, Format::e4m3, mx_blocks(1)},
                        {64, 5, Format::e5m2, mx_blocks(0)},
                        {4, 100, Format::e2m1, mx_blocks(1)},
                        {5, 130, Format::e4m3, {1, 128, BlockScaleRule::f32_amax}},
                        {130, 9, Format::e5m2, {128, 128, BlockScaleRule::f32_amax}}};
  for (const Case& c : cases) {
    std::vector<float> x(c.rows * c.cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, int(i % 40) - 20);
    const BlockQuantized q = quantize_blocks(x, c.rows, c.cols, c.element, c.spec);
    const std::vector<float> out = dequant(q);
    const size_t cb = size_t(info(c.element).storage_bytes());
    for (size_t r = 0; r < c.rows; ++r)
      for (size_t col = 0; col < c.cols; ++col) {
        uint32_t code = 0;
        std::memcpy(&code, &q.codes[(r * c.cols + col) * cb], cb);
        const float scale = q.scales[(r / q.block.rows) * q.scale_cols() + col / q.block.cols];
        ASSERT_EQ(out[r * c.cols + col], decode(c.element, code) * scale) << format_name(c.element) << " " << r << "," << col;
      }
  }
}

// A range of rows decodes as the whole tensor does, bit for bit (tall, wide and 2-D blocks, NVFP4's
// tensor scale, NaN blocks), and a range outside the tensor or a buffer of the wrong size is refused.
TEST(Block, DequantizeRowsIsTheSameRowsOfTheWholeDequantisation) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    size_t rows, cols;
    Format element;
    BlockSpec spec;
  };
  const Case cases[] = {{70, 33, Format::e4m3, mx_blocks(0)},
                        {5, 100, Format::e5m2, mx_blocks(1)},
                        {40, 48, Format::e2m1, {16, 16, BlockScaleRule::nvfp4}},
                        {33, 20, Format::e2m1, {1, 16, BlockScaleRule::nvfp4}},
                        {130, 9, Format::e5m2, {128, 128, BlockScaleRule::f32_amax}}};
  for (const Case& c : cases) {
    std::vector<float> x(c.rows * c.cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, int(i % 40) - 20);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    const BlockQuantized q = quantize_blocks(x, c.rows, c.cols, c.element, c.spec);
    const std::vector<float> whole = dequant(q);
    for (auto [r0, r1] : {std::pair<size_t, size_t>{0, c.rows}, {1, 4}, {c.rows - 1, c.rows}, {2, 2}}) {
      std::vector<float> part((r1 - r0) * c.cols);
      dequantize_block_rows(q, r0, r1, part);
      for (size_t i = 0; i < part.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(part[i]), std::bit_cast<uint32_t>(whole[r0 * c.cols + i]))
            << format_name(c.element) << " rows [" << r0 << ", " << r1 << ") element " << i;
    }
  }
  const BlockQuantized q = quantize_blocks(std::vector<float>(4 * 64, 1.5f), 4, 64, Format::e4m3, mx_blocks(1));
  std::vector<float> two_rows(2 * 64);
  EXPECT_ERROR(dequantize_block_rows(q, 3, 5, two_rows), "rows [3, 5) of 4");
  EXPECT_ERROR(dequantize_block_rows(q, 2, 1, two_rows), "rows [2, 1) of 4");
  EXPECT_ERROR(dequantize_block_rows(q, 0, 1, two_rows), "into 128 values");
}

// The one-pass bf16 dequantisation against the f32 one truncated: MX blocks of FP8 codes (power-of-
// two scales, above and below the parallel threshold, partial blocks) are bf16 values and convert;
// f32-amax block scales leave bits below bf16's mantissa and decline, as does a 2^-64 value
// (bf16 dot products flush its subnormal products).
TEST(Block, Bf16DequantizeEqualsTheF32OneWhereExactAndDeclinesElsewhere) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bf16_of = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = uint16_t(std::bit_cast<uint32_t>(v[i]) >> 16);
    return h;
  };
  for (auto [rows, cols, spec] : {std::tuple{size_t(300), size_t(200), mx_blocks(1)}, std::tuple{size_t(70), size_t(33), mx_blocks(0)},
                                  std::tuple{size_t(3), size_t(70), mx_blocks(1)}}) {
    for (Format element : {Format::e4m3, Format::e5m2}) {
      std::vector<float> x(rows * cols);
      for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, int(i % 30) - 15);
      const BlockQuantized q = quantize_blocks(x, rows, cols, element, spec);
      std::vector<uint16_t> h(x.size());
      ASSERT_TRUE(dequantize_blocks_bf16(q, h)) << format_name(element);
      EXPECT_EQ(h, bf16_of(dequant(q))) << format_name(element) << " " << rows << "x" << cols;
    }
  }
  std::vector<float> x(5 * 130);
  for (float& v : x) v = normal(rng);
  std::vector<uint16_t> h(x.size());
  EXPECT_FALSE(dequantize_blocks_bf16(quantize_blocks(x, 5, 130, Format::e4m3, {1, 128, BlockScaleRule::f32_amax}), h));
  std::vector<float> big(300 * 200);  // rows on several threads: one inexact row declines the whole
  for (float& v : big) v = normal(rng);
  std::vector<uint16_t> hbig(big.size());
  EXPECT_FALSE(dequantize_blocks_bf16(quantize_blocks(big, 300, 200, Format::e4m3, {128, 128, BlockScaleRule::f32_amax}), hbig));
  std::fill(x.begin(), x.end(), 1.0f);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  x[77] = std::ldexp(1.0f, -64);  // alone in its block, so the block's scale does not round it away
  EXPECT_FALSE(dequantize_blocks_bf16(quantize_blocks(x, 5, 130, Format::e4m3, mx_blocks(1)), h));
  x[77] = std::ldexp(1.0f, -63);
  EXPECT_TRUE(dequantize_blocks_bf16(quantize_blocks(x, 5, 130, Format::e4m3, mx_blocks(1)), h));
  BlockQuantized bad = quantize_blocks(x, 5, 130, Format::e4m3, mx_blocks(1));
  bad.scales.pop_back();
  EXPECT_ERROR(dequantize_blocks_bf16(bad, h), "dequantize_blocks_bf16: ");
}

}  // namespace
}  // namespace scalify
