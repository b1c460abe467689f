// The engine's backward rules and fused ops (scaled/scaled_grads.hpp) on (data, scale) pairs of
// torch tensors, in scalify._scalify.scaled: what scalify.torch.ScaledTensor's dispatch calls for
// aten's backward ops (gelu_backward, _softmax_backward_data, native_layer_norm_backward,
// embedding_dense_backward, ...), so a torch model's gradients are the engine's, bit for bit.
// Each gradient's data is rounded into the storage of the value it is the gradient of, as the
// engine's backward pass does (autograd/var.cpp); cross-entropy's is kept as computed, as there.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "scalify/autograd/data_precision.hpp"
#include "scalify/error.hpp"
#include "scalify/scaled/scaled_grads.hpp"

namespace scalify::python {
namespace {

using namespace nb::literals;

// An optional pair: None is an undefined ScaledTensor (no such input).
ScaledTensor optional_pair(nb::handle pair, const char* what) { return pair.is_none() ? ScaledTensor() : scaled_pair(pair, what); }

// The storage an op's output takes from its inputs (single elements are weak scalars, as the
// engine's Var has them); f32 when none counts.
DType output_storage(const std::vector<const ScaledTensor*>& inputs) {
  std::vector<DType> in;
  for (const ScaledTensor* x : inputs)
    if (x->data.defined() && x->data.numel() != 1) in.push_back(x->data.dtype());
  return in.empty() ? DType::f32 : promoted_storage(in);
}

// An output pair rounded into `storage`.
nb::tuple stored_pair(ScaledTensor y, DType storage, const std::string& what) {
  y.data = to_storage(y.data, storage, what);
  return pair_of(y);
}

// A gradient rounded into the storage of the value it is the gradient of (low-precision
// storages of two or more bytes, as the engine's backward; FP8 codes are cast by the recipe).
nb::tuple grad_pair(ScaledTensor g, DType storage, const std::string& op) {
  if (dtype_size(storage) >= 2) g.data = to_storage(g.data, storage, op + " grad");
  return pair_of(g);
}

Tensor int64_ids(nb::handle ids, const char* what) {
  const Tensor t = borrowed_tensor(ids, what);
  if (t.dtype() != DType::i64) throw nb::type_error((std::string(what) + ": needs an int64 tensor").c_str());
  return t;
}

// A condition as 0/1 f32: torch's bool masks read byte by byte, numbers as they are.
Tensor condition(nb::handle cond, const char* what) {
  AnyArray a;
  if (nb::try_cast(cond, a, false) && a.dtype().code == uint8_t(nb::dlpack::dtype_code::Bool)) {
    const auto* bytes = static_cast<const uint8_t*>(a.data());
    std::vector<float> v(a.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = bytes[i] ? 1.0f : 0.0f;
    return Tensor::from_vector(v, shape_from(shape_of(a)));
  }
  return borrowed_tensor(cond, what).to(DType::f32);
}

// The normalisation's state from x: the fused kernel (with its affine) or the plain one, as the
// engine's layer_norm / rms_norm choose; the affine needs x, weight and bias all unscaled or all
// with one normal scale, the only case the engine fuses (other scales compose its ops).
scaled::Norm normalised(const ScaledTensor& x, const ScaledTensor& w, const ScaledTensor& b, double eps, bool center, DType store_as) {
  const char* op = center ? "layer_norm" : "rms_norm";
  if (x.data.dim() < 1) throw Error(std::string(op) + ": x needs at least one dimension");
  if (!w.data.defined()) {
    if (b.data.defined()) throw Error(std::string(op) + ": a bias without a weight is not fused (compose norm and add)");
    return scaled::norm(x, eps, center);
  }
  if (!scaled::fuses_norm_affine(x, w, b))
    throw Error(std::string(op) +
                ": the fused affine needs x, weight and bias all unscaled or all with one normal scale (the engine composes the ops "
                "otherwise)");
  return scaled::norm_affine(x, w, b, eps, center, store_as);
}

}  // namespace

#define PAIR "tuple[typing.Any, float | None]"

void bind_scaled_grads(nb::module_& m) {
  m.def(
      "matmul_backward",
      [](nb::handle xp, nb::handle wp, nb::handle gp) {
        const ScaledTensor x = scaled_pair(xp, "matmul_backward x"), w = scaled_pair(wp, "matmul_backward w");
        const ScaledTensor g = scaled_pair(gp, "matmul_backward grad");
        if (x.data.dim() < 2 || w.data.dim() < 2 || g.data.dim() < 2)
          throw nb::value_error("matmul_backward: x, w and grad need two dimensions or more");
        const std::vector<ScaledTensor> d = scaled::matmul_backward(x, w, g);
        return nb::make_tuple(grad_pair(d[0], x.data.dtype(), "matmul"), grad_pair(d[1], w.data.dtype(), "matmul"));
      },
      "x"_a, "w"_a, "grad"_a, nb::sig("def matmul_backward(x: " PAIR ", w: " PAIR ", grad: " PAIR ") -> tuple[" PAIR ", " PAIR "]"),
      "The gradients (dx, dw) of x @ w for the output's gradient grad, each in its operand's storage: g w^T and x^T g as scaled "
      "matmuls, summed over broadcast batch dimensions (a 2-D w shared by every row of a batched x: one GEMM over all rows).");
  m.def(
      "where_backward",
      [](nb::handle cond, nb::handle gp, const std::vector<int64_t>& x_shape, const std::vector<int64_t>& y_shape,
         std::optional<std::string> x_dtype, std::optional<std::string> y_dtype) {
        const ScaledTensor g = scaled_pair(gp, "where_backward grad");
        const Tensor c = condition(cond, "where_backward condition");
        const std::vector<ScaledTensor> d = scaled::where_backward(c, g, Shape(x_shape), Shape(y_shape));
        return nb::make_tuple(grad_pair(d[0], x_dtype ? parse_dtype(*x_dtype) : g.data.dtype(), "where"),
                              grad_pair(d[1], y_dtype ? parse_dtype(*y_dtype) : g.data.dtype(), "where"));
      },
      "cond"_a, "grad"_a, "x_shape"_a, "y_shape"_a, "x_dtype"_a = nb::none(), "y_dtype"_a = nb::none(),
      nb::sig("def where_backward(cond: typing.Any, grad: " PAIR ", x_shape: list[int], y_shape: list[int], x_dtype: str | None = None, "
              "y_dtype: str | None = None) -> tuple[" PAIR ", " PAIR "]"),
      "The gradients of where(cond, x, y) (cond bool or numbers, nonzero true): grad where cond else zeros (ANY-scaled: grad's scale "
      "kept), and the converse, summed "
      "back to x_shape and y_shape, in x's and y's storage dtypes ('f32', 'f16', 'bf16', ...; default grad's).");
  m.def(
      "slice_backward",
      [](nb::handle gp, const std::vector<int64_t>& shape, int dim, int64_t start, int64_t end, std::optional<std::string> dtype) {
        const ScaledTensor g = scaled_pair(gp, "slice_backward grad");
        const int64_t d = dim_index(dim, shape.size());
        Shape part = Shape(shape);
        if (start < 0 || end < start || end > part[size_t(d)]) throw nb::value_error("slice_backward: start and end outside the dimension");
        part[size_t(d)] = end - start;
        if (g.shape() != part) throw nb::value_error("slice_backward: grad does not have the slice's shape");
        return grad_pair(scaled::slice_backward(g, Shape(shape), int(d), start, end), dtype ? parse_dtype(*dtype) : g.data.dtype(),
                         "slice");
      },
      "grad"_a, "shape"_a, "dim"_a, "start"_a, "end"_a, "dtype"_a = nb::none(),
      nb::sig("def slice_backward(grad: " PAIR ", shape: list[int], dim: int, start: int, end: int, dtype: str | None = None) -> " PAIR),
      "The gradient of x[start:end] along dim (step 1) for an x of `shape`: grad in place, zeros elsewhere, grad's scale kept, in "
      "x's storage dtype (default grad's): aten's slice_backward.");
  m.def(
      "max_backward",
      [](nb::handle gp, const std::vector<int64_t>& shape, int dim, nb::handle index, std::optional<std::string> dtype) {
        const ScaledTensor g = scaled_pair(gp, "max_backward grad");
        const int64_t d = dim_index(dim, shape.size());
        Shape kept = Shape(shape);
        kept[size_t(d)] = 1;
        const Tensor idx = int64_ids(index, "max_backward index");
        if (idx.numel() != numel_of(kept) || g.data.numel() != numel_of(kept))
          throw nb::value_error("max_backward: grad and index need one element per row of dim");
        return grad_pair(scaled::max_backward(g, Shape(shape), int(d), idx.reshape(kept)), dtype ? parse_dtype(*dtype) : g.data.dtype(),
                         "max");
      },
      "grad"_a, "shape"_a, "dim"_a, "index"_a, "dtype"_a = nb::none(),
      nb::sig("def max_backward(grad: " PAIR ", shape: list[int], dim: int, index: typing.Any, dtype: str | None = None) -> " PAIR),
      "The gradient of max over dim of an x of `shape` with the forward's int64 index of each maximum (keepdim or not): grad at the "
      "maximum, zeros elsewhere, grad's scale kept, in x's storage dtype (default grad's): aten's value_selecting_reduction_backward.");
  m.def(
      "unary_backward",
      [](const std::string& op, nb::handle xp, nb::handle yp, nb::handle gp) {
        const ScaledTensor x = optional_pair(xp, "unary_backward x"), y = optional_pair(yp, "unary_backward y");
        const ScaledTensor g = scaled_pair(gp, "unary_backward grad");
        const ScaledTensor& like = x.data.defined() ? x : y;
        if (!like.data.defined()) throw nb::value_error("unary_backward: needs x or y");
        if (g.shape() != like.shape() || (x.data.defined() && y.data.defined() && x.shape() != y.shape()))
          throw nb::value_error("unary_backward: grad, x and y must have one shape");
        return grad_pair(scaled::unary_backward(ops::parse_unary(op), x, y, g, kernel_store_as(like.data.dtype())), like.data.dtype(), op);
      },
      "op"_a, "x"_a.none(), "y"_a.none(), "grad"_a,
      nb::sig("def unary_backward(op: str, x: " PAIR " | None, y: " PAIR " | None, grad: " PAIR ") -> " PAIR),
      "The gradient of y = unary(op, x) for the output's gradient grad, in x's storage. op: neg, exp, log, sqrt, rsqrt, abs, relu, "
      "gelu_tanh, gelu_erf, silu, sigmoid, tanh or square. y is needed by exp, sqrt, rsqrt, sigmoid and tanh (x may then be None); "
      "the others need x (relu's gradient from y as x is the same).");
  m.def(
      "pow_backward",
      [](nb::handle xp, double p, nb::handle gp) {
        const ScaledTensor x = scaled_pair(xp, "pow_backward x"), g = scaled_pair(gp, "pow_backward grad");
        if (g.shape() != x.shape()) throw nb::value_error("pow_backward: grad and x differ in shape");
        return grad_pair(scaled::pow_backward(x, p, g), x.data.dtype(), "pow");
      },
      "x"_a, "p"_a, "grad"_a, nb::sig("def pow_backward(x: " PAIR ", p: float, grad: " PAIR ") -> " PAIR),
      "The gradient of x ** p: p x^(p-1) grad, in x's storage.");
  m.def(
      "softmax_backward",
      [](nb::handle yp, nb::handle gp, int dim, bool log) {
        const ScaledTensor y = scaled_pair(yp, "softmax_backward y"), g = scaled_pair(gp, "softmax_backward grad");
        if (g.shape() != y.shape()) throw nb::value_error("softmax_backward: grad and y differ in shape");
        const ScaledTensor dx = log ? scaled::log_softmax_backward(y, g, dim) : scaled::softmax_backward(y, g, dim);
        return grad_pair(dx, y.data.dtype(), log ? "log_softmax" : "softmax");  // y is stored as x is
      },
      "y"_a, "grad"_a, "dim"_a, "log"_a = false,
      nb::sig("def softmax_backward(y: " PAIR ", grad: " PAIR ", dim: int, log: bool = False) -> " PAIR),
      "The gradient of softmax (log_softmax when log) along dim from its output y, in y's storage: aten's _softmax_backward_data "
      "and _log_softmax_backward_data.");
  m.def(
      "fused_norm",
      [](nb::handle xp, nb::handle wp, nb::handle bp, double eps, bool center) {
        const ScaledTensor x = scaled_pair(xp, "fused_norm x"), w = optional_pair(wp, "fused_norm weight"),
                           b = optional_pair(bp, "fused_norm bias");
        const DType storage = output_storage({&x, &w, &b});
        scaled::Norm n = normalised(x, w, b, eps, center, kernel_store_as(storage));
        // aten's statistics, of the represented values: mean = mean(X_d) X_s, rstd = rstd(X_d) / X_s.
        const double s = n.saved.x_scale;
        nb::object mean = nb::none();
        if (center) mean = torch_tensor(ops::scale_shift(ops::mean(x.data, {-1}, true), s, 0.0));
        nb::object rstd = torch_tensor(ops::scale_shift(n.saved.rstd, 1.0 / s, 0.0));
        return nb::make_tuple(stored_pair(std::move(n.y), storage, center ? "layer_norm" : "rms_norm"), mean, rstd);
      },
      "x"_a, "weight"_a.none(), "bias"_a.none(), "eps"_a, "center"_a = true,
      nb::sig("def fused_norm(x: " PAIR ", weight: " PAIR " | None, bias: " PAIR " | None, eps: float, center: bool = True) -> tuple[" PAIR
              ", typing.Any | None, typing.Any]"),
      "layer_norm (center) or rms_norm over the last dimension with its affine fused as the engine fuses it (weight None: no affine; "
      "x, weight and bias all unscaled or all scaled), the output in the storage the inputs promote to: aten's native_layer_norm. "
      "Returns (y, mean, rstd): the statistics of the represented x per row, shaped [..., 1] (mean None for rms_norm).");
  m.def(
      "fused_norm_backward",
      [](nb::handle gp, nb::handle xp, nb::handle wp, nb::handle bp, double eps, bool center) {
        const ScaledTensor g = scaled_pair(gp, "fused_norm_backward grad"), x = scaled_pair(xp, "fused_norm_backward x");
        const ScaledTensor w = optional_pair(wp, "fused_norm_backward weight"), b = optional_pair(bp, "fused_norm_backward bias");
        if (g.shape() != x.shape()) throw nb::value_error("fused_norm_backward: grad and x differ in shape");
        const char* op = center ? "layer_norm" : "rms_norm";
        // The forward's xhat and rstd, recomputed from x: the same kernel on the same data, so the
        // same bits the engine's forward keeps for its backward.
        const scaled::Norm n = normalised(x, w, b, eps, center, DType::f32);
        if (!w.data.defined())
          return nb::make_tuple(grad_pair(scaled::norm_backward(n.saved, g), x.data.dtype(), op), nb::none(), nb::none());
        const std::vector<ScaledTensor> d =
            scaled::norm_affine_backward(n.saved, g, w, b.data.defined(), kernel_store_as(n.saved.x_storage));
        return nb::make_tuple(grad_pair(d[0], x.data.dtype(), op), grad_pair(d[1], w.data.dtype(), op),
                              b.data.defined() ? nb::object(grad_pair(d[2], b.data.dtype(), op)) : nb::none());
      },
      "grad"_a, "x"_a, "weight"_a.none(), "bias"_a.none(), "eps"_a, "center"_a = true,
      nb::sig("def fused_norm_backward(grad: " PAIR ", x: " PAIR ", weight: " PAIR " | None, bias: " PAIR
              " | None, eps: float, center: bool = True) -> tuple[" PAIR ", " PAIR " | None, " PAIR " | None]"),
      "The gradients (dx, dweight, dbias) of fused_norm(x, weight, bias, eps, center) for the output's gradient grad, each in its value's "
      "storage (None for an absent weight or bias): aten's native_layer_norm_backward. The forward's state is recomputed from x and "
      "eps, bit for bit what the engine keeps.");
  m.def(
      "embedding_backward",
      [](nb::handle gp, nb::handle ids, int64_t num_weights, std::optional<std::string> dtype) {
        const ScaledTensor g = scaled_pair(gp, "embedding_backward grad");
        if (num_weights < 1) throw nb::value_error("embedding_backward: num_weights must be positive");
        const DType storage = dtype ? parse_dtype(*dtype) : g.data.dtype();
        return grad_pair(scaled::embedding_backward(g, int64_ids(ids, "embedding_backward ids"), num_weights), storage, "embedding");
      },
      "grad"_a, "ids"_a, "num_weights"_a, "dtype"_a = nb::none(),
      nb::sig("def embedding_backward(grad: " PAIR ", ids: typing.Any, num_weights: int, dtype: str | None = None) -> " PAIR),
      "The weight's gradient [num_weights, D] of embedding(weight, ids): grad's rows scatter-added, grad's scale kept, in the "
      "weight's storage dtype ('f32', 'f16', 'bf16', ...; default grad's): aten's embedding_dense_backward.");
  m.def(
      "cross_entropy_backward",
      [](nb::handle lp, nb::handle targets, nb::handle gp) {
        const ScaledTensor logits = scaled_pair(lp, "cross_entropy_backward logits"), g = scaled_pair(gp, "cross_entropy_backward grad");
        if (logits.data.dim() != 2) throw nb::value_error("cross_entropy_backward: logits must be [rows, classes]");
        if (g.data.numel() != 1) throw nb::value_error("cross_entropy_backward: grad must be the loss's gradient, one value");
        // As computed: the engine keeps the loss and its gradient out of the storage rounding.
        return pair_of(scaled::cross_entropy_backward(logits, int64_ids(targets, "cross_entropy_backward targets"), g));
      },
      "logits"_a, "targets"_a, "grad"_a,
      nb::sig("def cross_entropy_backward(logits: " PAIR ", targets: typing.Any, grad: " PAIR ") -> " PAIR),
      "The logits' gradient of the mean cross-entropy against int64 targets for the loss's gradient grad: (softmax - onehot) "
      "grad / rows, that factor as a power-of-two scale.");
  m.def(
      "causal_attention",
      [](nb::handle qp, int64_t heads) {
        const ScaledTensor qkv = scaled_pair(qp, "causal_attention qkv");
        scaled::Attention a = scaled::causal_attention(qkv, heads);
        return nb::make_tuple(stored_pair(std::move(a.y), output_storage({&qkv}), "causal_attention"), torch_tensor(a.probs));
      },
      "qkv"_a, "heads"_a, nb::sig("def causal_attention(qkv: " PAIR ", heads: int) -> tuple[" PAIR ", typing.Any]"),
      "Fused causal multi-head self-attention on packed qkv [B, T, 3D] (one scale or none) -> (y [B, T, D] in qkv's storage, the "
      "probabilities [B, heads, T, T] its backward needs).");
  m.def(
      "causal_attention_backward",
      [](nb::handle qp, nb::handle probs, nb::handle gp, int64_t heads) {
        const ScaledTensor qkv = scaled_pair(qp, "causal_attention_backward qkv"), g = scaled_pair(gp, "causal_attention_backward grad");
        const Tensor p = borrowed_tensor(probs, "causal_attention_backward probs");
        return grad_pair(scaled::causal_attention_backward(qkv, p, g, heads), qkv.data.dtype(), "causal_attention");
      },
      "qkv"_a, "probs"_a, "grad"_a, "heads"_a,
      nb::sig("def causal_attention_backward(qkv: " PAIR ", probs: typing.Any, grad: " PAIR ", heads: int) -> " PAIR),
      "The gradient of causal_attention(qkv, heads) for y's gradient grad, in qkv's storage; probs from the forward.");
}

#undef PAIR

}  // namespace scalify::python
