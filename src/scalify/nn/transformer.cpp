#include "scalify/nn/transformer.hpp"

#include <cmath>

#include "scalify/error.hpp"

namespace scalify::nn {

std::vector<std::pair<std::string, Var>> BlockParams::named() const {
  return {{"ln1.w", ln1_w}, {"ln1.b", ln1_b}, {"attn.w_qkv", w_qkv}, {"attn.b_qkv", b_qkv},
          {"attn.w_proj", w_proj}, {"attn.b_proj", b_proj}, {"ln2.w", ln2_w}, {"ln2.b", ln2_b},
          {"mlp.w_fc", w_fc}, {"mlp.b_fc", b_fc}, {"mlp.w_out", w_out}, {"mlp.b_out", b_out}};
}

BlockParams init_block(int64_t d, int layers, uint64_t seed, DType dtype) {
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * layers);
  auto w = [&](Shape s, double sd, uint64_t k) { return Var(Tensor::randn(s, seed * 16 + k, sd, dtype), true); };
  auto c = [&](Shape s, double v) { return Var(Tensor::full(s, v, dtype), true); };
  return {c({d}, 1.0), c({d}, 0.0), w({d, 3 * d}, std, 1), c({3 * d}, 0.0), w({d, d}, proj_std, 2), c({d}, 0.0),
          c({d}, 1.0), c({d}, 0.0), w({d, 4 * d}, std, 3), c({4 * d}, 0.0), w({4 * d, d}, proj_std, 4), c({d}, 0.0)};
}

namespace {
Var apply(const LinearFn& linear, int which, const Var& x, const Var& w, const Var& b) {
  return linear ? linear(which, x, w, b) : matmul(x, w) + b;
}
}  // namespace

Var causal_self_attention(const Var& x, const BlockParams& p, int heads, const LinearFn& linear) {
  const int64_t B = x.shape()[0], T = x.shape()[1], D = x.shape()[2];
  if (D % heads != 0) throw Error("attention: model width " + std::to_string(D) + " is not divisible by " + std::to_string(heads) + " heads");
  const int64_t hd = D / heads;
  const Var qkv = apply(linear, 0, x, p.w_qkv, p.b_qkv);           // [B, T, 3D]
  auto heads_of = [&](int64_t part) {                              // [B, H, T, hd]
    return permute(reshape(slice(qkv, 2, part * D, (part + 1) * D), {B, T, heads, hd}), {0, 2, 1, 3});
  };
  const Var q = heads_of(0), k = heads_of(1), v = heads_of(2);
  const Var scores = mul_scalar(matmul(q, transpose(k, -1, -2)), 1.0 / std::sqrt(double(hd)));
  const Var att = softmax(causal_mask(scores));                    // [B, H, T, T]
  const Var y = reshape(permute(matmul(att, v), {0, 2, 1, 3}), {B, T, D});
  return apply(linear, 1, y, p.w_proj, p.b_proj);
}

Var transformer_block(const Var& x, const BlockParams& p, int heads, const LinearFn& linear) {
  const Var h = x + causal_self_attention(layer_norm(x, p.ln1_w, p.ln1_b), p, heads, linear);
  const Var m = apply(linear, 3, gelu(apply(linear, 2, layer_norm(h, p.ln2_w, p.ln2_b), p.w_fc, p.b_fc)), p.w_out, p.b_out);
  return h + m;
}

}  // namespace scalify::nn
