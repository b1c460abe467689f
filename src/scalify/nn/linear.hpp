#pragma once
// A linear layer y = x W + b that owns its quantised GEMMs: the model gives it the recipe's
// LinearRecipe when it is built (a plain matmul by default). Unit-scaled: the input is a non-cut
// edge (constrained), weight and bias are cut edges.
#include <cstdint>

#include "scalify/nn/layer_context.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

struct Linear {
  Var w, b;  // b undefined for a layer without bias
  quant::QLinear gemms;
  static Linear make(int64_t in, int64_t out, Init& init, bool output_projection = false, bool bias = true);
  // u-μP (unit-scaling's U.linear): alpha = in^-1/2, beta_x = (out / fused)^-1/2, beta_w = rows^-1/2,
  // then `constrain` (Constrain::x_to_output_scale or none). `fused`: the number of layers this
  // one packs side by side (SwiGLU's [gate | up]: 2), each of which scales its input gradient
  // by its own width. The unit-scaled variant ignores both (always Constrain::x).
  Var operator()(const Var& x, const LayerOptions& o, unit::Constrain constrain = unit::Constrain::x, int fused = 1) const;
};

}  // namespace scalify::nn
