// Every differentiable op: its gradient matches central finite differences in f64.
#include "gradcheck.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify {
namespace {

using testing::gradcheck;

Tensor rnd(const Shape& s, uint64_t seed, double std = 1.0) { return Tensor::randn(s, seed, std, DType::f64); }
// Values bounded away from zero (for log, sqrt, abs, relu kinks).
Tensor away_from_zero(const Shape& s, uint64_t seed) {
  std::vector<double> v = Tensor::rand(s, seed, 0.2, 2.0, DType::f64).to_vector();
  for (size_t i = 0; i < v.size(); ++i) v[i] *= (i % 3 == 1) ? -1.0 : 1.0;
  return Tensor::from_vector(v, s);
}
Tensor positive(const Shape& s, uint64_t seed) { return Tensor::rand(s, seed, 0.3, 2.0, DType::f64); }

TEST(GradCheck, ArithmeticWithBroadcasting) {
  const Shape shapes[][2] = {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}};
  for (const auto& s : shapes) {
    gradcheck("add", [](auto& v) { return v[0] + v[1]; }, {rnd(s[0], 1), rnd(s[1], 2)});
    gradcheck("sub", [](auto& v) { return v[0] - v[1]; }, {rnd(s[0], 3), rnd(s[1], 4)});
    gradcheck("mul", [](auto& v) { return v[0] * v[1]; }, {rnd(s[0], 5), rnd(s[1], 6)});
    gradcheck("div", [](auto& v) { return v[0] / v[1]; }, {rnd(s[0], 7), away_from_zero(s[1], 8)});
  }
  gradcheck("neg", [](auto& v) { return -v[0]; }, {rnd({5}, 9)});
  gradcheck("add_scalar", [](auto& v) { return v[0] + 2.5; }, {rnd({5}, 10)});
  gradcheck("mul_scalar", [](auto& v) { return v[0] * -1.5; }, {rnd({5}, 11)});
  gradcheck("pow", [](auto& v) { return pow_scalar(v[0], 2.7); }, {positive({6}, 12)});
  // maximum / minimum: distinct random values, so no tie sits within the finite-difference step.
  gradcheck("maximum", [](auto& v) { return maximum(v[0], v[1]); }, {rnd({4, 5}, 13), rnd({5}, 14)});
  gradcheck("minimum", [](auto& v) { return minimum(v[0], v[1]); }, {rnd({4, 5}, 15), rnd({4, 1}, 16)});
  // Unit-scaled ops with beta = alpha (ExactGradients) give true gradients: the wiring of mult and dim.
  gradcheck("unit silu mult 2",
            [](auto& v) {
              unit::ExactGradients e;
              return unit::silu(v[0], 2.0);
            },
            {rnd({6}, 17)});
  gradcheck("unit gelu_erf mult 0.5",
            [](auto& v) {
              unit::ExactGradients e;
              return unit::gelu_erf(v[0], 0.5);
            },
            {rnd({6}, 18)});
  gradcheck("unit softmax dim 0",
            [](auto& v) {
              unit::ExactGradients e;
              return unit::softmax(v[0], 0, 3.0);
            },
            {rnd({4, 3}, 19)});
}

TEST(GradCheck, UnaryMaps) {
  const Tensor x = rnd({4, 5}, 20), nz = away_from_zero({4, 5}, 21), pos = positive({4, 5}, 22);
  gradcheck("exp", [](auto& v) { return exp(v[0]); }, {x});
  gradcheck("log", [](auto& v) { return log(v[0]); }, {pos});
  gradcheck("sqrt", [](auto& v) { return sqrt(v[0]); }, {pos});
  gradcheck("rsqrt", [](auto& v) { return rsqrt(v[0]); }, {pos});
  gradcheck("abs", [](auto& v) { return abs(v[0]); }, {nz});
  gradcheck("relu", [](auto& v) { return relu(v[0]); }, {nz});
  gradcheck("gelu_tanh", [](auto& v) { return gelu(v[0]); }, {x});
  gradcheck("gelu_erf", [](auto& v) { return gelu_erf(v[0]); }, {x});
  gradcheck("silu", [](auto& v) { return silu(v[0]); }, {x});
  gradcheck("sigmoid", [](auto& v) { return sigmoid(v[0]); }, {x});
  gradcheck("tanh", [](auto& v) { return tanh(v[0]); }, {x});
}

TEST(GradCheck, Matmul) {
  gradcheck("matmul 2d", [](auto& v) { return matmul(v[0], v[1]); }, {rnd({3, 4}, 30), rnd({4, 5}, 31)});
  gradcheck("matmul batched", [](auto& v) { return matmul(v[0], v[1]); }, {rnd({2, 3, 4}, 32), rnd({2, 4, 5}, 33)});
  gradcheck("matmul broadcast rhs", [](auto& v) { return matmul(v[0], v[1]); }, {rnd({2, 3, 4}, 34), rnd({4, 2}, 35)});
  gradcheck("matmul broadcast batch", [](auto& v) { return matmul(v[0], v[1]); }, {rnd({2, 1, 3, 4}, 36), rnd({3, 4, 2}, 37)});
  gradcheck("matmul transposed rhs", [](auto& v) { return matmul(v[0], transpose(v[1], -1, -2)); },
            {rnd({2, 3, 4}, 38), rnd({2, 5, 4}, 39)});
}

TEST(GradCheck, ReductionsOverEachAxis) {
  const Tensor x = rnd({2, 3, 4}, 40);
  for (int d : {0, 1, 2, -1}) {
    gradcheck("sum", [d](auto& v) { return sum(v[0], {d}); }, {x});
    gradcheck("sum keepdim", [d](auto& v) { return sum(v[0], {d}, true); }, {x});
    gradcheck("mean", [d](auto& v) { return mean(v[0], {d}); }, {x});
    gradcheck("max", [d](auto& v) { return max(v[0], d); }, {x});  // random: no ties
  }
  gradcheck("sum all", [](auto& v) { return sum(v[0]); }, {x});
  gradcheck("sum two axes", [](auto& v) { return sum(v[0], {0, 2}); }, {x});
  gradcheck("mean all", [](auto& v) { return mean(v[0]); }, {x});
}

TEST(GradCheck, SoftmaxAndNorms) {
  const Tensor x = rnd({3, 5}, 50, 2.0);
  gradcheck("softmax", [](auto& v) { return softmax(v[0]); }, {x});
  gradcheck("softmax dim 0", [](auto& v) { return softmax(v[0], 0); }, {x});
  gradcheck("log_softmax", [](auto& v) { return log_softmax(v[0]); }, {x});
  gradcheck("layer_norm", [](auto& v) { return layer_norm(v[0]); }, {rnd({3, 6}, 51)});
  gradcheck("layer_norm affine", [](auto& v) { return layer_norm(v[0], v[1], v[2]); }, {rnd({2, 3, 6}, 52), rnd({6}, 53), rnd({6}, 54)});
  gradcheck("rms_norm", [](auto& v) { return rms_norm(v[0]); }, {rnd({3, 6}, 55)});
  gradcheck("rms_norm weight", [](auto& v) { return rms_norm(v[0], v[1]); }, {rnd({3, 6}, 56), rnd({6}, 57)});
}

TEST(GradCheck, EmbeddingCrossEntropyWhereMask) {
  const Tensor ids = Tensor::from_indices({1, 3, 1, 0, 4, 3}, {2, 3});  // repeated ids accumulate
  gradcheck("embedding", [ids](auto& v) { return embedding(v[0], ids); }, {rnd({5, 4}, 60)});
  const Tensor targets = Tensor::from_indices({2, 0, 4, 4}, {4});
  gradcheck("cross_entropy", [targets](auto& v) { return cross_entropy(v[0], targets); }, {rnd({4, 5}, 61, 2.0)});
  const Tensor cond = Tensor::from_vector(std::vector<float>{1, 0, 0, 1, 1, 0}, {2, 3});
  gradcheck("where", [cond](auto& v) { return where(cond, v[0], v[1]); }, {rnd({2, 3}, 62), rnd({3}, 63)});
  gradcheck("causal softmax", [](auto& v) { return softmax(causal_mask(v[0])); }, {rnd({2, 4, 4}, 64)});
  gradcheck("fused causal attention", [](auto& v) { return causal_self_attention(v[0], 2); }, {rnd({2, 5, 12}, 65)});
  gradcheck("dropout", [](auto& v) { return dropout(v[0], 0.3, 7); }, {rnd({4, 6}, 65)});
}

TEST(GradCheck, ShapeOps) {
  const Tensor x = rnd({2, 3, 4}, 70);
  gradcheck("reshape", [](auto& v) { return reshape(v[0], {6, 4}); }, {x});
  gradcheck("permute", [](auto& v) { return permute(v[0], {2, 0, 1}); }, {x});
  gradcheck("transpose", [](auto& v) { return transpose(v[0], 0, 2); }, {x});
  gradcheck("slice", [](auto& v) { return slice(v[0], 2, 1, 3); }, {x});
  gradcheck("expand", [](auto& v) { return expand(v[0], {5, 3, 4}); }, {rnd({3, 1}, 71)});
  gradcheck("concat", [](auto& v) { return concat({v[0], v[1]}, 1); }, {rnd({2, 3}, 72), rnd({2, 2}, 73)});
  gradcheck("split",
            [](auto& v) {
              auto p = split(v[0], {1, 3}, 1);
              return p[1] * p[1] + p[0];
            },
            {rnd({2, 4}, 74)});
}

// A composite: gradient accumulation through a reused value.
TEST(GradCheck, ReusedValuesAccumulate) {
  gradcheck("reuse",
            [](auto& v) {
              Var y = tanh(v[0]);
              return y * y + y;
            },
            {rnd({7}, 80)});
}

}  // namespace
}  // namespace scalify
