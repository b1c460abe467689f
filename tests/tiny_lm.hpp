#pragma once
// A tiny next-token task shared by the recipe tests: random token sequences from a few fixed
// seeds, so a model can fit them within a few dozen steps.
#include <cmath>
#include <cstdint>
#include <vector>

#include "scalify/nn/gpt.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::testing {

struct TokenBatch {
  Tensor inputs, targets, positions;  // [B, T], [B * T], [B, T]
};

inline TokenBatch token_batch(uint64_t seed, int64_t B, int64_t T, int64_t V) {
  std::vector<int64_t> in, tg, pos;
  const std::vector<double> r = Tensor::rand({B * (T + 1)}, seed, -0.49, double(V) - 0.51).to_vector();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      in.push_back(std::lround(r[size_t(b * (T + 1) + t)]));
      tg.push_back(std::lround(r[size_t(b * (T + 1) + t + 1)]));
      pos.push_back(t);
    }
  return {Tensor::from_indices(in, {B, T}), Tensor::from_indices(tg, {B * T}), Tensor::from_indices(pos, {B, T})};
}

// A GPT of `layers` blocks (one unless said; 2 heads, untied head) for the tiny task, its linear
// layers built for `recipe`.
inline nn::Gpt tiny_gpt(int64_t V, int64_t T, int64_t D, uint64_t seed, bool unit_scaled = false, const quant::Recipe& recipe = {},
                        int layers = 1) {
  nn::GptConfig c;
  c.unit_scaled = unit_scaled;
  c.vocab = V;
  c.seq = T;
  c.d_model = D;
  c.layers = layers;
  c.heads = 2;
  c.tied_head = false;
  return nn::Gpt(c, seed, recipe);
}

inline std::vector<Var> parameters_of(const nn::Gpt& model) {
  std::vector<Var> p;
  for (const auto& [name, v] : model.parameters()) p.push_back(v);
  return p;
}

// `steps` AdamW steps (lr 3e-3) of the model on the tiny task's 4 batches of B windows of T
// tokens; the loss of every step.
inline std::vector<double> train_tiny(const nn::Gpt& model, int64_t V, int64_t T, int64_t B, int steps = 60) {
  optim::AdamW opt(parameters_of(model), {.lr = 3e-3});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const TokenBatch batch = token_batch(uint64_t(step % 4), B, T, V);
    Var loss = model.loss(batch.inputs, batch.targets.reshape({B, T}));
    losses.push_back(loss.value().item());
    loss.backward();
    opt.step();
  }
  return losses;
}

// A run of the tiny task under a full recipe, as a training run applies it: the parameters in the
// recipe's master-weight storage, its optimizer state, the weight-gradient casts and loss scaling
// (a step whose gradients overflow is skipped).
struct RecipeRun {
  std::vector<double> losses;  // every step's
  std::vector<Var> params;     // after the last step, in model.parameters() order
  int64_t skipped_steps = 0;
};
inline RecipeRun train_tiny_recipe(nn::Gpt& model, const quant::Recipe& recipe, int64_t V, int64_t T, int64_t B, int steps) {
  RecipeRun run;
  run.params = quant::prepare_parameters(parameters_of(model), recipe);
  nn::NamedParams named = model.parameters();
  for (size_t i = 0; i < named.size(); ++i) named[i].second = run.params[i];
  model.set_parameters(named);
  std::vector<double> lr_scale;
  for (const auto& [name, p] : model.parameters()) lr_scale.push_back(model.lr_multiplier(name));
  optim::AdamW opt(run.params, quant::optimizer_config(recipe, {.lr = 3e-3}), lr_scale);
  quant::LossScaler scaler(recipe.loss_scaling);
  for (int step = 0; step < steps; ++step) {
    const TokenBatch batch = token_batch(uint64_t(step % 4), B, T, V);
    Var loss = model.loss(batch.inputs, batch.targets.reshape({B, T}));
    run.losses.push_back(loss.value().item());
    scaler.scale_loss(loss).backward();
    if (!scaler.unscale(run.params)) continue;  // overflow: skipped step (dynamic loss scaling)
    quant::cast_weight_gradients(run.params, recipe);
    opt.step();
  }
  run.skipped_steps = scaler.skipped_steps();
  return run;
}

}  // namespace scalify::testing
