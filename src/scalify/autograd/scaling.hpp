#pragma once
// SCALIFY's bundling, rescaling and casting primitives as differentiable ops (seed 000,
// Algorithms 4-6). All are no-ops on the represented value in the direction they do not act on.
#include "scalify/autograd/var.hpp"
#include "scalify/formats/format.hpp"

namespace scalify {

// Forward: data re-expressed against `scale`. Backward: identity.
Var set_scaling(const Var& x, float scale);
// Forward: scale * delta, data / delta (unscaled: unchanged). Backward: identity.
Var rebalance(const Var& x, float delta);
// Forward: rebalance by pow2_round(rms(data)) / pow2_round(amax(data)). Backward: identity.
Var dynamic_rescale_l2(const Var& x);
Var dynamic_rescale_max(const Var& x);
// Forward: identity. Backward: the gradient is rebalanced by its own rms / amax.
Var dynamic_rescale_l2_grad(const Var& x);
Var dynamic_rescale_max_grad(const Var& x);
// Forward: the data is quantised into `fmt` (round-to-nearest-even, saturating), the scale kept.
// Backward: identity.
Var cast_on_forward(const Var& x, Format fmt);
// Forward: identity. Backward: the gradient's data is quantised into `fmt`.
Var cast_on_backward(const Var& x, Format fmt);

}  // namespace scalify
