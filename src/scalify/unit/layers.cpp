#include "scalify/unit/layers.hpp"

#include <cmath>

#include "scalify/autograd/scaling.hpp"
#include "scalify/error.hpp"

namespace scalify::unit {

namespace {
double rms(const Tensor& t) { return std::sqrt(ops::mean(ops::unary(ops::Unary::square, t), {}).item()); }
int64_t rows_of(const Var& x) { return numel_of(x.shape()) / x.shape().back(); }
}  // namespace

Var ScaleProbe::tap(const Var& x, const std::string& name) {
  const size_t i = entries.size();
  entries.push_back({name, rms(x.value()), -1, x.scaled().data.dtype(), DType::f32});
  if (observe) observe(name, false, x.scaled());
  return Var::make("probe", x.scaled(), {x}, [this, i](const ScaledTensor& g) {
    if (observe) observe(entries[i].name, true, g);
    entries[i].backward_rms = rms(g.is_scaled() ? g.value() : g.data);
    entries[i].backward_storage = g.data.dtype();
    return std::vector<ScaledTensor>{g};
  });
}

Var LayerOptions::tap(const Var& x, const char* name) const {
  return probe ? probe->tap(x, std::string(prefix).append(name)) : x;
}
Var LayerOptions::lowp(const Var& x) const {
  return cast == Format::f32 ? x : cast_on_backward(cast_on_forward(x, cast), cast);
}

Var Init::weight(const Shape& s, bool output_projection) {
  const double sd = unit_scaled ? 1.0 : output_projection ? 0.02 / std::sqrt(2.0 * layers) : 0.02;
  return Var(Tensor::randn(s, ++seed, sd), true);
}
Var Init::constant(const Shape& s, double v) const { return Var(Tensor::full(s, v), true); }

Linear Linear::make(int64_t in, int64_t out, Init& init, bool output_projection) {
  return {init.weight({in, out}, output_projection), init.constant({out}, 0.0)};
}

Var Linear::operator()(const Var& x_in, const LayerOptions& o, const char* name) const {
  const Var x = o.lowp(x_in), wl = o.lowp(w);
  const std::string layer = std::string(o.prefix).append(name);
  if (!o.unit_scaled) return (o.matmul ? o.matmul(layer, x, wl) : scalify::matmul(x, wl)) + b;
  // The input activation is a non-cut edge (constrained); weight and bias are cut edges, the
  // bias's gradient summing over every row: beta = rows^-1/2 (as LayerNorm's).
  MatmulFn product;
  if (o.matmul) product = [&](const Var& xs, const Var& ws) { return o.matmul(layer, xs, ws); };
  return unit::matmul(x, wl, Constrain::x, product) + scaled(b, 1.0, 1.0 / std::sqrt(double(rows_of(x))));
}

LayerNorm LayerNorm::make(int64_t d, const Init& init, bool rms) {
  return {init.constant({d}, 1.0), rms ? Var() : init.constant({d}, 0.0)};
}

Var LayerNorm::operator()(const Var& x_in, const LayerOptions& o) const {
  const Var x = o.rescale_norm_grad ? dynamic_rescale_l2_grad(x_in) : x_in;
  if (!b.defined()) {
    if (o.unit_scaled) throw Error("RMSNorm has no unit-scaled form here; use LayerNorm with unit scaling");
    return scalify::rms_norm(x, w);
  }
  return o.unit_scaled ? unit::layer_norm(x, w, b) : scalify::layer_norm(x, w, b);
}

CausalSelfAttention CausalSelfAttention::make(int64_t d, int heads, Init& init) {
  if (heads <= 0 || d % heads != 0) throw Error("attention: width " + std::to_string(d) + " is not divisible by " + std::to_string(heads) + " heads");
  return {Linear::make(d, 3 * d, init), Linear::make(d, d, init, true), heads};
}

Var CausalSelfAttention::operator()(const Var& x, const LayerOptions& o) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], D = x.shape()[2], H = heads, hd = D / H;
  const bool u = o.unit_scaled;
  const Var qkv_out = o.tap(qkv(x, o, "attn.qkv"), "attn.qkv");
  // Standard attention takes the fused kernel (plain or one-scale values, any float storage); unit
  // scaling's own attention rules, per-block scales and probed runs (which tap the scores and
  // probabilities) compose the scaled ops below.
  const ScaledTensor& qs = qkv_out.scaled();
  if (!u && !o.probe && !qs.any_scale && (!qs.scale.defined() || qs.scale.numel() == 1) && !is_integer(qs.data.dtype()))
    return o.tap(proj(causal_self_attention(qkv_out, H), o, "attn.proj"), "attn.out");
  auto split_heads = [&](int64_t part) {  // [B, H, T, hd]
    return permute(reshape(slice(qkv_out, 2, part * D, (part + 1) * D), {B, T, H, hd}), {0, 2, 1, 3});
  };
  const Var q = split_heads(0), k = split_heads(1), v = split_heads(2);
  const Var kt = transpose(k, -1, -2);
  const Var scores = o.tap(u ? matmul_activations(q, kt) : mul_scalar(scalify::matmul(q, kt), 1 / std::sqrt(double(hd))),
                           "attn.scores (masked)");
  const Var att = o.tap(u ? causal_softmax(scores) : scalify::softmax(causal_mask(scores)), "attn.probs");
  const Var mix = reshape(permute(u ? matmul_activations(att, v) : scalify::matmul(att, v), {0, 2, 1, 3}), {B, T, D});
  return o.tap(proj(o.tap(mix, "attn.mix"), o, "attn.proj"), "attn.out");
}

int64_t Mlp::hidden_width(int64_t d, bool swiglu) { return swiglu ? (8 * d / 3 + 7) / 8 * 8 : 4 * d; }

Mlp Mlp::make(int64_t d, Init& init, bool swiglu) {
  const int64_t hidden = hidden_width(d, swiglu);
  return {Linear::make(d, swiglu ? 2 * hidden : hidden, init), Linear::make(hidden, d, init, true), swiglu};
}

Var Mlp::operator()(const Var& x, const LayerOptions& o) const {
  const Var h = o.tap(fc(x, o, "mlp.fc"), "mlp.fc");
  Var a;
  if (swiglu) {
    if (o.unit_scaled) throw Error("SwiGLU has no unit-scaled form here; use the GELU MLP with unit scaling");
    const int64_t hidden = h.shape().back() / 2;
    const int last = int(h.shape().size()) - 1;
    a = o.tap(scalify::silu(slice(h, last, 0, hidden)) * slice(h, last, hidden, 2 * hidden), "mlp.swiglu");
  } else {
    a = o.tap(o.unit_scaled ? unit::gelu(h, /*constrained=*/true) : scalify::gelu(h), "mlp.gelu");
  }
  return o.tap(out(a, o, "mlp.out"), "mlp.out");
}

GptBlock GptBlock::make(int64_t d, int heads, Init& init, bool rms_norm, bool swiglu) {
  LayerNorm ln1 = LayerNorm::make(d, init, rms_norm);
  CausalSelfAttention attn = CausalSelfAttention::make(d, heads, init);
  LayerNorm ln2 = LayerNorm::make(d, init, rms_norm);
  Mlp mlp = Mlp::make(d, init, swiglu);
  return {ln1, ln2, attn, mlp};
}

Var GptBlock::operator()(const Var& x, Residual r, const LayerOptions& o) const {
  const Var h = o.tap(residual(x, [&](const Var& v) { return attn(o.tap(ln1(v, o), "ln1"), o); }, r), "resid.attn");
  r.layer += 1;
  return o.tap(residual(h, [&](const Var& v) { return mlp(o.tap(ln2(v, o), "ln2"), o); }, r), "resid.mlp");
}

}  // namespace scalify::unit
