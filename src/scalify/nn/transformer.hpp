#pragma once
// A pre-LayerNorm causal transformer block (GPT-2 style), written once against ordinary ops:
//   x = x + proj(attention(ln1(x)));  x = x + fc2(gelu(fc1(ln2(x))))
// Parameters are plain Vars so optimizers and (later) recipes can see and replace them.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "scalify/autograd/functions.hpp"

namespace scalify::nn {

struct BlockParams {
  Var ln1_w, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_out, b_out;
  std::vector<std::pair<std::string, Var>> named() const;
};

// GPT-2 initialisation: N(0, 0.02) weights (output projections scaled by 1/sqrt(2 * layers)),
// zero biases, unit LayerNorm weights. Weights are [in, out] so y = x @ W + b.
BlockParams init_block(int64_t d_model, int layers, uint64_t seed, DType dtype = DType::f32);

// The linear layers of a block (qkv, attention projection, MLP in and out), each y = x @ w + b.
// Empty: plain matmuls. Recipes pass quantised layers (quant::QLinear) here.
using LinearFn = std::function<Var(int which, const Var& x, const Var& w, const Var& b)>;

// x: [B, T, D] -> [B, T, D]
Var causal_self_attention(const Var& x, const BlockParams& p, int heads, const LinearFn& linear = {});
Var transformer_block(const Var& x, const BlockParams& p, int heads, const LinearFn& linear = {});

}  // namespace scalify::nn
