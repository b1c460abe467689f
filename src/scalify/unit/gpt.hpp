#pragma once
// A GPT-style causal language model in two variants with the same structure: standard (GPT-2
// initialisation, ordinary ops, plain residual adds) and unit-scaled (unit-variance
// initialisation of non-bias parameters, Table A.2 ops with constraints, weighted residuals with
// the branch rewrite), built from the layers of layers.hpp.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/unit/layers.hpp"

namespace scalify::unit {

struct GptConfig {
  int64_t vocab = 64, seq = 32, d_model = 64;
  int layers = 4, heads = 4;
  bool unit_scaled = true;
  // fixed(0.1) by measurement: at initialisation it keeps every activation and gradient of a
  // 4-layer model within [0.55, 1.32] across seeds, while running-mean reaches the edges of
  // [0.5, 2] in the deeper attention layers (docs/RESULTS.md).
  Residual::Kind residual = Residual::Kind::fixed;
  double tau = 0.1;            // for Residual::Kind::fixed
  Format cast = Format::f32;   // low-precision emulation of every matmul's operands (f32: none)
};

class Gpt {
 public:
  Gpt(const GptConfig& config, uint64_t seed);
  // Mean next-token cross-entropy of ids [B, T] against targets [B, T].
  Var loss(const Tensor& ids, const Tensor& targets, ScaleProbe* probe = nullptr) const;
  NamedParams parameters() const;
  const GptConfig& config() const { return c_; }
  // Learning-rate multiplier per parameter (Appendix J.1): with unit scaling, non-projection
  // parameters (embeddings, norms, biases) get 1/sqrt(d_model); projection weights 1.
  double lr_multiplier(const std::string& name) const;

 private:
  GptConfig c_;
  Var wte_, wpe_, head_;
  std::vector<GptBlock> blocks_;
  LayerNorm lnf_;
};

}  // namespace scalify::unit
