#pragma once
// Differentiable operations on Vars. Each is one small function in functions.cpp recording its
// forward (a scaled op) and its backward (a rule of scaled/scaled_grads.hpp on the output gradient).
#include <cstdint>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify {

Var add(const Var& a, const Var& b);
Var sub(const Var& a, const Var& b);
Var mul(const Var& a, const Var& b);
Var div(const Var& a, const Var& b);
Var neg(const Var& x);
Var add_scalar(const Var& x, double c);
Var mul_scalar(const Var& x, double c);
Var pow_scalar(const Var& x, double p);
inline Var operator+(const Var& a, const Var& b) { return add(a, b); }
inline Var operator-(const Var& a, const Var& b) { return sub(a, b); }
inline Var operator*(const Var& a, const Var& b) { return mul(a, b); }
inline Var operator/(const Var& a, const Var& b) { return div(a, b); }
inline Var operator-(const Var& x) { return neg(x); }
inline Var operator*(const Var& x, double c) { return mul_scalar(x, c); }
inline Var operator*(double c, const Var& x) { return mul_scalar(x, c); }
inline Var operator+(const Var& x, double c) { return add_scalar(x, c); }

Var unary(ops::Unary op, const Var& x);
inline Var exp(const Var& x) { return unary(ops::Unary::exp, x); }
inline Var log(const Var& x) { return unary(ops::Unary::log, x); }
inline Var sqrt(const Var& x) { return unary(ops::Unary::sqrt, x); }
inline Var rsqrt(const Var& x) { return unary(ops::Unary::rsqrt, x); }
inline Var abs(const Var& x) { return unary(ops::Unary::abs, x); }
inline Var relu(const Var& x) { return unary(ops::Unary::relu, x); }
inline Var gelu(const Var& x) { return unary(ops::Unary::gelu_tanh, x); }  // GPT-2's tanh form
inline Var gelu_erf(const Var& x) { return unary(ops::Unary::gelu_erf, x); }
inline Var silu(const Var& x) { return unary(ops::Unary::silu, x); }
inline Var sigmoid(const Var& x) { return unary(ops::Unary::sigmoid, x); }
inline Var tanh(const Var& x) { return unary(ops::Unary::tanh, x); }

Var matmul(const Var& a, const Var& b);  // [..., M, K] @ [..., K, N], batch broadcasting

Var sum(const Var& x, const std::vector<int>& dims = {}, bool keepdim = false);
Var mean(const Var& x, const std::vector<int>& dims = {}, bool keepdim = false);
Var max(const Var& x, int dim, bool keepdim = false);

Var softmax(const Var& x, int dim = -1);
Var log_softmax(const Var& x, int dim = -1);
// Normalisation over the last dimension; weight and bias are optional (pass an undefined Var).
Var layer_norm(const Var& x, const Var& weight = {}, const Var& bias = {}, double eps = 1e-5);
Var rms_norm(const Var& x, const Var& weight = {}, double eps = 1e-6);
Var embedding(const Var& weight, const Tensor& ids);
Var cross_entropy(const Var& logits, const Tensor& targets);  // mean over rows

Var where(const Tensor& cond, const Var& a, const Var& b);
// Elementwise maximum / minimum with broadcasting; the gradient goes to the chosen operand (to a on ties).
Var maximum(const Var& a, const Var& b);
Var minimum(const Var& a, const Var& b);
// Sets masked-out entries (mask == 0) of attention scores [..., T, T] to -inf.
Var causal_mask(const Var& scores);
// Fused causal multi-head attention on a packed projection qkv [B, T, 3D] -> [B, T, D]
// (ops::causal_attention): softmax(mask(q k^T / sqrt(D/heads))) v per head, with one backward node.
// Scaled qkv (one scale s): Y_s = s (a convex combination of value rows), gradients keep g's scale.
Var causal_self_attention(const Var& qkv, int64_t heads);
Var dropout(const Var& x, double p, uint64_t seed);

Var reshape(const Var& x, const Shape& shape);
Var permute(const Var& x, const std::vector<int>& dims);
Var transpose(const Var& x, int d0, int d1);
Var slice(const Var& x, int dim, int64_t start, int64_t end);
Var expand(const Var& x, const Shape& shape);
Var concat(const std::vector<Var>& xs, int dim);
std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int dim);

}  // namespace scalify
