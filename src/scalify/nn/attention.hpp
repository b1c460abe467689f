#pragma once
// Causal multi-head self-attention: a fused qkv projection, softmax(q k^T / sqrt(hd)) v per head
// (unit-scaled: matmul_activations and the causal softmax scaled to ~ones), the output projection.
#include <cstdint>

#include "scalify/nn/linear.hpp"

namespace scalify::nn {

struct CausalSelfAttention {
  Linear qkv, proj;
  int heads;
  static CausalSelfAttention make(int64_t d, int heads, Init& init);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

}  // namespace scalify::nn
