// `scalify sweep` end to end (slow label): a learning-rate sweep of a tiny model under f32 over 2
// widths and 3 learning rates, as the u-μP study runs it at scale (docs/RESULTS.md).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "scalify/compare/sweep.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using testing::scratch, testing::slurp, testing::text_corpus, testing::tiny_run, testing::valid_png;

TEST(SweepTransfer, TwoWidthsThreeLearningRatesUnderF32) {
  const fs::path out = scratch("sweep_transfer");
  compare::SweepConfig c;
  c.base = tiny_run(text_corpus(), "", "f32");
  c.base.steps = 60;
  c.base.warmup = 6;
  c.base.eval_every = 60;
  c.base.eval_windows = 32;
  c.base.checkpoint_every = 60;
  c.base.stats_every = 30;
  // 2^-12 barely moves the model in 60 steps; 2^-8 and 2^-5 train it.
  c.grid = compare::parse_vary("lr=2^-12,2^-8,2^-5", c.base);
  c.widths = {32, 64};
  c.recipes = {"f32"};
  c.out = out.string();
  const compare::SweepReport rep = compare::sweep(c);
  ASSERT_EQ(rep.cells.size(), 6u);
  for (const compare::SweepCell& cell : rep.cells) {
    EXPECT_EQ(cell.status, "ok") << cell.note;
    EXPECT_TRUE(std::isfinite(cell.val_loss));
  }
  for (size_t w = 0; w < 2; ++w) {  // each width learns more at a trained learning rate than at 2^-12
    const double slowest = rep.cells[3 * w].val_loss;
    EXPECT_LT(std::min(rep.cells[3 * w + 1].val_loss, rep.cells[3 * w + 2].val_loss), slowest - 0.1);
  }
  ASSERT_EQ(rep.recipes.size(), 1u);
  ASSERT_TRUE(rep.recipes[0].across_widths.steps.has_value());
  const int64_t moved = *rep.recipes[0].across_widths.steps;
  EXPECT_EQ(rep.recipes[0].across_widths.text, moved <= 1 ? "transfers" : "moves by " + std::to_string(moved) + " steps");
  std::printf("%s", rep.table.c_str());
  EXPECT_NE(slurp(out / "report.md").find("across widths: " + rep.recipes[0].across_widths.text), std::string::npos);
  uint32_t w = 0, h = 0;
  EXPECT_TRUE(valid_png(out / "f32_widths.png", &w, &h));
  EXPECT_TRUE(fs::exists(out / "runs/f32/w64_d2/lr=2^-5/model.safetensors"));
}

}  // namespace
}  // namespace scalify
