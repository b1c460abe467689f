// scalify._scalify.scaled: the engine's scaled ops (scaled/scaled_ops.hpp) on (data, scale) pairs
// of torch tensors, for scalify.torch.ScaledTensor. Each torch op on scaled tensors calls the op
// the engine's own graph calls, so a scale rule has one home and a torch model computes what the
// engine computes, bit for bit. The output data is rounded into the storage its inputs promote to
// (autograd/data_precision.hpp), as the engine's Var does.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "scalify/autograd/data_precision.hpp"
#include "scalify/error.hpp"
#include "scalify/scaled/scaled_ops.hpp"

namespace scalify::python {
namespace {

using namespace nb::literals;
using TorchArray = nb::ndarray<nb::pytorch, nb::device::cpu>;
// DLPack 1.1's codes of torch's float8_e4m3fn and float8_e5m2 (nanobind names none of them).
constexpr uint8_t kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12;

DType dtype_of(const AnyArray& a, const char* what) {
  const nb::dlpack::dtype d = a.dtype();
  if (d == nb::dtype<float>()) return DType::f32;
  if (d == nb::dtype<double>()) return DType::f64;
  if (d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 16) return DType::f16;
  if (d.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && d.bits == 16) return DType::bf16;
  if (d == nb::dtype<int64_t>()) return DType::i64;
  if (d.code == kDLFloat8_e4m3fn && d.bits == 8) return DType::e4m3;
  if (d.code == kDLFloat8_e5m2 && d.bits == 8) return DType::e5m2;
  throw nb::type_error((std::string(what) + ": data must be float16, bfloat16, float32, float64, float8_e4m3fn or float8_e5m2").c_str());
}

nb::dlpack::dtype dlpack_of(DType t) {
  switch (t) {
    case DType::f32: return nb::dtype<float>();
    case DType::f64: return nb::dtype<double>();
    case DType::f16: return {uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::bf16: return {uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::i64: return nb::dtype<int64_t>();
    case DType::e4m3: return {kDLFloat8_e4m3fn, 8, 1};
    case DType::e5m2: return {kDLFloat8_e5m2, 8, 1};
    default: throw Error("scaled: no torch dtype holds " + std::string(dtype_name(t)) + " data");
  }
}

}  // namespace

Tensor borrowed_tensor(nb::handle data, const char* what) {
  AnyArray a;
  if (!nb::try_cast(data, a, false)) {
    if (!nb::try_cast(data, a, true))
      throw nb::type_error(
          (std::string(what) + ": needs a CPU tensor, got " + nb::cast<std::string>(nb::str(data.type().attr("__name__")))).c_str());
  }
  const DType dtype = dtype_of(a, what);
  auto* held = new AnyArray(a);
  std::shared_ptr<const void> owner(held->data(), [held](const void*) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than touch it
    nb::gil_scoped_acquire gil;
    delete held;
  });
  return Tensor::borrow(a.data(), shape_from(shape_of(a)), dtype, std::move(owner));
}

ScaledTensor scaled_pair(nb::handle pair, const char* what) {
  if (!PyTuple_Check(pair.ptr()) || PyTuple_Size(pair.ptr()) != 2)
    throw nb::type_error((std::string(what) + ": needs a (data, scale) pair").c_str());
  const nb::tuple t = nb::borrow<nb::tuple>(pair);
  const Tensor data = borrowed_tensor(t[0], what);
  if (t[1].is_none()) return ScaledTensor(data);
  const double s = number_value(t[1]);
  if (s == 0.0) return any_scale_constant(data);
  int exponent = 0;
  if (!(s >= 0x1p-126 && s <= 0x1p127) || std::frexp(s, &exponent) != 0.5)
    throw nb::value_error(
        (std::string(what) + ": a scale is a power of two in [2^-126, 2^127] (or 0.0 for ANY), not " + std::to_string(s)).c_str());
  return ScaledTensor(data, float(s));
}

nb::object torch_tensor(const Tensor& t) {
  const Tensor c = t.is_contiguous() ? t : t.contiguous();
  auto* held = new Tensor(c);
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const std::vector<size_t> shape = shape_to(c.shape());
  return nb::cast(TorchArray(held->raw_bytes(), shape.size(), shape.data(), owner, nullptr, dlpack_of(c.dtype())));
}

nb::tuple pair_of(const ScaledTensor& x) {
  if (x.any_scale) return nb::make_tuple(torch_tensor(x.data), 0.0);
  if (!x.is_scaled()) return nb::make_tuple(torch_tensor(x.data), nb::none());
  return nb::make_tuple(torch_tensor(x.data), double(x.scalar_scale()));
}

namespace {

// The output of `op` on `inputs`, its data rounded into the storage they promote to (single
// elements are weak scalars, as the engine's Var has them).
nb::tuple finished(ScaledTensor y, const std::vector<const ScaledTensor*>& inputs, const std::string& op) {
  std::vector<DType> in;
  for (const ScaledTensor* x : inputs)
    if (x->data.numel() != 1 && x->data.dtype() != DType::i64) in.push_back(x->data.dtype());
  if (!in.empty()) y.data = to_storage(y.data, promoted_storage(in), op);
  return pair_of(y);
}

}  // namespace

#define PAIR "tuple[typing.Any, float | None]"

void bind_scaled_pairs(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "scaled", "The engine's scale rules on (data, scale) pairs of torch tensors (scale: a power of two, None unscaled, 0.0 ANY)");
  m.def(
      "binary",
      [](const std::string& op, nb::handle xp, nb::handle yp) {
        const ScaledTensor x = scaled_pair(xp, op.c_str()), y = scaled_pair(yp, op.c_str());
        ScaledTensor z;
        if (op == "add")
          z = scaled::add(x, y);
        else if (op == "sub")
          z = scaled::sub(x, y);
        else if (op == "mul")
          z = scaled::mul(x, y);
        else if (op == "div")
          z = scaled::div(x, y);
        else if (op == "matmul")
          z = scaled::matmul(x, y);
        else if (op == "maximum")
          z = scaled::maximum(x, y);
        else if (op == "minimum")
          z = scaled::minimum(x, y);
        else
          throw Error("scaled.binary: unknown op '" + op + "'");
        return finished(z, {&x, &y}, op);
      },
      "op"_a, "x"_a, "y"_a, nb::sig("def binary(op: str, x: " PAIR ", y: " PAIR ") -> " PAIR),
      "add, sub, mul, div, matmul, maximum or minimum of two pairs");
  m.def(
      "unary",
      [](const std::string& op, nb::handle xp) {
        const ScaledTensor x = scaled_pair(xp, op.c_str());
        return finished(scaled::unary(ops::parse_unary(op), x), {&x}, op);
      },
      "op"_a, "x"_a, nb::sig("def unary(op: str, x: " PAIR ") -> " PAIR),
      "exp, log, sqrt, rsqrt, abs, relu, gelu_tanh, gelu_erf, silu, sigmoid, tanh or neg of a pair");
  m.def(
      "reduce",
      [](const std::string& op, nb::handle xp, const std::vector<int>& dims, bool keepdim) {
        const ScaledTensor x = scaled_pair(xp, op.c_str());
        if (op == "sum") return finished(scaled::sum(x, dims, keepdim), {&x}, op);
        if (op == "mean") return finished(scaled::mean(x, dims, keepdim), {&x}, op);
        if (op == "amax" && dims.size() == 1) return finished(scaled::max(x, dims[0], keepdim), {&x}, op);
        throw Error("scaled.reduce: unknown op '" + op + "' (amax over one dimension)");
      },
      "op"_a, "x"_a, "dims"_a, "keepdim"_a, nb::sig("def reduce(op: str, x: " PAIR ", dims: list[int], keepdim: bool) -> " PAIR),
      "sum, mean (dims [] for every dimension) or amax (one dimension) of a pair");
  m.def(
      "softmax",
      [](nb::handle xp, int dim, bool log) {
        const ScaledTensor x = scaled_pair(xp, "softmax");
        return finished(log ? scaled::log_softmax(x, dim) : scaled::softmax(x, dim), {&x}, log ? "log_softmax" : "softmax");
      },
      "x"_a, "dim"_a, "log"_a = false, nb::sig("def softmax(x: " PAIR ", dim: int, log: bool = False) -> " PAIR),
      "softmax (or log_softmax) along dim");
  m.def(
      "norm",
      [](nb::handle xp, double eps, bool center) {
        const ScaledTensor x = scaled_pair(xp, "norm");
        return finished(center ? scaled::layer_norm(x, eps) : scaled::rms_norm(x, eps), {&x}, center ? "layer_norm" : "rms_norm");
      },
      "x"_a, "eps"_a, "center"_a = true, nb::sig("def norm(x: " PAIR ", eps: float, center: bool = True) -> " PAIR),
      "layer_norm (center) or rms_norm over the last dimension, without affine");
  m.def(
      "where",
      [](nb::handle cond, nb::handle xp, nb::handle yp) {
        const ScaledTensor x = scaled_pair(xp, "where"), y = scaled_pair(yp, "where");
        return finished(scaled::where(borrowed_tensor(cond, "where condition").to(DType::f32), x, y), {&x, &y}, "where");
      },
      "cond"_a, "x"_a, "y"_a, nb::sig("def where(cond: typing.Any, x: " PAIR ", y: " PAIR ") -> " PAIR), "x where cond is nonzero, else y");
  m.def(
      "concat",
      [](const std::vector<nb::handle>& pairs, int dim) {
        std::vector<ScaledTensor> xs;
        for (nb::handle p : pairs) xs.push_back(scaled_pair(p, "concat"));
        std::vector<const ScaledTensor*> in;
        for (const ScaledTensor& x : xs) in.push_back(&x);
        return finished(scaled::concat(xs, dim), in, "concat");
      },
      "xs"_a, "dim"_a, nb::sig("def concat(xs: list[" PAIR "], dim: int) -> " PAIR), "the pairs joined along dim");
  m.def(
      "embedding",
      [](nb::handle wp, nb::handle ids) {
        const ScaledTensor w = scaled_pair(wp, "embedding");
        return finished(scaled::embedding(w, borrowed_tensor(ids, "embedding ids")), {&w}, "embedding");
      },
      "weight"_a, "ids"_a, nb::sig("def embedding(weight: " PAIR ", ids: typing.Any) -> " PAIR), "rows of weight by int64 ids");
  m.def(
      "cross_entropy",
      [](nb::handle lp, nb::handle targets) {
        // The loss stays f32 whatever the logits' storage, as the engine's (Var::Storage::as_computed).
        return pair_of(scaled::cross_entropy(scaled_pair(lp, "cross_entropy"), borrowed_tensor(targets, "cross_entropy targets")));
      },
      "logits"_a, "targets"_a, nb::sig("def cross_entropy(logits: " PAIR ", targets: typing.Any) -> " PAIR),
      "mean cross-entropy of [rows, classes] logits against int64 targets (the loss in float32)");
  m.def(
      "scalar",
      [](const std::string& op, nb::handle xp, double c) {
        const ScaledTensor x = scaled_pair(xp, op.c_str());
        if (op == "mul") return finished(scaled::mul_scalar(x, c), {&x}, op);
        if (op == "add") return finished(scaled::add_scalar(x, c), {&x}, op);
        if (op == "pow") return finished(scaled::pow_scalar(x, c), {&x}, op);
        throw Error("scaled.scalar: unknown op '" + op + "'");
      },
      "op"_a, "x"_a, "c"_a, nb::sig("def scalar(op: str, x: " PAIR ", c: float) -> " PAIR), "x * c, x + c or x ** c");
  m.def(
      "ema",
      [](nb::handle mp, nb::handle xp, double b) {
        const ScaledTensor mv = scaled_pair(mp, "ema"), x = scaled_pair(xp, "ema");
        return finished(scaled::ema(mv, x, b), {&mv, &x}, "ema");
      },
      "m"_a, "x"_a, "b"_a, nb::sig("def ema(m: " PAIR ", x: " PAIR ", b: float) -> " PAIR), "b m + (1 - b) x (the optimizer's moments)");
  m.def(
      "as_scaled",
      [](nb::handle x, const std::string& dtype) { return pair_of(as_scaled(borrowed_tensor(x, "as_scaled"), parse_dtype(dtype))); }, "x"_a,
      "dtype"_a = "f32", nb::sig("def as_scaled(x: typing.Any, dtype: str = 'f32') -> " PAIR),
      "x as (data, scale): the scale rms(x) rounded down to a power of two, the data x / scale stored in dtype");
  m.def(
      "set_scaling", [](nb::handle xp, float s) { return pair_of(set_scaling(scaled_pair(xp, "set_scaling"), s)); }, "x"_a, "scale"_a,
      nb::sig("def set_scaling(x: " PAIR ", scale: float) -> " PAIR), "the same value with the given scale");
  m.def(
      "rebalance", [](nb::handle xp, float delta) { return pair_of(rebalance(scaled_pair(xp, "rebalance"), delta)); }, "x"_a, "delta"_a,
      nb::sig("def rebalance(x: " PAIR ", delta: float) -> " PAIR), "scale * delta, data / delta");
  m.def(
      "dynamic_rescale",
      [](nb::handle xp, const std::string& by) {
        const ScaledTensor x = scaled_pair(xp, "dynamic_rescale");
        if (by == "l2") return pair_of(dynamic_rescale_l2(x));
        if (by == "max") return pair_of(dynamic_rescale_max(x));
        throw Error("dynamic_rescale: by 'l2' or 'max', not '" + by + "'");
      },
      "x"_a, "by"_a = "l2", nb::sig("def dynamic_rescale(x: " PAIR ", by: str = 'l2') -> " PAIR),
      "rebalanced by its data's rms (l2) or amax (max) rounded to a power of two");
  m.def(
      "cast_data",
      [](nb::handle xp, const std::string& format) { return pair_of(cast_data(scaled_pair(xp, "cast_data"), parse_format(format))); },
      "x"_a, "format"_a, nb::sig("def cast_data(x: " PAIR ", format: str) -> " PAIR),
      "the data rounded into format (nearest even, saturating), the scale kept; FP8 data comes back as uint8 codes");
  bind_scaled_grads(m);  // the backward rules and fused ops (scaled_grad_bindings.cpp)
}

#undef PAIR

}  // namespace scalify::python
