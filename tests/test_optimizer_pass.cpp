// The optimizer's all-parameter passes (optim/param_chunks): the global gradient norm and the
// finiteness check before an AdamW step.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "expect_error.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/optim/grad_norm.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify {
namespace {

// Plain f32, a scaled f16 gradient, a small bias, and a parameter without a gradient; the first
// spans several chunks.
std::vector<Var> mixed_params() {
  std::vector<Var> p = {Var(Tensor::randn({300, 70}, 1), true), Var(ScaledTensor(Tensor::randn({40, 30}, 2).to(DType::f16), 0.5f), true),
                        Var(Tensor::randn({7}, 3), true), Var(Tensor::randn({4, 4}, 4), true)};
  p[0].set_grad(ScaledTensor(Tensor::randn({300, 70}, 5, 3.0)));
  p[1].set_grad(ScaledTensor(Tensor::randn({40, 30}, 6).to(DType::f16), std::ldexp(1.0f, -12)));
  p[2].set_grad(ScaledTensor(Tensor::randn({7}, 7)));
  return p;
}

TEST(OptimizerPass, GradientSumSquaresIsThePerParameterSumOnAnyThreadCount) {
  const std::vector<Var> p = mixed_params();
  double expected = 0;  // per parameter, on its represented gradient
  for (const Var& v : p)
    if (v.scaled_grad().data.defined()) expected += ops::sum_squares(v.grad());
  const int threads = omp_get_max_threads();
  const double got = optim::gradient_sum_squares(p);
  omp_set_num_threads(1);
  const double one_thread = optim::gradient_sum_squares(p);
  omp_set_num_threads(threads);
  EXPECT_NEAR(got, expected, 1e-12 * expected);
  EXPECT_EQ(got, one_thread);         // partial sums added in a fixed order
  EXPECT_GT(got, 9.0 * 21000 * 0.9);  // the first gradient's share alone: a test that sees it
}

TEST(OptimizerPass, ANonFiniteGradientMakesTheSumNonFiniteAndStopsAdamWBeforeAnyChange) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<Var> p = mixed_params();
    std::vector<float> g = p[2].grad().to_floats();
    g[6] = bad;
    p[2].set_grad(ScaledTensor(Tensor::from_vector(g, {7})));
    EXPECT_FALSE(std::isfinite(optim::gradient_sum_squares(p)));
    const std::vector<float> before = p[0].value().to_floats();
    optim::AdamW opt(p, {.lr = 1e-2});
    EXPECT_ERROR(opt.step(), "non-finite gradient in parameter 2 of shape [7]");
    EXPECT_EQ(p[0].value().to_floats(), before);  // parameter 0 comes first, and is untouched
    EXPECT_EQ(opt.steps(), 0);
  }
}

}  // namespace
}  // namespace scalify
