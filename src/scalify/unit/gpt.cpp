#include "scalify/unit/gpt.hpp"

#include <cmath>

#include "scalify/error.hpp"

namespace scalify::unit {

Gpt::Gpt(const GptConfig& c, uint64_t seed) : c_(c) {
  Init init{c.unit_scaled, c.layers, seed * 1000};
  const int64_t D = c.d_model;
  wte_ = init.weight({c.vocab, D}, false);
  wpe_ = c.unit_scaled ? init.weight({c.seq, D}, false) : Var(Tensor::randn({c.seq, D}, ++init.seed, 0.01), true);
  for (int l = 0; l < c.layers; ++l) blocks_.push_back(GptBlock::make(D, c.heads, init));
  lnf_ = LayerNorm::make(D, init);
  head_ = init.weight({D, c.vocab}, false);
}

NamedParams Gpt::parameters() const {
  NamedParams p = {{"wte", wte_}, {"wpe", wpe_}};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    std::string prefix = "h";  // built with append: GCC 12 warns falsely on operator+ here
    blocks_[l].add_to(p, prefix.append(std::to_string(l)).append("."));
  }
  lnf_.add_to(p, "lnf");
  p.push_back({"head", head_});
  return p;
}

double Gpt::lr_multiplier(const std::string& name) const {
  if (!c_.unit_scaled) return 1.0;
  const bool weight = name.size() > 2 && name.compare(name.size() - 2, 2, ".w") == 0;
  const bool projection = name == "head" || (weight && (name.find(".attn.") != std::string::npos ||
                                                         name.find(".mlp.") != std::string::npos));
  return projection ? 1.0 : 1.0 / std::sqrt(double(c_.d_model));
}

Var Gpt::loss(const Tensor& ids, const Tensor& targets, ScaleProbe* probe) const {
  if (ids.dim() != 2 || ids.size(1) > c_.seq)
    throw Error("gpt: ids must be [B, T] with T <= " + std::to_string(c_.seq) + ", got " + shape_str(ids.shape()));
  const int64_t B = ids.size(0), T = ids.size(1);
  // Positions for every row (not broadcast), so the embedding's gradient count is B * T.
  std::vector<int64_t> pos(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = i % T;
  const Tensor positions = Tensor::from_indices(pos, {B, T});
  LayerOptions o{c_.unit_scaled, c_.cast, probe, ""};
  const bool u = c_.unit_scaled;
  Var x = u ? weighted_add({unit::embedding(wte_, ids), unit::embedding(wpe_, positions)}, {1.0, 1.0})
            : scalify::embedding(wte_, ids) + scalify::embedding(wpe_, positions);
  x = o.tap(x, "embed");
  Residual r;
  r.kind = u ? c_.residual : Residual::Kind::plain;
  r.tau = c_.tau;
  r.branch_rewrite = u;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    LayerOptions ol = o;
    ol.prefix = std::to_string(l);
    ol.prefix.insert(0, 1, 'h').push_back('.');  // no operator+: GCC 12 warns falsely (-Wrestrict)
    r.layer = 2 * int(l) + 1;  // running-mean counts both residual adds of every block
    x = blocks_[l](x, r, ol);
  }
  const Var xf = o.tap(lnf_(x, o), "lnf");
  const Var xl = o.lowp(xf), hl = o.lowp(head_);
  const Var logits = o.tap(reshape(u ? unit::matmul(xl, hl, Constrain::x) : scalify::matmul(xl, hl), {B * T, c_.vocab}), "logits");
  const Tensor flat_targets = targets.reshape({B * T});
  return u ? unit::softmax_cross_entropy(logits, flat_targets) : cross_entropy(logits, flat_targets);
}

}  // namespace scalify::unit
