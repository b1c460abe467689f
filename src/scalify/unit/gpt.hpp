#pragma once
// A GPT-style causal language model in two variants with the same structure: standard (GPT-2
// initialisation, ordinary ops, plain residual adds) and unit-scaled (unit-variance
// initialisation of non-bias parameters, Table A.2 ops with constraints, weighted residuals with
// the branch rewrite). Probes record the RMS of every activation and gradient for the scale tables.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/formats/format.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::unit {

struct GptConfig {
  int64_t vocab = 64, seq = 32, d_model = 64;
  int layers = 4, heads = 4;
  bool unit_scaled = true;
  Residual::Kind residual = Residual::Kind::running_mean;
  double tau = 0.2;  // for Residual::Kind::fixed
  // Low-precision emulation: weights and the activations entering every matmul are cast to this
  // format in the forward pass, and the gradients leaving them in the backward pass (f32: none).
  Format cast = Format::f32;
};

// RMS of tensors seen during one forward and backward pass, by name.
struct ScaleProbe {
  struct Entry {
    std::string name;
    double forward_rms = -1, backward_rms = -1;  // -1: not seen
  };
  std::vector<Entry> entries;
  // Identity op that records x's RMS now and its gradient's RMS in the backward pass.
  Var tap(const Var& x, const std::string& name);
};

class Gpt {
 public:
  Gpt(const GptConfig& config, uint64_t seed);
  // Mean next-token cross-entropy of ids [B, T] against targets [B, T].
  Var loss(const Tensor& ids, const Tensor& targets, ScaleProbe* probe = nullptr) const;
  std::vector<std::pair<std::string, Var>> parameters() const;
  const GptConfig& config() const { return c_; }
  // Learning-rate multiplier per parameter (Appendix J.1): with unit scaling, non-projection
  // parameters (embeddings, norms, biases) get 1/sqrt(d_model); everything else 1.
  double lr_multiplier(const std::string& name) const;

 private:
  struct Block {
    Var ln1_w, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_out, b_out;
  };
  Var block(const Var& x, const Block& b, int layer, ScaleProbe* probe) const;
  GptConfig c_;
  Var wte_, wpe_, lnf_w_, lnf_b_, head_;
  std::vector<Block> blocks_;
};

}  // namespace scalify::unit
