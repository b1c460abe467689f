// Full recipes: serialisation round trips, clear errors, and a tiny transformer trained under
// every preset (master weights, optimizer state, weight-gradient casts and loss scaling included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "scalify/autograd/functions.hpp"
#include "tiny_lm.hpp"
#include "scalify/error.hpp"
#include "scalify/nn/transformer.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::quant {
namespace {

TEST(Recipe, EveryPresetRoundTripsThroughJson) {
  for (const std::string& name : preset_names()) {
    const Recipe r = preset(name);
    const std::string text = r.to_json();
    EXPECT_EQ(Recipe::from_json(text).to_json(), text) << name;
  }
  const Recipe r = preset("scalify_fp8_4");
  EXPECT_EQ(r.master_weight, DType::f16);
  EXPECT_TRUE(r.scaled_state);
  EXPECT_EQ(r.optimizer_state, DType::f16);
  EXPECT_EQ(r.weight_gradient, Format::e5m2);
  EXPECT_EQ(r.linear.activation.format, Format::e4m3);
  EXPECT_EQ(r.linear.gradient.format, Format::e5m2);
}

TEST(Recipe, BadInputNamesWhatWasWrong) {
  auto message = [](const std::string& text) {
    try {
      Recipe::from_json(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message("{}").find("'name'"), std::string::npos);
  std::string text = preset("current").to_json();
  std::string bad = text;
  bad.replace(bad.find("\"e4m3\""), 6, "\"e4m4\"");
  EXPECT_NE(message(bad).find("e4m4"), std::string::npos);
  bad = text;
  bad.replace(bad.find("\"current\""), 9, "\"later\"");
  EXPECT_NE(message(bad).find("later"), std::string::npos);
  try {
    preset("fp9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scalify_fp8_4"), std::string::npos);
  }
}

TEST(Recipe, TinyTransformerTrainsUnderEveryFullPreset) {
  const int64_t V = 12, T = 8, B = 8, D = 32;
  for (const std::string& name : preset_names()) {
    const Recipe recipe = name == "fp8_cscale" ? [] { Recipe r = preset("fp8_cscale"); r.linear = recipe_fp8_cscale(4); return r; }()
                                               : preset(name);
    std::vector<Var> init = {Var(Tensor::randn({V, D}, 30, 0.5)), Var(Tensor::randn({T, D}, 31, 0.5)), Var(Tensor::randn({D, V}, 32, 0.3))};
    const nn::BlockParams b0 = nn::init_block(D, 1, 33);
    for (auto& [n, p] : b0.named()) init.push_back(p);
    const std::vector<Var> params = prepare_parameters(init, recipe);
    nn::BlockParams block;
    Var* fields[] = {&block.ln1_w, &block.ln1_b, &block.w_qkv, &block.b_qkv, &block.w_proj, &block.b_proj,
                     &block.ln2_w, &block.ln2_b, &block.w_fc, &block.b_fc, &block.w_out, &block.b_out};
    for (size_t i = 0; i < 12; ++i) *fields[i] = params[3 + i];
    std::vector<QLinear> layers;
    for (int i = 0; i < 5; ++i) layers.emplace_back(recipe.linear);
    const nn::LinearFn linear = [&](int which, const Var& x, const Var& w, const Var& bias) { return layers[size_t(which)](x, w, bias); };
    optim::AdamW opt(params, optimizer_config(recipe, {.lr = 3e-3}));
    LossScaler scaler(recipe.loss_scaling);
    double first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
      const testing::TokenBatch batch = testing::token_batch(uint64_t(step % 4), B, T, V);
      Var x = embedding(params[0], batch.inputs) + embedding(params[1], batch.positions);
      x = nn::transformer_block(x, block, 2, linear);
      Var loss = cross_entropy(reshape(layers[4](x, params[2]), {B * T, V}), batch.targets);
      const double l = loss.value().item();
      ASSERT_TRUE(std::isfinite(l)) << name << " step " << step;
      (step == 0 ? first : last) = l;
      scaler.scale_loss(loss).backward();
      if (!scaler.unscale(params)) continue;  // overflow: skipped step (dynamic loss scaling)
      cast_weight_gradients(params, recipe);
      opt.step();
    }
    std::printf("%-16s loss %.3f -> %.3f  (master %s%s, state %s, skipped %lld)\n", name.c_str(), first, last,
                std::string(dtype_name(params[3 + 2].scaled().data.dtype())).c_str(), recipe.scaled_state ? " scaled" : "",
                std::string(dtype_name(recipe.optimizer_state)).c_str(), (long long)scaler.skipped_steps());
    EXPECT_LT(last, 0.8 * first) << name;
    if (recipe.loss_scaling.kind == LossScalerConfig::Kind::none) {
      EXPECT_EQ(scaler.skipped_steps(), 0) << name << ": finite gradients throughout";
    }
    if (recipe.scaled_state) {
      EXPECT_TRUE(params[5].scaled().is_scaled()) << name;
    }
  }
}

}  // namespace
}  // namespace scalify::quant
