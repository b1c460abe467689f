// A loss that cannot be right is an error on every path that reports one: finite weights can
// still make every logit equal to the same overflowed value, and the evaluation then printed
// "validation loss: 0.000000" (the true loss of equal logits is ln(vocab)).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "expect_error.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/ptq.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

using namespace scalify::testing;

// A trained run whose checkpoints hold `value` in every entry of the token embedding, with valid
// checksums (so only the loss check can refuse them).
fs::path run_with_embedding(const std::string& name, float value, const std::string& recipe = "f32") {
  const fs::path run = scratch(name);
  train::TrainConfig c = tiny_run(text_corpus(), run, recipe);
  c.steps = 2;
  c.eval_every = 2;
  train::train(c, false);
  for (const char* file : {"checkpoint.safetensors", "model.safetensors"}) {
    io::SafeTensors st = io::read_safetensors((run / file).string());
    for (auto& [n, t] : st.tensors)
      if (n == "param.wte") t = Tensor::full(t.shape(), value);
    io::write_safetensors((run / file).string(), st);
  }
  return run;
}

TEST(ImplausibleLoss, TheLossKernelRefusesALossBelowItsLogitsResolution) {
  // Equal logits: the loss is ln C whatever their value, but a logit is known only to half an ulp:
  // once an ulp of the largest reaches the loss (and one nat), the loss is rounding noise.
  const Tensor targets = Tensor::from_indices({0, 3}, {2});
  const double ln8 = std::log(8.0);
  EXPECT_NEAR(ops::cross_entropy(Tensor::full({2, 8}, 1e6), targets).item(), ln8, 1e-6);
  EXPECT_NEAR(ops::cross_entropy(Tensor::full({2, 8}, 8388608.0), targets).item(), ln8, 1e-6);    // 2^23: ulp 1
  EXPECT_NEAR(ops::cross_entropy(Tensor::full({2, 8}, 16777216.0), targets).item(), ln8, 1e-6);   // 2^24: ulp 2 < ln 8
  EXPECT_TRUE(std::isnan(ops::cross_entropy(Tensor::full({2, 8}, 33554432.0), targets).item()));  // 2^25: ulp 4 > ln 8
  EXPECT_TRUE(std::isnan(ops::cross_entropy(Tensor::full({2, 8}, -3e38), targets).item()));
  // A huge logit with a loss as large as it is right: 3e7 known to within 2.
  std::vector<float> row(16, 0.0f);
  row[13] = 3e7f;
  EXPECT_NEAR(ops::cross_entropy(Tensor::from_vector(row, {2, 8}), targets).item(), 1.5e7, 1.0);
  // The scale a scaled tensor hands in counts.
  EXPECT_TRUE(std::isnan(ops::cross_entropy(Tensor::full({2, 8}, 2.0), targets, 1 << 24).item()));
  EXPECT_NEAR(ops::cross_entropy(Tensor::full({2, 8}, 2.0), targets, 1 << 20).item(), ln8, 1e-6);
  // A masked class (a logit of -inf) is no huge logit.
  std::vector<float> masked(16, 0.0f);
  masked[2] = masked[10] = -INFINITY;
  EXPECT_NEAR(ops::cross_entropy(Tensor::from_vector(masked, {2, 8}), targets).item(), std::log(7.0), 1e-6);
  // Computing in f64 a logit has 53 bits.
  EXPECT_NEAR(ops::cross_entropy(Tensor::full({2, 8}, 1e15, DType::f64), targets).item(), ln8, 1e-6);
  EXPECT_TRUE(std::isnan(ops::cross_entropy(Tensor::full({2, 8}, 1e17, DType::f64), targets).item()));
}

TEST(ImplausibleLoss, HugeFiniteWeightsAreRefusedByEveryPathThatReportsALoss) {
  const fs::path run = run_with_embedding("huge_wte", 3e38f);
  EXPECT_ERROR(train::evaluate(run.string()), "cannot be right");
  // Its post-training quantised copy.
  const fs::path ptq = run / "ptq.safetensors";
  train::quantize_checkpoint(run.string(), ptq.string(), {});
  EXPECT_ERROR(train::evaluate(ptq.string()), "cannot be right");
  EXPECT_ERROR(train::ptq_sweep(run.string(), 0, 1), "cannot be right");
  // Training on from it: the first step's loss is the divergence it is.
  train::TrainConfig c = tiny_run(text_corpus(), run, "f32");
  c.steps = 4;
  EXPECT_ERROR(train::train(c, true), "training diverged: the loss is nan at step 2");
}

TEST(ImplausibleLoss, ALossScalerDoesNotHideIt) {
  // A loss scaler skips steps whose gradients overflow; a loss that cannot be right is no such
  // overflow: the run stops as diverged instead of reporting a validation loss of nan.
  quant::Recipe r = quant::preset("f32");
  r.name = "f32_dynamic_loss_scaling";
  r.loss_scaling.kind = quant::LossScalerConfig::Kind::dynamic;
  r.loss_scaling.scale = 1024;
  const fs::path recipe = scratch("scaled_recipe.json");
  spit(recipe, r.to_json());
  const fs::path run = run_with_embedding("huge_wte_scaled", 3e38f, recipe.string());
  train::TrainConfig c = tiny_run(text_corpus(), run, recipe.string());
  c.steps = 4;
  EXPECT_ERROR(train::train(c, true), "training diverged");
}

TEST(ImplausibleLoss, OrdinaryWeightsStillEvaluate) {
  // The bound sits far above any trained model's logits: the same run unchanged evaluates.
  const fs::path run = run_with_embedding("ordinary_wte", 0.02f);
  const train::EvalResult r = train::evaluate(run.string());
  EXPECT_GT(r.loss, 0);
  EXPECT_LT(r.loss, 2 * std::log(256.0));
}

}  // namespace
}  // namespace scalify
