#pragma once
// Transformer layers in two variants with one structure: standard (ordinary ops) and unit-scaled
// (Table A.2 ops: constrained matmuls for activations, weights and biases as cut edges, causal
// softmax scaled to ~ones, constrained GELU, weighted residuals with the branch rewrite).
// Shapes: activations [B, T, D]; weights [in, out] (y = x W + b).
#include <cstdint>
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
  };
  std::vector<Entry> entries;
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
  std::string prefix;           // probe names: prefix + layer-local name
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
  Var operator()(const Var& x, const LayerOptions& o) const;
  void add_to(NamedParams& p, const std::string& name) const;
};

struct LayerNorm {
  Var w, b;
  static LayerNorm make(int64_t d, const Init& init);
  Var operator()(const Var& x, const LayerOptions& o) const;
  void add_to(NamedParams& p, const std::string& name) const;
};

struct CausalSelfAttention {
  Linear qkv, proj;
  int heads;
  static CausalSelfAttention make(int64_t d, int heads, Init& init);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

struct Mlp {
  Linear fc, out;
  static Mlp make(int64_t d, Init& init);
  Var operator()(const Var& x, const LayerOptions& o) const;
};

// Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(.)), with `residual` deciding how each add is
// weighted (its `layer` counts residual adds; this block uses layer and layer + 1).
struct GptBlock {
  LayerNorm ln1, ln2;
  CausalSelfAttention attn;
  Mlp mlp;
  static GptBlock make(int64_t d, int heads, Init& init);
  Var operator()(const Var& x, Residual residual, const LayerOptions& o) const;
  void add_to(NamedParams& p, const std::string& prefix) const;
};

}  // namespace scalify::unit
