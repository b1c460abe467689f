#include "scalify/autograd/scaling.hpp"

#include <functional>

namespace scalify {

namespace {
using Grads = std::vector<ScaledTensor>;
// The value's and the gradient's storage are the op's choice (a cast's format; a rescale keeps
// the input's).
Var forward_only(const char* name, const Var& x, ScaledTensor value) {
  return Var::make(
      name, std::move(value), {x}, [](const ScaledTensor& g) { return Grads{g}; }, Var::Storage::as_computed);
}
Var backward_only(const char* name, const Var& x, std::function<ScaledTensor(const ScaledTensor&)> on_grad) {
  return Var::make(
      name, x.scaled(), {x}, [on_grad](const ScaledTensor& g) { return Grads{on_grad(g)}; }, Var::Storage::as_computed);
}
}  // namespace

Var set_scaling(const Var& x, float scale) { return forward_only("set_scaling", x, set_scaling(x.scaled(), scale)); }
Var rebalance(const Var& x, float delta) { return forward_only("rebalance", x, rebalance(x.scaled(), delta)); }
Var dynamic_rescale_l2(const Var& x) { return forward_only("dynamic_rescale_l2", x, dynamic_rescale_l2(x.scaled())); }
Var dynamic_rescale_max(const Var& x) { return forward_only("dynamic_rescale_max", x, dynamic_rescale_max(x.scaled())); }

Var dynamic_rescale_l2_grad(const Var& x) {
  return backward_only("dynamic_rescale_l2_grad", x, [](const ScaledTensor& g) { return dynamic_rescale_l2(g); });
}
Var dynamic_rescale_max_grad(const Var& x) {
  return backward_only("dynamic_rescale_max_grad", x, [](const ScaledTensor& g) { return dynamic_rescale_max(g); });
}

Var cast_on_forward(const Var& x, Format fmt) { return forward_only("cast_on_forward", x, cast_data(x.scaled(), fmt)); }
Var cast_on_backward(const Var& x, Format fmt) {
  return backward_only("cast_on_backward", x, [fmt](const ScaledTensor& g) { return cast_data(g, fmt); });
}

}  // namespace scalify
