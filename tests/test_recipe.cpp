// Full recipes: serialisation round trips, clear errors, and a tiny transformer trained under
// every preset (master weights, optimizer state, weight-gradient casts and loss scaling included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "scalify/autograd/functions.hpp"
#include "tiny_lm.hpp"
#include "scalify/error.hpp"
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
    const Recipe recipe = preset(name);
    nn::Gpt model = testing::tiny_gpt(V, T, D, 33, recipe.unit_scaled);
    const std::vector<Var> params = prepare_parameters(testing::parameters_of(model), recipe);
    unit::NamedParams named = model.parameters();
    for (size_t i = 0; i < named.size(); ++i) named[i].second = params[i];
    model.set_parameters(named);
    ASSERT_EQ(named[4].first, "h0.attn.qkv.w");
    std::map<std::string, QLinear> layers;
    nn::GptOptions options = testing::quantised(model, recipe.linear, layers);
    options.rescale_norm_grad = recipe.rescale_norm_grad;
    std::vector<double> lr_scale;
    for (const auto& [name, p] : model.parameters()) lr_scale.push_back(model.lr_multiplier(name));
    optim::AdamW opt(params, optimizer_config(recipe, {.lr = 3e-3}), lr_scale);
    LossScaler scaler(recipe.loss_scaling);
    double first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
      const testing::TokenBatch batch = testing::token_batch(uint64_t(step % 4), B, T, V);
      Var loss = model.loss(batch.inputs, batch.targets.reshape({B, T}), options);
      const double l = loss.value().item();
      ASSERT_TRUE(std::isfinite(l)) << name << " step " << step;
      (step == 0 ? first : last) = l;
      scaler.scale_loss(loss).backward();
      if (!scaler.unscale(params)) continue;  // overflow: skipped step (dynamic loss scaling)
      cast_weight_gradients(params, recipe);
      opt.step();
    }
    std::printf("%-16s loss %.3f -> %.3f  (master %s%s, state %s, skipped %lld)\n", name.c_str(), first, last,
                std::string(dtype_name(params[4].scaled().data.dtype())).c_str(), recipe.scaled_state ? " scaled" : "",
                std::string(dtype_name(recipe.optimizer_state)).c_str(), (long long)scaler.skipped_steps());
    EXPECT_LT(last, 0.8 * first) << name;
    if (recipe.loss_scaling.kind == LossScalerConfig::Kind::none) {
      EXPECT_EQ(scaler.skipped_steps(), 0) << name << ": finite gradients throughout";
    }
    if (recipe.scaled_state) {
      EXPECT_TRUE(params[4].scaled().is_scaled()) << name;
    }
  }
}

}  // namespace
}  // namespace scalify::quant
