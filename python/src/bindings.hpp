// Shared by the binding files: array hand-over without copies, the names of rounding modes, the
// refusal of NUL in text that becomes a path.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <utility>
#include <vector>

#include "scalify/formats/block.hpp"
#include "scalify/formats/format.hpp"
#include "scalify/autograd/var.hpp"
#include "scalify/scaled/scaled_tensor.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::python {

namespace nb = nanobind;

using FloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using CodeArray = nb::ndarray<nb::c_contig, nb::device::cpu>;
using AnyArray = nb::ndarray<nb::c_contig, nb::device::cpu>;
using IdArray = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;

// Buffers the bindings fill completely: not zeroed first (a wasted pass over 16M values).
using Bytes = std::vector<std::byte, DefaultInitAllocator<std::byte>>;
using Floats = std::vector<float, DefaultInitAllocator<float>>;

Rounding parse_rounding(const std::string& r);
const char* rounding_name(Rounding r);

// A new NumPy array of `shape` owning `storage` (moved in), viewed as T.
template <class T, class Storage>
nb::object owned_array(Storage&& storage, const std::vector<size_t>& shape) {
  auto* held = new std::decay_t<Storage>(std::move(storage));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::decay_t<Storage>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(reinterpret_cast<T*>(held->data()), shape.size(), shape.data(), owner));
}

std::vector<size_t> shape_of(const auto& a) {
  std::vector<size_t> s;
  for (size_t i = 0; i < a.ndim(); ++i) s.push_back(a.shape(i));
  return s;
}
Shape shape_from(const std::vector<size_t>& s);
std::vector<size_t> shape_to(const Shape& s);
// Token ids (int64) as the engine's index tensor, copied.
Tensor ids_from(const IdArray& a);

// Python strings may hold NUL, which the file system reads as their end ("runs/a\0b" would be the
// folder "runs/a"): refused by name wherever text becomes a path or a config value.
const std::string& without_nul(const std::string& text, const std::string& what);

// --- Python values and the engine's tensors (tensor_values.cpp). ---
// A tensor from an array or DLPack tensor (float32 and float64 kept, copied), or from a list or
// number (float32, as torch.tensor makes them); TypeError naming `what` for anything else.
Tensor tensor_from_object(nb::handle value, const char* what);
bool is_tensor_like(nb::handle value);
// A Python or NumPy number (an operand taken as a scalar), and its value (OverflowError beyond a double).
bool is_number(nb::handle value);
double number_value(nb::handle value);  // what tensor_from_object or a Tensor operand takes
// A tensor's values as a new NumPy array: float64 for f64 data, else float32.
nb::object array_from(const Tensor& t);
// The other operand of a binary op with `like`: a Tensor as it is; a number or array as a constant
// of like's precision family (f64 for f64, else f32).
Var operand(nb::handle value, const Var& like);
// dim=None (every dimension), an int or a sequence of ints, each wrapped into [0, ndim) (IndexError outside).
std::vector<int> dims_from(nb::handle dim, size_t ndim);
// A shape (a sequence of ints, one of them possibly -1) for `numel` elements.
Shape shape_argument(nb::handle shape, int64_t numel);
// x[key] for ints, slices of step 1, ... and None (differentiable: slices and a reshape).
Var index(const Var& x, nb::handle key);
// A dimension index in [0, ndim) from one that may count from the end; IndexError outside.
int64_t dim_index(int64_t d, size_t ndim);

// --- (data, scale) pairs of torch tensors (scaled_pair_bindings.cpp). ---
// A CPU tensor's memory as an engine tensor, no copy (float16/bfloat16/float32/float64, int64).
Tensor borrowed_tensor(nb::handle data, const char* what);
// A (data, scale) tuple: scale a power of two, None (unscaled) or 0.0 (ANY).
ScaledTensor scaled_pair(nb::handle pair, const char* what);
// An engine tensor as a torch tensor sharing its buffer (FP8 / FP6 codes as uint8).
nb::object torch_tensor(const Tensor& t);
nb::tuple pair_of(const ScaledTensor& x);

// Each binds one part of the module scalify._scalify.
void bind_formats(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_recipes(nb::module_& m);
void bind_training(nb::module_& m);
void bind_torch_linear(nb::module_& m);
void bind_scaled_pairs(nb::module_& m);
// The backward rules and fused ops, into the submodule `scaled` (called by bind_scaled_pairs).
void bind_scaled_grads(nb::module_& scaled);

}  // namespace scalify::python
