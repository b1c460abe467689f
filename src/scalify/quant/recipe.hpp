#pragma once
// A recipe: how every tensor role of a training run is stored and scaled, as named, serialisable
// plain data (SPEC §2, §4-§6). Presets reproduce the experiment rows of the seeds.
#include <string>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/loss_scaler.hpp"

namespace scalify::quant {

struct Recipe {
  std::string name = "f32";
  LinearRecipe linear;                 // weight, activation and output-gradient roles of every linear layer
  DType master_weight = DType::f32;    // storage of the master weights
  bool scaled_state = false;           // SCALIFY: master weights and optimizer state as scaled tensors
  DType optimizer_state = DType::f32;  // storage of AdamW's m and v
  Format weight_gradient = Format::f32;  // cast of the weight gradients before the update (f32: none)
  int rescale_every = 0;               // SCALIFY: dynamic_rescale_l2 of the state every N steps
  bool rescale_norm_grad = false;      // SCALIFY #2-#4: dynamic_rescale_l2_grad before every norm (2 per block + the final one)
  bool rescale_gradients = false;      // SCALIFY #4: dynamic_rescale_l2 of scaled weight gradients before their cast
  LossScalerConfig loss_scaling{LossScalerConfig::Kind::none};

  std::string to_json() const;
  static Recipe from_json(const std::string& json);  // throws naming the bad field
};

// Presets:
//   f32; scalify_fp16_1..scalify_fp8_4 (seed 000 Table 3 rows #1-#4); current, delayed,
//   fp8_amax, fp8_cscale (seed 003, b = 0), mxfp8, blockwise (seed 004); f16_loss_scaled.
std::vector<std::string> preset_names();
Recipe preset(const std::string& name);  // throws listing the valid names

// Puts parameters into the recipe's master-weight storage (scaled f16 for SCALIFY state, ...),
// and the optimizer configuration for the recipe's state.
std::vector<Var> prepare_parameters(const std::vector<Var>& params, const Recipe& r);
optim::AdamWConfig optimizer_config(const Recipe& r, optim::AdamWConfig base);
// Casts every parameter gradient per the recipe's weight-gradient role (before the update):
// scaled gradients in their data, with the propagated scale (rescaled first if
// rescale_gradients); plain ones after rebalancing to unit RMS.
void cast_weight_gradients(const std::vector<Var>& params, const Recipe& r);

}  // namespace scalify::quant
