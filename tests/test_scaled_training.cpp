// SCALIFY end to end: a transformer training step on scaled tensors computes the same values as
// the unscaled step (model invariance), and keeps the data of activations and gradients unit-scaled.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "scalify/autograd/data_precision.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/autograd/scaling.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/nn/gpt.hpp"
#include "tiny_lm.hpp"

namespace scalify {
namespace {

// The GPT (one block, untied head) and its parameters in the model's fixed order.
struct Model {
  nn::Gpt gpt;
  std::vector<Var> params() const { return testing::parameters_of(gpt); }
};

constexpr int64_t V = 11, T = 8, B = 4, D = 16;

// rescale_norm_grad: SCALIFY's dynamic rescale of the gradient before every norm (#2-#4).
Model make_model(uint64_t seed, bool rescale_norm_grad = false) {
  quant::Recipe r;
  r.rescale_norm_grad = rescale_norm_grad;
  return {testing::tiny_gpt(V, T, D, seed, false, r)};
}

// The same parameters as scaled tensors: data = value / 2^k for a random k per parameter (or
// as_scaled's unit-RMS choice).
Var rescaled(const Var& p, int which, bool unit) {
  const Tensor v = p.value();
  if (unit) return Var(as_scaled(v), true);
  const float s = std::ldexp(1.0f, (which * 5) % 17 - 8);
  return Var(ScaledTensor(ops::scale_shift(v, 1.0 / s, 0.0), s), true);
}

Var loss_of(const Model& m, uint64_t seed, nn::ScaleProbe* probe = nullptr) {
  std::vector<int64_t> in, tg;
  const std::vector<double> r = Tensor::rand({B * (T + 1)}, seed, 0, double(V)).to_vector();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      in.push_back(int64_t(r[size_t(b * (T + 1) + t)]));
      tg.push_back(int64_t(r[size_t(b * (T + 1) + t + 1)]));
    }
  return m.gpt.loss(Tensor::from_indices(in, {B, T}), Tensor::from_indices(tg, {B, T}), probe);
}

// A copy whose parameters are given by `convert` (fresh leaves; the original is untouched).
template <class F>
Model converted(const Model& m, F convert) {
  Model s = m;
  nn::NamedParams params = m.gpt.parameters();
  int k = 0;
  for (auto& [name, v] : params) v = convert(v, k++);
  s.gpt.set_parameters(params);
  return s;
}

Model scaled_copy(const Model& m, bool unit) {
  return converted(m, [&](const Var& v, int k) {
    const bool zero = ops::sum(ops::unary(ops::Unary::abs, v.value()), {}).item() == 0;
    return zero ? Var(ScaledTensor(v.value(), 1.0f), true) : rescaled(v, k, unit);  // zeros: any scale
  });
}

TEST(ScaledTraining, TransformerStepIsModelInvariant) {
  const Model plain = make_model(5);
  const Model scaled = scaled_copy(plain, false);
  const Var l0 = loss_of(plain, 42), l1 = loss_of(scaled, 42);
  EXPECT_TRUE(l1.scaled().is_scaled());
  l0.backward();
  l1.backward();
  const double eps = std::numeric_limits<float>::epsilon();
  EXPECT_NEAR(l1.value().item(), l0.value().item(), 8 * eps * l0.value().item());
  const std::vector<Var> p0 = plain.params(), p1 = scaled.params();
  for (size_t i = 0; i < p0.size(); ++i) {
    ASSERT_TRUE(p1[i].scaled_grad().is_scaled()) << "parameter " << i << ": gradient lost its scale";
    const std::vector<double> g0 = p0[i].grad().to_vector(), g1 = p1[i].grad().to_vector();
    double norm = 0;
    for (double g : g0) norm = std::max(norm, std::fabs(g));
    for (size_t j = 0; j < g0.size(); ++j) ASSERT_NEAR(g1[j], g0[j], 64 * eps * norm) << "parameter " << i << " element " << j;
  }
}

TEST(ScaledTraining, AdamWUpdateIsModelInvariant) {
  // One AdamW step on scaled parameters (f32 data) lands on the same represented values as the
  // unscaled step, to f32 rounding of the moment updates. Both get the same represented gradients
  // (the scaled one as data / s with its power-of-two scale s): the two backward passes round
  // differently, and Adam's g / (|g| + eps) turns a tiny gradient's relative rounding into ~lr.
  const Model plain = make_model(8);
  const Model scaled = scaled_copy(plain, false);
  loss_of(plain, 3).backward();
  loss_of(scaled, 3).backward();
  for (size_t i = 0; i < plain.params().size(); ++i) {
    Var p1 = scaled.params()[i];
    const float s = p1.scaled_grad().scalar_scale();
    p1.set_grad(ScaledTensor(ops::scale_shift(plain.params()[i].grad(), 1.0 / s, 0.0), s));
  }
  optim::AdamW a(plain.params(), {.lr = 1e-2}), b(scaled.params(), {.lr = 1e-2});
  a.step();
  b.step();
  const std::vector<Var> p0 = plain.params(), p1 = scaled.params();
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_TRUE(p1[i].scaled().is_scaled());
    const std::vector<double> v0 = p0[i].value().to_vector(), v1 = p1[i].value().to_vector();
    for (size_t j = 0; j < v0.size(); ++j)  // an update of ~lr: its relative error ~1e-6
      ASSERT_NEAR(v1[j], v0[j], 1e-2 * 1e-5 + 1e-6 * std::fabs(v0[j])) << "parameter " << i << " element " << j;
  }
}

TEST(ScaledTraining, GradientDataStaysNearUnitScale) {
  // Parameters as_scaled (unit-RMS data) and SCALIFY's gradient rescale before every norm:
  // every parameter gradient's data has an RMS in [1/16, 8] (measured 0.105-3.52), while the
  // represented gradients span a factor of ~300. Without the rescales LayerNorm's backward multiplies the
  // gradient data by 1 / sigma of its input's data (~50 at GPT-2's init) and the data reach ~50.
  const Model scaled = scaled_copy(make_model(6, /*rescale_norm_grad=*/true), true);
  const Var loss = loss_of(scaled, 7);
  loss.backward();
  double min_value = 1e30, max_value = 0;
  for (const auto& [name, p] : scaled.gpt.parameters()) {
    const Tensor d = p.scaled_grad().data;
    const double rms_data = std::sqrt(ops::mean(ops::unary(ops::Unary::square, d), {}).item());
    const double rms_value = std::sqrt(ops::mean(ops::unary(ops::Unary::square, p.grad()), {}).item());
    if (rms_value == 0) continue;
    min_value = std::min(min_value, rms_value);
    max_value = std::max(max_value, rms_value);
    std::printf("%-14s gradient RMS %.2e, data RMS %.3g, scale %.3g\n", name.c_str(), rms_value, rms_data, p.scaled_grad().scalar_scale());
    EXPECT_GT(rms_data, 1.0 / 16) << name << ": gradient data too small";
    EXPECT_LT(rms_data, 8.0) << name << ": gradient data too large";
  }
  std::printf("represented gradient RMS spans %.2e .. %.2e\n", min_value, max_value);
}

TEST(ScalingPrimitives, NoOpsOnTheValueInTheDirectionTheyDoNotActOn) {
  const Tensor x0 = Tensor::randn({64}, 11, 3.0);
  const Var x(as_scaled(x0), true);
  const Tensor w = Tensor::randn({64}, 12);
  for (int which = 0; which < 4; ++which) {
    Var y = which == 0   ? set_scaling(x, 0.5f)
            : which == 1 ? rebalance(x, 8.0f)
            : which == 2 ? dynamic_rescale_l2(rebalance(x, 64.0f))
                         : dynamic_rescale_max(x);
    EXPECT_EQ(y.value().to_vector(), x0.to_vector()) << which;
    sum(mul(y, Var(w))).backward();
    EXPECT_EQ(x.grad().to_vector(), w.to_vector()) << which;
    Var(x).zero_grad();
  }
  EXPECT_EQ(set_scaling(x, 0.5f).scaled().scalar_scale(), 0.5f);
}

TEST(ScalingPrimitives, GradFormsRescaleOnlyTheGradient) {
  const Var x(as_scaled(Tensor::randn({256}, 13)), true);
  const Var y = dynamic_rescale_l2_grad(x);
  EXPECT_EQ(y.value().to_vector(), x.value().to_vector());
  // A gradient with a tiny data component (scale 1, data ~1e-3) comes back unit-RMS.
  const ScaledTensor g(Tensor::randn({256}, 14, 1e-3), 1.0f);
  y.backward(g);
  const ScaledTensor& got = x.scaled_grad();
  EXPECT_EQ(got.value().to_vector(), g.value().to_vector());
  const double rms = std::sqrt(ops::mean(ops::unary(ops::Unary::square, got.data), {}).item());
  EXPECT_GE(rms, 1.0);
  EXPECT_LT(rms, 2.0);
}

TEST(ScalingPrimitives, CastOnForwardAndOnBackward) {
  const Var x(as_scaled(Tensor::randn({500}, 15)), true);
  const Var f = cast_on_forward(x, Format::e4m3);
  EXPECT_EQ(f.scaled().data.dtype(), DType::e4m3);
  EXPECT_EQ(f.scaled().scalar_scale(), x.scaled().scalar_scale());
  EXPECT_EQ(f.scaled().data.to_vector(), x.scaled().data.to(DType::e4m3).to_vector());
  const Var b = cast_on_backward(x, Format::e5m2);
  EXPECT_EQ(b.value().to_vector(), x.value().to_vector());  // forward untouched
  const ScaledTensor g(Tensor::randn({500}, 16), 0.25f);
  b.backward(g);
  EXPECT_EQ(x.scaled_grad().data.dtype(), DType::e5m2);
  EXPECT_EQ(x.grad().to_vector(), cast_data(g, Format::e5m2).value().to_vector());
}

// Algorithm 1 of seed 000 on a tiny transformer: parameters as scaled f16 (data f16, scale f32),
// AdamW state in scaled f16, the whole step scale-propagated; its loss tracks the f32 run. As in
// seed 000's #4, the gradients are rescaled before the optimizer: their squares (the second
// moment) must fit f16, and LayerNorm's backward multiplies gradient data by 1 / sigma of its
// input's data (about 50 for GPT-2's N(0, 0.02) embeddings).
TEST(ScaledTraining, F16ScaledTransformerTracksF32) {
  auto train = [](bool scaled_f16) {
    Model m = make_model(21, /*rescale_norm_grad=*/scaled_f16);
    if (scaled_f16) m = converted(m, [](const Var& v, int) { return Var(as_scaled(v.value(), DType::f16), true); });
    optim::AdamWConfig cfg;
    cfg.lr = 1e-2;
    if (scaled_f16) cfg.state_dtype = DType::f16;
    optim::AdamW opt(m.params(), cfg);
    std::vector<double> losses;
    for (int step = 0; step < 120; ++step) {
      // The last step is inspected: every activation and gradient the probe sees, and how many
      // values each op lost rounding into f16 (SPEC §2 data precision: no loss scaling anywhere).
      const bool inspect = scaled_f16 && step == 119;
      nn::ScaleProbe probe;
      std::optional<StorageCastRecorder> casts;
      if (inspect) casts.emplace();
      // f16 runs as seed 000's #2-#4: one dynamic rescale of the gradient before every norm. Without
      // it the gradient data drifts and 0.1-2 % of some gradients (norm, matmul, bias) saturate at
      // f16's 65504 by step 120: the report below is how that shows.
      Var loss = loss_of(m, uint64_t(step % 6), inspect ? &probe : nullptr);  // a small fixed data set: the loss must fall
      losses.push_back(loss.value().item());
      loss.backward();
      if (inspect) {
        for (const nn::ScaleProbe::Entry& e : probe.entries) {
          EXPECT_EQ(e.forward_storage, DType::f16) << e.name << " activation";
          EXPECT_EQ(e.backward_storage, DType::f16) << e.name << " gradient";
        }
        EXPECT_GE(probe.entries.size(), 10u);
        std::printf("%-22s %9s %10s %10s %10s\n", "f16 data of", "values", "underflow", "subnormal", "saturated");
        for (const auto& [name, st] : casts->stats()) {
          std::printf("%-22s %9lld %9.4f%% %9.4f%% %9.4f%%\n", name.c_str(), (long long)st.values, 100 * st.underflow_fraction(),
                      100 * st.subnormal_fraction(), 100 * st.saturated_fraction());
          EXPECT_EQ(st.saturated, 0) << name;                // the propagated scales keep every tensor below f16's max
          EXPECT_LT(st.underflow_fraction(), 1e-3) << name;  // ... and above its subnormals
        }
        EXPECT_GT(casts->total().values, 0);
        for (const Var& p : m.params()) EXPECT_EQ(p.scaled_grad().data.dtype(), DType::f16);  // a gradient takes its parameter's storage
      }
      if (scaled_f16)
        for (Var p : m.params()) p.set_grad(dynamic_rescale_l2(p.scaled_grad()));
      opt.step();
    }
    if (scaled_f16) {
      for (const Var& p : m.params()) {
        EXPECT_EQ(p.scaled().data.dtype(), DType::f16);
        EXPECT_TRUE(p.scaled().is_scaled());
      }
      EXPECT_EQ(opt.first_moment(0).data.dtype(), DType::f16);
    }
    return losses;
  };
  const std::vector<double> f32 = train(false), f16 = train(true);
  auto tail_mean = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 12; i < l.size(); ++i) s += l[i];
    return s / 12;
  };
  std::printf("loss f32 %.3f -> %.3f, scaled f16 %.3f -> %.3f\n", f32.front(), tail_mean(f32), f16.front(), tail_mean(f16));
  EXPECT_LT(tail_mean(f32), 0.6 * f32.front());
  // f16 data has a relative precision of 2^-11 (and the f16 run rescales norm gradients): after
  // 120 steps on this small memorisation set the runs differ in detail, so the check is that f16
  // data costs nothing: its last-12-step mean loss is within 5 % of f32's (measured +2.9 %).
  EXPECT_NEAR(tail_mean(f16), tail_mean(f32), 0.05 * tail_mean(f32));
}

}  // namespace
}  // namespace scalify
