// Forward and backward of every differentiable op, one small function each.
#include "scalify/autograd/functions.hpp"

#include <cmath>
#include <limits>
#include <numeric>

#include "scalify/error.hpp"

namespace scalify {

using ops::sum_to;

Var add(const Var& a, const Var& b) {
  return Var::make("add", ops::add(a.value(), b.value()), {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
  });
}

Var sub(const Var& a, const Var& b) {
  return Var::make("sub", ops::sub(a.value(), b.value()), {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(ops::scale_shift(g, -1, 0), sb)};
  });
}

Var mul(const Var& a, const Var& b) {
  return Var::make("mul", ops::mul(a.value(), b.value()), {a, b}, [x = a.value(), y = b.value()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(ops::mul(g, y), x.shape()), sum_to(ops::mul(g, x), y.shape())};
  });
}

Var div(const Var& a, const Var& b) {
  Tensor out = ops::div(a.value(), b.value());
  return Var::make("div", out, {a, b}, [out, y = b.value(), sa = a.shape()](const Tensor& g) {
    const Tensor ga = ops::div(g, y);  // d(a/b)/da = 1/b, d(a/b)/db = -out/b
    return std::vector<Tensor>{sum_to(ga, sa), sum_to(ops::scale_shift(ops::mul(ga, out), -1, 0), y.shape())};
  });
}

Var neg(const Var& x) { return mul_scalar(x, -1.0); }

Var add_scalar(const Var& x, double c) {
  return Var::make("add_scalar", ops::scale_shift(x.value(), 1, c), {x}, [](const Tensor& g) {
    return std::vector<Tensor>{g};
  });
}

Var mul_scalar(const Var& x, double c) {
  return Var::make("mul_scalar", ops::scale_shift(x.value(), c, 0), {x}, [c](const Tensor& g) {
    return std::vector<Tensor>{ops::scale_shift(g, c, 0)};
  });
}

Var pow_scalar(const Var& x, double p) {
  return Var::make("pow", ops::pow_scalar(x.value(), p), {x}, [x = x.value(), p](const Tensor& g) {
    return std::vector<Tensor>{ops::mul(g, ops::scale_shift(ops::pow_scalar(x, p - 1), p, 0))};
  });
}

Var unary(ops::Unary op, const Var& x) {
  Tensor y = ops::unary(op, x.value());
  return Var::make(ops::unary_name(op), y, {x}, [op, x = x.value(), y](const Tensor& g) {
    return std::vector<Tensor>{ops::unary_backward(op, x, y, g)};
  });
}

Var matmul(const Var& a, const Var& b) {
  return Var::make("matmul", ops::matmul(a.value(), b.value()), {a, b}, [x = a.value(), w = b.value()](const Tensor& g) {
    // dA = G B^T, dB = A^T G (transposed views go to the GEMM without copies), summed over
    // broadcast batch dimensions.
    return std::vector<Tensor>{sum_to(ops::matmul(g, w.transpose(-1, -2)), x.shape()),
                               sum_to(ops::matmul(x.transpose(-1, -2), g), w.shape())};
  });
}

Var sum(const Var& x, const std::vector<int>& dims, bool keepdim) {
  Tensor out = ops::sum(x.value(), dims, keepdim);
  return Var::make("sum", out, {x}, [shape = x.shape(), dims, keepdim](const Tensor& g) {
    Tensor gk = g;
    if (!keepdim) {  // put the reduced dimensions back as size 1, then broadcast
      Shape kept = shape;
      std::vector<int> d = dims;
      if (d.empty()) d.resize(shape.size()), std::iota(d.begin(), d.end(), 0);
      for (int i : d) kept[size_t(i < 0 ? i + int(shape.size()) : i)] = 1;
      gk = g.reshape(kept);
    }
    return std::vector<Tensor>{gk.expand(shape).contiguous()};
  });
}

Var mean(const Var& x, const std::vector<int>& dims, bool keepdim) {
  const Tensor s = ops::sum(x.value(), dims, true);
  const double n = double(x.value().numel()) / double(std::max<int64_t>(s.numel(), 1));
  return mul_scalar(sum(x, dims, keepdim), 1.0 / n);
}

Var max(const Var& x, int dim, bool keepdim) {
  auto [values, index] = ops::max(x.value(), dim, true);
  Tensor out = keepdim ? values : values.squeeze(dim);
  return Var::make("max", out, {x}, [shape = x.shape(), dim, index](const Tensor& g) {
    // The gradient goes to the (first) maximum of each row.
    const int d = dim < 0 ? dim + int(shape.size()) : dim;
    const Tensor gk = g.reshape(index.shape());
    std::vector<float> pos(static_cast<size_t>(numel_of(shape)));
    // Position of each element along `dim`, compared with the argmax.
    const Shape strides = contiguous_strides(shape);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = float((int64_t(i) / strides[size_t(d)]) % shape[size_t(d)]);
    const Tensor hit = ops::sub(Tensor::from_vector(pos, shape), index.to(DType::f32));
    const Tensor is_max = ops::where(hit, Tensor::scalar(0.0), Tensor::scalar(1.0));
    return std::vector<Tensor>{ops::mul(is_max, gk)};
  });
}

Var softmax(const Var& x, int dim) {
  Tensor y = ops::softmax(x.value(), dim);
  return Var::make("softmax", y, {x}, [y, dim](const Tensor& g) {
    return std::vector<Tensor>{ops::softmax_backward(y, g, dim)};
  });
}

Var log_softmax(const Var& x, int dim) {
  Tensor y = ops::log_softmax(x.value(), dim);
  return Var::make("log_softmax", y, {x}, [y, dim](const Tensor& g) {
    return std::vector<Tensor>{ops::log_softmax_backward(y, g, dim)};
  });
}

namespace {
// y = xhat * weight + bias over the last dimension, as ops so the affine part differentiates itself.
Var affine(Var xhat, const Var& weight, const Var& bias) {
  if (weight.defined()) xhat = mul(xhat, weight);
  if (bias.defined()) xhat = add(xhat, bias);
  return xhat;
}
void check_affine(const char* op, const Var& x, const Var& p) {
  if (p.defined() && (p.value().dim() != 1 || p.value().size(0) != x.value().size(-1)))
    throw Error(std::string(op) + ": parameter of shape " + shape_str(p.shape()) + " does not match the last dimension of " +
                shape_str(x.shape()));
}
}  // namespace

Var layer_norm(const Var& x, const Var& weight, const Var& bias, double eps) {
  check_affine("layer_norm", x, weight);
  check_affine("layer_norm", x, bias);
  ops::NormResult r = ops::layer_norm(x.value(), eps);
  Var xhat = Var::make("layer_norm", r.y, {x}, [r](const Tensor& g) {
    return std::vector<Tensor>{ops::layer_norm_backward(r, g)};
  });
  return affine(xhat, weight, bias);
}

Var rms_norm(const Var& x, const Var& weight, double eps) {
  check_affine("rms_norm", x, weight);
  ops::NormResult r = ops::rms_norm(x.value(), eps);
  Var xhat = Var::make("rms_norm", r.y, {x}, [r](const Tensor& g) {
    return std::vector<Tensor>{ops::rms_norm_backward(r, g)};
  });
  return affine(xhat, weight, {});
}

Var embedding(const Var& weight, const Tensor& ids) {
  return Var::make("embedding", ops::embedding(weight.value(), ids), {weight}, [ids, v = weight.value().size(0)](const Tensor& g) {
    return std::vector<Tensor>{ops::embedding_backward(g, ids, v)};
  });
}

Var cross_entropy(const Var& logits, const Tensor& targets) {
  return Var::make("cross_entropy", ops::cross_entropy(logits.value(), targets), {logits},
                   [l = logits.value(), targets](const Tensor& g) {
                     return std::vector<Tensor>{ops::cross_entropy_backward(l, targets, g.item())};
                   });
}

Var where(const Tensor& cond, const Var& a, const Var& b) {
  return Var::make("where", ops::where(cond, a.value(), b.value()), {a, b}, [cond, sa = a.shape(), sb = b.shape()](const Tensor& g) {
    const Tensor zero = Tensor::scalar(0.0, g.dtype());
    return std::vector<Tensor>{sum_to(ops::where(cond, g, zero), sa), sum_to(ops::where(cond, zero, g), sb)};
  });
}

Var causal_mask(const Var& scores) {
  const int64_t T = scores.value().size(-1);
  if (scores.value().dim() < 2 || scores.value().size(-2) != T)
    throw Error("causal_mask: scores must be [..., T, T], got " + shape_str(scores.shape()));
  const Tensor minus_inf = Tensor::scalar(-std::numeric_limits<double>::infinity(), scores.value().dtype() == DType::f64 ? DType::f64 : DType::f32);
  return where(ops::causal_mask(T), scores, Var(minus_inf));
}

Var dropout(const Var& x, double p, uint64_t seed) {
  if (p == 0.0) return x;
  const Tensor mask = ops::dropout_mask(x.shape(), p, seed, x.value().dtype() == DType::f64 ? DType::f64 : DType::f32);
  return Var::make("dropout", ops::mul(x.value(), mask), {x}, [mask](const Tensor& g) {
    return std::vector<Tensor>{ops::mul(g, mask)};
  });
}

Var reshape(const Var& x, const Shape& shape) {
  return Var::make("reshape", x.value().reshape(shape), {x}, [s = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(s)};
  });
}

Var permute(const Var& x, const std::vector<int>& dims) {
  std::vector<int> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[size_t(dims[i] < 0 ? dims[i] + int(dims.size()) : dims[i])] = int(i);
  return Var::make("permute", x.value().permute(dims), {x}, [inverse](const Tensor& g) {
    return std::vector<Tensor>{g.permute(inverse)};
  });
}

Var transpose(const Var& x, int d0, int d1) {
  return Var::make("transpose", x.value().transpose(d0, d1), {x}, [d0, d1](const Tensor& g) {
    return std::vector<Tensor>{g.transpose(d0, d1)};
  });
}

Var slice(const Var& x, int dim, int64_t start, int64_t end) {
  return Var::make("slice", x.value().slice(dim, start, end), {x}, [s = x.shape(), dim, start, end](const Tensor& g) {
    Tensor full = Tensor::zeros(s, g.dtype() == DType::f64 ? DType::f64 : DType::f32);
    Tensor part = full.slice(dim, start, end);
    part.copy_(g);
    return std::vector<Tensor>{full};
  });
}

Var expand(const Var& x, const Shape& shape) {
  return Var::make("expand", x.value().expand(shape), {x}, [s = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, s)};
  });
}

Var concat(const std::vector<Var>& xs, int dim) {
  std::vector<Tensor> values;
  std::vector<int64_t> sizes;
  for (const Var& x : xs) {
    values.push_back(x.value());
    sizes.push_back(x.value().size(dim));
  }
  return Var::make("concat", ops::concat(values, dim), xs, [sizes, dim](const Tensor& g) {
    return ops::split(g, sizes, dim);
  });
}

std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int dim) {
  std::vector<Var> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, dim, at, at + s));
    at += s;
  }
  if (at != x.value().size(dim))
    throw Error("split: sizes sum to " + std::to_string(at) + ", dimension " + std::to_string(dim) + " of " +
                shape_str(x.shape()) + " has " + std::to_string(x.value().size(dim)));
  return out;
}

}  // namespace scalify
