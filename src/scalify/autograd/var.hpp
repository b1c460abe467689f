#pragma once
// Reverse-mode automatic differentiation. A Var holds a value (a Tensor) and, when it was computed
// from Vars that require gradients, the Node that made it: the inputs and a backward function
// mapping the output gradient to one gradient per input. backward() walks the graph in reverse
// topological order, sums gradients of reused values, stores them on leaves, and frees the graph.
//
// Values and gradients are ScaledTensors (SPEC §2): an unscaled tensor is simply one without a
// scale, and every op in functions.cpp runs its forward and backward through the scale rules of
// scaled/scaled_ops, so scales propagate through the backward pass too. With no scaled input
// anywhere, every op takes the plain kernel and results are bit-identical to the unscaled engine.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalify/scaled/scaled_tensor.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify {

class Var;
// Gradients for each input (undefined data where an input needs none).
using BackwardFn = std::function<std::vector<ScaledTensor>(const ScaledTensor& grad_output)>;
// The same on plain tensors: for custom functions written without scales (applied to the
// represented values of scaled gradients).
using PlainBackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

namespace detail {
struct VarImpl;
struct Node {
  std::string name;
  std::vector<std::shared_ptr<VarImpl>> inputs;
  BackwardFn backward;
  bool promoted = true;  // Var::Storage::promoted: gradients are rounded into their inputs' storage
};
struct VarImpl {
  ScaledTensor value;
  ScaledTensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> node;  // null for leaves and constants
  bool graph_freed = false;    // computed by an op whose graph a backward() has freed
};
}  // namespace detail

class Var {
 public:
  Var() = default;
  // A leaf. Parameters are leaves with requires_grad = true.
  explicit Var(Tensor value, bool requires_grad = false);
  explicit Var(ScaledTensor value, bool requires_grad = false);

  // The represented value (data * scale; the data itself when unscaled) and gradient.
  Tensor value() const;
  Tensor grad() const;                      // undefined until backward reached this leaf
  const ScaledTensor& scaled() const;       // (data, scale) as propagated
  const ScaledTensor& scaled_grad() const;  // undefined data until backward reached this leaf
  bool requires_grad() const;
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return scaled().data.shape(); }

  void set_requires_grad(bool r);
  void zero_grad();
  void set_grad(ScaledTensor g);  // for gradient transforms (loss scaling, clipping)
  void set_value(Tensor v);       // for optimizers: replace a leaf's value in place
  void set_value(ScaledTensor v);
  Var detach() const;  // same value, no history

  // Backpropagate from a single-element value (gradient 1), or with an explicit seed gradient.
  // The graph is freed afterwards: a second backward() through it throws (recompute the forward).
  void backward() const;
  void backward(const Tensor& grad_output) const;
  void backward(const ScaledTensor& grad_output) const;

  // Records an op: `value` computed from `inputs`, differentiated by `backward`. Records nothing
  // when no input requires gradients or inside a NoGrad scope. This is also the public way to
  // write a custom function with its own backward.
  // Data precision (autograd/data_precision.hpp): with `promoted` the value's data is rounded into
  // the storage its inputs promote to, and each input's gradient into that input's storage when it
  // is 16 bits or wider (FP8 and narrower values come from explicit casts, whose recipes choose
  // their gradients' format); with `as_computed` (casts, losses) both are kept as computed.
  enum class Storage : uint8_t { promoted, as_computed };
  static Var make(std::string name, ScaledTensor value, const std::vector<Var>& inputs, BackwardFn backward,
                  Storage storage = Storage::promoted);
  static Var make(std::string name, Tensor value, const std::vector<Var>& inputs, PlainBackwardFn backward);
  // The storage an op's output data takes from these inputs (what make rounds into; `computed`
  // when only weakly typed scalar constants are given): ops whose backward keeps their output
  // round it first, so the graph holds the stored copy only.
  static DType storage_for(const std::vector<Var>& inputs, DType computed);

  const std::string& op_name() const;  // "" for leaves
  size_t graph_inputs() const;         // inputs of the node that made this value (0 for leaves)

 private:
  std::shared_ptr<detail::VarImpl> impl_;
};

// While alive, ops record no graph (evaluation, optimizer updates).
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool previous_;
};
bool grad_enabled();

// Two gradients of one value summed in the value's storage (`storage`, its data dtype): how
// backward() sums the gradients of a reused value and a leaf accumulates over backward() calls,
// and so how data parallelism sums the ranks' gradients.
ScaledTensor accumulate_gradient(const ScaledTensor& sum, const ScaledTensor& g, DType storage);
// The storage a leaf's gradients are summed in: the leaf's data dtype; but the gradient's own for
// an unscaled gradient of a scaled leaf (a scaled master weight read through its represented
// value, quant::QLinear), which the leaf's data has no scale for.
DType gradient_storage(const ScaledTensor& leaf, const ScaledTensor& grad);

}  // namespace scalify
