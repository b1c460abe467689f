#pragma once
// Reverse-mode automatic differentiation. A Var holds a value (a Tensor) and, when it was computed
// from Vars that require gradients, the Node that made it: the inputs and a backward function
// mapping the output gradient to one gradient per input. backward() walks the graph in reverse
// topological order, sums gradients of reused values, stores them on leaves, and frees the graph.
//
// Values are Tensors for now; the scale-propagation issue turns them into scaled tensors with
// scale 1 when unscaled, so every op's forward and backward sits in one small function in
// functions.cpp where a scale rule can be attached beside it.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify {

class Var;
// Gradients for each input (an undefined Tensor where an input needs none).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

namespace detail {
struct VarImpl;
struct Node {
  std::string name;
  std::vector<std::shared_ptr<VarImpl>> inputs;
  BackwardFn backward;
};
struct VarImpl {
  Tensor value;
  Tensor grad;
  bool requires_grad = false;
  std::shared_ptr<Node> node;  // null for leaves and constants
};
}  // namespace detail

class Var {
 public:
  Var() = default;
  // A leaf. Parameters are leaves with requires_grad = true.
  explicit Var(Tensor value, bool requires_grad = false);

  const Tensor& value() const;
  const Tensor& grad() const;  // undefined until backward reached this leaf
  bool requires_grad() const;
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return value().shape(); }

  void set_requires_grad(bool r);
  void zero_grad();
  void set_value(Tensor v);  // for optimizers: replace a leaf's value in place
  Var detach() const;        // same value, no history

  // Backpropagate from a single-element value (gradient 1), or with an explicit seed gradient.
  void backward() const;
  void backward(const Tensor& grad_output) const;

  // Records an op: `value` computed from `inputs`, differentiated by `backward`. Records nothing
  // when no input requires gradients or inside a NoGrad scope. This is also the public way to
  // write a custom function with its own backward.
  static Var make(std::string name, Tensor value, const std::vector<Var>& inputs, BackwardFn backward);

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

}  // namespace scalify
