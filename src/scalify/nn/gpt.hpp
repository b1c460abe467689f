#pragma once
// The GPT model: token embedding, learned positions, pre-norm blocks (causal multi-head attention,
// GELU or SwiGLU MLP), final norm, output head tied to the embedding (or untied). Written once
// against the autograd ops; every training method applies to it without changing this code:
//   - standard or unit-scaled variant (unit scaling: Table A.2 ops, weighted residuals with the
//     branch rewrite, unit-variance init, the 1/sqrt(d) learning-rate rule via lr_multiplier);
//   - a recipe's quantised linear layers through GptOptions::matmul (the head and embeddings stay
//     in high precision);
//   - SCALIFY's scaled parameters through set_parameters, and its LayerNorm-gradient rescale.
// Shapes: ids [B, T] (T <= seq); weights [in, out] (y = x W + b).
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/unit/layers.hpp"

namespace scalify::nn {

using unit::NamedParams;

struct GptConfig {
  int64_t vocab = 256, seq = 64, d_model = 128;
  int layers = 4, heads = 4;
  bool unit_scaled = false;
  bool rms_norm = false;     // RMSNorm instead of LayerNorm (standard variant)
  bool swiglu = false;       // SwiGLU MLP instead of GELU (standard variant)
  bool tied_head = true;     // logits = x wte^T; false: a separate [d, vocab] head
  bool final_norm = true;
  // Unit scaling's residual scheme. fixed(0.1) by measurement: at initialisation it keeps every
  // activation and gradient of a 4-layer model within [0.55, 1.32] across seeds, while
  // running-mean reaches the edges of [0.5, 2] in the deeper attention layers (docs/RESULTS.md).
  unit::Residual::Kind residual = unit::Residual::Kind::fixed;
  double tau = 0.1;            // for Residual::Kind::fixed
  Format cast = Format::f32;   // low-precision emulation of every matmul's operands (f32: none)
  void validate() const;       // throws scalify::Error naming the bad field
  int64_t parameter_count() const;
};

// What a forward pass may be given besides the tokens.
struct GptOptions {
  unit::ScaleProbe* probe = nullptr;
  std::function<Var(const std::string& name, const Var& x, const Var& w)> matmul;  // recipe hook
  bool rescale_norm_grad = false;  // SCALIFY: dynamic_rescale_l2_grad before every norm (2 per block + the final one)
};

class Gpt {
 public:
  Gpt(const GptConfig& config, uint64_t seed);
  // Logits [B, T, vocab] for ids [B, T].
  Var logits(const Tensor& ids, const GptOptions& options = {}) const;
  // Mean next-token cross-entropy of ids [B, T] against targets [B, T].
  Var loss(const Tensor& ids, const Tensor& targets, const GptOptions& options = {}) const;
  Var loss(const Tensor& ids, const Tensor& targets, unit::ScaleProbe* probe) const {
    return loss(ids, targets, GptOptions{probe, {}, false});
  }
  // Names and handles of every parameter, in a fixed order: wte, wpe, h{l}.ln1.w, ... lnf.w, head.
  NamedParams parameters() const;
  // Replaces parameters by name (e.g. by their scaled or low-precision forms); shapes must match.
  void set_parameters(const NamedParams& params);
  // Names of the linear layers a recipe quantises: h{l}.attn.qkv, h{l}.attn.proj, h{l}.mlp.fc, h{l}.mlp.out.
  std::vector<std::string> linear_names() const;
  const GptConfig& config() const { return c_; }
  // Learning-rate multiplier per parameter: 1 in the standard model; with unit scaling 32 (Adam's
  // larger steps for O(1) parameters), times 1/sqrt(d_model) for non-projection parameters
  // (embeddings, norms, biases; Appendix J.1).
  double lr_multiplier(const std::string& name) const;
  // Whether AdamW's weight decay applies: matrices only, not gains, biases or embeddings' positions.
  static bool decays(const std::string& name);

 private:
  std::vector<std::pair<std::string, Var*>> refs();
  GptConfig c_;
  Var wte_, wpe_, head_;
  std::vector<unit::GptBlock> blocks_;
  unit::LayerNorm lnf_;
};

}  // namespace scalify::nn
