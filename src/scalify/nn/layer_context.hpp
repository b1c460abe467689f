#pragma once
// What every layer of a model shares: the variant (standard or unit-scaled), the probe that
// records activations and gradients, the layer's name prefix, and the initialiser.
// Shapes: activations [B, T, D]; weights [in, out] (y = x W + b).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "scalify/autograd/var.hpp"

namespace scalify::nn {

// RMS of tensors seen during one forward and backward pass, by name.
struct ScaleProbe {
  struct Entry {
    std::string name;
    double forward_rms = -1, backward_rms = -1;                         // -1: not seen
    DType forward_storage = DType::f32, backward_storage = DType::f32;  // the data's dtype
  };
  std::vector<Entry> entries;
  // Optional: also shown every tapped tensor (a value now, its gradient in the backward pass).
  std::function<void(const std::string& name, bool gradient, const ScaledTensor& t)> observe;
  // Identity op that records x's RMS now and its gradient's RMS in the backward pass.
  Var tap(const Var& x, const std::string& name);
};

struct LayerOptions {
  bool unit_scaled = true;         // unit scaling's ops (Table A.2) instead of the standard ones
  ScaleProbe* probe = nullptr;     // records activations and gradients when set
  std::string prefix;              // probe names: prefix + layer-local name
  bool rms_norm = false;           // RMSNorm (weight only) instead of LayerNorm
  bool swiglu = false;             // SwiGLU MLP instead of GELU (standard variant only)
  bool rescale_norm_grad = false;  // SCALIFY (seed 000): dynamic_rescale_l2_grad before every norm (2 per block + the final one)
  // u-μP (unit-scaling 0.3.5's TransformerLayer): its ops instead of the standard ones, with the
  // SwiGLU's and the attention softmax's `mult`.
  bool umup = false;
  double act_mult = 1, attn_mult = 1;
  // The model's context (GptConfig::seq): u-μP's attention scale takes it as T whatever the
  // window's length, so evaluation and sampling on shorter windows run at the trained scale.
  int64_t context = 0;
  Var tap(const Var& x, const char* name) const;
};

using NamedParams = std::vector<std::pair<std::string, Var>>;

// Initialisation: unit-scaled layers use unit-variance non-bias weights; standard ones GPT-2's
// N(0, 0.02), with output projections at 0.02 / sqrt(2 layers).
struct Init {
  bool unit_scaled;
  int layers;
  uint64_t seed;
  // false: parameters are allocated and not drawn or written (no page touched), for a model whose
  // every value is set next (a pretrained one), so loading it does not hold a second random copy.
  bool draw = true;
  Var weight(const Shape& s, bool output_projection);
  Var constant(const Shape& s, double v) const;
};

}  // namespace scalify::nn
