// FP4 training's pieces (issue 31): NVFP4 and MXFP4 block quantisation bit for bit against a
// reference computed from the published definitions (tests/data/fp4/make_reference.py, plain
// Python), the block GEMM on NVFP4 operands, the random Hadamard transform against its definition,
// stochastic rounding of blocks, and the FP4 recipes' checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "hadamard_reference.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/quant/block_gemm.hpp"
#include "scalify/quant/hadamard.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify {
namespace {

struct ReferenceCase {
  std::string name;
  BlockScaleRule rule;
  size_t rows, cols;
  BlockSpec spec;
  std::vector<float> x, scales;
  std::vector<uint8_t> codes;
  float tensor_scale;
};

std::vector<float> hex_floats(std::istringstream& in) {
  std::vector<float> v;
  std::string w;
  while (in >> w) v.push_back(std::strtof(w.c_str(), nullptr));
  return v;
}

std::vector<ReferenceCase> reference_cases() {
  std::ifstream f(SCALIFY_FP4_REFERENCE);
  EXPECT_TRUE(f.good()) << SCALIFY_FP4_REFERENCE;
  std::vector<ReferenceCase> cases;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "case") {
      ReferenceCase c;
      std::string rule;
      size_t br, bc;
      in >> c.name >> rule >> c.rows >> c.cols >> br >> bc;
      c.rule = rule == "nvfp4"       ? BlockScaleRule::nvfp4
               : rule == "e4m3_amax" ? BlockScaleRule::e4m3_amax
               : rule == "mx_floor"  ? BlockScaleRule::mx_floor
                                     : BlockScaleRule::mx_ceil;
      c.spec = {br, bc, c.rule};
      cases.push_back(c);
    } else if (key == "x") {
      cases.back().x = hex_floats(in);
    } else if (key == "codes") {
      int code;
      while (in >> code) cases.back().codes.push_back(uint8_t(code));
    } else if (key == "scales") {
      cases.back().scales = hex_floats(in);
    } else if (key == "tensor_scale") {
      cases.back().tensor_scale = hex_floats(in).at(0);
    }
  }
  return cases;
}

// The codes, every block scale and the tensor scale equal the reference's, bit for bit (the
// limited test pass runs this on the kernels one ISA down too).
TEST(Fp4, BlockQuantisationMatchesThePublishedDefinitionsBitForBit) {
  const std::vector<ReferenceCase> cases = reference_cases();
  ASSERT_EQ(cases.size(), 9u);
  for (const ReferenceCase& c : cases) {
    ASSERT_EQ(c.x.size(), c.rows * c.cols) << c.name;
    const BlockQuantized q = quantize_blocks(c.x, c.rows, c.cols, Format::e2m1, c.spec);
    ASSERT_EQ(q.codes.size(), c.codes.size()) << c.name;
    for (size_t i = 0; i < c.codes.size(); ++i)
      ASSERT_EQ(uint8_t(q.codes[i]), c.codes[i]) << c.name << " element " << i << " x = " << c.x[i];
    ASSERT_EQ(q.scales.size(), c.scales.size()) << c.name;
    for (size_t i = 0; i < c.scales.size(); ++i) ASSERT_EQ(q.scales[i], c.scales[i]) << c.name << " block " << i;
    EXPECT_EQ(q.tensor_scale, c.tensor_scale) << c.name;
  }
}

// The NVFP4 block scale's fast e4m3 rounding equals the scalar codec's (nearest even,
// saturating), over every e4m3 value, every midpoint between two and their neighbours, and a
// sweep of 2^-12 .. 2^10.
TEST(Fp4, E4m3NearestEqualsTheCodec) {
  auto codec = [](float v) { return decode(Format::e4m3, encode(Format::e4m3, v, {.overflow = Overflow::saturate})); };
  std::vector<float> probes = {0.0f, 448.0f, 463.9f, 464.0f, 465.0f, 1e30f, std::numeric_limits<float>::infinity()};
  for (uint32_t c = 0; c < 127; ++c) {
    const float v = decode(Format::e4m3, c), next = decode(Format::e4m3, c + 1);
    probes.insert(probes.end(), {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e9f)});
    if (c < 126)
      probes.insert(probes.end(), {0.5f * (v + next), std::nextafter(0.5f * (v + next), 0.0f), std::nextafter(0.5f * (v + next), 1e9f)});
  }
  for (float v = 0x1p-12f; v < 0x1p10f; v *= 1.0013f) probes.push_back(v);
  for (float v : probes) ASSERT_EQ(e4m3_nearest(v), codec(v)) << v;
}

// value = code * block scale * tensor scale, in that order in f32.
TEST(Fp4, Nvfp4DecodesAsCodeTimesBlockScaleTimesTensorScale) {
  const ReferenceCase c = reference_cases().at(1);  // nvfp4_square: 16 x 16 blocks
  const BlockQuantized q = quantize_blocks(c.x, c.rows, c.cols, Format::e2m1, c.spec);
  std::vector<float> back(c.x.size());
  dequantize_blocks(q, back);
  for (size_t r = 0; r < c.rows; ++r)
    for (size_t col = 0; col < c.cols; ++col) {
      const size_t i = r * c.cols + col;
      const float block = q.scales[(r / 16) * q.scale_cols() + col / 16];
      ASSERT_EQ(back[i], (decode(Format::e2m1, uint32_t(q.codes[i])) * block) * q.tensor_scale) << i;
    }
  // And the tensor scale maps the tensor's amax onto 448 * 6: the largest block scale is at most 448.
  float top = 0;
  for (float s : q.scales) top = std::max(top, s);
  EXPECT_LE(top, 448.0f);
  EXPECT_GE(top, 256.0f);
}

// The block GEMM of NVFP4 operands (1 x 16 activation blocks, 16 x 16 weight blocks) equals the
// f64 product of their decoded values within f32 accumulation.
TEST(Fp4, BlockGemmOnNvfp4OperandsEqualsTheProductOfTheirValues) {
  const int64_t M = 8, K = 64, N = 32;
  const Tensor a = Tensor::randn({M, K}, 3), b = Tensor::randn({K, N}, 4, 0.05);
  const std::vector<float> av = a.to_floats(), bv = b.to_floats();
  const BlockQuantized qa = quantize_blocks(av, M, K, Format::e2m1, {1, 16, BlockScaleRule::nvfp4});
  const BlockQuantized qb = quantize_blocks(bv, K, N, Format::e2m1, {16, 16, BlockScaleRule::nvfp4});
  std::vector<float> da(av.size()), db(bv.size());
  dequantize_blocks(qa, da);
  dequantize_blocks(qb, db);
  const std::vector<float> c = quant::block_scaled_gemm(false, false, M, N, K, qa, qb).to_floats();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += double(da[size_t(i * K + k)]) * db[size_t(k * N + j)];
        mag += std::fabs(double(da[size_t(i * K + k)]) * db[size_t(k * N + j)]);
      }
      ASSERT_NEAR(c[size_t(i * N + j)], want, 1e-6 * mag + 1e-30) << i << "," << j;
    }
}

// H16 H16^T = 16 I, and (1/4) H16 D is orthogonal: the GEMM of two transformed operands equals the
// plain GEMM up to f32 rounding; rows past the last whole 16 are left as they are; one outlier
// spreads evenly over its 16 rows.
TEST(Fp4, HadamardTransformIsOrthogonalAndLeavesTheGemmUnchanged) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      int dot = 0;
      for (int k = 0; k < 16; ++k) dot += quant::hadamard16_entry(i, k) * quant::hadamard16_entry(j, k);
      ASSERT_EQ(dot, i == j ? 16 : 0) << i << "," << j;
    }
  const int64_t rows = 50, K = 5, N = 7;  // 3 whole blocks and a tail of 2 rows
  const Tensor x = Tensor::randn({rows, K}, 8), g = Tensor::randn({rows, N}, 9);
  const Tensor hx = quant::hadamard16_rows(ScaledTensor(x)).data, hg = quant::hadamard16_rows(ScaledTensor(g)).data;
  const std::vector<double> plain = ops::matmul(x.transpose(0, 1), g).to_vector(),
                            transformed = ops::matmul(hx.transpose(0, 1), hg).to_vector();
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(transformed[i], plain[i], 1e-5 * (1 + std::fabs(plain[i]))) << i;
  EXPECT_EQ(hx.slice(0, 48, 50).to_vector(), x.slice(0, 48, 50).to_vector()) << "the tail";
  EXPECT_NE(hx.slice(0, 0, 16).to_vector(), x.slice(0, 0, 16).to_vector());
  std::vector<float> spike(16 * 3, 0.0f);
  spike[5 * 3 + 1] = 100.0f;
  const std::vector<float> spread = quant::hadamard16_rows(ScaledTensor(Tensor::from_vector(spike, {16, 3}))).data.to_floats();
  for (int r = 0; r < 16; ++r) EXPECT_EQ(std::fabs(spread[size_t(r * 3 + 1)]), 25.0f) << r;
  // A scaled tensor keeps its scale.
  EXPECT_EQ(quant::hadamard16_rows(ScaledTensor(x, 0.25f)).scalar_scale(), 0.25f);
}

// The transform pinned to its definition (tests/hadamard_reference.hpp: H16 by Sylvester's
// construction, the committed D, along the rows). The input has both axes a multiple of 16 (a
// transform along the columns would differ), a tail of rows, and dyadic values whose sums f32
// holds exactly, so the transform must equal the reference bit for bit: a flipped sign, another
// order of H16's rows or the wrong axis fails.
TEST(Fp4, HadamardTransformIsQuarterH16DAlongTheRowsBitForBit) {
  EXPECT_EQ(quant::kHadamardSigns, testing::kReferenceHadamardSigns);
  const std::vector<std::vector<double>> h = testing::sylvester_hadamard16();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) ASSERT_EQ(quant::hadamard16_entry(i, j), h[size_t(i)][size_t(j)]) << i << "," << j;
  const int64_t rows = 40, cols = 16;  // 2 whole blocks of rows and a tail of 8
  const std::vector<float> x = testing::dyadic_values(rows * cols, 31, 3);
  const std::vector<double> want = testing::hadamard16_rows_reference(x, rows, cols);
  const std::vector<float> got = quant::hadamard16_rows(ScaledTensor(Tensor::from_vector(x, {rows, cols}))).data.to_floats();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "row " << i / size_t(cols) << " column " << i % size_t(cols);
  EXPECT_NE(want[0], x[0]) << "the input is transformed";
}

// Stochastic rounding of NVFP4 blocks is unbiased: over many streams the mean decoded value of
// each element approaches the input (x between two e2m1 values); nearest rounding's does not.
TEST(Fp4, StochasticRoundingOfBlocksIsUnbiased) {
  std::vector<float> x(16);
  for (size_t i = 0; i < 16; ++i) x[i] = 0.3f + 0.31f * float(i);  // amax 4.95: the block spans e2m1's grid
  const int n = 4000;
  std::vector<double> mean(16, 0.0), nearest(16);
  std::vector<float> back(16);
  for (int s = 0; s < n; ++s) {
    dequantize_blocks(quantize_blocks(x, 1, 16, Format::e2m1, {1, 16, BlockScaleRule::nvfp4}, Rounding::stochastic, uint64_t(s)), back);
    for (size_t i = 0; i < 16; ++i) mean[i] += back[i] / n;
  }
  dequantize_blocks(quantize_blocks(x, 1, 16, Format::e2m1, {1, 16, BlockScaleRule::nvfp4}), back);
  double biased = 0;
  for (size_t i = 0; i < 16; ++i) {
    // The grid step around x is at most 2 (between 4 and 6 scaled): the mean of n draws has a
    // standard deviation of at most 1 / sqrt(n); 4 of them.
    EXPECT_NEAR(mean[i], x[i], 4.0 / std::sqrt(double(n))) << i;
    biased = std::max(biased, std::fabs(double(back[i]) - x[i]));
  }
  EXPECT_GT(biased, 0.1) << "nearest rounding is biased per element";
}

// The FP4 presets are valid, quantise what they say, and a transform where it cannot be undone
// is refused by name.
TEST(Fp4, PresetsAndTheirChecks) {
  const quant::Recipe nv = quant::preset("nvfp4");
  EXPECT_EQ(nv.linear.forward.weight.block, (BlockSpec{16, 16, BlockScaleRule::nvfp4}));
  EXPECT_EQ(nv.linear.forward.activation.block, (BlockSpec{1, 16, BlockScaleRule::nvfp4}));
  EXPECT_EQ(nv.linear.input_grad.gradient.rounding, Rounding::stochastic);
  EXPECT_EQ(nv.linear.forward.activation.rounding, Rounding::nearest_even);
  EXPECT_EQ(nv.linear.weight_grad.activation.transform, quant::Transform::hadamard16);
  EXPECT_EQ(nv.linear.forward.activation.transform, quant::Transform::none);
  EXPECT_EQ(nv.high_precision.last_blocks, 1);
  EXPECT_EQ(quant::preset("nvfp4_no_hadamard").linear.weight_grad.gradient.transform, quant::Transform::none);
  EXPECT_EQ(quant::preset("nvfp4_no_sr").linear.weight_grad.gradient.rounding, Rounding::nearest_even);
  EXPECT_EQ(quant::preset("nvfp4_1x16_weights").linear.forward.weight.block.rows, 1u);
  EXPECT_EQ(quant::preset("nvfp4_no_tensor_scale").linear.forward.weight.block.rule, BlockScaleRule::e4m3_amax);
  EXPECT_EQ(quant::preset("nvfp4_all_layers").high_precision.last_blocks, 0);
  EXPECT_EQ(quant::preset("mxfp4").linear.forward.weight.scaling, quant::Scaling::mx);
  EXPECT_EQ(quant::preset("mxfp4_rceil").linear.forward.weight.block.rule, BlockScaleRule::mx_ceil);
  EXPECT_EQ(quant::Recipe::from_json(quant::preset("mxfp4_rceil").to_json()).linear, quant::preset("mxfp4_rceil").linear);

  quant::Recipe forward_transform = nv;
  forward_transform.linear.forward.activation.transform = quant::Transform::hadamard16;
  EXPECT_ERROR(forward_transform.validate(), "a transform applies to the weight-gradient GEMM's operands only");
  quant::Recipe one_sided = nv;
  one_sided.linear.weight_grad.gradient.transform = quant::Transform::none;
  EXPECT_ERROR(one_sided.validate(), "linear.weight_grad: its activation and gradient need the same transform");
  std::string text = nv.to_json();
  text.replace(text.find("\"hadamard16\""), 12, "\"fourier\"");
  EXPECT_ERROR(quant::Recipe::from_json(text), "unknown transform 'fourier'");
  text = nv.to_json();
  text.replace(text.find("\"block_scale\": \"nvfp4\""), 22, "\"block_scale\": \"nvfp8\"");
  EXPECT_ERROR(quant::Recipe::from_json(text), "block_scale must be mx_floor, mx_ceil, f32_amax, nvfp4 or e4m3_amax");
}

// The NVFP4 linear layer's forward equals the product of its operands' decoded values (whichever
// GEMM path the CPU takes), and its weight gradient, through the Hadamard transform, stays close
// to the unquantised one.
TEST(Fp4, Nvfp4LinearLayerComputesTheProductOfItsDecodedOperands) {
  const quant::Recipe nv = quant::preset("nvfp4");
  const Tensor x = Tensor::randn({32, 64}, 21), w = Tensor::randn({64, 48}, 22, 0.05), g = Tensor::randn({32, 48}, 23, 1e-3);
  Var xv(x, true), wv(w, true);
  const quant::QLinear layer(nv.linear);
  const Var y = layer(xv, wv);
  y.backward(g);
  std::vector<float> dx(size_t(x.numel())), dw(size_t(w.numel()));
  dequantize_blocks(quantize_blocks(x.to_floats(), 32, 64, Format::e2m1, {1, 16, BlockScaleRule::nvfp4}), dx);
  dequantize_blocks(quantize_blocks(w.to_floats(), 64, 48, Format::e2m1, {16, 16, BlockScaleRule::nvfp4}), dw);
  const std::vector<double> want = ops::matmul(Tensor::from_vector(dx, {32, 64}), Tensor::from_vector(dw, {64, 48})).to_vector();
  const std::vector<double> got = y.value().to_vector();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
  // dW through FP4 operands: its relative RMS error against the f32 product (measured 0.168 with
  // the transform; FP4 keeps 2 significant bits) stays below 0.25.
  const Tensor exact = ops::matmul(x.transpose(0, 1), g);
  const double err = std::sqrt(ops::mean(ops::unary(ops::Unary::square, ops::sub(wv.grad(), exact)), {}).item()),
               rms = std::sqrt(ops::mean(ops::unary(ops::Unary::square, exact), {}).item());
  std::printf("NVFP4 dW relative RMS error %.3f\n", err / rms);
  EXPECT_LT(err / rms, 0.25);
}

}  // namespace
}  // namespace scalify
