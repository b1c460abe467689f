// `scalify sweep` (compare/sweep.hpp): the verdict's grid-step rule on hand-made loss tables, the
// argument errors, and a tiny sweep's report, plots and rerun.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "scalify/compare/sweep.hpp"
#include "scalify/error.hpp"
#include "scalify/quant/recipe.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using testing::scratch, testing::slurp, testing::spit, testing::text_corpus, testing::tiny_run, testing::valid_png;

// The message of the scalify::Error `fn` throws ("" when it throws none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SweepVerdict, BestValueIsTheLowestFiniteLossAndDivergedMeansAboveTheUntrainedLoss) {
  EXPECT_EQ(compare::best_value({3.0, 2.5, 2.7}), 1u);
  EXPECT_EQ(compare::best_value({NAN, 2.5, INFINITY}), 1u);  // not finite: never the best
  EXPECT_EQ(compare::best_value({NAN, -INFINITY, 2.9}), 2u);
  EXPECT_EQ(compare::best_value({2.5, 2.4, 2.4, 2.6}), 1u);  // a tie goes to the lower value
  EXPECT_EQ(compare::best_value({NAN, NAN}), std::nullopt);
  EXPECT_TRUE(compare::diverged_loss(5.6 + 1e-9, 5.6));
  EXPECT_FALSE(compare::diverged_loss(5.6, 5.6));
  EXPECT_TRUE(compare::diverged_loss(NAN, 5.6));
  EXPECT_TRUE(compare::diverged_loss(-INFINITY, 5.6));
}

TEST(SweepVerdict, TransfersWithinOneGridStepElseMovesByTheLargestDistance) {
  EXPECT_EQ(compare::transfer_verdict({3, 3, 3}).text, "transfers");
  EXPECT_EQ(compare::transfer_verdict({3, 4, 3}).text, "transfers");  // one step apart
  const compare::TransferVerdict moved = compare::transfer_verdict({1, 2, 3});
  EXPECT_EQ(moved.text, "moves by 2 steps");
  EXPECT_EQ(moved.steps, 2);
  EXPECT_EQ(compare::transfer_verdict({5, 0}).text, "moves by 5 steps");
  // A shape whose every value diverged has no best and is left out.
  EXPECT_EQ(compare::transfer_verdict({2, std::nullopt, 3}).text, "transfers");
  EXPECT_EQ(compare::transfer_verdict({2, std::nullopt}).steps, std::nullopt);
  EXPECT_EQ(compare::transfer_verdict({std::nullopt, std::nullopt}).text.rfind("no verdict", 0), 0u);
}

// Hand-made cells for summarise_sweep: losses[width index][value index] at depth 2.
compare::SweepConfig hand_config() {
  compare::SweepConfig c;
  c.base.model.d_model = 32;
  c.base.model.heads = 2;
  c.base.model.layers = 2;
  c.grid = compare::parse_vary("lr=2^-10:2^-6", c.base);
  c.widths = {32, 64, 128};
  c.depths = {2};
  c.recipes = {"f32"};
  return c;
}
std::vector<compare::SweepCell> hand_cells(const std::vector<std::vector<double>>& losses) {
  std::vector<compare::SweepCell> cells;
  const std::vector<int64_t> widths = {32, 64, 128};
  for (size_t w = 0; w < losses.size(); ++w)
    for (size_t v = 0; v < losses[w].size(); ++v) {
      compare::SweepCell cell;
      cell.recipe = "f32";
      cell.width = widths[w];
      cell.depth = 2;
      cell.value = v;
      cell.val_loss = losses[w][v];
      if (!std::isfinite(losses[w][v])) cell.status = "diverged";
      cells.push_back(cell);
    }
  return cells;
}

TEST(SweepVerdict, TablesOfHandMadeLossesGiveTheirVerdicts) {
  const compare::SweepConfig c = hand_config();
  // Best at 2^-8 for every width: transfers.
  auto r = compare::summarise_sweep(c, hand_cells({{3.0, 2.8, 2.5, 2.9, 3.2}, {2.9, 2.6, 2.4, 2.7, 3.1}, {2.8, 2.5, 2.3, 2.6, NAN}}));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].across_widths.text, "transfers");
  EXPECT_EQ(r[0].across_depths.text, "no verdict (one depth)");
  // Best at 2^-6, 2^-7, 2^-8 as the width grows (μP's drift under standard parametrisation): moves by 2.
  r = compare::summarise_sweep(c, hand_cells({{3.0, 2.8, 2.6, 2.5, 2.4}, {2.9, 2.6, 2.4, 2.3, 2.5}, {2.8, 2.5, 2.3, 2.4, NAN}}));
  EXPECT_EQ(r[0].across_widths.text, "moves by 2 steps");
  // NaN cells (diverged) are shown so and never the best.
  r = compare::summarise_sweep(c, hand_cells({{3.0, 2.8, 2.6, 2.5, NAN}, {2.9, 2.6, 2.4, 2.3, NAN}, {NAN, 2.5, 2.4, 2.2, NAN}}));
  EXPECT_EQ(r[0].across_widths.text, "transfers");
  EXPECT_NE(r[0].table.find("| 128 | 2 | diverged | 2.5000 | 2.4000 | **2.2000** | diverged | 2^-7 |"), std::string::npos) << r[0].table;
  EXPECT_NE(r[0].csv.find("128,2,diverged,2.500000,2.400000,2.200000,diverged,0.0078125\n"), std::string::npos) << r[0].csv;
  // Ties: the lower value is each width's best; 2^-9 against 2^-7 is 2 steps.
  r = compare::summarise_sweep(c, hand_cells({{3.0, 2.4, 2.4, 2.5, 2.6}, {2.9, 2.6, 2.4, 2.3, 2.3}, {2.8, 2.5, 2.3, 2.2, 2.4}}));
  EXPECT_EQ(r[0].across_widths.text, "moves by 2 steps");
}

TEST(SweepVerdict, DepthsAreComparedWidthByWidthAndTheLargestDistanceIsTheVerdict) {
  compare::SweepConfig c = hand_config();
  c.widths = {32, 64};
  c.depths = {2, 4};
  auto cell = [](int64_t w, int64_t d, size_t v, double loss) {
    compare::SweepCell x;
    x.recipe = "f32";
    x.width = w;
    x.depth = d;
    x.value = v;
    x.val_loss = loss;
    return x;
  };
  // Best value index: width 32 -> 2 at depth 2, 3 at depth 4; width 64 -> 2 at depth 2, 0 at depth 4.
  const std::vector<std::vector<double>> rows = {{3.0, 2.8, 2.5, 2.9, 3.2},
                                                 {3.0, 2.8, 2.6, 2.5, 3.2},  // width 32: depth 2, 4
                                                 {3.0, 2.8, 2.5, 2.9, 3.2},
                                                 {2.0, 2.8, 2.6, 2.5, 3.2}};  // width 64: depth 2, 4
  std::vector<compare::SweepCell> cells;
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t v = 0; v < 5; ++v) cells.push_back(cell(r < 2 ? 32 : 64, r % 2 ? 4 : 2, v, rows[r][v]));
  const auto rep = compare::summarise_sweep(c, cells);
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].across_depths.text, "moves by 2 steps");  // width 64: index 2 at depth 2, 0 at depth 4
  EXPECT_EQ(rep[0].across_widths.text, "moves by 3 steps");  // depth 4: index 3 at width 32, 0 at width 64
  EXPECT_NE(rep[0].table.find("| 64 | 4 | **2.0000** |"), std::string::npos) << rep[0].table;
}

TEST(SweepArguments, BadVaryWidthsAndDepthsAreErrorsNamingTheProblem) {
  train::TrainConfig base;  // d_model 128, heads 4: head dimension 32
  const compare::SweepGrid g = compare::parse_vary("lr=2^-10:2^-8", base);
  ASSERT_EQ(g.values.size(), 3u);
  EXPECT_EQ(g.values[0].x, 1.0 / 1024);
  EXPECT_EQ(g.values[2].label, "2^-8");
  const compare::SweepGrid listed = compare::parse_vary("weight_decay=0.1, 0.01,0.3", base);
  ASSERT_EQ(listed.values.size(), 3u);
  EXPECT_EQ(listed.values[0].text, "0.01");  // ascending: one grid step between neighbours
  EXPECT_EQ(listed.values[2].text, "0.3");
  const compare::SweepGrid powers = compare::parse_vary("lr=2^-5,2^-12,0.001", base);
  ASSERT_EQ(powers.values.size(), 3u);
  EXPECT_EQ(powers.values[0].label, "2^-12");
  EXPECT_EQ(powers.values[0].x, 1.0 / 4096);
  EXPECT_EQ(powers.values[1].label, "0.001");
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=2^-3,0.125", base); }).find("given twice"), std::string::npos);

  EXPECT_NE(error_of([&] { compare::parse_vary("learning_rate=1,2", base); }).find("unknown key 'learning_rate'"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=0.001,fast", base); }).find("'fast' is not a number"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=0.001", base); }).find("at least 2 values"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=2^-3:2^-3", base); }).find("at least 2 values"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=2^-2:2^-6", base); }).find("empty range"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=2^-2:4", base); }).find("integer exponents"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=0.001,0.001", base); }).find("given twice"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr", base); }).find("KEY=v1,v2"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("d_model=64,128", base); }).find("--widths"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("batch=2.5,4", base); }).find("batch"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::parse_vary("lr=-1,0.1", base); }).find("lr=-1"), std::string::npos);

  EXPECT_EQ(compare::parse_sizes("256,64", "--widths"), (std::vector<int64_t>{64, 256}));
  EXPECT_NE(error_of([] { compare::parse_sizes("64,x", "--widths"); }).find("'x' is not a positive integer"), std::string::npos);
  EXPECT_NE(error_of([] { compare::parse_sizes("0", "--depths"); }).find("--depths: '0'"), std::string::npos);
  EXPECT_NE(error_of([] { compare::parse_sizes("64,64", "--widths"); }).find("given twice"), std::string::npos);

  compare::SweepConfig c;
  c.base = base;
  c.grid = g;
  const train::TrainConfig wide = compare::cell_config(c, "f32", 256, 3, 1, 7);
  EXPECT_EQ(wide.model.d_model, 256);
  EXPECT_EQ(wide.model.heads, 8);  // head dimension 32 kept
  EXPECT_EQ(wide.model.layers, 3);
  EXPECT_EQ(wide.seed, 7u);
  EXPECT_EQ(wide.lr, 1.0 / 512);
  EXPECT_DOUBLE_EQ(wide.min_lr, base.min_lr / base.lr / 512);  // min_lr follows lr
  compare::SweepConfig pretrained = c;
  pretrained.base.init = "some/model";
  pretrained.recipes = {"f32"};
  EXPECT_NE(error_of([&] { compare::sweep(pretrained); }).find("init (a pretrained model) has one shape"), std::string::npos);
  EXPECT_NE(error_of([&] { compare::cell_config(c, "f32", 80, 2, 0, 1); }).find("width 80 is not a multiple of the head dimension 32"),
            std::string::npos);
}

// A sweep of the tiny model: 2 widths x 2 learning rates, under f32 and a recipe whose every
// step overflows (f16 under a fixed loss scale of 1e38: every cell diverges).
compare::SweepConfig tiny_sweep(const fs::path& out) {
  compare::SweepConfig c;
  c.base = tiny_run(text_corpus(), "", "f32");
  c.base.steps = 6;
  c.base.eval_every = 6;
  c.grid = compare::parse_vary("lr=2^-9:2^-8", c.base);
  c.widths = {32, 64};
  quant::Recipe r = quant::preset("f16_loss_scaled");
  r.name = "overflow";
  r.loss_scaling.kind = quant::LossScalerConfig::Kind::fixed;
  r.loss_scaling.scale = 1e38;
  const fs::path recipe = out.parent_path() / "overflow.json";
  spit(recipe, r.to_json());
  c.recipes = {"f32", recipe.string()};
  c.out = out.string();
  return c;
}

TEST(Sweep, WritesTablesVerdictsAndPlotsAndARerunSkipsFinishedCells) {
  const fs::path out = scratch("sweep");
  const compare::SweepConfig config = tiny_sweep(out);
  std::vector<std::string> cell_lines;
  size_t steps_seen = 0;
  const auto on_step = [&](const std::string&) { ++steps_seen; };
  const auto on_cell = [&](const compare::SweepCell&, size_t, size_t, const std::string& l) { cell_lines.push_back(l); };
  const compare::SweepReport rep = compare::sweep(config, on_step, on_cell, "scalify sweep ...");
  ASSERT_EQ(rep.cells.size(), 8u);
  ASSERT_EQ(cell_lines.size(), 8u);
  EXPECT_EQ(cell_lines[0].rfind("[1/8] f32 w32_d2 lr=2^-9: val loss ", 0), 0u) << cell_lines[0];
  EXPECT_EQ(cell_lines[7], "[8/8] overflow w64_d2 lr=2^-8: diverged");
  EXPECT_EQ(steps_seen, 8u * 6u);  // every cell trains its 6 steps (the overflowing recipe's are skipped, but reported)
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rep.cells[i].status, "ok") << rep.cells[i].note;
  for (size_t i = 4; i < 8; ++i) EXPECT_EQ(rep.cells[i].status, "diverged");
  ASSERT_EQ(rep.recipes.size(), 2u);
  EXPECT_TRUE(rep.recipes[0].across_widths.steps.has_value());
  EXPECT_EQ(rep.recipes[1].across_widths.text.rfind("no verdict", 0), 0u);
  EXPECT_EQ(rep.plot_error, "");

  const std::string md = slurp(out / "report.md");
  EXPECT_NE(md.find("# Sweep of lr"), std::string::npos);
  EXPECT_NE(md.find("min_lr follows lr"), std::string::npos);
  EXPECT_NE(md.find("scalify sweep ..."), std::string::npos);
  EXPECT_NE(md.find("### f32"), std::string::npos);
  EXPECT_NE(md.find("| 64 | 2 | diverged | diverged | – |"), std::string::npos) << md;  // overflow's row
  EXPECT_NE(md.find("across widths: " + rep.recipes[0].across_widths.text), std::string::npos);
  EXPECT_NE(md.find("![f32: validation loss against lr, one curve per width](f32_widths.png)"), std::string::npos);
  for (const char* row : {"| 32 | 2 |", "| 64 | 2 |"}) {  // f32's rows: one best each, in bold
    const size_t at = rep.recipes[0].table.find(row);
    ASSERT_NE(at, std::string::npos);
    const std::string line = rep.recipes[0].table.substr(at, rep.recipes[0].table.find('\n', at) - at);
    size_t bold = 0;
    for (size_t i = line.find("**"); i != std::string::npos; i = line.find("**", i + 2)) ++bold;
    EXPECT_EQ(bold, 2u) << line;
  }
  EXPECT_EQ(slurp(out / "f32.csv").rfind("width,depth,0.001953125,0.00390625,best\n32,2,", 0), 0u);
  for (const char* png : {"f32_widths.png", "overflow_widths.png"}) {
    uint32_t w = 0, h = 0;
    EXPECT_TRUE(valid_png(out / png, &w, &h)) << png;
    EXPECT_GE(w, 800u);
  }
  EXPECT_FALSE(fs::exists(out / "f32_depths.png"));  // one depth
  EXPECT_TRUE(fs::exists(out / "runs/f32/w64_d2/lr=2^-8/model.safetensors"));

  // Rerun: nothing trains, the same losses come back.
  steps_seen = 0;
  cell_lines.clear();
  const compare::SweepReport again = compare::sweep(config, on_step, on_cell);
  EXPECT_EQ(steps_seen, 0u);
  ASSERT_EQ(again.cells.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(again.cells[i].status, rep.cells[i].status);
    if (rep.cells[i].status == "ok") {
      EXPECT_EQ(again.cells[i].val_loss, rep.cells[i].val_loss);
    }
  }
  // A cell whose outcome is gone trains again, alone.
  fs::remove_all(out / "runs/f32/w32_d2/lr=2^-8");
  compare::sweep(config, on_step, on_cell);
  EXPECT_EQ(steps_seen, 6u);

  // Another sweep in the same folder is refused.
  compare::SweepConfig other = config;
  other.widths = {32};
  EXPECT_NE(error_of([&] { compare::sweep(other); }).find("holds another sweep"), std::string::npos);
}

}  // namespace
}  // namespace scalify

namespace scalify {
namespace {

TEST(Sweep, SeveralDepthsGetTheirOwnPlotAndVerdict) {
  const fs::path out = scratch("sweep_depths");
  compare::SweepConfig c;
  c.base = tiny_run(text_corpus(), "", "f32");
  c.base.steps = 6;
  c.base.eval_every = 6;
  c.grid = compare::parse_vary("lr=2^-9:2^-8", c.base);
  c.depths = {1, 2};
  c.recipes = {"f32"};
  c.out = out.string();
  const compare::SweepReport rep = compare::sweep(c);
  ASSERT_EQ(rep.cells.size(), 4u);
  EXPECT_EQ(rep.plot_error, "");
  EXPECT_EQ(rep.recipes.at(0).across_widths.text, "no verdict (one width)");
  EXPECT_TRUE(rep.recipes.at(0).across_depths.steps.has_value());
  for (const char* png : {"f32_widths.png", "f32_depths.png"}) {
    uint32_t w = 0, h = 0;
    EXPECT_TRUE(valid_png(out / png, &w, &h)) << png;
  }
  EXPECT_NE(slurp(out / "report.md").find("](f32_depths.png)"), std::string::npos);
  EXPECT_TRUE(fs::exists(out / "runs/f32/w32_d1/lr=2^-9/model.safetensors"));
}

}  // namespace
}  // namespace scalify

namespace scalify {
namespace {

TEST(Sweep, SeveralSeedsGiveARunEachAndTheCellTheirMean) {
  const fs::path out = scratch("sweep_seeds");
  compare::SweepConfig c;
  c.base = tiny_run(text_corpus(), "", "f32");
  c.base.steps = 4;
  c.base.eval_every = 4;
  c.grid = compare::parse_vary("lr=2^-9:2^-8", c.base);
  c.recipes = {"f32"};
  c.seeds = {3, 5};
  c.out = out.string();
  const compare::SweepReport rep = compare::sweep(c);
  ASSERT_EQ(rep.cells.size(), 2u);
  for (const compare::SweepCell& cell : rep.cells) {
    ASSERT_EQ(cell.runs.size(), 2u);
    double sum = 0;
    for (const std::string& run : cell.runs) {
      EXPECT_NE(run.find("_seed"), std::string::npos) << run;
      double last = NAN;  // the trainer's own record of the run's last evaluation
      std::istringstream metrics(slurp(out / run / "metrics.jsonl"));
      for (std::string line; std::getline(metrics, line);)
        if (const nlohmann::json j = nlohmann::json::parse(line); j.contains("val_loss")) last = j["val_loss"].get<double>();
      sum += last;
    }
    EXPECT_EQ(cell.val_loss, sum / 2);
  }
  EXPECT_TRUE(fs::exists(out / "runs/f32/w32_d2/lr=2^-8_seed5/model.safetensors"));
  EXPECT_NE(rep.cells[0].val_loss, rep.cells[1].val_loss);
}

}  // namespace
}  // namespace scalify
