#pragma once
// The MLP of a decoder block. GELU: out(gelu(fc(x))), hidden 4 d. SwiGLU: out(silu(gate) * up)
// with [gate | up] = fc(x), hidden 8 d / 3 rounded up to a multiple of 8 (LLaMA's rule; about the
// GELU MLP's parameter count).
#include <cstdint>

#include "scalify/nn/linear.hpp"

namespace scalify::nn {

struct Mlp {
  Linear fc, out;
  bool swiglu = false;
  bool gelu_erf = false;                                // the erf GELU instead of the tanh form
  static int64_t hidden_width(int64_t d, bool swiglu);  // the default width
  static Mlp make(int64_t d, int64_t hidden, bool swiglu, bool gelu_erf, bool bias, Init& init);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

}  // namespace scalify::nn
