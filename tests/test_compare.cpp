// `scalify compare` on a tiny config: the report's files and columns, valid PNGs, a diverging
// recipe reported as such while the others complete, --resume, and bytes per parameter of
// training state measured on the tensors against what each recipe declares.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/compare/compare.hpp"
#include "scalify/train/session.hpp"
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
  const auto v = [](double delta, double half) { return compare::verdict(delta, half, 0.05); };
  EXPECT_EQ(v(-0.03, 0.01), "better than baseline");
  EXPECT_EQ(v(0.004, 0.01), "not distinguishable from baseline");
  EXPECT_EQ(v(-0.004, 0.01), "not distinguishable from baseline");
  EXPECT_EQ(v(0.03, 0.01), "within +0.05 of baseline");
  EXPECT_EQ(v(0.05, 0.01), "inconclusive");
  EXPECT_EQ(v(0.07, 0.01), "worse");
  EXPECT_EQ(compare::verdict(NAN, NAN, 0.05), "no noise estimate");
}

// Over seeds, worked by hand: three seeds whose batch differences are constant within each seed
// (0.01, 0.02, 0.06: no window-sampling spread in any seed alone), so the seeds' spread is
// t(0.975, 2) sd / sqrt(3) with sd = sqrt(((0.01-0.03)^2 + (0.02-0.03)^2 + (0.06-0.03)^2) / 2),
// and the window error of the seed-averaged batch means is 0. One seed: only the window error.
TEST(Noise, DeltaOverSeedsAddsTheSeedsSpreadToTheWindowError) {
  const std::vector<double> base = {1.0, 1.1, 1.2, 1.3};
  auto shifted = [&](double d) {
    std::vector<double> r = base;
    for (double& x : r) x += d;
    return r;
  };
  const compare::DeltaInterval d = compare::delta_over_seeds({shifted(0.01), shifted(0.02), shifted(0.06)}, {base, base, base}, 2, 8);
  const double sd = std::sqrt((0.0004 + 0.0001 + 0.0009) / 2);
  EXPECT_NEAR(d.delta, 0.03, 1e-12);
  EXPECT_EQ(d.seeds, 3);
  EXPECT_NEAR(d.seed_half_width, 4.303 * sd / std::sqrt(3.0), 1e-12);
  EXPECT_NEAR(d.window_half_width, 0.0, 1e-12);
  EXPECT_NEAR(d.half_width, d.seed_half_width, 1e-12);
  // One seed: the paired window-sampling interval of PairedDeltaOfBatchMeans, nothing added.
  const std::vector<double> recipe = {1.0, 1.2, 1.1, 1.3}, b = {0.9, 1.0, 1.05, 1.15};
  const compare::DeltaInterval one = compare::delta_over_seeds({recipe}, {b}, 2, 8);
  EXPECT_EQ(one.half_width, compare::paired_delta(recipe, b, 2, 8).half_width);
  EXPECT_EQ(one.seed_half_width, 0.0);
  // Window error and seed spread together: in quadrature.
  const compare::DeltaInterval both = compare::delta_over_seeds({recipe, shifted(0.3)}, {b, base}, 2, 8);
  EXPECT_NEAR(both.half_width, std::hypot(both.window_half_width, both.seed_half_width), 1e-15);
  EXPECT_GT(both.window_half_width, 0.0);
  EXPECT_TRUE(std::isnan(compare::delta_over_seeds({recipe}, {}, 2, 8).delta));
  EXPECT_TRUE(std::isnan(compare::delta_over_seeds({}, {}, 2, 8).delta));
  EXPECT_TRUE(std::isnan(compare::delta_over_seeds({recipe, {1.0}}, {b, {1.0}}, 2, 8).delta)) << "a seed without batches";
}

TEST(Compare, SeedListsAreCountsOrListsAndBadOnesAreErrors) {
  EXPECT_EQ(compare::seed_list("3", 5), (std::vector<uint64_t>{5, 6, 7}));
  EXPECT_EQ(compare::seed_list("1", 5), (std::vector<uint64_t>{5}));
  EXPECT_EQ(compare::seed_list("1,9,4", 5), (std::vector<uint64_t>{1, 9, 4}));
  for (const char* bad : {"0", "101", "x", "", "1,1", "1,,2", "-1", "2,x", "1.5"}) EXPECT_THROW(compare::seed_list(bad, 1), Error) << bad;
  EXPECT_EQ(compare::default_eval_every(300), 30);
  EXPECT_EQ(compare::default_eval_every(5), 1);
  EXPECT_EQ(compare::default_eval_every(201), 21);
}

// A comparison of `recipes` under `base` into `out`, without the interleaved speed timing (the
// tests that look at it set its rounds).
compare::CompareConfig comparison(const train::TrainConfig& base, const std::vector<std::string>& recipes, const fs::path& out) {
  compare::CompareConfig c;
  c.base = base;
  c.recipes = recipes;
  c.out = out.string();
  c.speed.rounds = 0;
  return c;
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
  compare::CompareConfig c = comparison(tiny_run(text_corpus(), "", "f32"), {"current", recipe.string()}, out);
  c.base.steps = 12;
  return c;
}

TEST(Compare, WritesTheReportAndReportsADivergingRecipeWhileTheOthersComplete) {
  const fs::path out = scratch("compare");
  std::vector<std::string> progress;
  compare::CompareConfig config = overflowing_comparison(out);
  config.speed.rounds = 2;  // the interleaved timing after training, kept short
  config.speed.min_seconds = 0;
  const int threads = num_threads();
  const compare::CompareReport rep = compare::compare(config, false, [&](const std::string& l) { progress.push_back(l); });
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
  for (const char* c : {"recipe",
                        "status",
                        "seeds",
                        "val_loss",
                        "val_delta",
                        "val_delta_ci95",
                        "window_ci95",
                        "seed_ci95",
                        "verdict",
                        "val_bpb",
                        "train_loss",
                        "skipped_steps",
                        "nonfinite_steps",
                        "mean_underflow",
                        "mean_clipped",
                        "scale_statistics_per_step",
                        "tokens_per_s",
                        "speed_vs_f32",
                        "speed_vs_f32_low",
                        "speed_vs_f32_high",
                        "peak_memory_mb",
                        "state_bytes_per_parameter",
                        "cpu_share",
                        "step_time_spread"})
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
                        "| fp8_cscale | 12 | ", "FP8-CSCALE (e4m3) is within 1% of f32"})
    EXPECT_NE(md.find(s), std::string::npos) << s;
  EXPECT_EQ(md.find("[histograms](runs/overflow/"), std::string::npos) << "a diverged recipe has no final model to inspect";
  ASSERT_EQ(rep.plot_error, "") << "gnuplot is part of scripts/setup.sh";
  for (const char* png :
       {"runs/f32/inspect/histograms.png", "runs/current/inspect/scales.png", "runs/current/inspect/quant_fractions.png"}) {
    uint32_t w = 0, h = 0;
    EXPECT_TRUE(valid_png(out / png, &w, &h)) << png;
  }
  for (const char* png : {"delta.png", "loss.png", "loss_delta.png"}) {
    uint32_t w = 0, h = 0;
    EXPECT_TRUE(valid_png(out / png, &w, &h)) << png;
    EXPECT_EQ(w, 1400u) << png;
  }
  // delta.png first (its height: a line per recipe with a delta: current), then the curves.
  EXPECT_LT(md.find("![validation loss minus the baseline, with its interval](delta.png)"), md.find("| recipe | status |"));
  EXPECT_NE(md.find("![validation loss minus the baseline over training](loss_delta.png)"), std::string::npos);
  // Each evaluation's delta with its interval: step, mean, low, high, low <= mean <= high, the
  // interval wider than nothing (the window-sampling error of real batches).
  std::istringstream steps(slurp(out / "delta_steps.dat"));
  int points = 0;
  for (std::string line; std::getline(steps, line);) {
    if (line.empty()) continue;
    double step = 0, mean = 0, low = 0, high = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%lf %lf %lf %lf", &step, &mean, &low, &high), 4) << line;
    EXPECT_LT(low, mean) << line;
    EXPECT_LT(mean, high) << line;
    ++points;
  }
  EXPECT_GE(points, 2) << "an evaluation every eval_every steps, and the last";
  ASSERT_FALSE(progress.empty());
  const auto last_step = std::find_if(progress.rbegin(), progress.rend(), [](const std::string& l) { return !l.starts_with("speed"); });
  ASSERT_NE(last_step, progress.rend());
  EXPECT_NE(last_step->find("[3/3] overflow"), std::string::npos) << *last_step;
  EXPECT_NE(last_step->find("eta"), std::string::npos);
  // Speeds timed interleaved: 2 rounds over the recipes that trained (not the diverged one); f32
  // against itself is 1 in every round; a recipe's median ratio lies within its rounds' range.
  EXPECT_NE(std::find(progress.begin(), progress.end(), "speed, round 2/2 [2/2] f32"), progress.end()) << "round 2 runs in reverse";
  EXPECT_EQ(rep.speed.rounds, 2);
  EXPECT_EQ(rep.rows[0].speed.vs_f32, 1.0);
  EXPECT_EQ(rep.rows[0].speed.vs_f32_low, 1.0);
  const compare::RecipeSpeed& current = rep.rows[1].speed;
  EXPECT_GT(current.tokens_per_s, 0);
  EXPECT_LE(current.vs_f32_low, current.vs_f32);
  EXPECT_LE(current.vs_f32, current.vs_f32_high);
  EXPECT_GT(current.cpu_share, 0.05);
  EXPECT_EQ(rep.rows[2].speed.tokens_per_s, 0) << "a diverged recipe is not timed";
  EXPECT_EQ(num_threads(), threads) << "the timing's one thread outlived it";
  EXPECT_NE(md.find("timed after training, interleaved in one process on one thread (2 rounds"), std::string::npos);
}

// --seeds: every recipe under each seed, in a run folder of its own. A run under seed 2 is the run
// a one-seed comparison under seed 2 makes, bit for bit; a row's delta is the mean of the seeds'
// paired deltas (read back from the runs' outcome files), and its interval holds their spread.
TEST(Compare, SeveralSeedsGiveEachRecipeARunPerSeedAndAnIntervalOverThem) {
  train::TrainConfig base = tiny_run(text_corpus(), "", "f32");
  base.steps = 6;
  const fs::path out = scratch("compare_seeds");
  compare::CompareConfig c = comparison(base, {"current"}, out);
  c.seeds = {1, 2, 3};
  const compare::CompareReport rep = compare::compare(c, false);
  ASSERT_EQ(rep.runs.size(), 6u);
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_EQ(rep.rows[1].seeds, (std::vector<uint64_t>{1, 2, 3}));
  std::vector<double> deltas;
  for (int seed : {1, 2, 3}) {
    const std::string s = std::to_string(seed);
    const json mine = json::parse(slurp(out / ("runs/current_seed" + s) / "outcome.json"));
    const json f32 = json::parse(slurp(out / ("runs/f32_seed" + s) / "outcome.json"));
    deltas.push_back(mine["val_loss"].get<double>() - f32["val_loss"].get<double>());
  }
  const double mean = (deltas[0] + deltas[1] + deltas[2]) / 3;
  double ss = 0;
  for (double d : deltas) ss += (d - mean) * (d - mean);
  const compare::RecipeOutcome& row = rep.rows[1];
  EXPECT_NEAR(row.val_delta, mean, 1e-12);
  EXPECT_NE(deltas[0], deltas[1]) << "the seeds trained alike";
  EXPECT_NEAR(row.noise.seed_half_width, 4.303 * std::sqrt(ss / 2 / 3), 1e-12);
  EXPECT_GT(row.noise.window_half_width, 0);
  // The verdict by the stated rule, worked here from the interval.
  const double lo = row.val_delta - row.noise.half_width, hi = row.val_delta + row.noise.half_width;
  EXPECT_EQ(row.verdict, hi < 0       ? "better than baseline"
                         : lo <= 0    ? "not distinguishable from baseline"
                         : hi <= 0.05 ? "within +0.05 of baseline"
                         : lo > 0.05  ? "worse"
                                      : "inconclusive");

  train::TrainConfig seed2 = base;
  seed2.seed = 2;
  const compare::CompareReport one = compare::compare(comparison(seed2, {"current"}, scratch("compare_seed2")), false);
  EXPECT_EQ(one.rows[1].result.val_loss, rep.runs[3].result.val_loss) << rep.runs[3].run;
  EXPECT_EQ(rep.runs[3].run, "current_seed2");
  EXPECT_EQ(one.rows[1].run, "current");

  const std::string md = slurp(out / "report.md");
  for (const char* text : {"under each of 3 seeds", "seeds 1, 2, 3", "mean over 3 seeds", "`<recipe>_seed<N>`"})
    EXPECT_NE(md.find(text), std::string::npos) << text;
  const json summary = json::parse(slurp(out / "summary.json"));
  EXPECT_EQ(summary["runs"].size(), 6u);
  EXPECT_EQ(summary["seeds"], json({1, 2, 3}));
  EXPECT_EQ(compare::comparison_config(out.string()).seeds, (std::vector<uint64_t>{1, 2, 3}));

  // The baseline lost on one seed (its outcome rewritten as diverged, then the report rebuilt by
  // --resume, which reads finished runs back): no delta, no interval, no verdict but the reason;
  // the f32 row diverged, its losses not a mean over the seeds that survived.
  json f32_seed2 = json::parse(slurp(out / "runs/f32_seed2/outcome.json"));
  f32_seed2["status"] = "diverged";
  f32_seed2["note"] = "made to diverge by the test";
  spit(out / "runs/f32_seed2/outcome.json", f32_seed2.dump());
  const compare::CompareReport broken = compare::compare(compare::comparison_config(out.string()), true);
  EXPECT_EQ(broken.rows[0].status, "diverged");
  EXPECT_EQ(broken.rows[0].note, "seed 2: made to diverge by the test");
  EXPECT_TRUE(std::isnan(broken.rows[0].result.val_loss));
  EXPECT_EQ(broken.rows[1].verdict, "no baseline");
  EXPECT_TRUE(std::isnan(broken.rows[1].val_delta));
  EXPECT_TRUE(std::isnan(broken.rows[1].noise.half_width));
  EXPECT_EQ(broken.rows[1].result.val_loss, row.result.val_loss) << "the recipe itself finished every seed";
}

// A comparison of the baseline alone: its loss curve, no delta picture and no link to one.
TEST(Compare, BaselinesAloneDrawTheirLossAndNoDelta) {
  train::TrainConfig base = tiny_run(text_corpus(), "", "f32");
  base.steps = 3;
  const fs::path out = scratch("compare_baseline_only");
  const compare::CompareReport rep = compare::compare(comparison(base, {"f32"}, out), false);
  EXPECT_EQ(rep.plot_error, "");
  uint32_t w = 0, h = 0;
  EXPECT_TRUE(valid_png(out / "loss.png", &w, &h));
  EXPECT_FALSE(fs::exists(out / "delta.png"));
  EXPECT_FALSE(fs::exists(out / "loss_delta.png"));
  const std::string md = slurp(out / "report.md");
  EXPECT_EQ(md.find("delta.png"), std::string::npos);
  EXPECT_NE(md.find("![loss](loss.png)"), std::string::npos);
}

TEST(Compare, CountsTheUmupRecipesOwnTransformer) {
  // A u-μP recipe trains unit-scaling's transformer (SwiGLU of 4 d: 12 d² per block, no biases,
  // an untied head), not the base model: its count, by hand, next to the base's.
  train::TrainConfig base = tiny_run(text_corpus(), "", "f32");
  base.steps = 2;
  const fs::path out = scratch("compare_umup_count");
  compare::compare(comparison(base, {"umup"}, out), false);
  const int64_t d = base.model.d_model, V = base.model.vocab, T = base.model.seq, L = base.model.layers;
  const int64_t umup = L * (16 * d * d + 2 * d) + (V + T) * d + d + V * d;
  const json summary = json::parse(slurp(out / "summary.json"));
  EXPECT_EQ(summary.at("umup_parameters").get<int64_t>(), umup);
  EXPECT_EQ(summary.at("parameters").get<int64_t>(), base.model.parameter_count());
  EXPECT_NE(slurp(out / "report.md").find("(the u-μP recipes' transformer: " + std::to_string(umup) + ")"), std::string::npos);
}

TEST(Compare, ResumeRerunsOnlyTheUnfinishedRecipes) {
  const train::TrainConfig base = tiny_run(text_corpus(), "", "f32");
  const fs::path whole = scratch("compare_whole"), cut = scratch("compare_cut");
  const compare::CompareReport reference = compare::compare(comparison(base, {"f32", "current"}, whole), false);
  // The same comparison, stopped by its caller during the second recipe (after its checkpoint at
  // step 3): compare::Stopped passes through, where the recipe's own errors would make a failed row.
  EXPECT_THROW(compare::compare(comparison(base, {"f32", "current"}, cut), false,
                                [](const std::string& line) {
                                  if (line.find("[2/2] current  step 5/") != std::string::npos)
                                    throw compare::Stopped(std::make_exception_ptr(std::runtime_error("the caller's")));
                                }),
               compare::Stopped);
  EXPECT_FALSE(fs::exists(cut / "runs/current/outcome.json"));
  // Without --resume the folder is refused; with it, f32 is read back and current resumes.
  EXPECT_THROW(compare::compare(comparison(base, {"f32", "current"}, cut), false), Error);
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
  compare::CompareConfig c = comparison(base, {"f32"}, out);
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
  EXPECT_THROW(compare::compare(comparison(base, {"f32"}, foreign), false), Error);
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
  compare::CompareConfig c = comparison(tiny_run(text_corpus(), "", "f32"), {(dir / "my_current.json").string()}, dir / "out");
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
// weights and the data storage, SPEC §2) and AdamW's two moments; scaled-f16 linear masters
// (msamp_o2) hold 2 bytes of data and an f32 gradient for the blocks' four linear weights.
double declared_bytes_per_parameter(const quant::Recipe& r, const train::TrainConfig& c) {
  const double gradient = r.weight_gradient == Format::f32 ? double(std::min(dtype_size(r.master_weight), dtype_size(r.data_storage)))
                                                           : double(info(r.weight_gradient).bits) / 8.0;
  // A moment in its own format (issue 48): its codes, plus per group an f32 scale (and COAT's k and
  // centre); f32 moments in optimizer_state's storage.
  auto moment = [&](const optim::StateFormat& f) {
    if (f.is_plain_f32()) return double(dtype_size(r.optimizer_state));
    const double per_group = f.scaling == optim::StateScaling::per_group ? (f.expand ? 12.0 : 4.0) / double(f.group_size) : 0.0;
    return double(info(f.storage).bits) / 8.0 + per_group;
  };
  double linear_masters = 0;  // bytes per parameter the scaled-f16 linear masters change
  if (r.linear_master_weight == quant::LinearMaster::scaled_f16) {
    const nn::GptConfig m = train::Session::model_config(c, r);
    const double d = double(m.d_model), hidden = double(m.block().mlp_hidden);
    const double linear = double(m.layers) * (d * 3 * d + d * d + 2 * d * hidden);  // qkv, proj, fc, out
    linear_masters = linear / double(m.parameter_count()) * ((2.0 - double(dtype_size(r.master_weight))) + (4.0 - gradient));
  }
  return dtype_size(r.master_weight) + gradient + moment(r.first_moment) + moment(r.second_moment) + linear_masters;
}

TEST(Compare, StateBytesPerParameterMatchWhatEachRecipeDeclares) {
  const fs::path data = text_corpus();
  for (const std::string& name : quant::preset_names()) {
    train::TrainConfig c = tiny_run(data, scratch("bytes_" + name), name);
    c.steps = 1;
    c.eval_windows = 1;
    const train::TrainResult r = train::train(c, false);
    const double declared = declared_bytes_per_parameter(quant::preset(name), c);
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
