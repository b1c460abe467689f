#pragma once
// A training run's configuration: every key of the TOML file (`--config`), each overridable from
// the command line. Keys are flat (`steps = 600`); unknown keys, wrong types and out-of-range
// values are errors naming the key. The effective configuration is written to the run folder.
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "scalify/nn/gpt.hpp"

namespace scalify::train {

struct TrainConfig {
  std::string data;  // text file or folder ("" = the default corpus)
  std::string out = "runs/train";
  std::string recipe = "f32";  // a quant::preset name or a recipe JSON file
  std::string init;            // a pretrained model's folder (hub/): its shape, weights and tokenizer; "" = a new model
  // What a new run found in `init` (train/init_record.hpp; recorded, not set by hand): the CRC-32C
  // of each file it reads again (config.json, tokenizer) and of each weight file, as JSON objects;
  // "" in runs of earlier versions.
  std::string init_files, init_weights;
  uint64_t seed = 1;
  int64_t steps = 300, batch = 16, accum = 1;
  nn::GptConfig model;  // keys: vocab, seq, d_model, layers, heads, kv_heads, mlp_hidden, ... (GptConfig's fields)
  double lr = 2e-3, min_lr = 2e-4, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  // u-μP's weight decay (unit-scaling's independent_weight_decay): every parameter decays by this
  // x lr(t) / lr per step, whatever its learning rate; 0 by default. weight_decay is AdamW's coupled
  // coefficient, which u-μP does not use: each recipe refuses the other's key (validate()).
  double independent_weight_decay = 0;
  int64_t warmup = 30;  // linear warmup steps, then cosine decay from lr to min_lr
  // 256 evaluation windows (16 batches of the default 16): enough batches for compare's
  // window-sampling error of a delta (compare/noise.hpp); 64 gave 4.
  int64_t eval_every = 100, eval_windows = 256, checkpoint_every = 100, stats_every = 50;
  double val_fraction = 0.1;
  // The keys given explicitly (set(), a config file, a run's config.toml), so that a default a
  // pretrained model changes (seq, lr, min_lr: with_pretrained_model) never overrides a choice.
  std::set<std::string> given;

  // Sets one key from its text form (command-line overrides); throws naming the key.
  void set(const std::string& key, const std::string& value);
  void set(const std::string& key_equals_value);  // "KEY=VALUE" (--set)
  void validate() const;
  std::string to_toml() const;
  static std::vector<std::string> keys();
};

// The config with its recipe's defaults for keys not given: a u-μP recipe trains without AdamW's
// coupled weight_decay (0; its decay is independent_weight_decay) and without gradient clipping
// (grad_clip 0: unit-scaled gradients have a global norm of hundreds, growing with the width, and
// unit-scaling does not clip). A recipe that does not load leaves the config as it is (validate() names it).
// A u-μP recipe's model keys are unit-scaling's TransformerDecoder's (umup_model_keys): set
// where not given, and a given one that differs is an error naming it; mlp_hidden 0 becomes the
// 4 d_model it means, so config.toml (and what counts parameters or memory from it) holds the
// model that trains.
TrainConfig with_recipe_defaults(const TrainConfig& config);
// u-μP's transformer in `m`'s keys: RMSNorm, SwiGLU, no biases, an untied head, an MLP of 4 d_model
// (where mlp_hidden is 0). The one place of the rule: Session::model_config, with_recipe_defaults
// and the run folders of earlier versions (their config.toml holds the standard keys) use it.
void set_umup_model_keys(nn::GptConfig& m);
TrainConfig load_config_file(const std::string& path);  // validates
TrainConfig run_config(const std::string& run_dir);     // a run folder's config.toml, validated
// The config a resumed run trains with (the CLI's --resume, Python's resume=True): the run
// folder's config.toml with `overrides` applied (more steps, other keys; the trainer refuses a
// recipe other than the run's), in that folder whatever the overrides say.
TrainConfig resume_config(const std::string& run_dir, const std::function<void(TrainConfig&)>& overrides);
TrainConfig parse_config(const std::string& toml_text, const std::string& what);

// Learning rate at `step` (0-based): linear warmup to lr over `warmup` steps, then cosine to min_lr.
double learning_rate(const TrainConfig& c, int64_t step);

}  // namespace scalify::train
