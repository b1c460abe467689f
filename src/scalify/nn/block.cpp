#include "scalify/nn/block.hpp"

namespace scalify::nn {

GptBlock GptBlock::make(const BlockSpec& s, Init& init) {
  // In this order, which is the order the initialiser draws in.
  LayerNorm ln1 = LayerNorm::make(s.d_model, init, s.rms_norm, s.norm_eps);
  CausalSelfAttention attn = CausalSelfAttention::make(s.d_model, s.heads, s.kv_heads, s.rope_theta, s.bias, init);
  LayerNorm ln2 = LayerNorm::make(s.d_model, init, s.rms_norm, s.norm_eps);
  Mlp mlp = Mlp::make(s.d_model, s.mlp_hidden, s.swiglu, s.gelu_erf, s.bias, init);
  return {ln1, ln2, attn, mlp};
}

Var GptBlock::operator()(const Var& x, unit::Residual r, const LayerOptions& o, KvBlock* cache) const {
  const Var h = o.tap(unit::residual(
                          x, [&](const Var& v) { return attn(o.tap(ln1(v, o), "ln1"), o, cache); }, r),
                      "resid.attn");
  r.layer += 1;
  return o.tap(unit::residual(
                   h, [&](const Var& v) { return mlp(o.tap(ln2(v, o), "ln2"), o); }, r),
               "resid.mlp");
}

}  // namespace scalify::nn
