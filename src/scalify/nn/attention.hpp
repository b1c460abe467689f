#pragma once
// Causal multi-head self-attention: a fused qkv projection, softmax(q k^T / sqrt(hd)) v per head
// (unit-scaled: matmul_activations and the causal softmax scaled to ~ones), the output projection.
// Optionally grouped-query (kv_heads < heads key/value heads, each shared by heads / kv_heads
// query heads; qkv is [q | k | v] of widths D, kv_heads hd, kv_heads hd) and rotary positions on
// q and k (rope_theta > 0).
#include <cstdint>

#include "scalify/nn/kv_cache.hpp"
#include "scalify/nn/layer_context.hpp"
#include "scalify/nn/linear.hpp"

namespace scalify::nn {

struct CausalSelfAttention {
  Linear qkv, proj;
  int heads, kv_heads;
  double rope_theta = 0;  // 0: no rotary embedding (the model adds learned positions instead)
  static CausalSelfAttention make(int64_t d, int heads, int kv_heads, double rope_theta, bool bias, Init& init);
  // x [B, T, D] at positions 0 .. T-1; with `cache`, at positions cache->length() .. onwards, the
  // new keys and values appended to it. An empty cache takes any T (the prompt: the same
  // computation as without one); a filled one one token at a time (T = 1, which sees every key).
  // Standard attention only: unit scaling's scales depend on the window's length.
  Var operator()(const Var& x, const LayerOptions& o, KvBlock* cache = nullptr) const;
};

}  // namespace scalify::nn
