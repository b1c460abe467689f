#include "scalify/nn/norm.hpp"

#include "scalify/autograd/scaling.hpp"
#include "scalify/error.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

LayerNorm LayerNorm::make(int64_t d, const Init& init, bool rms, double eps) {
  return {init.constant({d}, 1.0), rms ? Var() : init.constant({d}, 0.0), eps};
}

Var LayerNorm::operator()(const Var& x_in, const LayerOptions& o) const {
  const Var x = o.rescale_norm_grad ? dynamic_rescale_l2_grad(x_in) : x_in;
  if (!b.defined()) {
    if (o.umup) return unit::rms_norm(x, w, eps);
    if (o.unit_scaled) throw Error("RMSNorm has no unit-scaled form here; use LayerNorm with unit scaling");
    return scalify::rms_norm(x, w, eps);
  }
  return o.unit_scaled ? unit::layer_norm(x, w, b, eps) : scalify::layer_norm(x, w, b, eps);
}

}  // namespace scalify::nn
