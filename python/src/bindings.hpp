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

// Each binds one part of the module scalify._scalify.
void bind_formats(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_recipes(nb::module_& m);
void bind_training(nb::module_& m);

}  // namespace scalify::python
