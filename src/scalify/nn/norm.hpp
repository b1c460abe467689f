#pragma once
// LayerNorm (weight and bias) or RMSNorm (weight only), standard or unit-scaled; with SCALIFY's
// LayerNorm-gradient rescale (seed 000 #2-#4) when the options ask for it.
#include <cstdint>

#include "scalify/nn/layer_context.hpp"

namespace scalify::nn {

struct LayerNorm {
  Var w, b;  // b undefined for RMSNorm
  double eps = 1e-5;
  static double default_eps(bool rms) { return rms ? 1e-6 : 1e-5; }
  static LayerNorm make(int64_t d, const Init& init, bool rms, double eps);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

}  // namespace scalify::nn
