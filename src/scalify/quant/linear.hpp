#pragma once
// The general linear layer of seed 000 (Algorithm 6): the weight and the input are quantised in
// the forward pass, the matmul runs on the exactly decoded operands with f32 accumulation and
// output, the output gradient is quantised in the backward pass, then the bias is added. Each
// role has its own quantiser (format + scaling strategy + state), so every recipe of the seeds
// runs through this one layer.
#include <memory>
#include <string>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/quant/quantizer.hpp"

namespace scalify::quant {

struct LinearRecipe {
  std::string name = "f32";
  bool quantized = false;  // false: a plain f32 matmul (bit-identical to the engine)
  QuantizerConfig weight, activation, gradient;
};

// Presets matching the seeds' experiment rows.
LinearRecipe recipe_f32();
LinearRecipe recipe_scalify(Format forward, Format backward);  // SCALIFY FP16 / FP8 matmuls
LinearRecipe recipe_cast(Format forward, Format backward);     // plain casts, no scale (unit scaling, baselines)
LinearRecipe recipe_current(int gradient_margin = 0);          // per-tensor current, e4m3 / e5m2
LinearRecipe recipe_delayed(int history = 16, HistoryReduce reduce = HistoryReduce::max);
LinearRecipe recipe_fp8_amax(int gradient_margin = 3);         // seed 003 FP8-AMAX
LinearRecipe recipe_fp8_cscale(int bias);                      // seed 003 FP8-CSCALE(b)
LinearRecipe recipe_mxfp8();                                   // seed 004 MXFP8
LinearRecipe recipe_blockwise();                               // 1x128 activations/gradients, 128x128 weights
// The named recipes a user picks are the presets of quant/recipe.hpp, which are built from these.

class QLinear {
 public:
  // `stream` sets the layer's stochastic-rounding bits apart from other layers' (a model gives
  // each of its layers its own).
  explicit QLinear(LinearRecipe recipe, uint64_t stream = 0);
  // y = x @ w (+ b), x [..., K], w [K, N], b [N]. Without gradient recording (NoGrad: evaluation,
  // sampling) the quantisers run in inference mode and keep their state as training left it.
  Var operator()(const Var& x, const Var& w, const Var& b = {}) const;
  const LinearRecipe& recipe() const { return recipe_; }
  // Statistics of the last quantisation of each role.
  const QuantStats& weight_stats() const { return state_->weight.last(); }
  const QuantStats& activation_stats() const { return state_->activation.last(); }
  const QuantStats& gradient_stats() const { return state_->gradient.last(); }
  // Every quantiser of the layer by role name (weight, activation, gradient and the transposed
  // copies' weight_t, activation_t, gradient_t), for statistics and checkpoints.
  std::vector<std::pair<std::string, Quantizer*>> quantizers() const;

 private:
  struct State {
    Quantizer weight, activation, gradient;
    // Block / MX backward operands are re-quantised from the high-precision source along the
    // backward reduction dimension (never from the forward copy): their own quantisers.
    Quantizer weight_t, activation_t, gradient_t;
  };
  LinearRecipe recipe_;
  std::shared_ptr<State> state_;
};

}  // namespace scalify::quant
