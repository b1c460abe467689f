// Every recipe field that only an ablation (or a single preset) switches reaches the computation.
// FP4: the linear layer's GEMMs are observed (quant::GemmOperandObserver) and each operand they
// read is checked against its definition, computed here from the published recipe (arXiv
// 2509.25149 and TransformerEngine's NVFP4BlockScaling; OCP MX for MXFP4): block shape and scale
// rule, the random Hadamard transform along the tokens of the weight-gradient GEMM, and stochastic
// rounding (unbiased, and not nearest). Then each ablation trains the tiny model to other tensors
// than its base preset, which trains to the same tensors twice. The fields, and the preset that
// switches each:
//   weight_grad.{activation, gradient}.transform            nvfp4_no_hadamard
//   {input_grad, weight_grad}.gradient.rounding             nvfp4_no_sr
//   {forward, input_grad}.weight.block (16 x 16 or 1 x 16)  nvfp4_1x16_weights
//   every operand's block.rule (nvfp4 or e4m3_amax)         nvfp4_no_tensor_scale
//   high_precision.last_blocks                              nvfp4_all_layers
//   every operand's block.rule (mx_floor or mx_ceil)        mxfp4_rceil, against mxfp4
// Likewise, switched back alone, each piece SCALIFY's rows of seed 000's Table 3 add
// (rescale_norm_grad, master_weight, weight_gradient, optimizer_state, rescale_gradients,
// rescale_every) and the parameter only FP8-AMAX (the gradients' margin) or FP8-CSCALE (bias) sets.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hadamard_reference.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/recipe.hpp"
#include "tiny_lm.hpp"

namespace scalify::quant {
namespace {

// An FP4 preset as its definition states it.
struct Fp4Definition {
  const char* preset;
  size_t k;  // block length along each GEMM's reduction: 16 (NVFP4) or 32 (MX)
  BlockScaleRule rule;
  bool square_weights;  // 16 x 16 weight blocks, the same numbers in the forward and transposed use
  bool stochastic_gradients;
  bool hadamard;  // (1/4) H16 D along the tokens of both weight-gradient operands
};
const Fp4Definition kNvfp4 = {"nvfp4", 16, BlockScaleRule::nvfp4, true, true, true};
const Fp4Definition kFp4Definitions[] = {
    kNvfp4,
    {"nvfp4_no_hadamard", 16, BlockScaleRule::nvfp4, true, true, false},
    {"nvfp4_no_sr", 16, BlockScaleRule::nvfp4, true, false, true},
    {"nvfp4_1x16_weights", 16, BlockScaleRule::nvfp4, false, true, true},
    {"nvfp4_no_tensor_scale", 16, BlockScaleRule::e4m3_amax, true, true, true},
    {"mxfp4", 32, BlockScaleRule::mx_floor, false, true, true},
    {"mxfp4_rceil", 32, BlockScaleRule::mx_ceil, false, true, true},
};

// The layer's input: x [rows, K] and the output gradient g [rows, N] dyadic (their transform is
// exact in f32: tests/hadamard_reference.hpp), rows = 2 whole Hadamard blocks of tokens and a tail
// of 8; K and N one MX block.
constexpr int64_t kRows = 40, kK = 32, kN = 32;
struct LayerInput {
  std::vector<float> x = testing::dyadic_values(kRows * kK, 41, 3), w = Tensor::randn({kK, kN}, 42, 0.2).to_floats(),
                     g = testing::dyadic_values(kRows * kN, 43, 10);
};

struct GemmOperands {
  Quantized a, b;
};
using Observed = std::map<LinearGemm, GemmOperands>;

// One forward and backward of `layer`: each GEMM's operands as it read them.
Observed run_layer(const QLinear& layer, const LayerInput& in) {
  Observed seen;
  const GemmOperandObserver observer([&](LinearGemm gemm, const Quantized& a, const Quantized& b) { seen[gemm] = {a, b}; });
  Var x(Tensor::from_vector(in.x, {kRows, kK}), true), w(Tensor::from_vector(in.w, {kK, kN}), true);
  layer(x, w).backward(Tensor::from_vector(in.g, {kRows, kN}));
  return seen;
}

std::vector<float> values_of(const BlockQuantized& q) {
  std::vector<float> v(q.rows * q.cols);
  dequantize_blocks(q, v);
  return v;
}

// What an operand should be: `src` [rows, cols] in e2m1 blocks of `spec`, rounded `stochastic`ally or to nearest.
struct OperandDefinition {
  std::vector<float> src;
  size_t rows, cols;
  BlockSpec spec;
  bool stochastic;
};

// The six operands of an FP4 preset's GEMMs by its definition, each with the name it is reported by.
std::vector<std::pair<std::string, OperandDefinition>> definitions(const Fp4Definition& d, const LayerInput& in) {
  const BlockSpec along_rows{1, d.k, d.rule}, down_columns{d.k, 1, d.rule}, square{16, 16, d.rule};
  std::vector<float> hx = in.x, hg = in.g;
  if (d.hadamard) {
    const std::vector<double> tx = testing::hadamard16_rows_reference(in.x, kRows, kK),
                              tg = testing::hadamard16_rows_reference(in.g, kRows, kN);
    hx.assign(tx.begin(), tx.end());  // exact: dyadic inputs
    hg.assign(tg.begin(), tg.end());
  }
  const size_t R = kRows, K = kK, N = kN;
  return {
      {"forward x", {in.x, R, K, along_rows, false}},
      {"forward w", {in.w, K, N, d.square_weights ? square : down_columns, false}},
      {"input_grad g", {in.g, R, N, along_rows, d.stochastic_gradients}},
      {"input_grad w", {in.w, K, N, d.square_weights ? square : along_rows, false}},
      {"weight_grad x", {hx, R, K, down_columns, false}},
      {"weight_grad g", {hg, R, N, down_columns, d.stochastic_gradients}},
  };
}
const Quantized& observed(const Observed& seen, size_t operand) {
  const GemmOperands& o = seen.at(LinearGemm(operand / 2));
  return operand % 2 ? o.b : o.a;
}

// e2m1's magnitudes: the two of them around |v| (v in units of its block's decode scale; beyond 6
// saturates).
std::pair<double, double> e2m1_neighbours(double v) {
  const double grid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6}, a = std::min(std::fabs(v), 6.0);
  size_t i = 0;
  while (i + 1 < std::size(grid) && grid[i + 1] <= a) ++i;
  return grid[i] == a ? std::pair(a, a) : std::pair(grid[i], grid[i + 1]);
}
// The decode scale of element i: its block's scale times the tensor scale.
double decode_scale(const BlockQuantized& q, size_t i) {
  const size_t r = i / q.cols, c = i % q.cols;
  return double(q.scales[(r / q.block.rows) * q.scale_cols() + c / q.block.cols]) * q.tensor_scale;
}

// `got` is the operand `def` says: nearest rounding bit for bit; stochastic rounding with the
// nearest's scales, each element one of its value's two e2m1 neighbours, not all the nearest.
void expect_operand(const Quantized& got, const OperandDefinition& def, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(got.blockwise);
  const BlockQuantized& q = got.blocks;
  ASSERT_EQ(q.block, def.spec);
  ASSERT_EQ(q.element, Format::e2m1);
  const BlockQuantized nearest = quantize_blocks(def.src, def.rows, def.cols, Format::e2m1, def.spec);
  const std::vector<float> want = values_of(nearest), have = values_of(q);
  if (!def.stochastic) {
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(have[i], want[i]) << "element " << i << " of " << def.src[i];
    return;
  }
  ASSERT_EQ(q.scales, nearest.scales);
  ASSERT_EQ(q.tensor_scale, nearest.tensor_scale);
  size_t not_nearest = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double v = def.src[i] / decode_scale(q, i), code = decode(Format::e2m1, uint32_t(uint8_t(q.codes[i])));
    const auto [lo, hi] = e2m1_neighbours(v);
    ASSERT_TRUE(std::fabs(code) == lo || std::fabs(code) == hi) << "element " << i << ": " << code << " for " << v;
    ASSERT_TRUE(code == 0 || (code < 0) == (v < 0)) << "element " << i << ": " << code << " for " << v;
    not_nearest += have[i] != want[i];
  }
  EXPECT_GT(not_nearest, 0u) << "stochastic rounding rounded every element to nearest";
}

// Each operand of each GEMM of each FP4 preset's layer is what the preset's definition says: the
// transform along the tokens, block shapes, scale rules, rounding. A field the layer ignored would
// leave its ablation's operands equal to the base preset's, which differ on this input (checked).
TEST(RecipeFields, EveryFp4OperandIsWhatTheDefinitionSays) {
  const LayerInput in;
  for (const Fp4Definition& d : kFp4Definitions) {
    SCOPED_TRACE(d.preset);
    const Observed seen = run_layer(QLinear(preset(d.preset).linear), in);
    ASSERT_EQ(seen.size(), 3u) << "three GEMMs";
    const auto defs = definitions(d, in);
    for (size_t i = 0; i < defs.size(); ++i) expect_operand(observed(seen, i), defs[i].second, defs[i].first);
  }
  // The definitions each ablation changes differ on this input, so the checks above tell them apart.
  auto values = [&](const Fp4Definition& d, size_t operand) {
    const OperandDefinition o = definitions(d, in)[operand].second;
    return values_of(quantize_blocks(o.src, o.rows, o.cols, Format::e2m1, o.spec));
  };
  EXPECT_NE(values(kNvfp4, 4), values(kFp4Definitions[1], 4)) << "transform";
  EXPECT_NE(values(kNvfp4, 1), values(kFp4Definitions[3], 1)) << "square weights";
  EXPECT_NE(values(kNvfp4, 3), values(kFp4Definitions[3], 3)) << "square weights, transposed use";
  EXPECT_NE(values(kNvfp4, 0), values(kFp4Definitions[4], 0)) << "tensor scale";
  EXPECT_NE(values(kFp4Definitions[5], 0), values(kFp4Definitions[6], 0)) << "MX floor and ceiling rules";
}

// Stochastic rounding of both NVFP4 gradient operands as the layer hands them to their GEMMs is
// unbiased: each element's mean over n draws (n training steps of the layer, each with its own
// bits) converges to its unquantised value, the transformed one in the weight-gradient GEMM.
// Bound: a draw lies between the value's two neighbours, a step d apart, so by Hoeffding's
// inequality P(|mean - E| >= t) <= 2 exp(-2 n t^2 / d^2); over the 2560 elements a false alarm
// below 1e-6 takes t = d sqrt(ln(2 * 2560 / 1e-6) / (2 n)). E differs from the value by the random
// bits' resolution (22 bits below an e2m1 step: d 2^-22 <= 2^-21 s, s the decode scale), the f32
// rounding of the pre-scaled value (2^-24 |x|) and of the decoded one (2^-24 6 s): at most
// 2^-24 |x| + 2^-20 s. Nearest rounding's mean is off by up to d / 2.
TEST(RecipeFields, Nvfp4GradientOperandsAreStochasticallyRoundedWithoutBias) {
  const LayerInput in;
  const QLinear layer(preset("nvfp4").linear);
  const auto defs = definitions(kNvfp4, in);
  const size_t operands[] = {2, 5};  // input_grad g, weight_grad g (transformed)
  const int n = 1000;
  std::map<size_t, std::vector<double>> mean;
  std::map<size_t, BlockQuantized> first;
  for (int draw = 0; draw < n; ++draw) {
    const Observed seen = run_layer(layer, in);
    for (size_t o : operands) {
      const BlockQuantized& q = observed(seen, o).blocks;
      if (draw == 0) first[o] = q;
      const std::vector<float> v = values_of(q);
      mean[o].resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) mean[o][i] += v[i] / double(n);
    }
  }
  const double elements = double(kRows * kN * 2), t_over_d = std::sqrt(std::log(2 * elements / 1e-6) / (2 * n));
  for (size_t o : operands) {
    SCOPED_TRACE(defs[o].first);
    const OperandDefinition& def = defs[o].second;
    for (size_t i = 0; i < def.src.size(); ++i) {
      const double s = decode_scale(first[o], i), x = def.src[i];
      const auto [lo, hi] = e2m1_neighbours(x / s);
      const double expected = std::copysign(std::min(std::fabs(x), 6 * s), x);  // beyond the block's range: saturated
      const double bound = t_over_d * (hi - lo) * s + 0x1p-24 * std::fabs(x) + 0x1p-20 * s;
      ASSERT_NEAR(mean[o][i], expected, bound) << "element " << i << " (x " << x << ", neighbours " << lo * s << ", " << hi * s << ")";
    }
  }
}

// The observer sees; it changes nothing: the layer's outputs and gradients are bit-identical with
// and without one.
TEST(RecipeFields, ObservingTheOperandsChangesNothing) {
  const LayerInput in;
  auto run = [&](bool observe) {
    const QLinear layer(preset("nvfp4").linear);
    std::optional<GemmOperandObserver> observer;
    if (observe) observer.emplace([](LinearGemm, const Quantized&, const Quantized&) {});
    Var x(Tensor::from_vector(in.x, {kRows, kK}), true), w(Tensor::from_vector(in.w, {kK, kN}), true);
    const Var y = layer(x, w);
    y.backward(Tensor::from_vector(in.g, {kRows, kN}));
    return std::vector{y.value().to_floats(), x.grad().to_floats(), w.grad().to_floats()};
  };
  EXPECT_EQ(run(true), run(false));
}

// A model's parameters by name, as trained.
using Trained = std::vector<std::pair<std::string, std::vector<float>>>;
// Where two trainings' tensors first differ, in words; empty when they are bit-identical.
std::string first_difference(const Trained& a, const Trained& b) {
  for (size_t p = 0; p < a.size(); ++p)
    for (size_t i = 0; i < a[p].second.size(); ++i)
      if (std::bit_cast<uint32_t>(a[p].second[i]) != std::bit_cast<uint32_t>(b.at(p).second.at(i)))
        return a[p].first + "[" + std::to_string(i) + "]: " + std::to_string(a[p].second[i]) + " vs " + std::to_string(b[p].second[i]);
  return "";
}

// The tiny model's parameters after a few AdamW steps under a preset: two blocks, so NVFP4 (which
// keeps the last block in high precision) quantises the first.
Trained trained(const std::string& name) {
  const int64_t V = 12, T = 8, B = 8, D = 32;
  const nn::Gpt model = testing::tiny_gpt(V, T, D, 5, false, preset(name), 2);
  testing::train_tiny(model, V, T, B, 3);
  Trained out;
  for (const auto& [param, v] : model.parameters()) out.emplace_back(param, v.value().to_floats());
  return out;
}

// Each ablation trains to other tensors than its base preset: the field it switches reaches the
// training (a layer that ignored it would train both to the same bits). The base preset trains to
// the same tensors twice, so a difference is the field's.
TEST(RecipeFields, EachFp4AblationTrainsToOtherTensorsThanItsBase) {
  const Trained nvfp4 = trained("nvfp4");
  ASSERT_EQ(first_difference(trained("nvfp4"), nvfp4), "") << "training is deterministic";
  for (const char* ablation : {"nvfp4_no_hadamard", "nvfp4_no_sr", "nvfp4_1x16_weights", "nvfp4_no_tensor_scale", "nvfp4_all_layers"})
    EXPECT_NE(first_difference(trained(ablation), nvfp4), "") << ablation << " trains to nvfp4's tensors";
  EXPECT_NE(first_difference(trained("mxfp4_rceil"), trained("mxfp4")), "") << "mxfp4_rceil trains to mxfp4's tensors";
}

// The pieces that SCALIFY's rows of seed 000's Table 3 add one by one, and the two parameters only
// FP8-AMAX and FP8-CSCALE set: each switched back alone changes the tensors a full recipe run
// (master weights, optimizer state, weight-gradient casts) trains to. rescale_every is switched
// between 2 and 0 (the preset's 100 steps would not come round in a short run).
TEST(RecipeFields, EachScalifyRowPieceAndFp8ParameterChangesTraining) {
  struct Switch {
    const char* preset;
    const char* field;
    void (*on)(Recipe&);
    void (*off)(Recipe&);
  };
  const Switch switches[] = {
      {"scalify_fp16_2", "rescale_norm_grad", [](Recipe&) {}, [](Recipe& r) { r.rescale_norm_grad = false; }},
      {"scalify_fp16_2", "master_weight", [](Recipe&) {}, [](Recipe& r) { r.master_weight = DType::f32; }},
      {"scalify_fp8_3", "weight_gradient", [](Recipe&) {}, [](Recipe& r) { r.weight_gradient = Format::f32; }},
      {"scalify_fp8_4", "optimizer_state", [](Recipe&) {}, [](Recipe& r) { r.optimizer_state = DType::f32; }},
      {"scalify_fp8_4", "rescale_gradients", [](Recipe&) {}, [](Recipe& r) { r.rescale_gradients = false; }},
      {"scalify_fp8_4", "rescale_every", [](Recipe& r) { r.rescale_every = 2; }, [](Recipe& r) { r.rescale_every = 0; }},
      {"fp8_amax", "gradient margin", [](Recipe&) {},
       [](Recipe& r) { r.linear.input_grad.gradient.margin = r.linear.weight_grad.gradient.margin = 0; }},
      {"fp8_cscale", "bias", [](Recipe&) {},
       [](Recipe& r) {
         for (QuantizerConfig* c : {&r.linear.forward.activation, &r.linear.forward.weight, &r.linear.input_grad.gradient,
                                    &r.linear.input_grad.weight, &r.linear.weight_grad.activation, &r.linear.weight_grad.gradient})
           c->bias = 0;
       }},
  };
  auto train = [](Recipe r) {
    r.validate();
    const int64_t V = 12, T = 8, B = 8, D = 32;
    nn::Gpt model = testing::tiny_gpt(V, T, D, 5, r.unit_scaled, r, 2);
    const testing::RecipeRun run = testing::train_tiny_recipe(model, r, V, T, B, 4);
    Trained out;
    const nn::NamedParams named = model.parameters();
    for (size_t i = 0; i < named.size(); ++i) out.emplace_back(named[i].first, run.params[i].value().to_floats());
    return out;
  };
  std::map<std::string, Trained> trained_on;  // by recipe, each trained twice
  for (const Switch& s : switches) {
    SCOPED_TRACE(std::string(s.preset) + ": " + s.field);
    Recipe on = preset(s.preset);
    s.on(on);
    Recipe off = on;
    s.off(off);
    ASSERT_NE(on.to_json(), off.to_json());
    if (!trained_on.contains(on.to_json())) {
      trained_on[on.to_json()] = train(on);
      ASSERT_EQ(first_difference(train(on), trained_on[on.to_json()]), "") << "training is deterministic";
    }
    EXPECT_NE(first_difference(train(off), trained_on[on.to_json()]), "") << "switched off, it trains to the same tensors";
  }
}

}  // namespace
}  // namespace scalify::quant
