// AdamW with low-precision moments (optim/state_format) and master weights: one update from the
// decoded moments equals the f64 update the test computes itself; the new moments are the
// encodings of the f64 ones; stochastically rounded bf16 master weights land on a neighbour.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/optim/adamw.hpp"

namespace scalify::optim {
namespace {

std::vector<float> decoded(const EncodedState& s, const StateFormat& f) {
  std::vector<float> out(size_t(s.numel));
  decode_state(s, f, out);
  return out;
}

TEST(AdamWState, Fp8MomentsUpdateEqualsTheF64Reference) {
  const StateFormat e4m3_tensor{.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  const StateFormat e4m3_group_expand{.storage = Format::e4m3, .scaling = StateScaling::per_group, .expand = true};
  const StateFormat f16_tensor_nonneg{.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
  const StateFormat e4m3_group_expand_nonneg{
      .storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true, .expand = true};
  for (const auto& [mf, vf] : {std::pair{e4m3_tensor, f16_tensor_nonneg}, std::pair{e4m3_group_expand, e4m3_group_expand_nonneg}}) {
    AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    c.m_format = mf;
    c.v_format = vf;
    std::vector<Var> params = {Var(Tensor::randn({300}, 1), true), Var(Tensor::randn({7, 5}, 2), true)};
    AdamW opt(params, c, {1.0, 0.5}, {true, false});
    ASSERT_TRUE(opt.encodes_state());
    for (int t = 1; t <= 3; ++t) {
      const double multiplier = t == 2 ? 0.25 : 1.0;
      std::vector<std::vector<double>> want_w, want_m, want_v;
      for (size_t k = 0; k < params.size(); ++k) {
        const Tensor g = Tensor::randn(params[k].shape(), 10 * t + int(k));
        params[k].set_grad(ScaledTensor(g));
        const std::vector<double> gv = g.to_vector(), w = params[k].value().to_vector();
        const std::vector<float> m = decoded(opt.encoded_first_moment(k), mf), v = decoded(opt.encoded_second_moment(k), vf);
        const double lr = c.lr * (k == 0 ? 1.0 : 0.5), wd = k == 0 ? c.weight_decay : 0.0;
        want_w.emplace_back(w.size());
        want_m.emplace_back(w.size());
        want_v.emplace_back(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
          const double gi = gv[i] * multiplier;
          const double mi = c.beta1 * m[i] + (1 - c.beta1) * gi, vi = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
          const double mhat = mi / (1 - std::pow(c.beta1, t)), vhat = vi / (1 - std::pow(c.beta2, t));
          want_w[k][i] = w[i] - lr * (mhat / (std::sqrt(vhat) + c.eps) + wd * w[i]);
          want_m[k][i] = mi;
          want_v[k][i] = vi;
        }
      }
      opt.step(multiplier);
      for (size_t k = 0; k < params.size(); ++k) {
        const std::vector<double> got = params[k].value().to_vector();
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], double(float(want_w[k][i]))) << "step " << t << " parameter " << k << " element " << i;
        // The stored moments encode the f64 ones rounded to f32 (the encoders are tested in test_state_format).
        std::vector<float> m32(want_m[k].begin(), want_m[k].end()), v32(want_v[k].begin(), want_v[k].end());
        EXPECT_EQ(opt.encoded_first_moment(k).codes, encode_state(m32, mf).codes) << "step " << t << " parameter " << k;
        EXPECT_EQ(opt.encoded_second_moment(k).codes, encode_state(v32, vf).codes) << "step " << t << " parameter " << k;
      }
    }
    EXPECT_EQ(opt.state_bytes(0), opt.encoded_first_moment(0).bytes() + opt.encoded_second_moment(0).bytes());
  }
}

// bf16 master weights with stochastic rounding: each new weight is one of the two bf16 values
// around the f64 update, not always the nearest.
TEST(AdamWState, StochasticBf16MasterWeightsLandOnANeighbour) {
  AdamWConfig c{.lr = 1e-3};
  c.master_rounding = Rounding::stochastic;
  std::vector<Var> params = {Var(Tensor::randn({4096}, 3).to(DType::bf16), true)};
  AdamW opt(params, c);
  const Tensor g = Tensor::randn({4096}, 4);
  params[0].set_grad(ScaledTensor(g.to(DType::bf16)));
  const std::vector<double> w = params[0].value().to_vector(), gv = params[0].grad().to_vector();
  opt.step();
  ASSERT_EQ(params[0].value().dtype(), DType::bf16);
  const std::vector<double> got = params[0].value().to_vector();
  int not_nearest = 0, inexact = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double mhat = 0.1 * gv[i] / 0.1, vhat = 0.001 * gv[i] * gv[i] / 0.001;  // step 1: bias correction undoes (1 - beta)
    const double want = w[i] - c.lr * (mhat / (std::sqrt(vhat) + c.eps));
    // The bf16 neighbours of want: truncate its f32 bits to bf16, and the next bf16 up in magnitude.
    const float wf = float(want);
    const uint32_t bits = std::bit_cast<uint32_t>(wf) & 0xFFFF0000u;
    const double down = std::bit_cast<float>(bits), up = std::bit_cast<float>(bits + 0x10000u);
    ASSERT_TRUE(got[i] == down || got[i] == up) << i << ": " << want << " -> " << got[i];
    if (double(wf) != down) ++inexact;
    const double nearest = std::fabs(wf - down) <= std::fabs(up - wf) ? down : up;
    not_nearest += got[i] != nearest;
  }
  EXPECT_GT(inexact, 3000);
  EXPECT_GT(not_nearest, inexact / 10);
}

TEST(AdamWState, RejectsASignlessFirstMoment) {
  AdamWConfig c;
  c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .non_negative = true};
  EXPECT_THROW(AdamW({Var(Tensor::randn({4}, 1), true)}, c), Error);
}

}  // namespace
}  // namespace scalify::optim
