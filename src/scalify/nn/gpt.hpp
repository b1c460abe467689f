#pragma once
// The GPT model: token embedding, learned positions (or rotary ones in attention), pre-norm blocks
// (causal multi-head or grouped-query attention, GELU or SwiGLU MLP, with or without biases), final
// norm, output head tied to the embedding (or untied): GPT-2 and Llama are configurations of it
// (hub/ maps their checkpoints onto it). Written once
// against the autograd ops; every training method applies to it without changing this code:
//   - standard or unit-scaled variant (unit scaling: Table A.2 ops, weighted residuals with the
//     branch rewrite, unit-variance init, the 1/sqrt(d) learning-rate rule via lr_multiplier);
//   - a recipe's quantised linear layers, given to the layers when the model is built (the head,
//     embeddings, norms and attention's batched matmuls stay in high precision);
//   - SCALIFY's scaled parameters through set_parameters, and its LayerNorm-gradient rescale.
// Shapes: ids [B, T] (T <= seq); weights [in, out] (y = x W + b).
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "scalify/nn/block.hpp"
#include "scalify/nn/kv_cache.hpp"
#include "scalify/nn/layer_context.hpp"
#include "scalify/nn/norm.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::nn {

struct GptConfig {
  int64_t vocab = 256, seq = 64, d_model = 128;
  int layers = 4, heads = 4;
  int kv_heads = 0;        // key/value heads; 0: as many as heads; fewer: grouped-query attention
  int64_t mlp_hidden = 0;  // the MLP's hidden width; 0: Mlp::hidden_width's default
  bool unit_scaled = false;
  bool rms_norm = false;  // RMSNorm instead of LayerNorm (standard variant)
  bool swiglu = false;    // SwiGLU MLP instead of GELU (standard variant)
  bool gelu_erf = false;  // GELU with erf (Hugging Face's "gelu", Cerebras-GPT's) instead of GPT-2's tanh form
  bool bias = true;       // biases in the blocks' linear layers (Llama has none)
  bool tied_head = true;  // logits = x wte^T; false: a separate [d, vocab] head
  bool final_norm = true;
  double norm_eps = 0;    // 0: LayerNorm::default_eps (1e-5 LayerNorm, 1e-6 RMSNorm)
  double rope_theta = 0;  // > 0: rotary positions with this base instead of learned ones (wpe)
  // Unit scaling's residual scheme. fixed(0.1) by measurement: at initialisation it keeps every
  // activation and gradient of a 4-layer model within [0.55, 1.32] across seeds, while
  // running-mean reaches the edges of [0.5, 2] in the deeper attention layers (docs/RESULTS.md).
  unit::Residual::Kind residual = unit::Residual::Kind::fixed;
  double tau = 0.1;  // for Residual::Kind::fixed
  // u-μP (unit-scaling 0.3.5's TransformerDecoder; docs/NUMERICS.md): unit-variance parameters,
  // its ops and residual rule, a 1/fan_in readout and the lr rule of lr_multiplier. Needs
  // rms_norm, swiglu, no biases and an untied head (Session::model_config sets them for a u-μP
  // recipe). Its hyperparameters, each unit-scaling's default:
  bool umup = false;
  double residual_mult = 1, residual_attn_ratio = 1;  // transformer_residual_scaling_rule's
  double act_mult = 1;                                // the SwiGLU's (silu_glu's mult)
  double attn_mult = 1;                               // the attention softmax's (scaled_dot_product_attention's mult)
  double loss_mult = 1;                               // the cross-entropy's: logits() are the readout times it
  void validate() const;                              // throws scalify::Error naming the bad field
  bool operator==(const GptConfig&) const = default;
  int64_t parameter_count() const;
  BlockSpec block() const;  // the values above resolved (kv_heads, mlp_hidden, norm_eps) for a block
  bool learned_positions() const { return rope_theta == 0; }
};

// unset: the parameters are allocated, not initialised; set_parameters must give every one.
enum class Weights : uint8_t { random, unset };

class Gpt {
 public:
  // The recipe's linear layers (recipe.linear_for each of them) and its LayerNorm-gradient
  // rescale are built into the model; its other roles (storage, optimizer) are the trainer's.
  Gpt(const GptConfig& config, uint64_t seed, const quant::Recipe& recipe = {}, Weights weights = Weights::random);
  // Logits [B, T, vocab] for ids [B, T]; `probe` records every activation and gradient.
  Var logits(const Tensor& ids, ScaleProbe* probe = nullptr) const;
  // Incremental decoding: the logits of ids [B, T] at positions cache.length() onwards, the
  // cache extended by their keys and values: the prompt first (an empty cache, any T), then one
  // token at a time. Each equals the matching rows of logits() of the whole prefix to f32
  // rounding. Up to config().seq positions; refused (scalify::Error) where kv_cache_refusal says.
  Var logits(const Tensor& ids, KvCache& cache) const;
  // "" when logits(ids, cache) applies; else why not.
  std::string kv_cache_refusal() const;
  // Mean next-token cross-entropy of ids [B, T] against targets [B, T].
  Var loss(const Tensor& ids, const Tensor& targets, ScaleProbe* probe = nullptr) const;
  // Names and handles of every parameter, in a fixed order: wte, wpe (learned positions),
  // h{l}.ln1.w, ... (biases .b where the model has them), lnf.w, head (untied).
  NamedParams parameters() const;
  // Replaces parameters by name (e.g. by their scaled or low-precision forms); shapes must match.
  void set_parameters(const NamedParams& params);
  // Names of the linear layers a recipe quantises: h{l}.attn.qkv, h{l}.attn.proj, h{l}.mlp.fc, h{l}.mlp.out.
  std::vector<std::string> linear_names() const;
  // The quantised ones (a recipe's high-precision layers and an f32 recipe's have none), by name,
  // for their quantisers' statistics and checkpointed state.
  std::vector<std::pair<std::string, const quant::QLinear*>> quantized_linears() const;
  const GptConfig& config() const { return c_; }
  // Learning-rate multiplier per parameter: 1 in the standard model; with unit scaling 32 (Adam's
  // larger steps for O(1) parameters), times 1/sqrt(d_model) for non-projection parameters
  // (embeddings, norms, biases; Appendix J.1). u-μP (unit-scaling's optim.lr_scale_func_adam):
  // weights fan_in^-1/2 (embeddings' fan_in d_model), norms, biases and the head 1, the blocks'
  // parameters also layers^-1/2.
  double lr_multiplier(const std::string& name) const;
  // u-μP's tag of a parameter: "weight", "bias", "norm" or "output" (unit-scaling's mup_type).
  std::string mup_type(const std::string& name) const;
  // Whether AdamW's weight decay applies: matrices only, not gains, biases or embeddings' positions.
  static bool decays(const std::string& name);

 private:
  std::vector<std::pair<std::string, Var*>> refs();
  Var forward(const Tensor& ids, ScaleProbe* probe, KvCache* cache) const;
  // Every linear layer of the blocks with its name, in model order.
  std::vector<std::pair<std::string, Linear*>> linears();
  GptConfig c_;
  Var wte_, wpe_, head_;
  std::vector<GptBlock> blocks_;
  LayerNorm lnf_;
  bool rescale_norm_grad_ = false;
  std::set<std::string> unset_;  // Weights::unset: the parameters set_parameters has not given yet
};

}  // namespace scalify::nn
