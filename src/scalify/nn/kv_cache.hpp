#pragma once
// The keys and values a decoder has computed for the positions it has seen, so that the next
// token's forward attends to them instead of recomputing the prefix (incremental decoding). It
// holds what the forward computed, in the forward's precision (f32; rotated keys and values per
// key/value head), never requantised: Gpt::kv_cache_refusal names the models it cannot serve
// (quantised linear layers, unit-scaled attention).
#include <cstdint>
#include <vector>

#include "scalify/autograd/var.hpp"

namespace scalify::nn {

// One attention layer's: [B, length, kv_heads * hd] each, keys after the rotary embedding.
struct KvBlock {
  Var keys, values;
  int64_t length() const { return keys.defined() ? keys.shape()[1] : 0; }
};

// A whole model's: a block each (Gpt::logits fills them), and the positions seen.
struct KvCache {
  std::vector<KvBlock> blocks;
  int64_t length() const { return blocks.empty() ? 0 : blocks.front().length(); }
};

}  // namespace scalify::nn
