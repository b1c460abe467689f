// `scalify compare` on a tiny config: the report's files and columns, valid PNGs, a diverging
// recipe reported as such while the others complete, --resume, and bytes per parameter of
// training state measured on the tensors against what each recipe declares.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scalify/error.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/compare/compare.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::scratch, testing::slurp, testing::spit, testing::text_corpus, testing::tiny_run, testing::valid_png;

// The window-sampling error of a paired delta, against values worked by hand: differences
// d = (0.1, 0.2, 0.05, 0.15) over 4 batches of 2 windows: mean 0.125, squared deviations summing
// to 0.0125, SE^2 = 4/3 * (2/8)^2 * 0.0125, t(0.975, 3) = 3.182.
TEST(Noise, PairedDeltaOfBatchMeans) {
  const std::vector<double> recipe = {1.0, 1.2, 1.1, 1.3}, base = {0.9, 1.0, 1.05, 1.15};
  const compare::PairedDelta d = compare::paired_delta(recipe, base, 2, 8);
  EXPECT_NEAR(d.delta, 0.125, 1e-12);
  EXPECT_NEAR(d.se, std::sqrt(4.0 / 3.0 / 16.0 * 0.0125), 1e-12);
  EXPECT_EQ(d.df, 3);
  EXPECT_NEAR(d.half_width, 3.182 * d.se, 1e-12);
  // A last batch of one window weighs half as much: (2 0.1 + 2 0.2 + 2 0.05 + 0.15) / 7.
  EXPECT_NEAR(compare::paired_delta(recipe, base, 2, 7).delta, 0.85 / 7, 1e-12);
  EXPECT_TRUE(std::isnan(compare::paired_delta(recipe, {1.0, 2.0}, 2, 8).delta));  // not the same batches
  EXPECT_TRUE(std::isnan(compare::paired_delta({1.0}, {1.0}, 2, 2).delta));        // one batch: no spread
  EXPECT_TRUE(std::isnan(compare::paired_delta(recipe, base, 2, 20).delta));       // 4 batches cannot hold 20 windows of 2
}

TEST(Noise, TQuantilesAreTheTablesAndVerdictsFollowTheStatedRule) {
  EXPECT_EQ(compare::t975(1), 12.706);
  EXPECT_EQ(compare::t975(15), 2.131);
  EXPECT_EQ(compare::t975(30), 2.042);
  EXPECT_EQ(compare::t975(35), 2.021);
  EXPECT_EQ(compare::t975(1000), 1.960);
  const auto v = [](double delta, double half) { return compare::verdict({delta, half / 2, half, 10}, 0.05); };
  EXPECT_EQ(v(-0.03, 0.01), "better than baseline");
  EXPECT_EQ(v(0.004, 0.01), "not distinguishable from baseline");
  EXPECT_EQ(v(-0.004, 0.01), "not distinguishable from baseline");
  EXPECT_EQ(v(0.03, 0.01), "within +0.05 of baseline");
  EXPECT_EQ(v(0.05, 0.01), "inconclusive");
  EXPECT_EQ(v(0.07, 0.01), "worse");
  EXPECT_EQ(compare::verdict({NAN, NAN, NAN, 0}, 0.05), "no noise estimate");
}

std::vector<std::string> csv_header(const fs::path& p) {
  std::istringstream in(slurp(p));
  std::string line, cell;
  std::getline(in, line);
  std::vector<std::string> cols;
  std::istringstream cells(line);
  while (std::getline(cells, cell, ',')) cols.push_back(cell);
  return cols;
}

// A comparison with a recipe that cannot train: f16 matmuls under a static loss scale of 1e38,
// so every step's gradients overflow and the step is skipped.
compare::CompareConfig overflowing_comparison(const fs::path& out) {
  quant::Recipe r = quant::preset("f16_loss_scaled");
  r.name = "overflow";
  r.loss_scaling.kind = quant::LossScalerConfig::Kind::fixed;
  r.loss_scaling.scale = 1e38;
  const fs::path recipe = out.parent_path() / "overflow.json";
  spit(recipe, r.to_json());
  compare::CompareConfig c{tiny_run(text_corpus(), "", "f32"), {"current", recipe.string()}, out.string()};
  c.base.steps = 12;
  return c;
}

TEST(Compare, WritesTheReportAndReportsADivergingRecipeWhileTheOthersComplete) {
  const fs::path out = scratch("compare");
  std::vector<std::string> progress;
  const compare::CompareReport rep =
      compare::compare(overflowing_comparison(out), false, [&](const std::string& l) { progress.push_back(l); });
  ASSERT_EQ(rep.rows.size(), 3u);
  EXPECT_EQ(rep.rows[0].recipe, "f32");  // the baseline, added first
  EXPECT_EQ(rep.rows[0].status, "ok");
  EXPECT_EQ(rep.rows[1].status, "ok") << rep.rows[1].note;
  EXPECT_EQ(rep.rows[2].name, "overflow");
  EXPECT_EQ(rep.rows[2].status, "diverged");
  EXPECT_EQ(rep.rows[2].result.skipped, 12);
  EXPECT_TRUE(std::isfinite(rep.rows[1].val_delta));
  std::printf("%s", rep.table.c_str());

  for (const char* f : {"report.md", "summary.csv", "summary.json", "compare.json", "runs/f32/outcome.json", "runs/current/metrics.jsonl",
                        "runs/overflow/outcome.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  const std::vector<std::string> cols = csv_header(out / "summary.csv");
  for (const char* c : {"recipe", "status", "val_loss", "val_delta", "val_delta_ci95", "verdict", "val_bpb", "train_loss", "skipped_steps",
                        "nonfinite_steps", "mean_underflow", "mean_clipped", "scale_statistics_per_step", "tokens_per_s", "peak_memory_mb",
                        "state_bytes_per_parameter", "cpu_share", "step_time_spread"})
    EXPECT_NE(std::find(cols.begin(), cols.end(), c), cols.end()) << c;
  // The timing beside the speed: each finished recipe's steps filled some share of the cores (CPU
  // time over wall time x threads; a little above 1 when spinning threads are counted), and their
  // wall times spread by a factor of at least 1.
  for (const compare::RecipeOutcome& o : rep.rows)
    if (o.status == "ok") {
      EXPECT_GT(o.result.cpu_share, 0.05) << o.name;
      EXPECT_LT(o.result.cpu_share, 1.5) << o.name;
      EXPECT_GE(o.result.step_time_spread, 1.0) << o.name;
    }
  const json summary = json::parse(slurp(out / "summary.json"));
  ASSERT_EQ(summary["recipes"].size(), 3u);
  EXPECT_EQ(summary["recipes"][2]["status"], "diverged");

  const std::string md = slurp(out / "report.md");
  for (const char* s : {"| recipe | status |", "| overflow | diverged |", "- Verdicts (the 95 % interval", " ± ",
                        "**Diverged**: overflow (skipped 12 of 12", "cpu:", "State B/param", "## Numerics",
                        "[histograms](runs/current/inspect/histograms.png)", "[scales](runs/current/inspect/scales.png)", "| fp8_amax | ",
                        "| fp8_cscale | 12 | ", "FP8-CSCALE is within 1% of f32"})
    EXPECT_NE(md.find(s), std::string::npos) << s;
  EXPECT_EQ(md.find("[histograms](runs/overflow/"), std::string::npos) << "a diverged recipe has no final model to inspect";
  ASSERT_EQ(rep.plot_error, "") << "gnuplot is part of scripts/setup.sh";
  for (const char* png :
       {"runs/f32/inspect/histograms.png", "runs/current/inspect/scales.png", "runs/current/inspect/quant_fractions.png"}) {
    uint32_t w = 0, h = 0;
    EXPECT_TRUE(valid_png(out / png, &w, &h)) << png;
  }
  for (const char* png : {"loss.png", "loss_delta.png"}) {
    uint32_t w = 0, h = 0;
    EXPECT_TRUE(valid_png(out / png, &w, &h)) << png;
    EXPECT_EQ(w, 1280u) << png;
    EXPECT_EQ(h, 720u) << png;
  }
  ASSERT_FALSE(progress.empty());
  EXPECT_NE(progress.back().find("[3/3] overflow"), std::string::npos) << progress.back();
  EXPECT_NE(progress.back().find("eta"), std::string::npos);
}

TEST(Compare, ResumeRerunsOnlyTheUnfinishedRecipes) {
  const train::TrainConfig base = tiny_run(text_corpus(), "", "f32");
  const fs::path whole = scratch("compare_whole"), cut = scratch("compare_cut");
  const compare::CompareReport reference = compare::compare({base, {"f32", "current"}, whole.string()}, false);
  // The same comparison, stopped during the second recipe (after its checkpoint at step 3).
  struct Stop {};
  EXPECT_THROW(compare::compare({base, {"f32", "current"}, cut.string()}, false,
                                [](const std::string& line) {
                                  if (line.find("[2/2] current  step 5/") != std::string::npos) throw Stop{};
                                }),
               Stop);
  EXPECT_FALSE(fs::exists(cut / "runs/current/outcome.json"));
  // Without --resume the folder is refused; with it, f32 is read back and current resumes.
  EXPECT_THROW(compare::compare({base, {"f32", "current"}, cut.string()}, false), Error);
  const auto f32_written = fs::last_write_time(cut / "runs/f32/metrics.jsonl");
  std::string first_line;
  const compare::CompareReport resumed = compare::compare(compare::comparison_config(cut.string()), true, [&](const std::string& line) {
    if (first_line.empty()) first_line = line;
  });
  EXPECT_EQ(fs::last_write_time(cut / "runs/f32/metrics.jsonl"), f32_written) << "a finished recipe was rerun";
  EXPECT_NE(first_line.find("[2/2] current  step 4/"), std::string::npos) << first_line;
  ASSERT_EQ(resumed.rows.size(), 2u);
  // Bit-exact resume: the interrupted comparison ends where the whole one did.
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed.rows[i].result.val_loss, reference.rows[i].result.val_loss) << i;
    EXPECT_EQ(resumed.rows[i].result.train_loss, reference.rows[i].result.train_loss) << i;
  }
}

TEST(Compare, CorruptStateAndForeignFoldersAreClearErrors) {
  const train::TrainConfig base = tiny_run(text_corpus(), "", "f32");
  const fs::path out = scratch("compare_corrupt");
  compare::CompareConfig c{base, {"f32"}, out.string()};
  c.base.steps = 2;
  compare::compare(c, false);
  spit(out / "runs/f32/outcome.json", "{\"recipe\": 3}");
  try {
    compare::compare(compare::comparison_config(out.string()), true);
    FAIL() << "a corrupt outcome.json was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs/f32/outcome.json"), std::string::npos) << e.what();
  }
  spit(out / "compare.json", "[1, 2]");
  EXPECT_THROW(compare::comparison_config(out.string()), Error);
  // A folder that holds someone else's runs/f32 (no compare.json) is not overwritten.
  const fs::path foreign = scratch("compare_foreign");
  fs::create_directories(foreign / "runs/f32");
  spit(foreign / "runs/f32/mine.txt", "keep");
  EXPECT_THROW(compare::compare({base, {"f32"}, foreign.string()}, false), Error);
  EXPECT_EQ(slurp(foreign / "runs/f32/mine.txt"), "keep");
}

TEST(Compare, RecipeListsExpandNamesAndRejectUnknownOnes) {
  EXPECT_EQ(compare::recipe_list("seeds"), quant::preset_names());
  EXPECT_EQ(compare::recipe_list("f32, scalify, scalify_fp8_3"),
            (std::vector<std::string>{"f32", "scalify_fp16_1", "scalify_fp16_2", "scalify_fp8_3", "scalify_fp8_4"}));
  try {
    compare::recipe_list("f32,fp9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("per_tensor"), std::string::npos) << e.what();
  }
  EXPECT_THROW(compare::recipe_list(" , "), Error);
  EXPECT_THROW(compare::recipe_list("missing.json"), Error);
}

TEST(Compare, ARecipeJsonFileRunsUnderItsStem) {
  const fs::path dir = scratch("recipe_file");
  fs::create_directories(dir);
  quant::Recipe r = quant::preset("current");
  r.name = "my_current";
  spit(dir / "my_current.json", r.to_json());
  compare::CompareConfig c{tiny_run(text_corpus(), "", "f32"), {(dir / "my_current.json").string()}, (dir / "out").string()};
  c.base.steps = 3;
  const compare::CompareReport rep = compare::compare(c, false);
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_EQ(rep.rows[1].name, "my_current");
  EXPECT_EQ(rep.rows[1].status, "ok") << rep.rows[1].note;
  spit(dir / "bad.json", "{\"name\": 3}");
  EXPECT_THROW(quant::load_recipe((dir / "bad.json").string()), Error);
}

// What a recipe declares it stores per parameter: master weights, the weight gradient (in the
// recipe's cast format, else in the storage of the parameter as used: the narrower of the master
// weights and the data storage, SPEC §2) and AdamW's two moments.
double declared_bytes_per_parameter(const quant::Recipe& r) {
  const double gradient = r.weight_gradient == Format::f32 ? double(std::min(dtype_size(r.master_weight), dtype_size(r.data_storage)))
                                                           : double(info(r.weight_gradient).bits) / 8.0;
  return dtype_size(r.master_weight) + gradient + 2.0 * dtype_size(r.optimizer_state);
}

TEST(Compare, StateBytesPerParameterMatchWhatEachRecipeDeclares) {
  const fs::path data = text_corpus();
  for (const std::string& name : quant::preset_names()) {
    train::TrainConfig c = tiny_run(data, scratch("bytes_" + name), name);
    c.steps = 1;
    c.eval_windows = 1;
    const train::TrainResult r = train::train(c, false);
    const double declared = declared_bytes_per_parameter(quant::preset(name));
    // Scaled tensors add one f32 scale per tensor: under 0.05 bytes per parameter here.
    EXPECT_NEAR(r.state_bytes_per_parameter, declared, 0.05) << name;
    if (name == "f32") {
      EXPECT_EQ(r.state_bytes_per_parameter, 16.0);
    }
    if (name == "scalify_fp8_4") {
      EXPECT_NEAR(r.state_bytes_per_parameter, 2 + 1 + 2 + 2, 0.05);
    }
  }
}

}  // namespace
}  // namespace scalify
