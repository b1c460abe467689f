#include "scalify/nn/block.hpp"

namespace scalify::nn {

GptBlock GptBlock::make(int64_t d, int heads, Init& init, bool rms_norm, bool swiglu) {
  LayerNorm ln1 = LayerNorm::make(d, init, rms_norm);
  CausalSelfAttention attn = CausalSelfAttention::make(d, heads, init);
  LayerNorm ln2 = LayerNorm::make(d, init, rms_norm);
  Mlp mlp = Mlp::make(d, init, swiglu);
  return {ln1, ln2, attn, mlp};
}

Var GptBlock::operator()(const Var& x, unit::Residual r, const LayerOptions& o) const {
  const Var h = o.tap(unit::residual(
                          x, [&](const Var& v) { return attn(o.tap(ln1(v, o), "ln1"), o); }, r),
                      "resid.attn");
  r.layer += 1;
  return o.tap(unit::residual(
                   h, [&](const Var& v) { return mlp(o.tap(ln2(v, o), "ln2"), o); }, r),
               "resid.mlp");
}

}  // namespace scalify::nn
