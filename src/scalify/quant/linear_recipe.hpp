#pragma once
// How a linear layer y = x w quantises the operands of its three GEMMs, as typed data:
//   forward      y  = x  w    (activation x [rows, K], weight w [K, N]; reduces over K)
//   input_grad   dx = g  w^T  (output gradient g [rows, N], weight;    reduces over N)
//   weight_grad  dw = x^T g   (activation, output gradient;            reduces over rows)
// Each operand has its own quantiser configuration (format, scaling strategy, block shape,
// rounding). Block shapes are stated along the GEMM's reduction dimension: a 1 x k block holds k
// consecutive elements of the reduction, whichever way the tensor is laid out; a two-dimensional
// block (k x k) covers the reduction in either orientation and is used as given.
#include <array>
#include <optional>
#include <utility>

#include "scalify/quant/quantizer.hpp"

namespace scalify::quant {

struct LinearRecipe {
  struct Forward {
    QuantizerConfig activation, weight;
    bool operator==(const Forward&) const = default;
  };
  struct InputGrad {
    QuantizerConfig gradient, weight;
    bool operator==(const InputGrad&) const = default;
  };
  struct WeightGrad {
    QuantizerConfig activation, gradient;
    bool operator==(const WeightGrad&) const = default;
  };

  bool quantized = false;  // false: a plain matmul in the data's precision (bit-identical to the engine)
  Forward forward;
  InputGrad input_grad;
  WeightGrad weight_grad;

  // The three tensor roles, each configured the same in every GEMM it enters (every seeded recipe).
  struct Roles {
    QuantizerConfig weight, activation, gradient;
  };
  static LinearRecipe uniform(const QuantizerConfig& weight, const QuantizerConfig& activation, const QuantizerConfig& gradient);
  // The roles when the recipe is uniform, else nothing.
  std::optional<Roles> roles() const;
  // The six operands in a fixed order, each with its name ("forward.activation", ...).
  std::array<std::pair<const char*, const QuantizerConfig*>, 6> operands() const;
  // Whether every operand is scaled by SCALIFY (propagated scales, no statistics).
  bool all_scalify() const;
  bool operator==(const LinearRecipe&) const = default;
};

}  // namespace scalify::quant
