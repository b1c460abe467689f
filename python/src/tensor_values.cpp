// Python values to and from the engine's tensors: arrays, DLPack tensors, lists and numbers in;
// NumPy arrays out; the dims, shapes and index keys torch's methods take.
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"

namespace scalify::python {

using namespace nb::literals;

namespace {

// A Python int as int64_t; one past int64 is out of range of anything: IndexError.
int64_t index_value(nb::handle i) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) throw nb::index_error(("index " + nb::cast<std::string>(nb::str(i)) + " is out of range").c_str());
  return v;
}

// A DLPack dtype as NumPy names it ("int64", "float16", "bool", ...), for errors.
std::string dtype_text(const nb::dlpack::dtype& d) {
  switch (nb::dlpack::dtype_code(d.code)) {
    case nb::dlpack::dtype_code::Int: return "int" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::UInt: return "uint" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::Float: return "float" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::Bfloat: return "bfloat" + std::to_string(d.bits);
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: return "complex" + std::to_string(d.bits);
  }
}

Tensor tensor_from_array(const AnyArray& a, const char* what) {
  const Shape shape = shape_from(shape_of(a));
  if (a.dtype() == nb::dtype<float>()) {
    const float* p = static_cast<const float*>(a.data());
    return Tensor::from_vector(std::vector<float>(p, p + a.size()), shape);
  }
  if (a.dtype() == nb::dtype<double>()) {
    const double* p = static_cast<const double*>(a.data());
    return Tensor::from_vector(std::vector<double>(p, p + a.size()), shape);
  }
  throw nb::type_error((std::string(what) + ": needs float32 or float64 values, got a " + dtype_text(a.dtype()) +
                        " array; convert it first (e.g. .astype(numpy.float32))")
                           .c_str());
}

bool is_python_number_or_list(nb::handle h) { return is_number(h) || PyList_Check(h.ptr()) || PyTuple_Check(h.ptr()); }

}  // namespace

bool is_number(nb::handle h) {
  if (PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr())) return true;
  // NumPy's scalars (numpy.float32(2), a reduction's result): numbers, not arrays.
  nb::handle type = h.type();
  return nb::hasattr(type, "__module__") && nb::cast<std::string>(nb::str(type.attr("__module__"))) == "numpy" && PyNumber_Check(h.ptr()) &&
         !nb::hasattr(h, "__len__");
}

double number_value(nb::handle h) {
  const double v = PyFloat_AsDouble(h.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();  // OverflowError for ints beyond a double
  return v;
}

bool is_tensor_like(nb::handle value) {
  AnyArray a;
  return nb::isinstance<Var>(value) || is_python_number_or_list(value) || nb::try_cast(value, a);
}

Tensor tensor_from_object(nb::handle value, const char* what) {
  AnyArray a;
  if (nb::try_cast(value, a, false)) return tensor_from_array(a, what);  // NumPy, DLPack: as they are
  if (is_python_number_or_list(value)) {                                 // as torch.tensor makes them: float32
    nb::object numpy = nb::module_::import_("numpy");
    nb::object converted = numpy.attr("asarray")(value, "dtype"_a = numpy.attr("float32"));
    return tensor_from_array(nb::cast<AnyArray>(converted), what);
  }
  if (nb::try_cast(value, a, true)) return tensor_from_array(a, what);  // non-contiguous arrays: copied contiguous
  throw nb::type_error(
      (std::string(what) + ": needs an array, a list or a number, got " + nb::cast<std::string>(nb::str(value.type().attr("__name__"))))
          .c_str());
}

nb::object array_from(const Tensor& t) {
  if (t.dtype() == DType::f64) return owned_array<double>(t.to_vector(), shape_to(t.shape()));
  return owned_array<float>(t.to_floats(), shape_to(t.shape()));
}

Var operand(nb::handle value, const Var& like) {
  if (nb::isinstance<Var>(value)) return nb::cast<Var>(value);
  const DType family = like.scaled().data.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (is_number(value)) return Var(Tensor::scalar(number_value(value), family));
  const Tensor t = tensor_from_object(value, "scalify.Tensor operand");
  return Var(t.dtype() == family ? t : t.to(family));
}

std::vector<int> dims_from(nb::handle dim, size_t ndim) {
  if (dim.is_none()) return {};
  auto is_int = [](nb::handle h) { return PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()); };
  auto dim_value = [ndim](nb::handle d) { return int(dim_index(index_value(d), ndim)); };
  if (is_int(dim)) return {dim_value(dim)};
  if (!PySequence_Check(dim.ptr())) throw nb::type_error("dim: needs an int or a sequence of ints");
  std::vector<int> dims;
  for (nb::handle d : dim) {
    if (!is_int(d)) throw nb::type_error("dim: needs an int or a sequence of ints");
    dims.push_back(dim_value(d));
  }
  return dims;
}

Shape shape_argument(nb::handle given, int64_t numel) {
  Shape shape;
  int64_t known = 1, inferred = -1;
  if (!PySequence_Check(given.ptr())) throw nb::type_error("shape: needs a sequence of ints");
  for (nb::handle d : given) {
    if (!PyLong_Check(d.ptr()) || PyBool_Check(d.ptr())) throw nb::type_error("shape: needs ints");
    const int64_t n = nb::cast<int64_t>(d);
    if (n == -1) {
      if (inferred >= 0) throw nb::value_error("shape: only one dimension can be -1");
      inferred = int64_t(shape.size());
    } else if (n < 0) {
      throw nb::value_error(("shape: dimension " + std::to_string(n) + " is negative").c_str());
    } else {
      known *= n;
    }
    shape.push_back(n);
  }
  if (inferred >= 0) {
    if (known == 0 || numel % known != 0)
      throw nb::value_error(("shape " + shape_str(shape) + " cannot hold " + std::to_string(numel) + " elements").c_str());
    shape[size_t(inferred)] = numel / known;
  }
  return shape;
}

int64_t dim_index(int64_t d, size_t ndim) {
  const int64_t n = int64_t(ndim);
  if (d < -n || d >= n)
    throw nb::index_error(
        ("dimension " + std::to_string(d) + " is out of range for a tensor of " + std::to_string(n) + " dimensions").c_str());
  return d < 0 ? d + n : d;
}

Var index(const Var& x, nb::handle key) {
  std::vector<nb::handle> items;
  if (PyTuple_Check(key.ptr())) {
    for (nb::handle k : key) items.push_back(k);
  } else {
    items.push_back(key);
  }
  size_t consumed = 0;  // dimensions of x the key names (ints and slices)
  bool ellipsis = false;
  for (nb::handle k : items) {
    if (k.ptr() == Py_Ellipsis) {
      if (ellipsis) throw nb::index_error("an index can only have a single ellipsis ('...')");
      ellipsis = true;
    } else if (!k.is_none()) {
      ++consumed;
    }
  }
  const Shape& shape = x.shape();
  if (consumed > shape.size())
    throw nb::index_error(
        ("too many indices: " + std::to_string(consumed) + " for a tensor of " + std::to_string(shape.size()) + " dimensions").c_str());
  Var out = x;
  Shape result;    // the output's shape: int-indexed dims dropped, None's added
  size_t dim = 0;  // the dimension of x the next item applies to
  for (nb::handle k : items) {
    if (k.ptr() == Py_Ellipsis) {
      for (size_t n = shape.size() - consumed; n > 0; --n) result.push_back(shape[dim++]);
    } else if (k.is_none()) {
      result.push_back(1);
    } else if (PyLong_Check(k.ptr()) && !PyBool_Check(k.ptr())) {
      const int64_t n = shape[dim], i = index_value(k);
      if (i < -n || i >= n)
        throw nb::index_error(
            ("index " + std::to_string(i) + " is out of range for dimension " + std::to_string(dim) + " of size " + std::to_string(n))
                .c_str());
      const int64_t at = i < 0 ? i + n : i;
      out = slice(out, int(dim), at, at + 1);
      ++dim;
    } else if (PySlice_Check(k.ptr())) {
      Py_ssize_t start = 0, stop = 0, step = 0, length = 0;
      if (PySlice_GetIndicesEx(k.ptr(), Py_ssize_t(shape[dim]), &start, &stop, &step, &length) != 0) throw nb::python_error();
      if (step != 1) throw nb::index_error("slices with a step other than 1 are not supported");
      if (length == 0) throw nb::index_error(("the slice selects nothing of dimension " + std::to_string(dim)).c_str());
      if (length != shape[dim]) out = slice(out, int(dim), start, stop);
      result.push_back(length);
      ++dim;
    } else {
      throw nb::type_error(
          ("a Tensor is indexed by ints, slices, ... and None, not " + nb::cast<std::string>(nb::str(k.type().attr("__name__")))).c_str());
    }
  }
  for (; dim < shape.size(); ++dim) result.push_back(shape[dim]);
  return result == out.shape() ? out : reshape(out, result);
}

}  // namespace scalify::python
