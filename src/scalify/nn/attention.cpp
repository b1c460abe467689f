#include "scalify/nn/attention.hpp"

#include <cmath>
#include <string>

#include "scalify/error.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

CausalSelfAttention CausalSelfAttention::make(int64_t d, int heads, Init& init) {
  if (heads <= 0 || d % heads != 0)
    throw Error("attention: width " + std::to_string(d) + " is not divisible by " + std::to_string(heads) + " heads");
  return {Linear::make(d, 3 * d, init), Linear::make(d, d, init, true), heads};
}

Var CausalSelfAttention::operator()(const Var& x, const LayerOptions& o) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], D = x.shape()[2], H = heads, hd = D / H;
  const bool u = o.unit_scaled;
  const Var qkv_out = o.tap(qkv(x, o), "attn.qkv");
  // Standard attention takes the fused kernel (plain or one-scale values, any float storage); unit
  // scaling's own attention rules, per-block scales and probed runs (which tap the scores and
  // probabilities) compose the scaled ops below.
  const ScaledTensor& qs = qkv_out.scaled();
  if (!u && !o.probe && !qs.any_scale && (!qs.scale.defined() || qs.scale.numel() == 1) && !is_integer(qs.data.dtype()))
    return o.tap(proj(causal_self_attention(qkv_out, H), o), "attn.out");
  auto split_heads = [&](int64_t part) {  // [B, H, T, hd]
    return permute(reshape(slice(qkv_out, 2, part * D, (part + 1) * D), {B, T, H, hd}), {0, 2, 1, 3});
  };
  const Var q = split_heads(0), k = split_heads(1), v = split_heads(2);
  const Var kt = transpose(k, -1, -2);
  const Var scores =
      o.tap(u ? unit::matmul_activations(q, kt) : mul_scalar(matmul(q, kt), 1 / std::sqrt(double(hd))), "attn.scores (masked)");
  const Var att = o.tap(u ? unit::causal_softmax(scores) : softmax(causal_mask(scores)), "attn.probs");
  const Var mix = reshape(permute(u ? unit::matmul_activations(att, v) : matmul(att, v), {0, 2, 1, 3}), {B, T, D});
  return o.tap(proj(o.tap(mix, "attn.mix"), o), "attn.out");
}

}  // namespace scalify::nn
