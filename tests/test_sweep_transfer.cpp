// `scalify sweep` end to end (slow label): issue 47's transfer claim in miniature, a learning-rate
// sweep of a tiny u-μP model over 2 widths and 3 learning rates, as scripts/umup_transfer.sh runs
// it at scale (docs/RESULTS.md).
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

TEST(SweepTransfer, UmupsBestLearningRateIsTheSameAtTwoWidths) {
  const fs::path out = scratch("sweep_transfer");
  compare::SweepConfig c;
  c.base = tiny_run(text_corpus(), "", "umup");
  c.base.steps = 60;
  c.base.warmup = 6;
  c.base.eval_every = 60;
  c.base.eval_windows = 32;
  c.base.checkpoint_every = 60;
  c.base.stats_every = 30;
  // Measured: 2^-2 best at both widths, about 1 nat below 2^1 and 1.7 below 2^-5.
  c.grid = compare::parse_vary("lr=2^-5,2^-2,2^1", c.base);
  c.widths = {32, 64};
  c.recipes = {"umup"};
  c.out = out.string();
  const compare::SweepReport rep = compare::sweep(c);
  std::printf("%s", rep.table.c_str());
  ASSERT_EQ(rep.cells.size(), 6u);
  for (const compare::SweepCell& cell : rep.cells) {
    EXPECT_EQ(cell.status, "ok") << cell.note;
    EXPECT_TRUE(std::isfinite(cell.val_loss));
  }
  for (size_t w = 0; w < 2; ++w) {  // an interior optimum at each width
    EXPECT_LT(rep.cells[3 * w + 1].val_loss, rep.cells[3 * w].val_loss) << "width " << w;
    EXPECT_LT(rep.cells[3 * w + 1].val_loss, rep.cells[3 * w + 2].val_loss) << "width " << w;
  }
  ASSERT_EQ(rep.recipes.size(), 1u);
  ASSERT_TRUE(rep.recipes[0].across_widths.steps.has_value());
  EXPECT_EQ(*rep.recipes[0].across_widths.steps, 0);
  EXPECT_EQ(rep.recipes[0].across_widths.text, "transfers");
  EXPECT_NE(slurp(out / "report.md").find("across widths: transfers"), std::string::npos);
  uint32_t w = 0, h = 0;
  EXPECT_TRUE(valid_png(out / "umup_widths.png", &w, &h));
  EXPECT_TRUE(fs::exists(out / "runs/umup/w64_d2/lr=2^-2/model.safetensors"));
}

}  // namespace
}  // namespace scalify
