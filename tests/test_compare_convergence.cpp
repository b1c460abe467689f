// Convergence (slow; CI runs it once, natively): a GPT of over 1M parameters on the default corpus,
// trained under every seeded recipe through `compare`, ends within +0.05 nats of its baseline's
// validation loss, and its report's verdict says so (the delta's 95 % interval below +0.05 or
// holding 0): FP32 for SCALIFY, per-tensor FP8, MXFP8, blockwise, FP16 with loss scaling,
// NVFP4 and MXFP4; unit-scaled FP32 for unit scaling in FP16 and FP8. NVFP4 also within 2 %
// (relative) of FP32, the goal issue 31 set (measured -0.05 %). (The unscaled FP16/FP8 baselines
// and the FP4 ablations are left out: they are there to show what fails.) The table is printed
// whether the test passes or not.
#include <gtest/gtest.h>

#include <cstdio>

#include "scalify/compare/compare.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

TEST(Convergence, EverySeededRecipeReachesItsBaselineOnTheDefaultCorpus) {
  compare::CompareConfig c;
  c.base.model.d_model = 128;
  c.base.model.layers = 5;
  c.base.model.heads = 4;
  c.base.model.seq = 64;
  c.base.batch = 8;
  c.base.steps = 200;
  c.base.warmup = 20;
  c.base.eval_every = 100;
  c.base.eval_windows = 256;
  c.recipes = {"f32",       "scalify_fp16_1", "scalify_fp16_2",  "scalify_fp8_3", "scalify_fp8_4", "unit_f32",
               "unit_fp16", "unit_fp8",       "current",         "delayed",       "fp8_amax",      "fp8_cscale",
               "mxfp8",     "blockwise",      "f16_loss_scaled", "nvfp4",         "mxfp4"};
  c.out = testing::scratch("convergence").string();
  c.speed.rounds = 0;  // parity is the question here, not speed
  ASSERT_GE(c.base.model.parameter_count(), 1000000);
  const compare::CompareReport rep = compare::compare(c, false, {}, "tests/test_compare_convergence");
  std::printf("%lld parameters, %lld steps of %lld x %lld bytes\n%s", (long long)c.base.model.parameter_count(), (long long)c.base.steps,
              (long long)c.base.batch, (long long)c.base.model.seq, rep.table.c_str());
  ASSERT_EQ(rep.rows.size(), c.recipes.size());
  for (const compare::RecipeOutcome& o : rep.rows) {
    EXPECT_EQ(o.status, "ok") << o.name << ": " << o.note;
    if (o.recipe != "f16_loss_scaled") {
      EXPECT_EQ(o.result.skipped, 0) << o.name;  // only dynamic loss scaling may skip (its first steps)
    }
    if (o.recipe != o.baseline) {
      EXPECT_LE(o.val_delta, compare::kParityNats) << o.name << " vs " << o.baseline;
      // The report's rule: the delta's 95 % interval (window-sampling error) lies below +0.05 or holds 0.
      const std::vector<std::string> v = compare::verdict_names(compare::kParityNats);
      EXPECT_TRUE(o.verdict == v[0] || o.verdict == v[1] || o.verdict == v[2])
          << o.name << ": " << o.verdict << " (" << o.val_delta << " ± " << o.noise.half_width << ")";
    }
    if (o.recipe == "nvfp4") {
      EXPECT_LE(o.val_delta, 0.02 * (o.result.val_loss - o.val_delta)) << "NVFP4 within 2 % of FP32";
    }
  }
}

}  // namespace
}  // namespace scalify
