#pragma once
// The keys and values a decoder has computed for the positions it has seen, so that the next
// token's forward attends to them instead of recomputing the prefix (incremental decoding). The
// cache holds the values the forward computed (f32 for the f32 models it serves: rotated keys,
// values, per key/value head), not requantised ones.
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
