// u-μP (GptConfig::umup) against unit-scaling 0.3.5, the library that defines it: references
// written by tests/data/umup/make_reference.py (committed data), and the unit scale of every
// tensor of a u-μP model at initialisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "scalify/error.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/nn/block.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/train/config.hpp"
#include "scalify/train/trainer.hpp"
#include "scalify/unit/unit_ops.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

const std::string kDir = std::string(SCALIFY_TESTS_DATA_DIR) + "/umup/";

nn::GptConfig umup_config(int64_t d_model, int layers) {
  nn::GptConfig c;
  c.vocab = 40;
  c.seq = 16;
  c.d_model = d_model;
  c.layers = layers;
  c.heads = 2;
  c.umup = c.rms_norm = c.swiglu = true;
  c.bias = c.tied_head = false;
  c.rope_theta = 10000;  // unit-scaling's TransformerDecoder has no position embedding
  return c;
}

double rms(const Tensor& t) { return std::sqrt(ops::mean(ops::unary(ops::Unary::square, t.to(DType::f64)), {}).item()); }

TEST(UmupReference, LearningRateFactorsAreUnitScalingsAdamFactors) {
  // unit-scaling's optim.AdamW (lr = 1) on a TransformerDecoder: "<d_model> <layers> <name> <factor>".
  std::ifstream in(kDir + "lr_factors.txt");
  ASSERT_TRUE(in) << kDir + "lr_factors.txt";
  std::map<std::pair<int64_t, int>, std::map<std::string, double>> ref;
  int64_t d;
  int layers;
  std::string name;
  double factor;
  while (in >> d >> layers >> name >> factor) ref[{d, layers}][name] = factor;
  ASSERT_EQ(ref.size(), 4u);
  for (const auto& [shape, factors] : ref) {
    const nn::Gpt model(umup_config(shape.first, shape.second), 1);
    std::set<std::string> names;
    for (const auto& [n, p] : model.parameters()) {
      names.insert(n);
      ASSERT_TRUE(factors.count(n)) << n << " has no reference";
      EXPECT_NEAR(model.lr_multiplier(n), factors.at(n), 1e-15 * factors.at(n)) << n << " at d_model " << shape.first;
    }
    EXPECT_EQ(names.size(), factors.size()) << "the same parameters as unit-scaling's model";
  }
}

TEST(UmupReference, ResidualTausAreTransformerResidualScalingRules) {
  std::ifstream in(kDir + "taus.txt");
  ASSERT_TRUE(in);
  int layers, index, count = 0;
  double mult, ratio, tau;
  while (in >> layers >> mult >> ratio >> index >> tau) {
    EXPECT_NEAR(unit::umup_residual_tau(index, 2 * layers, mult, ratio), tau, 1e-15)
        << layers << " " << mult << " " << ratio << " " << index;
    ++count;
  }
  EXPECT_EQ(count, 2 * (1 + 2 + 4 + 3 + 3 + 6));
  EXPECT_THROW(unit::umup_residual_tau(4, 4, 1, 1), Error);
}

TEST(UmupReference, TransformerLayerMatchesUnitScalingToF32Rounding) {
  // unit-scaling's TransformerLayer (affine RMSNorms; the one difference, as Scalify's norms have
  // gains) at initialisation, from its weights and inputs: output, input gradient and every
  // weight's gradient of sum(y * g), with its (non-exact, unit-scaled) backward.
  const io::SafeTensors st = io::read_safetensors(kDir + "layer.safetensors", io::Unverified::quiet);
  std::map<std::string, Tensor> t;
  for (const auto& [n, v] : st.tensors) t[n] = v;
  auto meta = [&](const char* k) { return std::stod(st.metadata.at(k)); };
  const int64_t D = int64_t(meta("d_model"));
  const int heads = int(meta("heads")), layers = int(meta("layers")), index = int(meta("index"));
  const nn::BlockSpec spec{D, 4 * D, heads, heads, true, true, false, false, meta("norm_eps"), 0};
  nn::Init init{true, layers, 1};
  nn::GptBlock block = nn::GptBlock::make(spec, init);
  const std::map<std::string, Var*> params = {
      {"ln1.w", &block.ln1.w}, {"attn.qkv.w", &block.attn.qkv.w}, {"attn.proj.w", &block.attn.proj.w},
      {"ln2.w", &block.ln2.w}, {"mlp.fc.w", &block.mlp.fc.w},     {"mlp.out.w", &block.mlp.out.w}};
  for (const auto& [n, p] : params) *p = Var(t.at("w." + n).to(DType::f32), true);
  unit::Residual r;
  r.kind = unit::Residual::Kind::umup;
  r.adds = 2 * layers;
  r.layer = 2 * index + 1;
  r.residual_mult = meta("residual_mult");
  r.residual_attn_ratio = meta("residual_attn_ratio");
  EXPECT_NEAR(unit::umup_residual_tau(2 * index, 2 * layers, r.residual_mult, r.residual_attn_ratio), meta("mhsa_tau"), 1e-15);
  EXPECT_NEAR(unit::umup_residual_tau(2 * index + 1, 2 * layers, r.residual_mult, r.residual_attn_ratio), meta("mlp_tau"), 1e-15);
  nn::LayerOptions o;
  o.unit_scaled = false;
  o.umup = true;
  o.attn_mult = meta("attn_mult");
  const Var x(t.at("x").to(DType::f32), true);
  const Var y = block(x, r, o);
  sum(y * Var(t.at("g").to(DType::f32))).backward();
  // f32 rounding: each tensor within 2e-6 of its RMS (f32's epsilon 1.2e-7; the errors are 1-4e-7).
  auto expect_close = [](const std::string& what, const Tensor& got, const Tensor& want) {
    ASSERT_EQ(got.shape(), want.shape()) << what;
    const double err = rms(ops::sub(got.to(DType::f64), want)), scale = rms(want);
    std::printf("%-14s RMS %8.4f, error RMS %.2e\n", what.c_str(), scale, err);
    EXPECT_LT(err, 2e-6 * scale) << what;
  };
  expect_close("y", y.value(), t.at("y"));
  expect_close("grad x", x.grad(), t.at("grad.x"));
  for (const auto& [n, p] : params) expect_close("grad " + n, p->grad(), t.at("grad." + n));
}

TEST(UmupReference, SingleOpsMatchUnitScalingForwardAndBackward) {
  // unit-scaling's silu_glu (mult 1.7), linear_readout, cross_entropy (mult 1.3) and embedding,
  // with the library's (unit-scaled, non-exact) backward, from its inputs: Scalify's ops in f32
  // within f32 rounding (2e-6 of each tensor's RMS).
  const io::SafeTensors st = io::read_safetensors(kDir + "ops.safetensors", io::Unverified::quiet);
  std::map<std::string, Tensor> t;
  for (const auto& [n, v] : st.tensors) t[n] = v;
  auto f32 = [&](const std::string& n, bool grad = false) { return Var(t.at(n).to(DType::f32), grad); };
  auto ids = [&](const std::string& n) {
    std::vector<int64_t> v;
    for (float x : t.at(n).to_floats()) v.push_back(int64_t(x));
    return Tensor::from_indices(v, t.at(n).shape());
  };
  auto expect_close = [](const std::string& what, const Tensor& got, const Tensor& want) {
    ASSERT_EQ(got.shape(), want.shape()) << what;
    const double err = rms(ops::sub(got.to(DType::f64), want)), scale = rms(want);
    std::printf("%-26s RMS %8.4f, error RMS %.2e\n", what.c_str(), scale, err);
    EXPECT_LT(err, 2e-6 * scale) << what;
  };
  {
    const Var input = f32("silu_glu.input", true), gate = f32("silu_glu.gate", true);
    const Var y = unit::silu_glu(input, gate, std::stod(st.metadata.at("silu_glu_mult")));
    sum(y * f32("silu_glu.g")).backward();
    expect_close("silu_glu y", y.value(), t.at("silu_glu.y"));
    expect_close("silu_glu grad input", input.grad(), t.at("silu_glu.grad.input"));
    expect_close("silu_glu grad gate", gate.grad(), t.at("silu_glu.grad.gate"));
  }
  {
    // Gpt's readout: alpha 1 / fan_in, x's gradient vocab^-1/2, W's rows^-1/2.
    const Var x = f32("readout.x", true), w = f32("readout.w", true);
    const double d = double(w.shape()[0]), V = double(w.shape()[1]), rows = double(x.shape()[0]);
    const Var y = unit::matmul(x, w, 1 / d, 1 / std::sqrt(V), 1 / std::sqrt(rows));
    sum(y * f32("readout.g")).backward();
    expect_close("linear_readout y", y.value(), t.at("readout.y"));
    expect_close("linear_readout grad x", x.grad(), t.at("readout.grad.x"));
    expect_close("linear_readout grad w", w.grad(), t.at("readout.grad.w"));
  }
  {
    const Var logits = f32("cross_entropy.logits", true);
    const Var loss = unit::cross_entropy(logits, ids("cross_entropy.targets"), std::stod(st.metadata.at("cross_entropy_mult")));
    loss.backward();
    expect_close("cross_entropy loss", loss.value().reshape({1}), t.at("cross_entropy.y"));
    expect_close("cross_entropy grad logits", logits.grad(), t.at("cross_entropy.grad.logits"));
  }
  {
    const Var w = f32("embedding.w", true);
    const Var y = unit::embedding(w, ids("embedding.ids"));
    sum(y * f32("embedding.g")).backward();
    expect_close("embedding y", y.value(), t.at("embedding.y"));
    expect_close("embedding grad w", w.grad(), t.at("embedding.grad.w"));
  }
}

TEST(UmupAttention, TheFusedKernelEqualsTheComposedOpsForwardAndBackward) {
  // unit::causal_self_attention (the model's, through the fused kernel) against
  // unit::scaled_dot_product_attention composed of matmuls and softmax, in f64: a wrong score
  // factor or a missing s on either side shows far above rounding.
  const int64_t B = 2, T = 7, H = 2, hd = 4, D = H * hd;
  for (const double mult : {1.0, 0.5, 3.0}) {
    const Tensor packed = Tensor::randn({B, T, 3 * D}, 11, 1.0, DType::f64), g = Tensor::randn({B, T, D}, 12, 1.0, DType::f64);
    const Var fused_in(packed, true), composed_in(packed, true);
    const Var fused = unit::causal_self_attention(fused_in, H, mult);
    sum(fused * Var(g)).backward();
    auto heads = [&](int64_t part) {
      return permute(reshape(slice(composed_in, 2, part * D, (part + 1) * D), {B, T, H, hd}), {0, 2, 1, 3});
    };
    const Var composed = reshape(permute(unit::scaled_dot_product_attention(heads(0), heads(1), heads(2), mult), {0, 2, 1, 3}), {B, T, D});
    sum(composed * Var(g)).backward();
    EXPECT_LT(rms(ops::sub(fused.value(), composed.value())), 1e-13 * rms(composed.value())) << mult;
    EXPECT_LT(rms(ops::sub(fused_in.grad(), composed_in.grad())), 1e-13 * rms(composed_in.grad())) << mult;
  }
}

// Every activation and gradient (the probe's) and every parameter of a u-μP model at
// initialisation, as test_unit's UnitGpt.ScalesAtInitialisation does for the unit-scaled one.
TEST(UmupGpt, EveryTensorHasUnitScaleAtInitialisationAtTwoWidths) {
  for (const int64_t d : {64, 256}) {
    nn::GptConfig c = umup_config(d, 4);
    c.vocab = 64;
    c.seq = 32;
    c.rope_theta = 0;  // learned positions (Scalify's default), unit-scaled as the embedding
    const nn::Gpt model(c, 1);
    const Tensor ids = Tensor::rand({8, 32}, 5, -0.49, 63.49).to(DType::i64);
    const Tensor tg = Tensor::rand({8, 32}, 50, -0.49, 63.49).to(DType::i64);
    nn::ScaleProbe probe;
    model.loss(ids, tg, &probe).backward();
    double lo = 1e30, hi = 0, attn_lo = 1e30, attn_hi = 0;
    auto check = [&](const std::string& name, double v) {
      // u-μP's attention scale (scaled_dot_product_attention's sqrt(ln T / T) model of a flat
      // causal softmax) undercounts how alike the values of deeper layers are: the attention's
      // output (attn.mix, attn.out) grows to 2.1-2.4 in layers 3 and 4, and its input gradient
      // (attn.qkv's) falls to 0.41-0.49. unit-scaling 0.3.5's own TransformerDecoder does the
      // same (attn.mix 2.07-2.33 in layers 3-4 at d_model 64 and 256, seq 32), and the layer
      // itself matches it to f32 rounding (UmupReference): these get [0.4, 2.3], named here (measured
      // [0.407, 2.26]); every other tensor [0.65, 1.95] (measured [0.697, 1.87]).
      const bool attention = name.find("attn.mix") != std::string::npos || name.find("attn.out") != std::string::npos ||
                             name.find("attn.qkv (grad)") != std::string::npos;
      (attention ? attn_lo : lo) = std::min(attention ? attn_lo : lo, v);
      (attention ? attn_hi : hi) = std::max(attention ? attn_hi : hi, v);
      const double min = attention ? 0.4 : 0.65, max = attention ? 2.3 : 1.95;
      EXPECT_TRUE(v >= min && v <= max) << name << " has RMS " << v << " at d_model " << d;
    };
    size_t checked = 0;
    for (const auto& e : probe.entries) {
      // The one exception, by design: u-μP's readout (linear_readout) scales by 1/fan_in, not
      // fan_in^-1/2, so the logits start at d_model^-1/2 of unit scale (μP's readout); their
      // gradient is unit-scaled.
      if (e.name == "logits")
        EXPECT_NEAR(e.forward_rms, 1 / std::sqrt(double(d)), 0.1 / std::sqrt(double(d))) << "logits at d_model " << d;
      else
        check(e.name, e.forward_rms);
      check(e.name + " (grad)", e.backward_rms);
      checked += 2;
    }
    for (const auto& [name, p] : model.parameters()) {
      check("parameter " + name, rms(p.value()));
      ++checked;
    }
    EXPECT_GT(checked, 4u * 20);
    std::printf("d_model %ld: %zu tensors, RMS in [%.3g, %.3g] (logits, attention apart), attention in [%.3g, %.3g]\n", long(d), checked,
                lo, hi, attn_lo, attn_hi);
  }
}

TEST(UmupOptimizer, DecayScaleMultipliesEachParametersWeightDecay) {
  // u-μP's independent weight decay goes through AdamW's per-parameter decay_scale: with a zero
  // gradient (Adam's update 0) a step is w (1 - lr lr_scale weight_decay decay_scale).
  const Var a(Tensor::full({3}, 1.0), true), b(Tensor::full({3}, 1.0), true);
  optim::AdamWConfig c;
  c.lr = 0.5, c.weight_decay = 0.1;
  optim::AdamW opt({a, b}, c, {1.0, 0.25}, {true, true}, {2.0, 8.0});
  sum(a * 0.0 + b * 0.0).backward();
  opt.step();
  EXPECT_FLOAT_EQ(a.value().to(DType::f64).data<double>()[0], 1 - 0.5 * 0.1 * 2.0);
  EXPECT_FLOAT_EQ(b.value().to(DType::f64).data<double>()[0], 1 - 0.5 * 0.25 * 0.1 * 8.0);
  EXPECT_THROW(optim::AdamW({a}, c, {}, {}, {-1.0}), Error);
  EXPECT_THROW(optim::AdamW({a}, c, {}, {}, {1.0, 1.0}), Error);
}

std::string validation_error(const train::TrainConfig& c) {  // "" when c is valid
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// u-μP's lr defaults to 2^0 (min_lr 0.1) where not given: f32's 2e-3 barely trains its model.
TEST(UmupOptimizer, LearningRateDefaultsToOneUnlessGiven) {
  train::TrainConfig c;
  c.recipe = "umup";
  EXPECT_EQ(train::with_recipe_defaults(c).lr, 1.0);
  EXPECT_EQ(train::with_recipe_defaults(c).min_lr, 0.1);
  c.set("min_lr", "0.25");
  EXPECT_EQ(train::with_recipe_defaults(c).lr, 1.0);
  EXPECT_EQ(train::with_recipe_defaults(c).min_lr, 0.25);
  c.set("lr", "0.5");
  EXPECT_EQ(train::with_recipe_defaults(c).lr, 0.5);
  train::TrainConfig standard;
  EXPECT_EQ(train::with_recipe_defaults(standard).lr, 2e-3);
  EXPECT_EQ(train::with_recipe_defaults(standard).min_lr, 2e-4);
  // A resumed run reads its config.toml (every key given): the lr it trained with stays.
  train::TrainConfig run;
  run.recipe = "umup";
  const train::TrainConfig resumed = train::parse_config(train::with_recipe_defaults(run).to_toml(), "config.toml");
  EXPECT_EQ(train::with_recipe_defaults(resumed).lr, 1.0);
}

TEST(UmupOptimizer, WeightDecayIsIndependentAndZeroUnlessGiven) {
  // Under u-μP the decay is independent_weight_decay, per step (unit-scaling's independent weight
  // decay, its default 0); weight_decay keeps its one meaning (AdamW's coupled coefficient, 0.1 by
  // default), which u-μP does not use: each recipe refuses the other's key by name.
  train::TrainConfig c;
  c.recipe = "umup";
  EXPECT_EQ(train::with_recipe_defaults(c).weight_decay, 0.0);
  EXPECT_EQ(train::with_recipe_defaults(c).independent_weight_decay, 0.0);
  EXPECT_NO_THROW(train::with_recipe_defaults(c).validate());
  c.set("independent_weight_decay", "0.001");
  EXPECT_EQ(train::with_recipe_defaults(c).independent_weight_decay, 0.001);
  EXPECT_NO_THROW(train::with_recipe_defaults(c).validate());
  c.set("weight_decay", "0.1");  // compare --recipes f32,umup --set weight_decay=0.1
  const std::string refused = validation_error(train::with_recipe_defaults(c));
  EXPECT_NE(refused.find("'weight_decay'"), std::string::npos) << refused;
  EXPECT_NE(refused.find("set independent_weight_decay"), std::string::npos) << refused;
  train::TrainConfig standard;
  EXPECT_EQ(train::with_recipe_defaults(standard).weight_decay, 0.1);
  standard.set("independent_weight_decay", "0.001");
  EXPECT_NE(validation_error(train::with_recipe_defaults(standard)).find("'independent_weight_decay'"), std::string::npos);
  // A resumed run reads its config.toml (every key given): the decay it trained with stays.
  train::TrainConfig run;
  run.recipe = "umup";
  run.set("independent_weight_decay", "0.002");
  const train::TrainConfig resumed = train::parse_config(train::with_recipe_defaults(run).to_toml(), "config.toml");
  EXPECT_EQ(train::with_recipe_defaults(resumed).independent_weight_decay, 0.002);
  EXPECT_NO_THROW(train::with_recipe_defaults(resumed).validate());
}

TEST(UmupOptimizer, GradientClippingIsOffUnlessGiven) {
  // Unit-scaled gradients have a global norm of hundreds (growing with the width): grad_clip 1
  // would clip every step by a width-dependent factor; unit-scaling does not clip.
  train::TrainConfig c;
  c.recipe = "umup";
  EXPECT_EQ(train::with_recipe_defaults(c).grad_clip, 0.0);
  c.set("grad_clip", "5");
  EXPECT_EQ(train::with_recipe_defaults(c).grad_clip, 5.0);
  train::TrainConfig standard;
  EXPECT_EQ(train::with_recipe_defaults(standard).grad_clip, 1.0);
}

TEST(UmupGpt, AttentionKeepsTheContextsScaleOnShorterWindows) {
  // u-μP's attention scale s takes T = the model's context (seq), not the window's length: causal
  // attention then gives a short window's rows exactly as the same rows of a full window, so
  // evaluation and sampling on shorter windows run at the scale the model trained at.
  const nn::GptConfig c = umup_config(32, 2);
  const nn::Gpt model(c, 1);
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < c.seq; ++i) tokens.push_back((7 * i + 3) % c.vocab);
  const int64_t shorter = 5;
  const Tensor full = model.logits(Tensor::from_indices(tokens, {1, c.seq})).value().to(DType::f64);
  const Tensor part = model.logits(Tensor::from_indices(std::vector<int64_t>(tokens.begin(), tokens.begin() + shorter), {1, shorter}))
                          .value()
                          .to(DType::f64);
  const double* f = full.contiguous().data<double>();
  const double* p = part.contiguous().data<double>();
  const double scale = rms(full);
  for (int64_t i = 0; i < shorter * c.vocab; ++i) ASSERT_NEAR(p[i], f[i], 1e-6 * scale) << "logit " << i;
  // The composed op (probed runs, scaled inputs) keeps the same rule.
  const Var q(Tensor::randn({1, 2, c.seq, 16}, 11, 1.0)), k(Tensor::randn({1, 2, c.seq, 16}, 12, 1.0)),
      v(Tensor::randn({1, 2, c.seq, 16}, 13, 1.0));
  auto head = [&](const Var& x) { return Var(x.value().slice(2, 0, shorter).contiguous()); };
  const Tensor all = unit::scaled_dot_product_attention(q, k, v, 1.5).value().slice(2, 0, shorter).contiguous().to(DType::f64);
  const Tensor few = unit::scaled_dot_product_attention(head(q), head(k), head(v), 1.5, c.seq).value().to(DType::f64);
  for (int64_t i = 0; i < few.numel(); ++i) ASSERT_NEAR(few.data<double>()[i], all.data<double>()[i], 1e-6) << "element " << i;
}

TEST(UmupGpt, LogitsCarryTheLossMultSoSamplingSeesTheLossesDistribution) {
  // loss_mult scales the logits the cross-entropy sees; sampling reads logits(), so the mult is in
  // them: the loss is the mean cross-entropy of logits() itself (log-softmax in f64 here).
  nn::GptConfig c = umup_config(32, 2);
  const nn::Gpt plain(c, 1);
  c.loss_mult = 2.5;
  const nn::Gpt model(c, 1);
  const int64_t T = 6;
  std::vector<int64_t> ids, targets;
  for (int64_t i = 0; i < T; ++i) ids.push_back((5 * i + 1) % c.vocab), targets.push_back((3 * i + 2) % c.vocab);
  const Tensor in = Tensor::from_indices(ids, {1, T});
  const Tensor logits = model.logits(in).value().to(DType::f64).contiguous();
  const Tensor base = plain.logits(in).value().to(DType::f64).contiguous();
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data<double>() + t * c.vocab;
    double top = l[0], z = 0;
    for (int64_t v = 0; v < c.vocab; ++v) top = std::max(top, l[v]);
    for (int64_t v = 0; v < c.vocab; ++v) z += std::exp(l[v] - top);
    loss += (top + std::log(z) - l[targets[size_t(t)]]) / T;
    for (int64_t v = 0; v < c.vocab; ++v) ASSERT_NEAR(l[v], 2.5 * base.data<double>()[t * c.vocab + v], 1e-6 * std::fabs(l[v]) + 1e-12);
  }
  EXPECT_NEAR(model.loss(in, Tensor::from_indices(targets, {1, T})).value().item(), loss, 1e-5 * loss);
}

TEST(UmupConfig, ModelKeysAreUnitScalingsAndAConflictingOneIsRefusedByName) {
  // A u-μP recipe trains unit-scaling's transformer: its keys resolved in the config (so
  // config.toml, the memory estimate and compare's parameter count see that model), a given
  // conflicting one refused by name rather than overridden.
  train::TrainConfig c;
  c.recipe = "umup";
  c.model.d_model = 64;
  const train::TrainConfig r = train::with_recipe_defaults(c);
  EXPECT_TRUE(r.model.rms_norm && r.model.swiglu && !r.model.bias && !r.model.tied_head);
  EXPECT_EQ(r.model.mlp_hidden, 4 * 64);
  // Counted by hand: per block qkv 3d², proj d², SwiGLU 3 x 4d² = 12d², two RMS gains 2d; the
  // embeddings (vocab + seq) d, the final gain d, the untied head vocab d.
  const int64_t d = 64, V = r.model.vocab, T = r.model.seq, L = r.model.layers;
  EXPECT_EQ(r.model.parameter_count(), L * (16 * d * d + 2 * d) + (V + T) * d + d + V * d);
  for (const auto& [key, value] :
       {std::pair<const char*, const char*>{"bias", "true"}, {"tied_head", "true"}, {"rms_norm", "false"}, {"swiglu", "false"}}) {
    train::TrainConfig bad = c;
    bad.set(key, value);
    try {
      train::with_recipe_defaults(bad);
      ADD_FAILURE() << key << " = " << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(key) + "'"), std::string::npos) << e.what();
    }
  }
  train::TrainConfig agreeing = c;
  agreeing.set("bias", "false");
  EXPECT_NO_THROW(train::with_recipe_defaults(agreeing));
  // A run's config.toml read again (every key given) keeps them.
  EXPECT_NO_THROW(train::with_recipe_defaults(train::parse_config(r.to_toml(), "config.toml")));
}

TEST(UmupOptimizer, TinyLearningRateTrainsAndOverflowingDecayScaleNamesLr) {
  // The independent decay's per-parameter scale 1 / (lr factor) is taken only where there is a
  // decay: an lr near the smallest double trains (it moves nothing) instead of failing on an
  // infinite scale; with a decay it is refused naming lr.
  train::TrainConfig c = testing::tiny_run(testing::text_corpus(), testing::scratch("umup_tiny_lr"), "umup");
  c.steps = 1;
  c.set("lr", "1e-320");
  c.set("min_lr", "0");
  EXPECT_NO_THROW(train::train(c, false));
  c.out = testing::scratch("umup_tiny_lr_decay").string();
  c.set("independent_weight_decay", "0.1");
  try {
    train::train(c, false);
    ADD_FAILURE() << "an infinite decay scale was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'lr'"), std::string::npos) << e.what();
  }
}

TEST(UmupConfig, KeysAddedForUmupAreWrittenOnlyWhenSet) {
  // config.toml (and a checkpoint's config) of a run that leaves u-μP's keys at their defaults
  // holds none of them, so it still loads in a build from before u-μP; a set one is written and
  // reads back.
  const char* added[] = {"residual_mult", "residual_attn_ratio", "act_mult", "attn_mult", "loss_mult", "independent_weight_decay"};
  const std::string standard = train::TrainConfig().to_toml();
  for (const char* k : added) EXPECT_EQ(standard.find(std::string("\n") + k + " ="), std::string::npos) << k;
  train::TrainConfig c;
  c.recipe = "umup";
  c.set("loss_mult", "2.5");
  c.set("independent_weight_decay", "0.01");
  const std::string text = c.to_toml();
  EXPECT_NE(text.find("\nloss_mult = 2.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nindependent_weight_decay = 0.01\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nact_mult ="), std::string::npos) << text;
  const train::TrainConfig back = train::parse_config(text, "config.toml");
  EXPECT_EQ(back.model.loss_mult, 2.5);
  EXPECT_EQ(back.model.act_mult, 1.0);
  EXPECT_EQ(back.independent_weight_decay, 0.01);
}

TEST(UmupGpt, ConfigurationIsRefusedWhereItIsNotUnitScalingsTransformer) {
  nn::GptConfig c = umup_config(32, 2);
  c.bias = true;
  EXPECT_THROW(c.validate(), Error);
  c = umup_config(32, 2);
  c.unit_scaled = true;
  EXPECT_THROW(c.validate(), Error);
  c = umup_config(32, 2);
  c.attn_mult = 0;
  EXPECT_THROW(c.validate(), Error);
  c = umup_config(32, 2);
  c.kv_heads = 1;  // grouped-query attention: no counterpart in unit-scaling
  try {
    c.validate();
    ADD_FAILURE() << "kv_heads < heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads"), std::string::npos) << e.what();
  }
  c.kv_heads = c.heads;
  EXPECT_NO_THROW(c.validate());
  EXPECT_NO_THROW(umup_config(32, 2).validate());
}

}  // namespace
}  // namespace scalify
