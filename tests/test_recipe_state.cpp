// The optimizer-state roles of a recipe (issue 48): the presets' published choices, JSON written
// and read back, old JSON (no state fields) still loading as f32 state, bad fields refused by name.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.hpp"
#include "scalify/compare/recipe_lists.hpp"
#include "scalify/error.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/session.hpp"

namespace scalify::quant {
namespace {

// The model the memory-estimate tests price: d 128, 5 layers of 4 heads, seq 64.
train::TrainConfig estimate_config() {
  train::TrainConfig cfg;
  cfg.model.d_model = 128;
  cfg.model.layers = 5;
  cfg.model.heads = 4;
  cfg.model.seq = 64;
  return cfg;
}

std::string error_of(const std::string& json) {
  try {
    Recipe::from_json(json).validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(RecipeState, PresetsHoldTheirPublishedChoices) {
  const Recipe ms = preset("msamp_o2"), coat = preset("coat"), ablation = preset("fp8_adam_no_expansion");
  EXPECT_EQ(ms.first_moment.storage, Format::e4m3);
  EXPECT_EQ(ms.first_moment.scaling, optim::StateScaling::per_tensor);
  EXPECT_EQ(ms.second_moment.storage, Format::f16);
  EXPECT_EQ(ms.second_moment.scaling, optim::StateScaling::per_tensor);
  for (const Recipe* r : {&coat, &ablation})
    for (const optim::StateFormat* f : {&r->first_moment, &r->second_moment}) {
      EXPECT_EQ(f->storage, Format::e4m3) << r->name;
      EXPECT_EQ(f->scaling, optim::StateScaling::per_group) << r->name;
      EXPECT_EQ(f->group_size, 128) << r->name;
      EXPECT_EQ(f->expand_min, 16) << r->name;
      EXPECT_EQ(f->expand, r == &coat) << r->name;
    }
  EXPECT_FALSE(coat.first_moment.non_negative);
  EXPECT_TRUE(coat.second_moment.non_negative);
}

TEST(RecipeState, JsonRoundTripsAndOldJsonLoads) {
  for (const std::string name : {"msamp_o2", "coat", "fp8_adam_no_expansion"}) {
    const Recipe r = preset(name);
    const Recipe back = Recipe::from_json(r.to_json());
    EXPECT_EQ(back.first_moment, r.first_moment) << name;
    EXPECT_EQ(back.second_moment, r.second_moment) << name;
    EXPECT_EQ(back.to_json(), r.to_json()) << name;
  }
  Recipe sr = preset("f32");
  sr.master_weight = DType::bf16;
  sr.master_rounding = Rounding::stochastic;
  sr.first_moment = {
      .storage = Format::e5m2, .scaling = optim::StateScaling::per_group, .group_size = 32, .rounding = Rounding::stochastic};
  EXPECT_EQ(Recipe::from_json(sr.to_json()).master_rounding, Rounding::stochastic);
  EXPECT_EQ(Recipe::from_json(sr.to_json()).first_moment, sr.first_moment);
  // Every recipe before the roles: no state fields in its JSON, f32 moments when read.
  const std::string old = preset("current").to_json();
  EXPECT_EQ(old.find("moment"), std::string::npos);
  EXPECT_EQ(old.find("master_rounding"), std::string::npos);
  const Recipe loaded = Recipe::from_json(old);
  EXPECT_TRUE(loaded.first_moment.is_plain_f32() && loaded.second_moment.is_plain_f32());
  EXPECT_EQ(loaded.master_rounding, Rounding::nearest_even);
}

TEST(RecipeState, BadStateFieldsAreRefusedByName) {
  std::string base = preset("f32").to_json();
  base.pop_back();  // the closing brace: append a field
  while (!base.empty() && base.back() != '}' && base.back() != '"' && base.back() != 'e') base.pop_back();
  auto with = [&](const std::string& field) { return base + ",\n" + field + "}"; };
  auto expect = [&](const std::string& field, const std::string& words) {
    const std::string e = error_of(with(field));
    EXPECT_NE(e.find(words), std::string::npos) << field << " -> " << e;
  };
  expect(R"("first_moment": {"storage": "e4m3"})", "first_moment: e4m3 storage needs a scale");
  expect(R"("second_moment": {"storage": "bf16", "scaling": "per_tensor"})", "second_moment: bf16 storage takes no scale");
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_tensor", "non_negative": true})", "first moment takes both signs");
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_tensor", "expand": true})", "expansion needs");
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_group", "group_size": 0})", "group_size");
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_channel"})", "must be none, per_tensor or per_group");
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_tensor", "rounding": "toward_zero"})", "nearest_even or stochastic");
  expect(R"("first_moment": {"storage": "e2m1", "scaling": "per_tensor"})", "storage must be one of");
  expect(R"("second_moment": {"storage": "e4m3", "sclaing": "per_tensor"})", "unknown field 'sclaing' in second_moment");
  expect(R"("master_rounding": "up")", "master_rounding");
  expect(R"("master_rounding": "stochastic")", "master_rounding stochastic rounds unscaled master weights narrower than f32");
  Recipe scaled = preset("scalify_fp8_4");
  scaled.first_moment = {.storage = Format::e4m3, .scaling = optim::StateScaling::per_tensor};
  EXPECT_THROW(scaled.validate(), Error);
}

// MS-AMP O2's scaled f16 master weights of the quantised linear layers: msamp_o2 holds them, the
// JSON names them only when set (every earlier recipe's JSON is unchanged), bad values and
// combinations that cannot apply are refused by name.
TEST(RecipeState, ScaledF16LinearMasterWeights) {
  EXPECT_EQ(preset("msamp_o2").linear_master_weight, LinearMaster::scaled_f16);
  EXPECT_NE(preset("msamp_o2").to_json().find(R"("linear_master_weight": "scaled_f16")"), std::string::npos);
  EXPECT_EQ(Recipe::from_json(preset("msamp_o2").to_json()).linear_master_weight, LinearMaster::scaled_f16);
  for (const std::string name : {"f32", "coat", "delayed", "scalify_fp8_4"}) {
    EXPECT_EQ(preset(name).linear_master_weight, LinearMaster::master_weight) << name;
    EXPECT_EQ(preset(name).to_json().find("linear_master_weight"), std::string::npos) << name;
  }
  EXPECT_TRUE(optimizer_config(preset("msamp_o2"), {}).scaled_masters);
  EXPECT_FALSE(optimizer_config(preset("coat"), {}).scaled_masters);

  std::string ms = preset("msamp_o2").to_json();
  const std::string set = R"("linear_master_weight": "scaled_f16")";
  auto replaced = [&](const std::string& by) { return std::string(ms).replace(ms.find(set), set.size(), by); };
  std::string e = error_of(replaced(R"("linear_master_weight": "f16")"));
  EXPECT_NE(e.find("linear_master_weight must be master_weight or scaled_f16, got 'f16'"), std::string::npos) << e;
  e = error_of(replaced(R"("linear_master_weight": 16)"));
  EXPECT_NE(e.find("'linear_master_weight' in recipe has the wrong type"), std::string::npos) << e;

  Recipe scaled = preset("scalify_fp8_4");
  scaled.linear_master_weight = LinearMaster::scaled_f16;
  EXPECT_ERROR(scaled.validate(), "with scaled_state SCALIFY's scaled master weights already carry their own scales");
  Recipe unit = preset("unit_fp8");
  unit.linear_master_weight = LinearMaster::scaled_f16;
  EXPECT_ERROR(unit.validate(), "needs the standard model: unit scaling passes each weight through a scaling op");
  Recipe unquantized = preset("f32");
  unquantized.linear_master_weight = LinearMaster::scaled_f16;
  EXPECT_ERROR(unquantized.validate(), "applies to the weights of the quantised linear layers, and linear.quantized is false");
}

// The memory estimate counts the scaled f16 masters: 2 bytes per quantised linear weight instead of
// f32's 4 (12 d_model^2 weights per block of the default GELU model with a 4 x MLP).
TEST(RecipeState, MemoryEstimateCountsScaledF16Masters) {
  const train::TrainConfig cfg = estimate_config();
  Recipe f32_masters = preset("msamp_o2");
  f32_masters.linear_master_weight = LinearMaster::master_weight;
  const double saved = train::estimated_memory_bytes(cfg, f32_masters, true) - train::estimated_memory_bytes(cfg, preset("msamp_o2"), true);
  EXPECT_EQ(saved, 2.0 * 12 * 128 * 128 * 5);
  Recipe kept = preset("msamp_o2");
  kept.high_precision.last_blocks = 1;  // its layers keep f32 masters
  EXPECT_EQ(train::estimated_memory_bytes(cfg, f32_masters, true) - train::estimated_memory_bytes(cfg, kept, true),
            2.0 * 12 * 128 * 128 * 4);
}

// The memory estimate counts the moments in their own formats: 8 bytes per parameter in f32,
// msamp_o2's 1 (E4M3) + 2 (f16), coat's 2 x (1 + 3 x 4 / 128) (codes, and per group of 128 the
// scale, k and centre). The other roles of the three presets are delayed's.
TEST(RecipeState, MemoryEstimateCountsTheMomentsInTheirFormats) {
  const train::TrainConfig cfg = estimate_config();
  const double params = double(train::Session::model_config(cfg, preset("delayed")).parameter_count());
  const double delayed = train::estimated_memory_bytes(cfg, preset("delayed"), true);
  Recipe msamp = preset("msamp_o2");
  msamp.linear_master_weight = LinearMaster::master_weight;
  EXPECT_DOUBLE_EQ(delayed - train::estimated_memory_bytes(cfg, msamp, true), (8 - 3) * params);
  EXPECT_DOUBLE_EQ(delayed - train::estimated_memory_bytes(cfg, preset("coat"), true), (8 - 2 * (1 + 12.0 / 128)) * params);
  EXPECT_DOUBLE_EQ(delayed - train::estimated_memory_bytes(cfg, preset("fp8_adam_no_expansion"), true), (8 - 2 * (1 + 4.0 / 128)) * params);
}

// Integer storage for weights, moments or activations trained a model of zeros; refused by name.
TEST(RecipeState, IntegerStorageIsRefused) {
  for (const std::string field : {"master_weight", "optimizer_state", "data_storage"})
    for (const DType d : {DType::u8, DType::i32}) {
      Recipe r = preset("f32");
      (field == "master_weight" ? r.master_weight : field == "optimizer_state" ? r.optimizer_state : r.data_storage) = d;
      EXPECT_ERROR(r.validate(), field + " must be a floating-point dtype, got " + std::string(dtype_name(d)));
    }
}

// With bf16 masters the scaled f16 linear masters save no data bytes, and their gradients stay f32
// where bf16 masters' would be bf16: 2 bytes more per linear weight (12 d^2 per block).
TEST(RecipeState, MemoryEstimateOfScaledF16MastersBesideBf16Masters) {
  const train::TrainConfig cfg = estimate_config();
  Recipe bf16 = preset("msamp_o2");
  bf16.master_weight = DType::bf16;
  Recipe plain = bf16;
  plain.linear_master_weight = LinearMaster::master_weight;
  EXPECT_EQ(train::estimated_memory_bytes(cfg, bf16, true) - train::estimated_memory_bytes(cfg, plain, true), 2.0 * 12 * 128 * 128 * 5);
}

TEST(RecipeState, FieldsThatWouldBeIgnoredAreRefusedByName) {
  std::string base = preset("f32").to_json();
  base.pop_back();
  while (!base.empty() && base.back() != '}' && base.back() != '"' && base.back() != 'e') base.pop_back();
  auto with = [&](const std::string& field) { return base + ",\n" + field + "}"; };
  auto expect = [&](const std::string& field, const std::string& words) {
    const std::string e = error_of(with(field));
    EXPECT_NE(e.find(words), std::string::npos) << field << " -> " << e;
  };
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_tensor", "group_size": 64})",
         "field 'group_size' in first_moment applies only to per_group scaling, and scaling is per_tensor");
  expect(R"("second_moment": {"storage": "bf16", "group_size": 128})",
         "field 'group_size' in second_moment applies only to per_group scaling, and scaling is none");
  expect(R"("second_moment": {"storage": "e4m3", "scaling": "per_group", "non_negative": true, "expand_min": 8})",
         "field 'expand_min' in second_moment applies only with the expansion, and expand is false");
  expect(R"("first_moment": {"storage": "e4m3", "scaling": "per_group", "expand": false, "expand_min": 16})",
         "field 'expand_min' in first_moment applies only with the expansion");
  // Where they apply they are read, and the JSON of every preset stays valid.
  EXPECT_EQ(
      error_of(with(R"("first_moment": {"storage": "e4m3", "scaling": "per_group", "group_size": 64, "expand": true, "expand_min": 8})")),
      "no error");
  // The same fields set in code (the Python attributes): Recipe::validate refuses them by name.
  Recipe ms = preset("msamp_o2");
  ms.first_moment.group_size = 64;
  EXPECT_ERROR(ms.validate(), "first_moment: group_size 64 applies only to per_group scaling, and scaling is per_tensor");
  Recipe ablation = preset("fp8_adam_no_expansion");
  ablation.second_moment.expand_min = 8;
  EXPECT_ERROR(ablation.validate(), "second_moment: expand_min 8 applies only with the expansion, and expand is false");
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(Recipe::from_json(preset(name).to_json()).validate()) << name;
}

TEST(RecipeState, CompareNamesTheStateList) {
  EXPECT_EQ(compare::recipe_list("f32,state"), (std::vector<std::string>{"f32", "msamp_o2", "coat", "fp8_adam_no_expansion"}));
  EXPECT_EQ(compare::recipe_family("coat"), "FP8 optimizer state");
}

}  // namespace
}  // namespace scalify::quant
