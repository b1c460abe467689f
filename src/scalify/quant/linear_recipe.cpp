#include "scalify/quant/linear_recipe.hpp"

namespace scalify::quant {

LinearRecipe LinearRecipe::uniform(const QuantizerConfig& weight, const QuantizerConfig& activation, const QuantizerConfig& gradient) {
  LinearRecipe r;
  r.quantized = true;
  r.forward = {activation, weight};
  r.input_grad = {gradient, weight};
  r.weight_grad = {activation, gradient};
  return r;
}

std::optional<LinearRecipe::Roles> LinearRecipe::roles() const {
  if (forward.activation != weight_grad.activation || forward.weight != input_grad.weight || input_grad.gradient != weight_grad.gradient)
    return std::nullopt;
  return Roles{forward.weight, forward.activation, input_grad.gradient};
}

std::array<std::pair<const char*, const QuantizerConfig*>, 6> LinearRecipe::operands() const {
  return {{{"forward.activation", &forward.activation},
           {"forward.weight", &forward.weight},
           {"input_grad.gradient", &input_grad.gradient},
           {"input_grad.weight", &input_grad.weight},
           {"weight_grad.activation", &weight_grad.activation},
           {"weight_grad.gradient", &weight_grad.gradient}}};
}

bool LinearRecipe::all_scalify() const {
  for (const auto& [name, c] : operands())
    if (c->scaling != Scaling::scalify) return false;
  return true;
}

}  // namespace scalify::quant
