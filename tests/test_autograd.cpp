// The autograd tape itself: recording, no_grad, detach, custom functions, accumulation, freeing.
#include <gtest/gtest.h>

#include "expect_error.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"

namespace scalify {
namespace {

Var leaf(std::vector<float> v, bool grad = true) {
  const int64_t n = int64_t(v.size());
  return Var(Tensor::from_vector(v, {n}), grad);
}

TEST(Autograd, RecordsOnlyWhenSomeInputRequiresGrad) {
  const Var a = leaf({1, 2}), c = leaf({3, 4}, false);
  EXPECT_EQ((a * c).op_name(), "mul");
  EXPECT_TRUE((a * c).requires_grad());
  EXPECT_FALSE((c * c).requires_grad());
  EXPECT_EQ((c * c).op_name(), "");
}

TEST(Autograd, NoGradScopeRecordsNothing) {
  const Var a = leaf({1, 2});
  {
    NoGrad ng;
    EXPECT_FALSE(grad_enabled());
    const Var y = exp(a) * a;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.graph_inputs(), 0u);
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(exp(a).requires_grad());
}

TEST(Autograd, DetachStopsTheGradient) {
  const Var a = leaf({2, 3});
  const Var y = sum(a * a.detach());  // d/da = a (not 2a)
  y.backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{2, 3}));
}

TEST(Autograd, CustomFunctionWithItsOwnBackward) {
  // A scaled identity: forward x, backward 4 g (the shape of unit scaling's id*(x, 1, 4)).
  const Var a = leaf({1, -1, 2});
  const Var y =
      Var::make("scaled_identity", a.value(), {a}, [](const Tensor& g) { return std::vector<Tensor>{ops::scale_shift(g, 4.0, 0.0)}; });
  EXPECT_EQ(y.op_name(), "scaled_identity");
  sum(y * 3.0).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{12, 12, 12}));
}

TEST(Autograd, GradientsAccumulateUntilCleared) {
  const Var a = leaf({1, 2});
  sum(a * 2.0).backward();
  sum(a * 3.0).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{5, 5}));
  Var b = a;
  b.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  // Reuse within one graph sums too: d/da (a*a + a) = 2a + 1.
  sum(a * a + a).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{3, 5}));
}

TEST(Autograd, GraphIsFreedAfterBackward) {
  const Var a = leaf({1, 2});
  const Var hidden = exp(a);
  const Var y = sum(hidden * hidden);
  EXPECT_EQ(y.graph_inputs(), 1u);
  EXPECT_EQ(hidden.graph_inputs(), 1u);
  y.backward();
  EXPECT_EQ(y.graph_inputs(), 0u);  // nodes and their captured tensors are released
  EXPECT_EQ(hidden.graph_inputs(), 0u);
  EXPECT_TRUE(a.grad().defined());
}

TEST(Autograd, ClearErrors) {
  const Var a = leaf({1, 2});
  EXPECT_THROW((a * 2.0).backward(), Error);  // not a single element: needs an explicit gradient
  EXPECT_THROW(leaf({1}, false).backward(), Error);
  EXPECT_THROW((a * 2.0).backward(Tensor::ones({3})), Error);
  Var b = a;
  EXPECT_THROW(b.set_value(Tensor::ones({3})), Error);
}

TEST(Autograd, ASecondBackwardThroughAFreedGraphIsAnError) {
  Var a = leaf({1, 2});
  const Var y = sum(a * a);
  y.backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{2, 4}));
  EXPECT_ERROR(y.backward(), "already freed by an earlier backward()");
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{2, 4}));  // untouched
  // A second loss through a shared, already freed intermediate: not a silent partial gradient.
  const Var b = leaf({3, 4});
  const Var h = b * b;
  sum(h).backward();
  EXPECT_ERROR(sum(h * b).backward(), "already freed");
  // A fresh forward pass works as before.
  a.zero_grad();
  sum(a * a).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{2, 4}));
}

}  // namespace
}  // namespace scalify
