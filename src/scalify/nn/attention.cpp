#include "scalify/nn/attention.hpp"

#include <cmath>
#include <string>

#include "scalify/error.hpp"
#include "scalify/nn/rope.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::nn {

CausalSelfAttention CausalSelfAttention::make(int64_t d, int heads, int kv_heads, double rope_theta, bool bias, Init& init) {
  if (heads <= 0 || d % heads != 0)
    throw Error("attention: width " + std::to_string(d) + " is not divisible by " + std::to_string(heads) + " heads");
  if (kv_heads <= 0 || heads % kv_heads != 0)
    throw Error("attention: " + std::to_string(heads) + " heads are not a multiple of " + std::to_string(kv_heads) + " key/value heads");
  const int64_t kv_width = d / heads * kv_heads;
  return {Linear::make(d, d + 2 * kv_width, init, false, bias), Linear::make(d, d, init, true, bias), heads, kv_heads, rope_theta};
}

namespace {
// [B, T, heads * hd] at positions start .. -> rotated per head.
Var rotate_heads(const Var& x, int64_t heads, double theta, int64_t start) {
  const Shape& s = x.shape();
  return reshape(rotary(reshape(x, {s[0], s[1], heads, s[2] / heads}), theta, start), s);
}
// [B, T, kv_heads * hd] -> [B, T, heads * hd]: key/value head j serves query heads j g .. j g + g - 1.
Var repeat_heads(const Var& x, int64_t kv_heads, int64_t group) {
  const Shape& s = x.shape();
  const int64_t hd = s[2] / kv_heads;
  return reshape(expand(reshape(x, {s[0], s[1], kv_heads, 1, hd}), {s[0], s[1], kv_heads, group, hd}), {s[0], s[1], s[2] * group});
}
// One new query q [B, 1, D] against every key and value so far ([B, L, H * hd] each), as the
// standard full-prefix computation treats its last row (which sees every key: no mask).
Var attend_last(const Var& q, const Var& k, const Var& v, int64_t H) {
  const int64_t B = q.shape()[0], D = q.shape()[2], hd = D / H, L = k.shape()[1];
  auto heads_of = [&](const Var& x, int64_t T) { return permute(reshape(x, {B, T, H, hd}), {0, 2, 1, 3}); };  // [B, H, T, hd]
  const Var scores = mul_scalar(matmul(heads_of(q, 1), transpose(heads_of(k, L), -1, -2)), 1 / std::sqrt(double(hd)));
  return reshape(permute(matmul(softmax(scores), heads_of(v, L)), {0, 2, 1, 3}), {B, 1, D});
}
}  // namespace

Var CausalSelfAttention::operator()(const Var& x, const LayerOptions& o, KvBlock* cache) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], D = x.shape()[2], H = heads, hd = D / H;
  const int64_t start = cache ? cache->length() : 0;
  if (start > 0 && T != 1) throw Error("attention: a filled key/value cache takes one token at a time, got " + std::to_string(T));
  if (cache && (o.unit_scaled || o.umup)) throw Error("attention: unit-scaled attention has no key/value cache (Gpt::kv_cache_refusal)");
  const bool u = o.unit_scaled;
  const unit::Constrain c = o.umup ? unit::Constrain::x_to_output_scale : unit::Constrain::x;  // uu.Linear's default
  Var qkv_out = o.tap(qkv(x, o, c), "attn.qkv");
  if (rope_theta > 0 || kv_heads != heads || cache) {  // to the packed [q | k | v] of H heads each
    const int64_t kv_width = hd * kv_heads;
    Var q = slice(qkv_out, 2, 0, D), k = slice(qkv_out, 2, D, D + kv_width), v = slice(qkv_out, 2, D + kv_width, D + 2 * kv_width);
    if (rope_theta > 0) {
      q = rotate_heads(q, H, rope_theta, start);
      k = rotate_heads(k, kv_heads, rope_theta, start);
    }
    if (cache) {
      cache->keys = start > 0 ? concat({cache->keys, k}, 1) : k;
      cache->values = start > 0 ? concat({cache->values, v}, 1) : v;
      if (start > 0) {
        const Var keys = kv_heads != heads ? repeat_heads(cache->keys, kv_heads, H / kv_heads) : cache->keys;
        const Var values = kv_heads != heads ? repeat_heads(cache->values, kv_heads, H / kv_heads) : cache->values;
        return o.tap(proj(o.tap(attend_last(q, keys, values, H), "attn.mix"), o), "attn.out");
      }
    }
    if (kv_heads != heads) {
      k = repeat_heads(k, kv_heads, H / kv_heads);
      v = repeat_heads(v, kv_heads, H / kv_heads);
    }
    qkv_out = concat({q, k, v}, 2);
  }
  // Standard attention takes the fused kernel (plain or one-scale values, any float storage); unit
  // scaling's own attention rules, per-block scales and probed runs (which tap the scores and
  // probabilities) compose the scaled ops below.
  const ScaledTensor& qs = qkv_out.scaled();
  const bool fusable = !qs.any_scale && (!qs.scale.defined() || qs.scale.numel() == 1) && !is_integer(qs.data.dtype());
  if (o.umup && fusable)  // probed too: u-μP's attention taps only its output
    return o.tap(proj(o.tap(unit::causal_self_attention(qkv_out, H, o.attn_mult, o.context), "attn.mix"), o, c), "attn.out");
  if (!u && !o.umup && !o.probe && fusable) return o.tap(proj(causal_self_attention(qkv_out, H), o), "attn.out");
  auto split_heads = [&](int64_t part) {  // [B, H, T, hd]
    return permute(reshape(slice(qkv_out, 2, part * D, (part + 1) * D), {B, T, H, hd}), {0, 2, 1, 3});
  };
  const Var q = split_heads(0), k = split_heads(1), v = split_heads(2);
  if (o.umup) {
    const Var mix = reshape(permute(unit::scaled_dot_product_attention(q, k, v, o.attn_mult, o.context), {0, 2, 1, 3}), {B, T, D});
    return o.tap(proj(o.tap(mix, "attn.mix"), o, c), "attn.out");
  }
  const Var kt = transpose(k, -1, -2);
  const Var scores =
      o.tap(u ? unit::matmul_activations(q, kt) : mul_scalar(matmul(q, kt), 1 / std::sqrt(double(hd))), "attn.scores (masked)");
  const Var att = o.tap(u ? unit::causal_softmax(scores) : softmax(causal_mask(scores)), "attn.probs");
  const Var mix = reshape(permute(u ? unit::matmul_activations(att, v) : matmul(att, v), {0, 2, 1, 3}), {B, T, D});
  return o.tap(proj(o.tap(mix, "attn.mix"), o), "attn.out");
}

}  // namespace scalify::nn
