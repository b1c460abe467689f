#pragma once
// The general linear layer of seed 000 (Algorithm 6): each of its three GEMMs (forward, input
// gradient, weight gradient; quant/linear_recipe.hpp) quantises its two operands as the recipe
// says and runs on the exactly decoded operands with f32 accumulation and output; then the bias is
// added. Every operand has its own quantiser (format + scaling strategy + state), so every recipe
// of the seeds runs through this one layer.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/quant/linear_recipe.hpp"
#include "scalify/quant/quantizer.hpp"

namespace scalify::quant {

// A layer's stochastic-rounding stream: FNV-1a of its name, the same on every machine and run.
uint64_t layer_stream(std::string_view layer_name);

// The three GEMMs of a linear layer (quant/linear_recipe.hpp).
enum class LinearGemm : uint8_t { forward, input_grad, weight_grad };

// A test seam: while a GemmOperandObserver lives on this thread, each quantised GEMM a QLinear runs
// on it hands the observer its two operands as the GEMM reads them (transformed and quantised:
// forward x, w; input_grad g, w; weight_grad x, g). Unused, it costs one thread-local pointer
// test per GEMM; it never changes what is computed.
class GemmOperandObserver {
 public:
  using Fn = std::function<void(LinearGemm gemm, const Quantized& a, const Quantized& b)>;
  explicit GemmOperandObserver(Fn fn);
  ~GemmOperandObserver();
  GemmOperandObserver(const GemmOperandObserver&) = delete;
  GemmOperandObserver& operator=(const GemmOperandObserver&) = delete;
  // What QLinear calls before each GEMM: to this thread's observer, if any.
  static void notify(LinearGemm gemm, const Quantized& a, const Quantized& b);

 private:
  Fn fn_;
  GemmOperandObserver* previous_;
};

class QLinear {
 public:
  // `stream` sets the layer's stochastic-rounding bits apart from other layers' (a model gives
  // each of its layers its own, layer_stream(name)).
  explicit QLinear(LinearRecipe recipe = {}, uint64_t stream = 0);
  // y = x @ w (+ b), x [..., K], w [K, N], b [N]. Without gradient recording (NoGrad: evaluation,
  // sampling) the quantisers run in inference mode and keep their state as training left it.
  Var operator()(const Var& x, const Var& w, const Var& b = {}) const;
  const LinearRecipe& recipe() const { return recipe_; }
  // Statistics of the last quantisation of the forward GEMM's operands and the input-gradient
  // GEMM's output gradient.
  const QuantStats& weight_stats() const;
  const QuantStats& activation_stats() const;
  const QuantStats& gradient_stats() const;
  // Every quantiser of the layer by its checkpoint name: the forward GEMM's activation and weight,
  // the input-gradient GEMM's gradient and weight_t, the weight-gradient GEMM's activation_t and
  // gradient_t. An operand configured as the same tensor's operand in an earlier GEMM, per-tensor
  // scaled, reuses that quantisation; its own quantiser then stays unused.
  std::vector<std::pair<std::string, Quantizer*>> quantizers() const;

 private:
  LinearRecipe recipe_;
  std::shared_ptr<std::vector<Quantizer>> quantizers_;  // one per operand, in quantizers() order
};

}  // namespace scalify::quant
