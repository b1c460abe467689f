#pragma once
// Rotary position embeddings (RoFormer), in the form Hugging Face's Llama uses: in every head the
// pair (x_i, x_{i + hd/2}) at position t turns by the angle t * theta^(-2i / hd) (rotate_half), so
// pretrained Llama weights apply unchanged. A rotation: a scaled input keeps its scale, and the
// backward is the rotation by the opposite angle, which the composed ops give.
#include <cstdint>

#include "scalify/autograd/functions.hpp"

namespace scalify::nn {

// x [B, T, H, hd] (hd even) at positions start .. start + T - 1.
Var rotary(const Var& x, double theta, int64_t start = 0);

}  // namespace scalify::nn
