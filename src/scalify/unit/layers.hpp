#pragma once
// Transformer layers in two variants with one structure: standard (ordinary ops) and unit-scaled
// (Table A.2 ops: constrained matmuls for activations, weights and biases as cut edges, causal
// softmax scaled to ~ones, constrained GELU, weighted residuals with the branch rewrite).
// Shapes: activations [B, T, D]; weights [in, out] (y = x W + b).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "scalify/formats/format.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::unit {

// RMS of tensors seen during one forward and backward pass, by name.
struct ScaleProbe {
  struct Entry {
    std::string name;
    double forward_rms = -1, backward_rms = -1;  // -1: not seen
    DType forward_storage = DType::f32, backward_storage = DType::f32;  // the data's dtype
  };
  std::vector<Entry> entries;
  // Optional: also shown every tapped tensor (a value now, its gradient in the backward pass).
  std::function<void(const std::string& name, bool gradient, const ScaledTensor& t)> observe;
  // Identity op that records x's RMS now and its gradient's RMS in the backward pass.
  Var tap(const Var& x, const std::string& name);
};

// What every layer of a model shares.
struct LayerOptions {
  bool unit_scaled = true;
  // Low-precision emulation: weights and the activations entering every matmul are cast to this
  // format in the forward pass, and their gradients in the backward pass (f32: none).
  Format cast = Format::f32;
  ScaleProbe* probe = nullptr;  // records activations and gradients when set
  std::string prefix;           // probe and layer names: prefix + layer-local name
  // Recipe hook: x @ w of a block's linear layer named prefix + local name (e.g. "h0.attn.qkv"),
  // quantised as the recipe says; empty: a plain matmul. Standard variant only.
  std::function<Var(const std::string& name, const Var& x, const Var& w)> matmul;
  bool rms_norm = false;           // RMSNorm (weight only) instead of LayerNorm
  bool swiglu = false;             // SwiGLU MLP instead of GELU (standard variant only)
  bool rescale_norm_grad = false;  // SCALIFY (seed 000): dynamic_rescale_l2_grad before every norm (2 per block + the final one)
  Var tap(const Var& x, const char* name) const;
  Var lowp(const Var& x) const;
};

using NamedParams = std::vector<std::pair<std::string, Var>>;

// Initialisation: unit-scaled layers use unit-variance non-bias weights; standard ones GPT-2's
// N(0, 0.02), with output projections at 0.02 / sqrt(2 layers).
struct Init {
  bool unit_scaled;
  int layers;
  uint64_t seed;
  Var weight(const Shape& s, bool output_projection);
  Var constant(const Shape& s, double v) const;
};

struct Linear {
  Var w, b;
  static Linear make(int64_t in, int64_t out, Init& init, bool output_projection = false);
  Var operator()(const Var& x, const LayerOptions& o, const char* name) const;
};

struct LayerNorm {
  Var w, b;  // b undefined for RMSNorm
  static LayerNorm make(int64_t d, const Init& init, bool rms = false);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

struct CausalSelfAttention {
  Linear qkv, proj;
  int heads;
  static CausalSelfAttention make(int64_t d, int heads, Init& init);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

// GELU: out(gelu(fc(x))), hidden 4d. SwiGLU: out(silu(gate) * up) with [gate | up] = fc(x),
// hidden 8d/3 rounded up to a multiple of 8 (about the GELU MLP's parameter count).
struct Mlp {
  Linear fc, out;
  bool swiglu = false;
  // The hidden width: 4 d, or for SwiGLU 8 d / 3 rounded up to a multiple of 8 (LLaMA's rule).
  static int64_t hidden_width(int64_t d, bool swiglu);
  static Mlp make(int64_t d, Init& init, bool swiglu = false);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

// Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(.)), with `residual` deciding how each add is
// weighted (its `layer` counts residual adds; this block uses layer and layer + 1).
struct GptBlock {
  LayerNorm ln1, ln2;
  CausalSelfAttention attn;
  Mlp mlp;
  static GptBlock make(int64_t d, int heads, Init& init, bool rms_norm = false, bool swiglu = false);
  Var operator()(const Var& x, Residual residual, const LayerOptions& o) const;
};

}  // namespace scalify::unit
