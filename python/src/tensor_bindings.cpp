// Tensors and autograd: the engine's Var (a value, possibly scaled, with its graph), its ops,
// SCALIFY's primitives and unit scaling's ops.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/autograd/scaling.hpp"
#include "scalify/error.hpp"
#include "scalify/unit/unit_ops.hpp"

namespace scalify::python {
namespace {

using namespace nb::literals;

// A tensor from a float32 or float64 array (float64 stays f64: gradient checks), copied.
Tensor tensor_from(const AnyArray& a) {
  const Shape shape = shape_from(shape_of(a));
  if (a.dtype() == nb::dtype<float>()) {
    const float* p = static_cast<const float*>(a.data());
    return Tensor::from_vector(std::vector<float>(p, p + a.size()), shape);
  }
  if (a.dtype() == nb::dtype<double>()) {
    const double* p = static_cast<const double*>(a.data());
    return Tensor::from_vector(std::vector<double>(p, p + a.size()), shape);
  }
  throw Error("tensor: needs a float32 or float64 array");
}
// A tensor's values as a new NumPy array: float64 for f64 data, else float32.
nb::object array_from(const Tensor& t) {
  if (t.dtype() == DType::f64) return owned_array<double>(t.to_vector(), shape_to(t.shape()));
  return owned_array<float>(t.to_floats(), shape_to(t.shape()));
}

}  // namespace

void bind_tensor(nb::module_& m) {
  nb::class_<Var>(m, "Tensor", "A value of the engine (data x power-of-two scale when scaled) with its autograd graph")
      .def(
          "__init__",
          [](Var* v, const AnyArray& a, bool requires_grad, std::optional<float> scale) {
            const Tensor t = tensor_from(a);
            new (v) Var(scale ? ScaledTensor(t, *scale) : ScaledTensor(t), requires_grad);
          },
          "array"_a, "requires_grad"_a = false, "scale"_a = nb::none(),
          "A leaf from a float32/float64 array; with `scale` the array is the data of a scaled tensor")
      .def(
          "numpy", [](const Var& v) { return array_from(v.value()); }, "The represented value (data x scale)")
      .def_prop_ro(
          "data", [](const Var& v) { return array_from(v.scaled().data); }, "The data component (as stored, widened)")
      .def_prop_ro(
          "scale",
          [](const Var& v) -> std::optional<float> {
            return v.scaled().has_single_scale() ? std::optional(v.scaled().scalar_scale()) : std::nullopt;
          },
          "The power-of-two scale, or None when unscaled")
      .def_prop_ro("dtype", [](const Var& v) { return std::string(dtype_name(v.scaled().data.dtype())); })
      .def_prop_ro("shape", [](const Var& v) { return nb::tuple(nb::cast(shape_to(v.shape()))); })
      .def_prop_ro("requires_grad", &Var::requires_grad)
      .def_prop_ro(
          "grad", [](const Var& v) -> nb::object { return v.scaled_grad().data.defined() ? array_from(v.grad()) : nb::none(); },
          "The gradient's represented value after backward(), else None")
      .def_prop_ro(
          "grad_scale",
          [](const Var& v) -> std::optional<float> {
            return v.scaled_grad().has_single_scale() ? std::optional(v.scaled_grad().scalar_scale()) : std::nullopt;
          },
          "The gradient's propagated scale, or None")
      .def(
          "backward",
          [](const Var& v) {
            nb::gil_scoped_release release;
            v.backward();
          },
          "Backpropagates from this single-element value")
      .def("zero_grad", &Var::zero_grad)
      .def(
          "set_value", [](Var& v, const AnyArray& a) { v.set_value(tensor_from(a)); }, "array"_a,
          "Replaces a leaf's value in place (an optimizer's update)")
      .def("__add__", [](const Var& a, const Var& b) { return a + b; })
      .def("__sub__", [](const Var& a, const Var& b) { return a - b; })
      .def("__mul__", [](const Var& a, const Var& b) { return a * b; })
      .def("__mul__", [](const Var& a, double c) { return a * c; })
      .def("__rmul__", [](const Var& a, double c) { return c * a; })
      .def("__truediv__", [](const Var& a, const Var& b) { return a / b; })
      .def("__neg__", [](const Var& a) { return -a; })
      .def("__matmul__", [](const Var& a, const Var& b) { return matmul(a, b); })
      .def("__repr__", [](const Var& v) {
        return "scalify.Tensor(shape " + shape_str(v.shape()) + ", " + std::string(dtype_name(v.scaled().data.dtype())) +
               (v.scaled().has_single_scale() ? ", scale " + std::to_string(v.scaled().scalar_scale()) : std::string()) + ")";
      });
  m.def(
      "as_scaled",
      [](const AnyArray& a, const std::string& dtype, bool requires_grad) {
        return Var(as_scaled(tensor_from(a), parse_dtype(dtype)), requires_grad);
      },
      "array"_a, "dtype"_a = "f32", "requires_grad"_a = true, "A scaled tensor of unit-RMS data (scale = pow2(rms)) stored in dtype");
  m.def("matmul", [](const Var& a, const Var& b) { return matmul(a, b); });
  m.def("add", [](const Var& a, const Var& b) { return a + b; });
  m.def("mul", [](const Var& a, const Var& b) { return a * b; });
  for (const auto& [name, op] : std::initializer_list<std::pair<const char*, ops::Unary>>{{"relu", ops::Unary::relu},
                                                                                          {"gelu", ops::Unary::gelu_tanh},
                                                                                          {"gelu_erf", ops::Unary::gelu_erf},
                                                                                          {"silu", ops::Unary::silu},
                                                                                          {"tanh", ops::Unary::tanh},
                                                                                          {"sigmoid", ops::Unary::sigmoid},
                                                                                          {"exp", ops::Unary::exp},
                                                                                          {"log", ops::Unary::log}})
    m.def(
        name, [op](const Var& x) { return unary(op, x); }, "x"_a);
  m.def(
      "softmax", [](const Var& x, int dim) { return softmax(x, dim); }, "x"_a, "dim"_a = -1);
  m.def(
      "log_softmax", [](const Var& x, int dim) { return log_softmax(x, dim); }, "x"_a, "dim"_a = -1);
  m.def(
      "layer_norm",
      [](const Var& x, std::optional<Var> w, std::optional<Var> b, double eps) {
        return layer_norm(x, w.value_or(Var()), b.value_or(Var()), eps);
      },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5);
  m.def(
      "cross_entropy",
      [](const Var& logits, const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& targets) {
        return cross_entropy(logits, ids_from(targets));
      },
      "logits"_a, "targets"_a, "Mean cross-entropy of logits [N, V] against int64 targets [N]");
  m.def("sum", [](const Var& x) { return sum(x); });
  m.def("mean", [](const Var& x) { return mean(x); });
  m.def("reshape", [](const Var& x, const std::vector<int64_t>& shape) { return reshape(x, Shape(shape.begin(), shape.end())); });
  m.def("transpose", [](const Var& x, int d0, int d1) { return transpose(x, d0, d1); });
  // SCALIFY's primitives (seed 000): no-ops on the represented value.
  m.def(
      "set_scaling", [](const Var& x, float s) { return set_scaling(x, s); }, "x"_a, "scale"_a);
  m.def(
      "rebalance", [](const Var& x, float d) { return rebalance(x, d); }, "x"_a, "delta"_a);
  m.def(
      "dynamic_rescale", [](const Var& x) { return dynamic_rescale_l2(x); }, "x"_a, "Rebalance by pow2(rms(data))");
  m.def(
      "dynamic_rescale_grad", [](const Var& x) { return dynamic_rescale_l2_grad(x); }, "x"_a, "The same on the gradient");
  m.def(
      "cast_on_forward", [](const Var& x, const std::string& f) { return cast_on_forward(x, parse_format(f)); }, "x"_a, "format"_a);
  m.def(
      "cast_on_backward", [](const Var& x, const std::string& f) { return cast_on_backward(x, parse_format(f)); }, "x"_a, "format"_a);

  // Unit scaling's ops (seeds 001/002, Table A.2): each keeps a unit-variance input's output and
  // gradient at unit variance.
  nb::module_ u = m.def_submodule("unit", "Unit scaling's ops (Table A.2): unit-variance outputs and gradients");
  u.def(
      "scaled", [](const Var& x, double alpha, double beta) { return unit::scaled(x, alpha, beta); }, "x"_a, "alpha"_a = 1.0,
      "beta"_a = 1.0, "id*(x, alpha, beta): the value times alpha, the gradient times beta");
  u.def(
      "matmul",
      [](const Var& x, const Var& w, const std::string& constrain) {
        const std::pair<const char*, unit::Constrain> names[] = {
            {"none", unit::Constrain::none}, {"x", unit::Constrain::x}, {"w", unit::Constrain::w}, {"both", unit::Constrain::both}};
        for (const auto& [n, c] : names)
          if (constrain == n) return unit::matmul(x, w, c);
        throw Error("unit.matmul: constrain must be none, x, w or both, got '" + constrain + "'");
      },
      "x"_a, "w"_a, "constrain"_a = "x");
  u.def(
      "gelu", [](const Var& x, bool constrained) { return unit::gelu(x, constrained); }, "x"_a, "constrained"_a = false);
  u.def(
      "relu", [](const Var& x, bool constrained) { return unit::relu(x, constrained); }, "x"_a, "constrained"_a = false);
  u.def(
      "softmax", [](const Var& x) { return unit::softmax(x); }, "x"_a);
  u.def(
      "layer_norm",
      [](const Var& x, std::optional<Var> w, std::optional<Var> b) { return unit::layer_norm(x, w.value_or(Var()), b.value_or(Var())); },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none());
  u.def(
      "softmax_cross_entropy",
      [](const Var& logits, const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& targets) {
        return unit::softmax_cross_entropy(logits, ids_from(targets));
      },
      "logits"_a, "targets"_a);
  u.def(
      "weighted_add", [](const std::vector<Var>& xs, const std::vector<double>& gammas) { return unit::weighted_add(xs, gammas); }, "xs"_a,
      "gammas"_a);
}

}  // namespace scalify::python
