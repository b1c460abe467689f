#pragma once
// The pre-norm decoder block: x + attn(ln1(x)), then + mlp(ln2(.)), with the residual scheme
// deciding how each add is weighted (its `layer` counts residual adds; a block uses layer and
// layer + 1).
#include <cstdint>

#include "scalify/nn/attention.hpp"
#include "scalify/nn/mlp.hpp"
#include "scalify/nn/norm.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

// What a block is built from: GptConfig::block() (its one source).
struct BlockSpec {
  int64_t d_model, mlp_hidden;
  int heads, kv_heads;
  bool rms_norm, swiglu, gelu_erf, bias;
  double norm_eps, rope_theta;
};

struct GptBlock {
  LayerNorm ln1, ln2;
  CausalSelfAttention attn;
  Mlp mlp;
  static GptBlock make(const BlockSpec& spec, Init& init);
  // `cache`: attention's keys and values (CausalSelfAttention::operator()).
  Var operator()(const Var& x, unit::Residual residual, const LayerOptions& o, KvBlock* cache = nullptr) const;
};

}  // namespace scalify::nn
