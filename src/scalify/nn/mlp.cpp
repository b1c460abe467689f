#include "scalify/nn/mlp.hpp"

#include "scalify/error.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

int64_t Mlp::hidden_width(int64_t d, bool swiglu) { return swiglu ? (8 * d / 3 + 7) / 8 * 8 : 4 * d; }

Mlp Mlp::make(int64_t d, int64_t hidden, bool swiglu, bool gelu_erf, bool bias, Init& init) {
  return {Linear::make(d, swiglu ? 2 * hidden : hidden, init, false, bias), Linear::make(hidden, d, init, true, bias), swiglu, gelu_erf};
}

Var Mlp::operator()(const Var& x, const LayerOptions& o) const {
  if (o.umup) {  // unit-scaling's MLP: linear_1 and linear_gate (fused here) and linear_2, constraint none
    if (!swiglu) throw Error("u-μP's MLP is SwiGLU (swiglu on)");
    const Var h = o.tap(fc(x, o, unit::Constrain::none, 2), "mlp.fc");
    const int64_t hidden = h.shape().back() / 2;
    const int last = int(h.shape().size()) - 1;
    const Var a = o.tap(unit::silu_glu(slice(h, last, hidden, 2 * hidden), slice(h, last, 0, hidden), o.act_mult), "mlp.swiglu");
    return o.tap(out(a, o, unit::Constrain::none), "mlp.out");
  }
  const Var h = o.tap(fc(x, o), "mlp.fc");
  Var a;
  if (swiglu) {
    if (o.unit_scaled) throw Error("SwiGLU has no unit-scaled form here; use the GELU MLP with unit scaling");
    const int64_t hidden = h.shape().back() / 2;
    const int last = int(h.shape().size()) - 1;
    a = o.tap(silu(slice(h, last, 0, hidden)) * slice(h, last, hidden, 2 * hidden), "mlp.swiglu");
  } else {
    a = o.tap(o.unit_scaled ? unit::gelu(h, /*constrained=*/true) : gelu_erf ? scalify::gelu_erf(h) : gelu(h), "mlp.gelu");
  }
  return o.tap(out(a, o), "mlp.out");
}

}  // namespace scalify::nn
