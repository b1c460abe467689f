#include "scalify/autograd/var.hpp"

#include <unordered_map>
#include <unordered_set>

#include "scalify/autograd/data_precision.hpp"
#include "scalify/error.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify {

namespace {
thread_local bool g_grad_enabled = true;
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGrad::NoGrad() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGrad::~NoGrad() { g_grad_enabled = previous_; }

Var::Var(Tensor value, bool requires_grad) : Var(ScaledTensor(std::move(value)), requires_grad) {}

Var::Var(ScaledTensor value, bool requires_grad) : impl_(std::make_shared<detail::VarImpl>()) {
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
}

const ScaledTensor& Var::scaled() const {
  if (!impl_) throw Error("use of an undefined Var");
  return impl_->value;
}
const ScaledTensor& Var::scaled_grad() const { return scaled(), impl_->grad; }
Tensor Var::value() const { return scaled().is_scaled() ? scaled().value() : scaled().data; }
Tensor Var::grad() const {
  const ScaledTensor& g = scaled_grad();
  return g.data.defined() && g.is_scaled() ? g.value() : g.data;
}
bool Var::requires_grad() const { return impl_ && impl_->requires_grad; }
void Var::set_requires_grad(bool r) {
  value();
  if (impl_->node) throw Error("set_requires_grad: only leaves can change requires_grad");
  impl_->requires_grad = r;
}
void Var::zero_grad() { scaled(), impl_->grad = ScaledTensor(); }
void Var::set_grad(ScaledTensor g) {
  if (g.data.defined() && g.shape() != shape())
    throw Error("set_grad: gradient shape " + shape_str(g.shape()) + " differs from " + shape_str(shape()));
  scaled(), impl_->grad = std::move(g);
}
void Var::set_value(Tensor v) { set_value(ScaledTensor(std::move(v))); }
void Var::set_value(ScaledTensor v) {
  scaled();
  if (v.shape() != impl_->value.shape())
    throw Error("set_value: shape " + shape_str(v.shape()) + " differs from " + shape_str(impl_->value.shape()));
  impl_->value = std::move(v);
}
Var Var::detach() const { return Var(scaled(), false); }
const std::string& Var::op_name() const {
  static const std::string leaf;
  return impl_ && impl_->node ? impl_->node->name : leaf;
}
size_t Var::graph_inputs() const { return impl_ && impl_->node ? impl_->node->inputs.size() : 0; }

Var Var::make(std::string name, Tensor value, const std::vector<Var>& inputs, PlainBackwardFn backward) {
  return make(std::move(name), ScaledTensor(std::move(value)), inputs, [backward](const ScaledTensor& g) {
    std::vector<ScaledTensor> out;
    for (Tensor& t : backward(g.is_scaled() ? g.value() : g.data)) out.emplace_back(std::move(t));
    return out;
  });
}

DType Var::storage_for(const std::vector<Var>& inputs, DType computed) {
  // Broadcast scalar constants (a mask's -inf fill) are weakly typed, as JAX's Python scalars:
  // they do not pull an f16 graph up to their f32.
  std::vector<DType> in;
  for (const Var& v : inputs)
    if (v.defined() && (v.requires_grad() || v.impl_->node || v.scaled().data.numel() != 1)) in.push_back(v.scaled().data.dtype());
  return in.empty() ? computed : promoted_storage(in);
}

Var Var::make(std::string name, ScaledTensor value, const std::vector<Var>& inputs, BackwardFn backward, Storage storage) {
  if (storage == Storage::promoted && value.data.defined())
    value.data = to_storage(value.data, storage_for(inputs, value.data.dtype()), name);
  Var out(std::move(value), false);
  if (!g_grad_enabled) return out;
  bool any = false;
  for (const Var& v : inputs) any = any || v.requires_grad();
  if (!any) return out;
  auto node = std::make_shared<detail::Node>();
  node->name = std::move(name);
  for (const Var& v : inputs) node->inputs.push_back(v.impl_);
  node->backward = std::move(backward);
  node->promoted = storage == Storage::promoted;
  out.impl_->requires_grad = true;
  out.impl_->node = std::move(node);
  return out;
}

DType gradient_storage(const ScaledTensor& leaf, const ScaledTensor& grad) {
  return leaf.is_scaled() && !grad.is_scaled() && grad.data.defined() ? grad.data.dtype() : leaf.data.dtype();
}

ScaledTensor accumulate_gradient(const ScaledTensor& sum, const ScaledTensor& g, DType storage) {
  ScaledTensor out = scaled::add(sum, g, kernel_store_as(storage));
  if (dtype_size(storage) >= 2) out.data = to_storage(out.data, storage, "grad accumulation");
  return out;
}

void Var::backward() const {
  const Tensor& d = scaled().data;
  if (d.numel() != 1)
    throw Error("backward(): needs a single-element value, got shape " + shape_str(d.shape()) +
                "; pass the gradient of the value: backward(gradient), a tensor of its shape");
  const Tensor one = Tensor::ones(d.shape(), d.dtype() == DType::f64 ? DType::f64 : DType::f32);
  // A scaled loss seeds a scaled gradient (scale 1), so the backward pass runs the scale rules.
  backward(scaled().is_scaled() ? ScaledTensor(one, 1.0f) : ScaledTensor(one));
}

void Var::backward(const Tensor& grad_output) const { backward(ScaledTensor(grad_output)); }

void Var::backward(const ScaledTensor& grad_output) const {
  if (!requires_grad()) throw Error("backward(): the value does not require gradients");
  if (grad_output.shape() != shape())
    throw Error("backward(): gradient shape " + shape_str(grad_output.shape()) + " differs from value shape " + shape_str(shape()));
  // Reverse topological order by iterative depth-first search over nodes.
  std::vector<detail::VarImpl*> order;
  std::unordered_set<detail::VarImpl*> seen;
  std::vector<std::pair<detail::VarImpl*, size_t>> stack{{impl_.get(), 0}};
  seen.insert(impl_.get());
  while (!stack.empty()) {
    auto& [v, next] = stack.back();
    // Its history is gone: backpropagating would silently stop here and leave the leaves' gradients wrong.
    if (v->graph_freed) throw Error("backward(): the graph was already freed by an earlier backward(); run the forward pass again");
    if (v->node && next < v->node->inputs.size()) {
      detail::VarImpl* in = v->node->inputs[next++].get();
      if (in->requires_grad && seen.insert(in).second) stack.push_back({in, 0});
    } else {
      order.push_back(v);
      stack.pop_back();
    }
  }
  std::unordered_map<detail::VarImpl*, ScaledTensor> grads;
  grads[impl_.get()] = grad_output;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    detail::VarImpl* v = *it;
    auto g = grads.find(v);
    if (g == grads.end()) continue;
    if (!v->node) {  // a leaf: accumulate into .grad, in the leaf's storage
      v->grad = v->grad.data.defined() ? accumulate_gradient(v->grad, g->second, gradient_storage(v->value, v->grad)) : g->second;
      continue;
    }
    const std::vector<ScaledTensor> in_grads = v->node->backward(g->second);
    if (in_grads.size() != v->node->inputs.size())
      throw Error("backward of '" + v->node->name + "' returned " + std::to_string(in_grads.size()) + " gradients for " +
                  std::to_string(v->node->inputs.size()) + " inputs");
    for (size_t i = 0; i < in_grads.size(); ++i) {
      detail::VarImpl* in = v->node->inputs[i].get();
      if (!in->requires_grad || !in_grads[i].data.defined()) continue;
      if (in_grads[i].shape() != in->value.shape())
        throw Error("backward of '" + v->node->name + "': gradient " + std::to_string(i) + " has shape " + shape_str(in_grads[i].shape()) +
                    ", input has " + shape_str(in->value.shape()));
      // The gradient's data takes the storage of the value it is the gradient of.
      ScaledTensor gi = in_grads[i];
      const DType storage = gradient_storage(in->value, gi);
      if (v->node->promoted && dtype_size(storage) >= 2) gi.data = to_storage(gi.data, storage, v->node->name + " grad");
      auto [slot, fresh] = grads.try_emplace(in, gi);
      if (!fresh) slot->second = accumulate_gradient(slot->second, gi, storage);  // a reused value
    }
    grads.erase(g);
  }
  // Free the graph: intermediate values keep their data but drop their history.
  for (detail::VarImpl* v : order)
    if (v->node) {
      v->node.reset();
      v->graph_freed = true;
    }
}

}  // namespace scalify
