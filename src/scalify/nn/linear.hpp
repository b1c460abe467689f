#pragma once
// A linear layer y = x W + b that owns its quantised GEMMs: the model gives it the recipe's
// LinearRecipe when it is built (a plain matmul by default). Unit-scaled: the input is a non-cut
// edge (constrained), weight and bias are cut edges.
#include <cstdint>

#include "scalify/nn/layer_context.hpp"
#include "scalify/quant/linear.hpp"

namespace scalify::nn {

struct Linear {
  Var w, b;  // b undefined for a layer without bias
  quant::QLinear gemms;
  static Linear make(int64_t in, int64_t out, Init& init, bool output_projection = false, bool bias = true);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

}  // namespace scalify::nn
