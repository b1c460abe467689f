// scalify.Tensor: the engine's Var (a value, possibly scaled, with its autograd graph) as a Python
// object that behaves like a torch.Tensor where the engine has the op: arithmetic with numbers and
// arrays, indexing, reductions with dim=, .item(), NumPy's __array__ and DLPack's __dlpack__.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"

namespace scalify::python {
namespace {

using namespace nb::literals;

// The operand types a binary operator takes, as the stubs show them.
#define SCALIFY_OPERAND "Tensor | float | numpy.typing.ArrayLike"

const Shape& shape_of_var(const Var& v) { return v.shape(); }
int64_t numel(const Var& v) { return v.scaled().data.numel(); }

double item(const Var& v) {
  if (numel(v) != 1)
    throw nb::value_error(("only a one-element Tensor converts to a Python number; this one has shape " + shape_str(v.shape())).c_str());
  return v.value().item();
}

// A binary operator: NotImplemented for operands it does not take, so Python tries the other side.
template <class Op>
nb::object binary(const Var& a, nb::handle b, Op op) {
  if (!is_tensor_like(b)) return nb::borrow(Py_NotImplemented);
  return nb::cast(op(a, b));
}

// An operator whose other side is a Python number (by_number(x, c): exact, with x's scale rules)
// or a Tensor / array (by_tensor(x, other)).
template <class ByNumber, class ByTensor>
auto number_or_tensor(ByNumber by_number, ByTensor by_tensor) {
  return [by_number, by_tensor](const Var& a, nb::handle b) {
    return binary(a, b,
                  [&](const Var& x, nb::handle y) { return is_number(y) ? by_number(x, number_value(y)) : by_tensor(x, operand(y, x)); });
  };
}

std::string repr(const Var& v) {
  nb::object numpy = nb::module_::import_("numpy");
  const std::string values = nb::cast<std::string>(
      numpy.attr("array2string")(array_from(v.value()), "separator"_a = ", ", "prefix"_a = "scalify.Tensor(", "threshold"_a = 64));
  std::string out = "scalify.Tensor(" + values + ", dtype=" + std::string(dtype_name(v.scaled().data.dtype()));
  if (v.scaled().has_single_scale()) out += ", scale=" + nb::cast<std::string>(nb::repr(nb::float_(v.scaled().scalar_scale())));
  if (v.requires_grad()) out += ", requires_grad=True";
  return out + ")";
}

}  // namespace

void bind_tensor(nb::module_& m) {
  nb::class_<Var> t(m, "Tensor",
                    "A value of the engine with its autograd graph: data x a power-of-two scale when scaled.\n\n"
                    "Tensor(values, requires_grad=False, scale=None): values from an array, a DLPack tensor (a CPU\n"
                    "torch.Tensor), a list or a number; float32 and float64 arrays keep their precision, lists and\n"
                    "numbers become float32. With `scale`, the values are the data of a scaled tensor.");
  t.def(
       "__init__",
       [](Var* v, nb::handle values, bool requires_grad, std::optional<float> scale) {
         const Tensor data = tensor_from_object(values, "scalify.Tensor");
         new (v) Var(scale ? ScaledTensor(data, *scale) : ScaledTensor(data), requires_grad);
       },
       "values"_a, "requires_grad"_a = false, "scale"_a = nb::none(),
       nb::sig("def __init__(self, values: numpy.typing.ArrayLike, requires_grad: bool = False, scale: float | None = None) -> None"))
      // --- values out ---
      .def("item", &item, "The value of a one-element Tensor as a Python float")
      .def("__float__", &item)
      .def(
          "__int__",
          [](const Var& v) {
            PyObject* n = PyLong_FromDouble(item(v));  // ValueError for NaN, OverflowError for inf, as int(float)
            if (!n) throw nb::python_error();
            return nb::steal<nb::int_>(n);
          },
          nb::sig("def __int__(self) -> int"))
      .def("__bool__", [](const Var& v) { return item(v) != 0.0; })
      .def(
          "tolist", [](const Var& v) { return array_from(v.value()).attr("tolist")(); }, nb::sig("def tolist(self) -> typing.Any"),
          "The represented value as (nested) Python lists of floats")
      .def(
          "__array__",
          [](const Var& v, nb::handle dtype, nb::handle copy) {
            if (!copy.is_none() && !nb::cast<bool>(copy))
              throw nb::value_error("a Tensor's values are computed (data x scale): NumPy cannot view them without a copy");
            nb::object a = array_from(v.value());
            return dtype.is_none() ? a : a.attr("astype")(dtype);
          },
          "dtype"_a = nb::none(), "copy"_a = nb::none(),
          nb::sig("def __array__(self, dtype: object = None, copy: bool | None = None) -> numpy.typing.NDArray[typing.Any]"),
          "numpy.asarray(t): the represented value")
      .def(
          "__dlpack__",
          [](const Var& v, nb::kwargs kwargs) {  // the represented value, handed over by NumPy's own DLPack export
            return array_from(v.value()).attr("__dlpack__")(**kwargs);
          },
          "kwargs"_a, nb::sig("def __dlpack__(self, **kwargs: typing.Any) -> typing.Any"),
          "DLPack export of the represented value (torch.from_dlpack(t)): a new CPU buffer")
      .def(
          "__dlpack_device__", [](const Var&) { return nb::make_tuple(1, 0); },
          nb::sig("def __dlpack_device__(self) -> tuple[int, int]"))  // kDLCPU, device 0
      // --- what it is ---
      .def_prop_ro(
          "data", [](const Var& v) { return array_from(v.scaled().data); },
          nb::sig("def data(self) -> numpy.typing.NDArray[numpy.floating[typing.Any]]"),
          "The data component (as stored, widened to float32 or float64)")
      .def_prop_ro(
          "scale",
          [](const Var& v) -> std::optional<float> {
            return v.scaled().has_single_scale() ? std::optional(v.scaled().scalar_scale()) : std::nullopt;
          },
          "The power-of-two scale, or None when unscaled")
      .def_prop_ro(
          "dtype", [](const Var& v) { return std::string(dtype_name(v.scaled().data.dtype())); },
          "The data's storage type: f32, f64, f16, bf16, e4m3, ...")
      .def_prop_ro(
          "shape", [](const Var& v) { return nb::tuple(nb::cast(shape_to(v.shape()))); }, nb::sig("def shape(self) -> tuple[int, ...]"),
          "The dimensions, as a tuple")
      .def_prop_ro(
          "ndim", [](const Var& v) { return v.shape().size(); }, "The number of dimensions")
      .def(
          "dim", [](const Var& v) { return v.shape().size(); }, "The number of dimensions (torch's name)")
      .def("numel", &numel, "The number of elements")
      .def(
          "size",
          [](const Var& v, std::optional<int64_t> dim) -> nb::object {
            if (!dim) return nb::tuple(nb::cast(shape_to(v.shape())));
            return nb::int_(v.shape()[size_t(dim_index(*dim, v.shape().size()))]);
          },
          "dim"_a = nb::none(), nb::sig("def size(self, dim: int | None = None) -> typing.Any"),
          "The shape, or the size of dimension dim (torch's name)")
      .def("__len__",
           [](const Var& v) {
             if (v.shape().empty()) throw nb::type_error("len() of a 0-d Tensor");
             return v.shape()[0];
           })
      .def(
          "__iter__",
          [](const Var& v) {
            if (v.shape().empty()) throw nb::type_error("iteration over a 0-d Tensor");
            nb::list rows;
            for (int64_t i = 0; i < v.shape()[0]; ++i) rows.append(index(v, nb::int_(i)));
            return nb::iter(rows);
          },
          nb::sig("def __iter__(self) -> collections.abc.Iterator[Tensor]"), "The Tensor's rows (its first dimension)")
      .def_prop_rw("requires_grad", &Var::requires_grad, &Var::set_requires_grad, "Whether backward() computes this leaf's gradient")
      // --- autograd ---
      .def_prop_ro(
          "grad", [](const Var& v) -> nb::object { return v.scaled_grad().data.defined() ? array_from(v.grad()) : nb::none(); },
          nb::sig("def grad(self) -> numpy.typing.NDArray[numpy.floating[typing.Any]] | None"),
          "The gradient's represented value after backward(), else None")
      .def_prop_ro(
          "grad_scale",
          [](const Var& v) -> std::optional<float> {
            return v.scaled_grad().has_single_scale() ? std::optional(v.scaled_grad().scalar_scale()) : std::nullopt;
          },
          "The gradient's propagated scale, or None")
      .def(
          "backward",
          [](const Var& v, nb::handle gradient) {
            if (gradient.is_none()) {
              nb::gil_scoped_release release;
              v.backward();
              return;
            }
            const Var seed = operand(gradient, v);
            nb::gil_scoped_release release;
            v.backward(seed.value().to(v.scaled().data.dtype() == DType::f64 ? DType::f64 : DType::f32));
          },
          "gradient"_a = nb::none(), nb::sig("def backward(self, gradient: Tensor | numpy.typing.ArrayLike | None = None) -> None"),
          "Backpropagates into the leaves' .grad: from this one-element value (gradient 1), or with the\n"
          "gradient of this value given (its shape). The graph is freed afterwards.")
      .def("zero_grad", &Var::zero_grad, "Forgets the gradient")
      .def("detach", &Var::detach, "The same value without history")
      .def(
          "set_value", [](Var& v, nb::handle values) { v.set_value(tensor_from_object(values, "set_value")); }, "values"_a,
          nb::sig("def set_value(self, values: numpy.typing.ArrayLike) -> None"),
          "Replaces a leaf's value in place (an optimizer's update)")
      // --- arithmetic: Tensors, numbers and arrays, either side ---
      .def("__add__",
           number_or_tensor([](const Var& x, double c) { return add_scalar(x, c); }, [](const Var& x, const Var& y) { return x + y; }),
           nb::sig("def __add__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def("__radd__",
           number_or_tensor([](const Var& x, double c) { return add_scalar(x, c); }, [](const Var& x, const Var& y) { return y + x; }),
           nb::sig("def __radd__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def("__sub__",
           number_or_tensor([](const Var& x, double c) { return add_scalar(x, -c); }, [](const Var& x, const Var& y) { return x - y; }),
           nb::sig("def __sub__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def("__rsub__",
           number_or_tensor([](const Var& x, double c) { return add_scalar(-x, c); }, [](const Var& x, const Var& y) { return y - x; }),
           nb::sig("def __rsub__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def("__mul__",
           number_or_tensor([](const Var& x, double c) { return mul_scalar(x, c); }, [](const Var& x, const Var& y) { return x * y; }),
           nb::sig("def __mul__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def("__rmul__",
           number_or_tensor([](const Var& x, double c) { return mul_scalar(x, c); }, [](const Var& x, const Var& y) { return y * x; }),
           nb::sig("def __rmul__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def(
          "__truediv__",
          [](const Var& a, nb::handle b) { return binary(a, b, [](const Var& x, nb::handle y) { return x / operand(y, x); }); },
          nb::sig("def __truediv__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def(
          "__rtruediv__",
          [](const Var& a, nb::handle b) { return binary(a, b, [](const Var& x, nb::handle y) { return operand(y, x) / x; }); },
          nb::sig("def __rtruediv__(self, other: " SCALIFY_OPERAND ", /) -> Tensor"))
      .def(
          "__matmul__",
          [](const Var& a, nb::handle b) { return binary(a, b, [](const Var& x, nb::handle y) { return matmul(x, operand(y, x)); }); },
          nb::sig("def __matmul__(self, other: Tensor | numpy.typing.ArrayLike, /) -> Tensor"))
      .def(
          "__rmatmul__",
          [](const Var& a, nb::handle b) { return binary(a, b, [](const Var& x, nb::handle y) { return matmul(operand(y, x), x); }); },
          nb::sig("def __rmatmul__(self, other: Tensor | numpy.typing.ArrayLike, /) -> Tensor"))
      .def(
          "__pow__", [](const Var& x, double p) { return pow_scalar(x, p); }, nb::is_operator(), "exponent"_a)
      .def("__neg__", [](const Var& x) { return -x; })
      .def("__pos__", [](const Var& x) { return x; })
      .def("__abs__", [](const Var& x) { return abs(x); })
      // --- indexing and layout ---
      .def("__getitem__", &index, "key"_a, nb::sig("def __getitem__(self, key: typing.Any, /) -> Tensor"),
           "x[key] for ints, slices (step 1), ... and None; differentiable")
      .def_prop_ro(
          "T",
          [](const Var& x) {
            std::vector<int> reversed;
            for (int d = int(x.shape().size()) - 1; d >= 0; --d) reversed.push_back(d);
            return permute(x, reversed);
          },
          "The dimensions reversed (for a matrix, its transpose)")
      .def(
          "reshape",
          [](const Var& x, nb::args shape) {
            return reshape(x, shape_argument(shape.size() == 1 && !PyLong_Check(shape[0].ptr()) ? shape[0] : shape, numel(x)));
          },
          "shape"_a, nb::sig("def reshape(self, *shape: int | collections.abc.Sequence[int]) -> Tensor"),
          "The same values in a new shape: reshape(2, 3) or reshape((2, 3)); one dimension may be -1")
      .def(
          "transpose", [](const Var& x, int dim0, int dim1) { return transpose(x, dim0, dim1); }, "dim0"_a, "dim1"_a,
          "Dimensions dim0 and dim1 swapped")
      .def(
          "permute",
          [](const Var& x, nb::args dims) {
            return permute(x, dims_from(dims.size() == 1 && !PyLong_Check(dims[0].ptr()) ? dims[0] : dims, x.shape().size()));
          },
          "dims"_a, nb::sig("def permute(self, *dims: int | collections.abc.Sequence[int]) -> Tensor"), "The dimensions in the order given")
      // --- reductions and functions, as methods ---
      .def(
          "sum", [](const Var& x, nb::handle dim, bool keepdim) { return sum(x, dims_from(dim, x.shape().size()), keepdim); },
          "dim"_a = nb::none(), "keepdim"_a = false,
          nb::sig("def sum(self, dim: int | collections.abc.Sequence[int] | None = None, keepdim: bool = False) -> Tensor"),
          "The sum over dim (every dimension when None)")
      .def(
          "mean", [](const Var& x, nb::handle dim, bool keepdim) { return mean(x, dims_from(dim, x.shape().size()), keepdim); },
          "dim"_a = nb::none(), "keepdim"_a = false,
          nb::sig("def mean(self, dim: int | collections.abc.Sequence[int] | None = None, keepdim: bool = False) -> Tensor"),
          "The mean over dim (every dimension when None)")
      .def(
          "softmax", [](const Var& x, int dim) { return softmax(x, dim); }, "dim"_a = -1)
      .def(
          "log_softmax", [](const Var& x, int dim) { return log_softmax(x, dim); }, "dim"_a = -1)
      .def("exp", [](const Var& x) { return exp(x); })
      .def("log", [](const Var& x) { return log(x); })
      .def("sqrt", [](const Var& x) { return sqrt(x); })
      .def("tanh", [](const Var& x) { return tanh(x); })
      .def("sigmoid", [](const Var& x) { return sigmoid(x); })
      .def("relu", [](const Var& x) { return relu(x); })
      .def("abs", [](const Var& x) { return abs(x); })
      .def(
          "matmul", [](const Var& a, nb::handle b) { return matmul(a, operand(b, a)); }, "other"_a,
          nb::sig("def matmul(self, other: Tensor | numpy.typing.ArrayLike) -> Tensor"))
      // Last: in the stubs, names after a method called `numpy` inside the class would resolve to it.
      .def(
          "numpy", [](const Var& v) { return array_from(v.value()); },
          nb::sig("def numpy(self) -> numpy.typing.NDArray[numpy.floating[typing.Any]]"),
          "The represented value (data x scale) as a new NumPy array (float64 for f64 data, else float32)")
      .def("__repr__", &repr);
  // NumPy defers to the Tensor's own operators (ndarray + Tensor keeps the graph) instead of
  // converting it through __array__ into a plain array.
  t.attr("__array_ufunc__") = nb::none();
}

}  // namespace scalify::python
