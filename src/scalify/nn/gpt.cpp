#include "scalify/nn/gpt.hpp"

#include <cmath>

#include "scalify/error.hpp"

namespace scalify::nn {

using namespace unit;

void GptConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("model: " + what);
  };
  need(vocab >= 2 && vocab <= (1 << 20), "vocab must be in [2, 2^20], got " + std::to_string(vocab));
  need(seq >= 1 && seq <= 65536, "seq must be in [1, 65536], got " + std::to_string(seq));
  need(d_model >= 1 && d_model <= 65536, "d_model must be in [1, 65536], got " + std::to_string(d_model));
  need(layers >= 1 && layers <= 1024, "layers must be in [1, 1024], got " + std::to_string(layers));
  need(heads >= 1 && d_model % heads == 0,
       "heads must divide d_model, got heads = " + std::to_string(heads) + ", d_model = " + std::to_string(d_model));
  need(kv_heads >= 0 && (kv_heads == 0 || heads % kv_heads == 0),
       "kv_heads must divide heads, got kv_heads = " + std::to_string(kv_heads) + ", heads = " + std::to_string(heads));
  need(mlp_hidden >= 0 && mlp_hidden <= (int64_t(1) << 20), "mlp_hidden must be in [0, 2^20], got " + std::to_string(mlp_hidden));
  need(norm_eps >= 0 && norm_eps < 1, "norm_eps must be in [0, 1), got " + std::to_string(norm_eps));
  need(rope_theta == 0 || (rope_theta > 1 && rope_theta < 1e12), "rope_theta must be 0 or in (1, 1e12), got " + std::to_string(rope_theta));
  need(rope_theta == 0 || (d_model / heads) % 2 == 0, "rotary positions need an even head width, got " + std::to_string(d_model / heads));
  need(!(unit_scaled && (rms_norm || swiglu || gelu_erf)),
       "unit scaling supports LayerNorm and tanh GELU only (rms_norm, swiglu and gelu_erf off)");
  need(!(unit_scaled && (rope_theta > 0 || (kv_heads != 0 && kv_heads != heads))),
       "unit scaling supports learned positions and multi-head attention only (rope_theta 0, kv_heads = heads)");
  need(tau > 0 && tau < 1, "tau must be in (0, 1), got " + std::to_string(tau));
  need(!(umup && unit_scaled), "umup and unit_scaled are two parametrisations: choose one");
  // unit-scaling's attention has no grouped heads, and repeating kv heads sums their gradients
  // (growing by sqrt(group)): no unit scale to keep.
  need(!(umup && kv_heads != 0 && kv_heads != heads),
       "u-μP supports multi-head attention only (kv_heads = heads, got kv_heads = " + std::to_string(kv_heads) +
           ", heads = " + std::to_string(heads) + "): unit-scaling has no grouped-query attention");
  need(!umup || (rms_norm && swiglu && !bias && !tied_head),
       "u-μP's transformer has RMSNorm, SwiGLU, no biases and an untied head (rms_norm, swiglu on; bias, tied_head off)");
  for (const auto& [name, v] : {std::pair<const char*, double>{"residual_mult", residual_mult},
                                {"residual_attn_ratio", residual_attn_ratio},
                                {"act_mult", act_mult},
                                {"attn_mult", attn_mult},
                                {"loss_mult", loss_mult}})
    need(v > 0 && v < 1e6, std::string(name) + " must be in (0, 1e6), got " + std::to_string(v));
}

BlockSpec GptConfig::block() const {
  return {d_model,
          mlp_hidden > 0 ? mlp_hidden
          : umup         ? 4 * d_model
                         : Mlp::hidden_width(d_model, swiglu),  // uu.MLP: 4 d
          heads,
          kv_heads > 0 ? kv_heads : heads,
          rms_norm,
          swiglu,
          gelu_erf,
          bias,
          norm_eps > 0 ? norm_eps
          : umup       ? 1e-5
                       : LayerNorm::default_eps(rms_norm),  // uu.RMSNorm's 1e-5
          rope_theta};
}

int64_t GptConfig::parameter_count() const {
  const BlockSpec b = block();
  const int64_t D = d_model, qkv = D + 2 * D / heads * b.kv_heads, fc = (swiglu ? 2 : 1) * b.mlp_hidden;
  const int64_t norm = rms_norm ? D : 2 * D;
  const int64_t weights = D * qkv + D * D + D * fc + b.mlp_hidden * D, biases = bias ? qkv + D + fc + D : 0;
  return vocab * D + (learned_positions() ? seq * D : 0) + layers * (2 * norm + weights + biases) + (final_norm ? norm : 0) +
         (tied_head ? 0 : D * vocab);
}

Gpt::Gpt(const GptConfig& c, uint64_t seed, const quant::Recipe& recipe, Weights weights)
    : c_(c), rescale_norm_grad_(recipe.rescale_norm_grad) {
  c.validate();
  Init init{c.unit_scaled || c.umup, c.layers, seed * 1000, weights == Weights::random};
  const int64_t D = c.d_model;
  wte_ = init.weight({c.vocab, D}, false);
  if (c.learned_positions())
    wpe_ = init.unit_scaled || !init.draw ? init.weight({c.seq, D}, false) : Var(Tensor::randn({c.seq, D}, ++init.seed, 0.01), true);
  const BlockSpec spec = c.block();
  for (int l = 0; l < c.layers; ++l) blocks_.push_back(GptBlock::make(spec, init));
  if (c.final_norm) lnf_ = LayerNorm::make(D, init, c.rms_norm, spec.norm_eps);
  if (!c.tied_head) head_ = init.weight({D, c.vocab}, false);
  if (weights == Weights::unset)
    for (const auto& [name, ref] : refs()) unset_.insert(name);
  // Each layer draws its stochastic-rounding bits from a stream of its own name.
  for (auto& [name, linear] : linears()) {
    const int block = std::stoi(name.substr(1));
    linear->gemms = quant::QLinear(recipe.linear_for(name, block, c.layers), quant::layer_stream(name));
  }
}

std::vector<std::pair<std::string, Linear*>> Gpt::linears() {
  std::vector<std::pair<std::string, Linear*>> r;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    GptBlock& b = blocks_[l];
    const std::string p = std::string("h").append(std::to_string(l)).append(".");  // GCC 12: no operator+ (-Wrestrict)
    r.push_back({p + "attn.qkv", &b.attn.qkv});
    r.push_back({p + "attn.proj", &b.attn.proj});
    r.push_back({p + "mlp.fc", &b.mlp.fc});
    r.push_back({p + "mlp.out", &b.mlp.out});
  }
  return r;
}

std::vector<std::pair<std::string, Var*>> Gpt::refs() {
  std::vector<std::pair<std::string, Var*>> r = {{"wte", &wte_}};
  if (wpe_.defined()) r.push_back({"wpe", &wpe_});
  auto norm = [&](LayerNorm& n, const std::string& name) {
    r.push_back({name + ".w", &n.w});
    if (n.b.defined()) r.push_back({name + ".b", &n.b});
  };
  const std::vector<std::pair<std::string, Linear*>> lin = linears();
  auto linear = [&](size_t i) {
    r.push_back({lin[i].first + ".w", &lin[i].second->w});
    if (lin[i].second->b.defined()) r.push_back({lin[i].first + ".b", &lin[i].second->b});
  };
  for (size_t l = 0; l < blocks_.size(); ++l) {
    GptBlock& b = blocks_[l];
    const std::string p = std::string("h").append(std::to_string(l)).append(".");  // GCC 12: no operator+ (-Wrestrict)
    norm(b.ln1, p + "ln1");
    linear(4 * l);      // attn.qkv
    linear(4 * l + 1);  // attn.proj
    norm(b.ln2, p + "ln2");
    linear(4 * l + 2);  // mlp.fc
    linear(4 * l + 3);  // mlp.out
  }
  if (c_.final_norm) norm(lnf_, "lnf");
  if (!c_.tied_head) r.push_back({"head", &head_});
  return r;
}

NamedParams Gpt::parameters() const {
  NamedParams p;
  for (const auto& [name, v] : const_cast<Gpt*>(this)->refs()) p.push_back({name, *v});
  return p;
}

void Gpt::set_parameters(const NamedParams& params) {
  auto r = refs();
  for (const auto& [name, v] : params) {
    bool found = false;
    for (auto& [n, ref] : r)
      if (n == name) {
        if (v.shape() != ref->shape())
          throw Error("model: parameter '" + name + "' has shape " + shape_str(v.shape()) + ", expected " + shape_str(ref->shape()));
        *ref = v;
        unset_.erase(name);
        found = true;
      }
    if (!found) throw Error("model: no parameter named '" + name + "'");
  }
}

std::vector<std::string> Gpt::linear_names() const {
  std::vector<std::string> n;
  for (const auto& [name, l] : const_cast<Gpt*>(this)->linears()) n.push_back(name);
  return n;
}

std::vector<std::pair<std::string, const quant::QLinear*>> Gpt::quantized_linears() const {
  std::vector<std::pair<std::string, const quant::QLinear*>> q;
  for (const auto& [name, l] : const_cast<Gpt*>(this)->linears())
    if (l->gemms.recipe().quantized) q.emplace_back(name, &l->gemms);
  return q;
}

namespace {
// The weight matrix of a block's linear layer (attention or MLP) or the untied head: the
// projections of unit scaling's learning-rate rule and the matrices weight decay applies to.
bool projection_matrix(const std::string& name) {
  const bool weight = name.size() > 2 && name.compare(name.size() - 2, 2, ".w") == 0;
  return name == "head" || (weight && (name.find(".attn.") != std::string::npos || name.find(".mlp.") != std::string::npos));
}
}  // namespace

std::string Gpt::mup_type(const std::string& name) const {
  if (name == "head") return "output";
  if (name == "wte" || name == "wpe" || projection_matrix(name)) return "weight";
  return name.compare(name.size() - 2, 2, ".b") == 0 ? "bias" : "norm";
}

double Gpt::lr_multiplier(const std::string& name) const {
  if (c_.umup) {
    const std::string type = mup_type(name);
    const bool in_block = name[0] == 'h' && name != "head";  // TransformerStack's parameters: mup_scaling_depth = layers
    const double depth = in_block ? 1 / std::sqrt(double(c_.layers)) : 1.0;
    if (type != "weight") return depth;
    int64_t fan_in = c_.d_model;  // embeddings: the model width
    if (name != "wte" && name != "wpe")
      for (const auto& [n, v] : parameters())
        if (n == name) fan_in = v.shape()[0];  // [in, out]
    return depth / std::sqrt(double(fan_in));
  }
  if (!c_.unit_scaled) return 1.0;
  // Unit-scaled parameters are O(1) where standard ones are O(1/sqrt(d)), so Adam's steps must be
  // larger: seed 002 Table A.3 puts unit-scaled Adam's learning rates 2^4 above the standard ones;
  // on the default corpus a sweep (docs/RESULTS.md) found 2^5-2^6 best, and 2^5 is used.
  constexpr double kUnitAdam = 32;
  return kUnitAdam * (projection_matrix(name) ? 1.0 : 1.0 / std::sqrt(double(c_.d_model)));
}

bool Gpt::decays(const std::string& name) { return name == "wte" || projection_matrix(name); }

Var Gpt::logits(const Tensor& ids, ScaleProbe* probe) const { return forward(ids, probe, nullptr); }

std::string Gpt::kv_cache_refusal() const {
  // A quantised layer's activation scale (current, delayed, per tensor) is taken over every row it
  // is given: one new token would be scaled differently from the same row in a full recompute.
  // Unit scaling's attention scales by the window's length (matmul_activations' sizes, the causal
  // softmax's counts): every position's keys and values change as the window grows.
  if (c_.umup) return "u-μP's attention (unit-scaling's scaled ops) has no key/value cache path";
  if (c_.unit_scaled) return "unit-scaled attention scales by the window's length, so earlier positions' keys and values change with it";
  const auto q = quantized_linears();
  if (!q.empty())
    return "the model's linear layers are quantised ('" + q.front().first +
           "' and others), and their activation scales depend on every token of the window";
  return "";
}

Var Gpt::logits(const Tensor& ids, KvCache& cache) const {
  const std::string refusal = kv_cache_refusal();
  if (!refusal.empty()) throw Error("gpt: no key/value cache: " + refusal);
  if (cache.blocks.empty()) cache.blocks.resize(blocks_.size());
  if (cache.blocks.size() != blocks_.size())
    throw Error("gpt: the key/value cache holds " + std::to_string(cache.blocks.size()) + " blocks, the model " +
                std::to_string(blocks_.size()));
  return forward(ids, nullptr, &cache);
}

Var Gpt::forward(const Tensor& ids, ScaleProbe* probe, KvCache* cache) const {
  if (!unset_.empty()) throw Error("model: parameter '" + *unset_.begin() + "' was never given a value");
  const int64_t start = cache ? cache->length() : 0;
  if (ids.dim() != 2 || ids.size(1) > c_.seq - start || ids.size(1) < 1)
    throw Error("gpt: ids must be [B, T] with 1 <= T <= " + std::to_string(c_.seq - start) +
                (start > 0 ? " (the context of " + std::to_string(c_.seq) + " less the " + std::to_string(start) + " cached)" : "") +
                ", got " + shape_str(ids.shape()));
  const int64_t B = ids.size(0), T = ids.size(1);
  LayerOptions o{c_.unit_scaled,     probe,   "",          c_.rms_norm,  c_.swiglu,
                 rescale_norm_grad_, c_.umup, c_.act_mult, c_.attn_mult, c_.umup ? c_.seq : 0};
  const bool u = c_.unit_scaled || c_.umup;  // u-μP's embeddings are unit scaling's
  Var x;
  if (c_.learned_positions()) {
    // Positions for every row (not broadcast), so the embedding's gradient count is B * T.
    std::vector<int64_t> pos(static_cast<size_t>(B * T));
    for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = start + i % T;
    const Tensor positions = Tensor::from_indices(pos, {B, T});
    x = u ? weighted_add({unit::embedding(wte_, ids), unit::embedding(wpe_, positions)}, {1.0, 1.0})
          : scalify::embedding(wte_, ids) + scalify::embedding(wpe_, positions);
  } else {
    x = u ? unit::embedding(wte_, ids) : scalify::embedding(wte_, ids);
  }
  x = o.tap(x, "embed");
  Residual r;
  r.kind = c_.umup ? Residual::Kind::umup : u ? c_.residual : Residual::Kind::plain;
  r.tau = c_.tau;
  r.adds = 2 * c_.layers;
  r.residual_mult = c_.residual_mult;
  r.residual_attn_ratio = c_.residual_attn_ratio;
  r.branch_rewrite = u;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    LayerOptions ol = o;
    ol.prefix = std::to_string(l);
    ol.prefix.insert(0, 1, 'h').push_back('.');  // no operator+: GCC 12 warns falsely (-Wrestrict)
    r.layer = 2 * int(l) + 1;                    // running-mean counts both residual adds of every block
    x = blocks_[l](x, r, ol, cache ? &cache->blocks[l] : nullptr);
  }
  const Var xf = c_.final_norm ? o.tap(lnf_(x, o), "lnf") : x;
  const Var head = c_.tied_head ? transpose(wte_, 0, 1) : head_;
  if (c_.umup) {  // linear_readout: alpha = 1 / fan_in, beta_x = fan_out^-1/2, beta_w = rows^-1/2
    const double rows = double(numel_of(xf.shape()) / c_.d_model);
    const Var readout = unit::matmul(xf, head, 1.0 / double(c_.d_model), 1 / std::sqrt(double(c_.vocab)), 1 / std::sqrt(rows));
    // cross_entropy's mult on the logits themselves, forward only (the library's logits' gradient
    // has no mult in it), so the loss and sampling see the same distribution softmax(mult logits).
    return o.tap(c_.loss_mult == 1 ? readout : unit::scaled(readout, c_.loss_mult, 1.0), "logits");
  }
  return o.tap(u ? unit::matmul(xf, head, Constrain::x) : scalify::matmul(xf, head), "logits");
}

Var Gpt::loss(const Tensor& ids, const Tensor& targets, ScaleProbe* probe) const {
  if (targets.shape() != ids.shape())
    throw Error("gpt: targets " + shape_str(targets.shape()) + " do not match ids " + shape_str(ids.shape()));
  const int64_t BT = ids.numel();
  const Var logits2 = reshape(logits(ids, probe), {BT, c_.vocab});
  const Tensor flat_targets = targets.reshape({BT});
  if (c_.umup) return unit::cross_entropy(logits2, flat_targets);  // loss_mult is in the logits
  return c_.unit_scaled ? unit::softmax_cross_entropy(logits2, flat_targets) : scalify::cross_entropy(logits2, flat_targets);
}

}  // namespace scalify::nn
