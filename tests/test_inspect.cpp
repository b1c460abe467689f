// `scalify inspect`: exponent histograms and their format classes on hand-built tensors with
// known counts; the inspection of a trained checkpoint (every tensor of every kind, histograms
// that count every value, data and scale of scaled tensors, the PNG); the scale history read
// back from metrics.jsonl and drawn.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "expect_error.hpp"
#include "scalify/inspect/histogram.hpp"
#include "scalify/inspect/inspect.hpp"
#include "scalify/inspect/report_section.hpp"
#include "scalify/inspect/scale_history.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/train/trainer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using inspect::ExponentHistogram, inspect::TensorKind;
using testing::scratch, testing::spit, testing::slurp, testing::text_corpus, testing::tiny_run, testing::valid_png;

TEST(ExponentHistogram, FormatRangesAreTheFormatsOwn) {
  const inspect::FormatRange e4m3 = inspect::format_range(Format::e4m3), e5m2 = inspect::format_range(Format::e5m2);
  EXPECT_EQ(e4m3.min_subnormal, std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3.underflow_below, std::ldexp(1.0, -10));
  EXPECT_EQ(e4m3.min_normal, std::ldexp(1.0, -6));
  EXPECT_EQ(e4m3.max, 448.0);
  EXPECT_EQ(e5m2.min_subnormal, std::ldexp(1.0, -16));
  EXPECT_EQ(e5m2.min_normal, std::ldexp(1.0, -14));
  EXPECT_EQ(e5m2.max, 57344.0);
}

TEST(ExponentHistogram, HandBuiltTensorHasKnownCountsPerBinAndClass) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v = {0.0f,
                                -0.0f,
                                1.0f,
                                -1.5f,
                                2.0f,
                                3.9f,
                                0.25f,
                                std::ldexp(1.0f, -10),            // e4m3: rounds to zero (half the smallest subnormal, ties to even)
                                std::ldexp(1.0f, -10) * 1.0001f,  // ... just above: rounds to the smallest subnormal
                                std::ldexp(1.0f, -9),
                                std::ldexp(1.0f, -7),
                                std::ldexp(1.0f, -6),
                                448.0f,
                                -449.0f,
                                1e30f,
                                inf,
                                nan};
  const ExponentHistogram h = inspect::exponent_histogram(Tensor::from_vector(v, {int64_t(v.size())}), Format::e4m3);
  EXPECT_EQ(h.count, 17);
  EXPECT_EQ(h.zeros, 2);
  EXPECT_EQ(h.nonfinite, 2);
  const std::map<int, int64_t> expected = {{0, 2}, {1, 2}, {-2, 1}, {-10, 2}, {-9, 1}, {-7, 1}, {-6, 1}, {8, 2}, {99, 1}};
  int64_t in_bins = 0;
  for (int e = ExponentHistogram::kMinExponent; e <= ExponentHistogram::kMaxExponent; ++e) {
    const auto it = expected.find(e);
    EXPECT_EQ(h.at(e), it == expected.end() ? 0 : it->second) << "bin " << e;
    in_bins += h.at(e);
  }
  EXPECT_EQ(in_bins, 13);
  EXPECT_EQ(h.lowest(), -10);
  EXPECT_EQ(h.highest(), 99);
  EXPECT_EQ(h.underflow, 1);
  EXPECT_EQ(h.subnormal, 3);  // 2^-10 (1 + 1e-4), 2^-9, 2^-7
  EXPECT_EQ(h.normal, 7);     // 1, 1.5, 2, 3.9, 0.25, 2^-6, 448
  EXPECT_EQ(h.clipped, 2);    // 449, 1e30
}

TEST(ExponentHistogram, ClassesFollowTheFormatAndExtremesLandInTheEdgeBins) {
  const std::vector<double> v = {1e-300, std::ldexp(1.0, -15), 60000.0, 1e300};
  const ExponentHistogram h = inspect::exponent_histogram(Tensor::from_vector(v, {4}), Format::e5m2);
  EXPECT_EQ(h.at(ExponentHistogram::kMinExponent), 1);
  EXPECT_EQ(h.at(ExponentHistogram::kMaxExponent), 1);
  EXPECT_EQ(h.at(-15), 1);
  EXPECT_EQ(h.underflow, 1);
  EXPECT_EQ(h.subnormal, 1);  // 2^-15: below e5m2's smallest normal 2^-14
  EXPECT_EQ(h.normal, 0);
  EXPECT_EQ(h.clipped, 2);
  EXPECT_EQ(h.lowest(), ExponentHistogram::kMinExponent);
}

TEST(ExponentHistogram, CountsEveryValueOfARandomTensorInAnyStorage) {
  const Tensor x = Tensor::randn({64, 33}, 5, 0.01);
  for (DType t : {DType::f32, DType::f16, DType::e4m3}) {
    const ExponentHistogram h = inspect::exponent_histogram(x.to(t), Format::e4m3);
    int64_t bins = 0;
    for (int64_t c : h.bins) bins += c;
    EXPECT_EQ(h.count, x.numel());
    EXPECT_EQ(bins + h.zeros + h.nonfinite, h.count) << dtype_name(t);
    EXPECT_EQ(h.underflow + h.subnormal + h.normal + h.clipped, bins) << dtype_name(t);
    if (t == DType::e4m3) {
      EXPECT_EQ(h.underflow, 0) << "stored e4m3 values are never below its smallest subnormal";
    }
  }
}

train::TrainConfig trained(const std::string& name, const std::string& recipe) {
  train::TrainConfig c = tiny_run(text_corpus(), scratch(name), recipe);
  train::train(c, false);
  return c;
}

TEST(Inspect, EveryTensorOfEveryKindWithHistogramsThatCountEveryValue) {
  const train::TrainConfig c = trained("inspect_f32", "f32");
  const inspect::Inspection in = inspect::inspect_checkpoint(c.out, {});
  EXPECT_EQ(in.step, c.steps);
  EXPECT_EQ(in.recipe, "f32");
  std::map<TensorKind, std::vector<std::string>> names;
  for (const inspect::InspectedTensor& t : in.tensors) {
    names[t.kind].push_back(t.name);
    const ExponentHistogram& h = t.histogram;
    int64_t bins = 0;
    for (int64_t b : h.bins) bins += b;
    EXPECT_EQ(bins + h.zeros + h.nonfinite, h.count) << t.name;
    EXPECT_TRUE(std::isnan(t.scale_log2)) << t.name << ": f32 tensors are not scaled";
    EXPECT_EQ(t.storage, DType::f32);
  }
  // Activations and their gradients in the same (model) order; every parameter and its gradient.
  EXPECT_EQ(names[TensorKind::activation], names[TensorKind::activation_grad]);
  EXPECT_EQ(names[TensorKind::weight], names[TensorKind::weight_grad]);
  const std::vector<std::string>& acts = names[TensorKind::activation];
  ASSERT_GE(acts.size(), 20u);
  EXPECT_EQ(acts.front(), "embed");
  EXPECT_EQ(acts.back(), "logits");
  EXPECT_EQ(names[TensorKind::weight].size(), size_t(4 + 12 * c.model.layers));  // wte, wpe, lnf w/b + 12 per block
  for (const inspect::InspectedTensor& t : in.tensors)
    if (t.name == "h1.attn.qkv" && t.kind == TensorKind::activation) {
      EXPECT_EQ(t.histogram.count, c.batch * c.model.seq * 3 * c.model.d_model);
    }
}

TEST(Inspect, ScaledTensorsShowTheirDataAndScale) {
  const train::TrainConfig c = trained("inspect_scalify", "scalify_fp8_3");
  const inspect::Inspection in = inspect::inspect_checkpoint(c.out, {});
  int weights = 0, f16_activations = 0;
  for (const inspect::InspectedTensor& t : in.tensors) {
    if (t.kind == TensorKind::weight) {  // SCALIFY's parameters are all scaled tensors
      EXPECT_TRUE(std::isfinite(t.scale_log2)) << t.name;
      EXPECT_EQ(t.scale_log2, std::round(t.scale_log2)) << t.name << ": scales are powers of two";
      ++weights;
    }
    if (t.kind == TensorKind::activation && t.storage == DType::f16) ++f16_activations;
  }
  EXPECT_EQ(weights, 4 + 12 * c.model.layers);
  EXPECT_GT(f16_activations, 10);
}

TEST(Inspect, InitialModelDiffersFromTheTrainedOne) {
  const train::TrainConfig c = trained("inspect_initial", "f32");
  inspect::InspectOptions o;
  o.initial = true;
  const inspect::Inspection init = inspect::inspect_checkpoint(c.out, o), end = inspect::inspect_checkpoint(c.out, {});
  EXPECT_EQ(init.step, 0);
  ASSERT_EQ(init.tensors.size(), end.tensors.size());
  double init_bias = -1, end_bias = -1;
  for (size_t i = 0; i < init.tensors.size(); ++i)
    if (init.tensors[i].name == "h0.attn.qkv.b" && init.tensors[i].kind == TensorKind::weight) {
      init_bias = init.tensors[i].rms;
      end_bias = end.tensors[i].rms;
    }
  EXPECT_EQ(init_bias, 0.0) << "biases start at zero";
  EXPECT_GT(end_bias, 0.0);
}

TEST(Inspect, WritesCsvAndThePicture) {
  const train::TrainConfig c = trained("inspect_write", "f32");
  const inspect::Inspection in = inspect::inspect_checkpoint(c.out, {});
  const fs::path out = scratch("inspect_out");
  ASSERT_EQ(inspect::write_inspection(in, out.string()), "") << "gnuplot is part of scripts/setup.sh";
  uint32_t w = 0, h = 0;
  EXPECT_TRUE(valid_png(out / "histograms.png", &w, &h));
  const std::string csv = slurp(out / "tensors.csv");
  EXPECT_EQ(size_t(std::count(csv.begin(), csv.end(), '\n')), in.tensors.size() + 1);
  EXPECT_EQ(csv.rfind("tensor,kind,storage,values,rms,scale_log2,zero,underflow,subnormal,normal,clipped,nonfinite,range\n", 0), 0u);
  EXPECT_NE(csv.find(",weight,f32,"), std::string::npos);
  EXPECT_NE(csv.find(",e4m3\n"), std::string::npos) << "the rows judged against the --format (e4m3)";
}

// A corrupt checkpoint with an infinite weight: the commands that use the model refuse it, but
// inspection is how one finds the bad tensor, so it reads it and counts the values.
TEST(Inspect, ShowsTheNonFiniteValuesOfACorruptCheckpoint) {
  const train::TrainConfig c = trained("inspect_nan", "f32");
  const std::string file = (fs::path(c.out) / "checkpoint.safetensors").string();
  io::SafeTensors st = io::read_safetensors(file);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h1.mlp.fc.w") t.data<float>()[0] = std::numeric_limits<float>::infinity();
  io::write_safetensors(file, st);
  const inspect::Inspection in = inspect::inspect_checkpoint(c.out, {});
  bool seen = false;
  for (const inspect::InspectedTensor& t : in.tensors)
    if (t.name == "h1.mlp.fc.w" && t.kind == TensorKind::weight) {
      EXPECT_EQ(t.histogram.nonfinite, 1);
      seen = true;
    }
  EXPECT_TRUE(seen);
}

TEST(Inspect, BadInputsNameWhatWasWrong) {
  EXPECT_ERROR(inspect::inspect_checkpoint("/nonexistent/run", {}), "/nonexistent/run");
  const fs::path junk = scratch("junk.safetensors");
  spit(junk, "not a safetensors file");
  EXPECT_ERROR(inspect::inspect_checkpoint(junk.string(), {}), "junk.safetensors");
}

TEST(ScaleHistory, ReadsEveryQuantisedTensorsBiasOverSteps) {
  const fs::path dir = scratch("scale_history");
  fs::create_directories(dir);
  spit(dir / "metrics.jsonl",
       "{\"step\":0,\"loss\":5.5}\n"
       "{\"step\":1,\"quant\":{\"h0.attn.qkv.weight\":{\"scale\":0.0078125,\"amax\":1,\"underflow\":0.01,\"clipped\":0},"
       "\"h0.attn.qkv.activation\":{\"scale\":0.5,\"amax\":200,\"underflow\":0,\"clipped\":0.02}}}\n"
       "{\"step\":3,\"quant\":{\"h0.attn.qkv.weight\":{\"scale\":0.015625,\"amax\":2,\"underflow\":0,\"clipped\":0},"
       "\"h0.attn.qkv.activation\":{\"scale\":1,\"amax\":400,\"underflow\":0,\"clipped\":0}}}\n");
  const std::vector<inspect::ScaleSeries> s = inspect::read_scale_history(dir.string());
  ASSERT_EQ(s.size(), 2u);
  std::map<std::string, const inspect::ScaleSeries*> by_role;
  for (const auto& x : s) by_role[x.role] = &x;
  ASSERT_TRUE(by_role.count("weight") && by_role.count("activation"));
  EXPECT_EQ(by_role["weight"]->layer, "h0.attn.qkv");
  ASSERT_EQ(by_role["weight"]->points.size(), 2u);
  EXPECT_EQ(by_role["weight"]->points[0].step, 1);
  EXPECT_EQ(by_role["weight"]->points[0].bias, 7.0);
  EXPECT_EQ(by_role["weight"]->points[1].bias, 6.0);
  EXPECT_EQ(by_role["weight"]->points[0].underflow, 0.01);
  EXPECT_EQ(by_role["activation"]->points[0].clipped, 0.02);
  EXPECT_TRUE(std::isnan(by_role["weight"]->points[0].underflow_energy)) << "older runs have no energy counter";
  spit(dir / "metrics.jsonl",
       "{\"step\":1,\"quant\":{\"h0.mlp.fc.gradient\":{\"scale\":1,\"underflow\":0.5,\"underflow_energy\":0.001,\"clipped\":0}}}\n");
  EXPECT_EQ(inspect::read_scale_history(dir.string())[0].points[0].underflow_energy, 0.001);
  spit(dir / "metrics.jsonl",
       "{\"step\":1,\"quant\":{\"h0.mlp.fc.gradient\":{\"scale\":1,\"underflow\":0.5,\"underflow_energy\":2,\"clipped\":0}}}\n");
  EXPECT_ERROR(inspect::read_scale_history(dir.string()), "underflow energy outside [0, 1]");
  spit(dir / "metrics.jsonl", "{\"step\":0}\n{broken\n");
  EXPECT_ERROR(inspect::read_scale_history(dir.string()), "line 2");
  spit(dir / "metrics.jsonl", "{\"step\":1,\"quant\":{\"h0.mlp.fc.weight\":{\"scale\":0,\"underflow\":0,\"clipped\":0}}}\n");
  EXPECT_ERROR(inspect::read_scale_history(dir.string()), "'h0.mlp.fc.weight' has scale 0, not a positive number");
  spit(dir / "metrics.jsonl", "{\"step\":1e300,\"quant\":{\"h0.mlp.fc.weight\":{\"scale\":1,\"underflow\":0,\"clipped\":0}}}\n");
  EXPECT_ERROR(inspect::read_scale_history(dir.string()), "step is not a step number");
  spit(dir / "metrics.jsonl", "{\"step\":1,\"quant\":{\"h0.mlp.fc.weight\":{\"scale\":1,\"underflow\":-5,\"clipped\":0}}}\n");
  EXPECT_ERROR(inspect::read_scale_history(dir.string()), "outside [0, 1]");
  spit(dir / "metrics.jsonl", "{\"step\":1,\"quant\":5}\n");
  EXPECT_ERROR(inspect::read_scale_history(dir.string()), "'quant' is not an object");
  EXPECT_ERROR(inspect::read_scale_history((dir / "missing").string()), "metrics.jsonl");
}

// The report's reading of the counters: the operand losing the most (by its mean over the run),
// the share of its squared norm, how many operands lose more than 10 % by role, and which
// conclusion the energy share supports; nothing when no operand loses 5 % on average.
TEST(ScaleHistory, UnderflowReadingNamesTheWorstOperandAndWhatItsValuesCarried) {
  using inspect::ScaleSeries;
  const std::vector<ScaleSeries> series = {
      {"h0.attn.qkv", "weight", {{10, 4, 0.01, 0, 0.0}, {20, 4, 0.03, 0, 0.0}}},
      {"h1.mlp.fc", "gradient", {{10, 4, 0.40, 0, 0.002}, {20, 4, 0.80, 0, 0.004}}},
      {"h1.mlp.out", "gradient", {{10, 4, 0.20, 0, 0.001}, {20, 4, 0.10, 0, 0.001}}},
  };
  const std::string text = inspect::underflow_reading("fp8_cscale", series, "within +0.05 of baseline");
  for (const char* s :
       {"**fp8_cscale**: h1.mlp.fc's output gradient loses the most: 60.00% of its non-zero values", "(at most 80.00%)",
        "carried 0.30% of its squared norm", "2 of 3 quantised operands lose more than 10 % on average (gradient 2)",
        "carried almost none of its magnitude", "its input and weight gradients", "(verdict on the loss: within +0.05 of baseline)"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  std::vector<ScaleSeries> heavy = series;
  heavy[1].points = {{10, 4, 0.6, 0, 0.2}};
  EXPECT_NE(inspect::underflow_reading("x", heavy, "").find("carried a real share"), std::string::npos);
  std::vector<ScaleSeries> old = series;
  old[1].points = {{10, 4, 0.6, 0, NAN}};
  EXPECT_NE(inspect::underflow_reading("x", old, "").find("predates the squared-norm counter"), std::string::npos);
  EXPECT_EQ(inspect::underflow_reading("x", {series[0]}, ""), "") << "2 % on average: nothing to explain";
}

TEST(ScaleHistory, ARunsQuantisersAreDrawnPerLayerAndRole) {
  const train::TrainConfig c = trained("scale_history_delayed", "delayed");
  const std::vector<inspect::ScaleSeries> s = inspect::read_scale_history(c.out);
  EXPECT_EQ(s.size(), size_t(4 * c.model.layers * 3));  // 4 linear layers per block, weight / activation / gradient
  std::set<std::string> roles;
  for (const auto& x : s) {
    roles.insert(x.role);
    EXPECT_EQ(x.points.size(), size_t(c.steps / c.stats_every)) << x.layer << "." << x.role;
    for (const auto& p : x.points) EXPECT_TRUE(std::isfinite(p.bias));
  }
  EXPECT_EQ(roles, (std::set<std::string>{"weight", "activation", "gradient"}));
  const fs::path out = scratch("scale_history_out");
  ASSERT_EQ(inspect::write_scale_history(s, out.string(), "delayed"), "");
  uint32_t w = 0, h = 0;
  EXPECT_TRUE(valid_png(out / "scales.png", &w, &h));
  EXPECT_TRUE(valid_png(out / "quant_fractions.png", &w, &h));
  EXPECT_TRUE(inspect::read_scale_history(trained("scale_history_f32", "f32").out).empty()) << "f32 quantises nothing";
}

}  // namespace
}  // namespace scalify
