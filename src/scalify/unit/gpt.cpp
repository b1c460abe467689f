#include "scalify/unit/gpt.hpp"

#include <cmath>

#include "scalify/autograd/scaling.hpp"
#include "scalify/error.hpp"

namespace scalify::unit {

namespace {
double rms(const Tensor& t) { return std::sqrt(ops::mean(ops::unary(ops::Unary::square, t), {}).item()); }
}  // namespace

Var ScaleProbe::tap(const Var& x, const std::string& name) {
  const size_t i = entries.size();
  entries.push_back({name, rms(x.value()), -1});
  return Var::make("probe", x.scaled(), {x}, [this, i](const ScaledTensor& g) {
    entries[i].backward_rms = rms(g.is_scaled() ? g.value() : g.data);
    return std::vector<ScaledTensor>{g};
  });
}

Gpt::Gpt(const GptConfig& c, uint64_t seed) : c_(c) {
  if (c.d_model % c.heads != 0) throw Error("gpt: d_model must be divisible by heads");
  const int64_t D = c.d_model;
  uint64_t k = seed * 1000;
  // Unit scaling: unit-variance non-bias parameters. Standard: GPT-2 (0.02, projections / sqrt(2L)).
  const double w_std = c.unit_scaled ? 1.0 : 0.02, proj_std = c.unit_scaled ? 1.0 : 0.02 / std::sqrt(2.0 * c.layers);
  auto w = [&](Shape s, double sd) { return Var(Tensor::randn(s, ++k, sd), true); };
  auto full = [&](Shape s, double v) { return Var(Tensor::full(s, v), true); };
  wte_ = w({c.vocab, D}, w_std);
  wpe_ = w({c.seq, D}, c.unit_scaled ? 1.0 : 0.01);
  for (int l = 0; l < c.layers; ++l)
    blocks_.push_back({full({D}, 1), full({D}, 0), w({D, 3 * D}, w_std), full({3 * D}, 0), w({D, D}, proj_std),
                       full({D}, 0), full({D}, 1), full({D}, 0), w({D, 4 * D}, w_std), full({4 * D}, 0),
                       w({4 * D, D}, proj_std), full({D}, 0)});
  lnf_w_ = full({D}, 1);
  lnf_b_ = full({D}, 0);
  head_ = w({D, c.vocab}, w_std);
}

std::vector<std::pair<std::string, Var>> Gpt::parameters() const {
  std::vector<std::pair<std::string, Var>> p = {{"wte", wte_}, {"wpe", wpe_}};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    std::string s = "h";  // built with append: GCC 12 warns falsely on operator+ here (-Wrestrict)
    s.append(std::to_string(l)).append(".");
    for (auto& [n, v] : std::vector<std::pair<std::string, Var>>{
             {"ln1.w", b.ln1_w}, {"ln1.b", b.ln1_b}, {"attn.w_qkv", b.w_qkv}, {"attn.b_qkv", b.b_qkv},
             {"attn.w_proj", b.w_proj}, {"attn.b_proj", b.b_proj}, {"ln2.w", b.ln2_w}, {"ln2.b", b.ln2_b},
             {"mlp.w_fc", b.w_fc}, {"mlp.b_fc", b.b_fc}, {"mlp.w_out", b.w_out}, {"mlp.b_out", b.b_out}})
      p.push_back({std::string(s).append(n), v});
  }
  p.push_back({"lnf.w", lnf_w_});
  p.push_back({"lnf.b", lnf_b_});
  p.push_back({"head", head_});
  return p;
}

double Gpt::lr_multiplier(const std::string& name) const {
  if (!c_.unit_scaled) return 1.0;
  const bool projection = name.find("w_qkv") != std::string::npos || name.find("w_proj") != std::string::npos ||
                          name.find("w_fc") != std::string::npos || name.find("w_out") != std::string::npos ||
                          name == "head";
  return projection ? 1.0 : 1.0 / std::sqrt(double(c_.d_model));
}

Var Gpt::block(const Var& x, const Block& b, int layer, ScaleProbe* probe) const {
  const int64_t B = x.shape()[0], T = x.shape()[1], D = c_.d_model, H = c_.heads, hd = D / H;
  std::string at = "h";
  at.append(std::to_string(layer)).append(".");
  auto tap = [&](const Var& v, const std::string& n) { return probe ? probe->tap(v, std::string(at).append(n)) : v; };
  const bool u = c_.unit_scaled;
  auto lowp = [&](const Var& v) {  // the matmul's operands in the emulated format, both directions
    return c_.cast == Format::f32 ? v : cast_on_backward(cast_on_forward(v, c_.cast), c_.cast);
  };
  auto linear = [&](const Var& v_in, const Var& w_in, const Var& bias) {
    const Var v = lowp(v_in), w = lowp(w_in);
    if (!u) return scalify::matmul(v, w) + bias;
    // A bias is a cut edge whose gradient sums over every row: beta = rows^-1/2 (as LayerNorm's).
    return unit::matmul(v, w, Constrain::x) + unit::scaled(bias, 1.0, 1.0 / std::sqrt(double(B * T)));
  };
  auto norm = [&](const Var& v, const Var& w, const Var& bias) {
    return u ? unit::layer_norm(v, w, bias) : scalify::layer_norm(v, w, bias);
  };
  auto attention = [&](const Var& v) {
    const Var qkv = tap(linear(v, b.w_qkv, b.b_qkv), "attn.qkv");
    auto heads = [&](int64_t part) {
      return permute(reshape(slice(qkv, 2, part * D, (part + 1) * D), {B, T, H, hd}), {0, 2, 1, 3});
    };
    const Var q = heads(0), k = heads(1), vv = heads(2);
    const Var kt = transpose(k, -1, -2);
    const Var scores = tap(u ? unit::matmul_activations(q, kt) : mul_scalar(scalify::matmul(q, kt), 1 / std::sqrt(double(hd))),
                           "attn.scores (masked)");
    const Var att = tap(u ? unit::causal_softmax(scores) : scalify::softmax(causal_mask(scores)), "attn.probs");
    const Var y = reshape(permute(u ? unit::matmul_activations(att, vv) : scalify::matmul(att, vv), {0, 2, 1, 3}), {B, T, D});
    return tap(linear(tap(y, "attn.mix"), b.w_proj, b.b_proj), "attn.out");
  };
  auto mlp = [&](const Var& v) {
    const Var h = tap(linear(v, b.w_fc, b.b_fc), "mlp.fc");
    const Var a = tap(u ? unit::gelu(h, /*constrained=*/true) : scalify::gelu(h), "mlp.gelu");
    return tap(linear(a, b.w_out, b.b_out), "mlp.out");
  };
  Residual r;
  r.kind = u ? c_.residual : Residual::Kind::plain;
  r.tau = c_.tau;
  r.branch_rewrite = u;
  r.layer = 2 * layer + 1;  // running-mean counts both residual adds of every block
  const Var h = tap(residual(x, [&](const Var& v) { return attention(tap(norm(v, b.ln1_w, b.ln1_b), "ln1")); }, r), "resid.attn");
  r.layer += 1;
  return tap(residual(h, [&](const Var& v) { return mlp(tap(norm(v, b.ln2_w, b.ln2_b), "ln2")); }, r), "resid.mlp");
}

Var Gpt::loss(const Tensor& ids, const Tensor& targets, ScaleProbe* probe) const {
  if (ids.dim() != 2 || ids.size(1) > c_.seq)
    throw Error("gpt: ids must be [B, T] with T <= " + std::to_string(c_.seq) + ", got " + shape_str(ids.shape()));
  const int64_t B = ids.size(0), T = ids.size(1);
  // Positions for every row (not broadcast), so the embedding's gradient count is B * T.
  std::vector<int64_t> pos(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = i % T;
  const Tensor positions = Tensor::from_indices(pos, {B, T});
  auto tap = [&](const Var& v, const std::string& n) { return probe ? probe->tap(v, n) : v; };
  const bool u = c_.unit_scaled;
  Var x = u ? weighted_add({unit::embedding(wte_, ids), unit::embedding(wpe_, positions)}, {1.0, 1.0})
            : scalify::embedding(wte_, ids) + scalify::embedding(wpe_, positions);
  x = tap(x, "embed");
  for (size_t l = 0; l < blocks_.size(); ++l) x = block(x, blocks_[l], int(l), probe);
  const Var xf = tap(u ? unit::layer_norm(x, lnf_w_, lnf_b_) : scalify::layer_norm(x, lnf_w_, lnf_b_), "lnf");
  auto lowp = [&](const Var& v) {
    return c_.cast == Format::f32 ? v : cast_on_backward(cast_on_forward(v, c_.cast), c_.cast);
  };
  const Var logits = tap(reshape(u ? unit::matmul(lowp(xf), lowp(head_), Constrain::x) : scalify::matmul(lowp(xf), lowp(head_)),
                                 {B * T, c_.vocab}), "logits");
  const Tensor flat_targets = targets.reshape({B * T});
  return u ? unit::softmax_cross_entropy(logits, flat_targets) : cross_entropy(logits, flat_targets);
}

}  // namespace scalify::unit
