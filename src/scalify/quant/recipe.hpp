#pragma once
// A recipe: how every tensor role of a training run is stored and scaled, as named, serialisable
// plain data (SPEC §2, §4-§6). Presets reproduce the experiment rows of the seeds.
#include <optional>
#include <string>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/quant/linear_recipe.hpp"
#include "scalify/quant/loss_scaler.hpp"

namespace scalify::quant {

// Which of a model's quantisable linear layers (the four of every decoder block: h{l}.attn.qkv,
// h{l}.attn.proj, h{l}.mlp.fc, h{l}.mlp.out) stay in high precision: the first and last blocks,
// and layers whose name matches a pattern ('*' matches any run of characters: "*.attn.qkv").
// The embeddings, norms, attention's batched matmuls and the output head always do.
struct HighPrecisionLayers {
  int first_blocks = 0, last_blocks = 0;
  std::vector<std::string> layers;
  bool operator==(const HighPrecisionLayers&) const = default;
  bool keeps(const std::string& layer, int block, int blocks) const;
};

// The master weights of the weight matrices of the linear layers the recipe quantises (MS-AMP's
// FP8Linear weights; every other parameter keeps master_weight): stored as master_weight, or
// scaled_f16 (MS-AMP O2): f16 data and one power-of-two scale per tensor, the scale chosen from the
// new weights' amax after every update by MS-AMP's rule with margin 0 (optim::AdamWConfig::scaled_masters).
enum class LinearMaster : uint8_t { master_weight, scaled_f16 };

struct Recipe {
  std::string name = "f32";
  LinearRecipe linear;                 // the operands of every quantised linear layer's three GEMMs
  HighPrecisionLayers high_precision;  // linear layers left out of `linear`
  DType master_weight = DType::f32;    // storage of the master weights
  bool scaled_state = false;           // SCALIFY: master weights and optimizer state as scaled tensors
  DType optimizer_state = DType::f32;  // storage of AdamW's m and v (scaled_state: their data)
  // AdamW's m and v of unscaled parameters (optim/state_format.hpp): f32, bf16, scaled f16, or FP8
  // with per-tensor or per-group scales, optionally COAT's expansion. Not with scaled_state.
  optim::StateFormat first_moment{}, second_moment{};
  Rounding master_rounding = Rounding::nearest_even;                // new master weights narrower than f32: nearest_even or stochastic
  LinearMaster linear_master_weight = LinearMaster::master_weight;  // not with scaled_state; needs quantised linear layers
  Format weight_gradient = Format::f32;                             // cast of the weight gradients before the update (f32: none)
  int rescale_every = 0;                                            // SCALIFY: dynamic_rescale_l2 of the state every N steps
  bool rescale_norm_grad = false;  // SCALIFY #2-#4: dynamic_rescale_l2_grad before every norm (2 per block + the final one)
  bool rescale_gradients = false;  // SCALIFY #4: dynamic_rescale_l2 of scaled weight gradients before their cast
  bool unit_scaled = false;        // unit scaling (seeds 001/002): the model is unit-scaled, its casts need no scale
  bool umup = false;               // u-μP (unit-scaling 0.3.5): the model is u-μP's, its casts need no scale
  // Storage of every activation's and gradient's data (SPEC §2 data precision): parameters stored
  // wider are cast to it at use, so ops keep their outputs in it end to end; their gradients go
  // back to the parameters' storage. f32: activations f32 unless the parameters are narrower.
  DType data_storage = DType::f32;
  LossScalerConfig loss_scaling{LossScalerConfig::Kind::none};
  // How the ranks exchange gradients (train/data_parallel.hpp): unset, in their own storage,
  // summed exactly as accumulation sums them; f16, bf16, e4m3 or e5m2, each rank's gradient cast
  // to it with one power-of-two scale per tensor shared by the ranks, and summed in f32. The cast
  // applies on one process too, so a single-process run shows what the format costs.
  std::optional<Format> gradient_allreduce;

  // The linear layer `layer` of decoder block `block` (of `blocks`): `linear`, or a plain matmul
  // where the layer stays in high precision.
  LinearRecipe linear_for(const std::string& layer, int block, int blocks) const;

  std::string to_json() const;
  static Recipe from_json(const std::string& json);  // throws naming the bad field
  // Refuses, by name, a recipe whose parts cannot be meant together (a format MX cannot scale,
  // state rescaling without scaled state, a data storage too narrow to hold an activation, ...).
  // Every preset passes; a new training run checks its recipe (a run folder trained before a
  // check existed still loads, evaluates and resumes).
  void validate() const;
};

// Presets:
//   f32; scalify_fp16_1..scalify_fp8_4 (seed 000 Table 3 rows #1-#4); unit_f32, unit_fp16,
//   unit_fp8 (seeds 001/002: plain casts in a unit-scaled model); umup, umup_fp8 (u-μP,
//   unit-scaling 0.3.5: f32, and plain E4M3 / E5M2 casts with no scale); current, delayed, fp8_amax,
//   fp8_cscale (seed 003, b = 4 from a sweep), mxfp8, blockwise (seed 004); f16_loss_scaled; the
//   baselines with no scaling of any kind, fp16_unscaled and fp8_unscaled; FP4: nvfp4, its
//   ablations (nvfp4_no_hadamard, _no_sr, _1x16_weights, _no_tensor_scale, _all_layers), mxfp4 and
//   mxfp4_rceil; f32 with low-precision gradient communication: f32_allreduce_f16, _e4m3, _e5m2;
//   low-precision optimizer state (issue 48): msamp_o2, coat, fp8_adam_no_expansion.
std::vector<std::string> preset_names();
// An optimizer state's scaling by its JSON name (none, per_tensor, per_group); the parser throws
// "<what> must be none, per_tensor or per_group, got '...'".
const char* state_scaling_name(optim::StateScaling scaling);
optim::StateScaling parse_state_scaling(const std::string& name, const std::string& what);
// The largest group_size and expand_min a recipe holds (JSON reads no more).
inline constexpr int64_t kMaxStateGroupSize = int64_t(1) << 30;
inline constexpr int kMaxExpandMin = 1 << 20;
// An optimizer-state role as its recipe JSON object, on one line (what checkpoints record).
std::string state_format_json(const optim::StateFormat& f);
// "" or why a field of f is set but unused (group_size without per_group scaling, expand_min
// without the expansion): Recipe::validate refuses it, as the JSON parser refuses the field.
std::string unused_state_field(const optim::StateFormat& f);
Recipe preset(const std::string& name);  // throws listing the valid names
// A preset name, or the path of a recipe JSON file (anything ending in .json).
Recipe load_recipe(const std::string& name_or_file);

// Which layers the recipe quantises, in words (for run logs and the compare report). Only the
// four linear layers of each decoder block are ever quantised (seed 003's choice): embeddings,
// norms, attention's two batched matmuls and the output head stay in high precision.
std::string quantized_layers(const Recipe& r);

// JSON and Python names of LinearMaster: "master_weight", "scaled_f16".
const char* linear_master_name(LinearMaster m);
LinearMaster parse_linear_master(const std::string& name);  // throws naming the valid names

// Puts parameters into the recipe's master-weight storage (scaled f16 for SCALIFY state, ...),
// and the optimizer configuration for the recipe's state. quantized_weight[i]: parameter i is the
// weight matrix of a linear layer the recipe quantises (those take linear_master_weight); empty:
// none is.
std::vector<Var> prepare_parameters(const std::vector<Var>& params, const Recipe& r, const std::vector<bool>& quantized_weight = {});
optim::AdamWConfig optimizer_config(const Recipe& r, optim::AdamWConfig base);
// Casts every parameter gradient per the recipe's weight-gradient role (before the update):
// scaled gradients in their data, with the propagated scale (rescaled first if
// rescale_gradients); plain ones after rebalancing to unit RMS.
void cast_weight_gradients(const std::vector<Var>& params, const Recipe& r);

}  // namespace scalify::quant
