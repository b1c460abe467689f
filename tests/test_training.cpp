// End-to-end: small models built from the engine's ops train, and their loss falls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "scalify/autograd/functions.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/optim/adamw.hpp"
#include "tiny_lm.hpp"

namespace scalify {
namespace {

TEST(Training, TwoLayerMlpFitsATeacher) {
  // Regression onto a fixed random teacher network: learnable exactly by the student's shape.
  const int64_t N = 256, In = 8, H = 32;
  const Tensor x = Tensor::randn({N, In}, 1);
  const Tensor teacher_w = Tensor::randn({In, 4}, 2, 0.7);
  const Tensor y = ops::unary(ops::Unary::tanh, ops::matmul(x, teacher_w));
  Var w1(Tensor::randn({In, H}, 3, 1.0 / std::sqrt(In)), true), b1(Tensor::zeros({H}), true);
  Var w2(Tensor::randn({H, 4}, 4, 1.0 / std::sqrt(H)), true), b2(Tensor::zeros({4}), true);
  optim::AdamW opt({w1, b1, w2, b2}, {.lr = 1e-2});
  auto loss_fn = [&] {
    const Var pred = matmul(gelu(matmul(Var(x), w1) + b1), w2) + b2;
    const Var d = pred - Var(y);
    return mean(d * d);
  };
  const double first = loss_fn().value().item();
  double last = first;
  for (int step = 0; step < 300; ++step) {
    Var loss = loss_fn();
    last = loss.value().item();
    loss.backward();
    opt.step();
  }
  std::printf("mlp: loss %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, 0.05 * first) << "first " << first << " last " << last;
}

TEST(Training, OneBlockCausalTransformerLearnsToCopy) {
  // Sequences [s, s]: the second half repeats the first, so next-token loss in the second half
  // can fall to zero only by attending T/2 positions back.
  const int64_t V = 12, half = 8, T = 2 * half, B = 16, D = 32;
  const nn::Gpt model = testing::tiny_gpt(V, T, D, 13);  // one block, 2 heads, untied head
  const std::vector<Var> params = testing::parameters_of(model);
  optim::AdamW opt(params, {.lr = 3e-3});

  auto batch = [&](uint64_t seed, Tensor& inputs, Tensor& targets) {
    std::vector<int64_t> seq(size_t(B * (T + 1))), in, tg;
    const std::vector<double> r = Tensor::rand({B * half}, seed, 0, double(V)).to_vector();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t <= T; ++t) seq[size_t(b * (T + 1) + t)] = int64_t(r[size_t(b * half + t % half)]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        in.push_back(seq[size_t(b * (T + 1) + t)]);
        tg.push_back(seq[size_t(b * (T + 1) + t + 1)]);
      }
    inputs = Tensor::from_indices(in, {B, T});
    targets = Tensor::from_indices(tg, {B, T});
  };
  auto loss_of = [&](const Tensor& inputs, const Tensor& targets) { return model.loss(inputs, targets); };
  Tensor in, tg;
  batch(1000, in, tg);
  const double first = loss_of(in, tg).value().item();
  EXPECT_NEAR(first, std::log(double(V)), 0.3);  // an untrained model guesses uniformly
  double last = first;
  for (int step = 0; step < 250; ++step) {
    batch(uint64_t(step), in, tg);
    Var loss = loss_of(in, tg);
    loss.backward();
    opt.step();
  }
  batch(2000, in, tg);  // held-out batch
  last = loss_of(in, tg).value().item();
  // Targets 1..7 of each sequence are random (ln 12 each at best); the other 9 are copies. A
  // model that copies perfectly reaches (7/16) ln 12 = 1.09; require it within 0.2.
  std::printf("copy task: loss %.3f -> %.3f\n", first, last);
  EXPECT_LT(last, 7.0 / 16.0 * std::log(double(V)) + 0.2) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace scalify
