// The C++ side of scalify.torch.Linear: the engine's quantised linear layer (quant::QLinear, the
// one the trainer runs) on torch's memory handed over by DLPack, in and out without a copy (the
// engine reads the inputs where they are; outputs own the engine's buffers). A forward keeps its
// graph in a LinearCall for the backward. The quantisers' state crosses as int64 rows a torch buffer holds (state_rows).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <bit>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::python {
namespace {

using namespace nb::literals;
using F32Matrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using StateRows = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A 2-D engine tensor as a NumPy array sharing its buffer (no copy: the array owns a reference).
nb::object shared_array(const Tensor& t) {
  const Tensor c = t.is_contiguous() ? t : t.contiguous();
  auto* held = new Tensor(c);
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const std::vector<size_t> shape = shape_to(c.shape());
  return nb::cast(nb::ndarray<nb::numpy, float>(held->data<float>(), shape.size(), shape.data(), owner));
}

// An engine tensor over the array's memory, no copy: the array (a torch tensor's storage) stays
// alive while the tensor does, released with the GIL held by whichever thread frees the tensor.
Tensor borrowed(const F32Matrix& a) {
  auto* held = new F32Matrix(a);
  std::shared_ptr<const void> owner(held->data(), [held](const void*) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: leak rather than touch it
    nb::gil_scoped_acquire gil;
    delete held;
  });
  return Tensor::borrow(a.data(), {int64_t(a.shape(0)), int64_t(a.shape(1))}, DType::f32, std::move(owner));
}

// One training forward's graph: what its backward needs, and the micro-batch it belongs to
// (-1: none), so that its backward quantises in the same micro-batch wherever it runs.
struct LinearCall {
  Var x, w, y;
  int64_t micro_batch = -1;
  bool done = false;
};

// quant::MicroBatchScope where a micro-batch is given (>= 0), nothing otherwise.
struct OptionalMicroBatch {
  explicit OptionalMicroBatch(int64_t index) {
    if (index >= 0) scope.emplace(index);
  }
  std::optional<quant::MicroBatchScope> scope;
};

// Every quantiser of a layer as it stood, the open step included: restoring it undoes what the
// quantisations since did (activation checkpointing's recomputed forward, model.eval()).
struct QuantizerSnapshot {
  std::vector<quant::Quantizer> quantizers;
};

struct TorchLinear {
  quant::QLinear layer;
  std::string name;
};

// Each quantiser's state as one int64 row: steps, history length, the scale's f32 bits, then the
// history's f32 bits (zeros past its length). Integer rows survive model.half() and .to(dtype).
constexpr int64_t kStateHead = 3;

int64_t state_width(const TorchLinear& l) {
  int64_t h = 0;
  for (const auto& [name, q] : l.layer.quantizers()) h = std::max<int64_t>(h, q->config().history);
  return kStateHead + h;
}

// The layer's forward, the GIL released: recording gradients (training: the quantisers advance, or
// join micro_batch's step) or not (inference: their state stays as training left it).
Var run_layer(TorchLinear& t, const Var& x, const Var& w, bool training, int64_t micro_batch) {
  nb::gil_scoped_release release;
  const OptionalMicroBatch scope(micro_batch);
  if (training) return t.layer(x, w);
  NoGrad no_grad;
  return t.layer(x, w);
}

}  // namespace

void bind_torch_linear(nb::module_& m) {
  nb::class_<LinearCall>(m, "LinearCall", "One forward of a quantised linear layer, kept for its backward")
      .def(
          "backward",
          [](LinearCall& c, F32Matrix grad_output) {
            if (c.done) throw Error("linear: this forward's backward already ran (its graph is freed)");
            if (grad_output.shape(0) != size_t(c.y.shape()[0]) || grad_output.shape(1) != size_t(c.y.shape()[1]))
              throw Error("linear: the output gradient's shape differs from the output's " + shape_str(c.y.shape()));
            const Tensor g = borrowed(grad_output);
            {
              nb::gil_scoped_release release;
              const OptionalMicroBatch scope(c.micro_batch);
              c.y.backward(g);
            }
            c.done = true;
            return nb::make_tuple(shared_array(c.x.grad()), shared_array(c.w.grad()));
          },
          "grad_output"_a, nb::sig("def backward(self, grad_output: typing.Any) -> tuple[typing.Any, typing.Any]"),
          "(input gradient [rows, in], weight gradient [in, out]) from the output's gradient [rows, out]")
      .def(
          "backward_scaled",
          [](LinearCall& c, nb::handle grad_output) {
            if (c.done) throw Error("linear: this forward's backward already ran (its graph is freed)");
            const ScaledTensor g = scaled_pair(grad_output, "linear gradient");
            if (g.shape() != c.y.shape())
              throw Error("linear: the output gradient's shape differs from the output's " + shape_str(c.y.shape()));
            {
              nb::gil_scoped_release release;
              const OptionalMicroBatch scope(c.micro_batch);
              c.y.backward(g);
            }
            c.done = true;
            return nb::make_tuple(pair_of(c.x.scaled_grad()), pair_of(c.w.scaled_grad()));
          },
          "grad_output"_a,
          nb::sig("def backward_scaled(self, grad_output: tuple[typing.Any, float | None]) -> "
                  "tuple[tuple[typing.Any, float | None], tuple[typing.Any, float | None]]"),
          "backward with (data, scale) pairs (scalify.torch.ScaledTensor): (input gradient, weight gradient [in, out])");

  nb::class_<QuantizerSnapshot>(m, "QuantizerSnapshot", "A quantised linear layer's quantisers as they stood (QuantizedLinear.snapshot)");

  nb::class_<TorchLinear>(m, "QuantizedLinear", "The engine's quantised linear layer (quant::QLinear) for scalify.torch.Linear")
      .def(
          "__init__",
          [](TorchLinear* t, const quant::LinearRecipe& recipe, const std::string& name) {
            new (t) TorchLinear{quant::QLinear(recipe, quant::layer_stream(name)), name};
          },
          "recipe"_a, "name"_a)
      .def(
          "forward",
          [](TorchLinear& t, F32Matrix x, F32Matrix weight_t, bool training, int64_t micro_batch) -> nb::tuple {
            // weight_t: the weight as the engine holds it, [in, out] (torch's weight transposed).
            if (x.shape(1) != weight_t.shape(0))
              throw Error("linear: input [" + std::to_string(x.shape(0)) + ", " + std::to_string(x.shape(1)) +
                          "] does not match the layer's " + std::to_string(weight_t.shape(0)) + " input features");
            const Var xv(borrowed(x), training), wv(borrowed(weight_t), training);
            const Var y = run_layer(t, xv, wv, training, micro_batch);
            nb::object out = shared_array(y.value());
            if (!training) return nb::make_tuple(out, nb::none());
            return nb::make_tuple(out, nb::cast(LinearCall{xv, wv, y, micro_batch}));
          },
          "x"_a, "weight_t"_a, "training"_a, "micro_batch"_a = -1,
          nb::sig("def forward(self, x: typing.Any, weight_t: typing.Any, training: bool, micro_batch: int = -1) -> "
                  "tuple[typing.Any, LinearCall | None]"),
          "(output [rows, out], the call for backward or None); micro_batch >= 0: the forward and its backward "
          "belong to that micro-batch of the open step (commit_step closes it)")
      .def(
          "forward_scaled",
          [](TorchLinear& t, nb::handle x_pair, nb::handle weight_pair, bool training, int64_t micro_batch) -> nb::tuple {
            // SCALIFY: the operands keep their propagated scales (the engine's QLinear on scaled tensors).
            const Var xv(scaled_pair(x_pair, "linear input"), training), wv(scaled_pair(weight_pair, "linear weight"), training);
            if (xv.shape().size() != 2 || wv.shape().size() != 2 || xv.shape()[1] != wv.shape()[0])
              throw Error("linear: input " + shape_str(xv.shape()) + " does not match the weight " + shape_str(wv.shape()) + " [in, out]");
            const Var y = run_layer(t, xv, wv, training, micro_batch);
            nb::object out = pair_of(y.scaled());
            if (!training) return nb::make_tuple(out, nb::none());
            return nb::make_tuple(out, nb::cast(LinearCall{xv, wv, y, micro_batch}));
          },
          "x"_a, "weight_t"_a, "training"_a, "micro_batch"_a = -1,
          nb::sig("def forward_scaled(self, x: tuple[typing.Any, float | None], weight_t: tuple[typing.Any, float | None], "
                  "training: bool, micro_batch: int = -1) -> tuple[tuple[typing.Any, float | None], LinearCall | None]"),
          "forward on (data, scale) pairs (scalify.torch.ScaledTensor): x [rows, in], the weight [in, out]")
      .def(
          "commit_step",
          [](TorchLinear& t) {
            for (const auto& q : t.layer.quantizers()) q.second->commit_step();
          },
          "Closes the step its micro-batches belonged to: each quantiser advances once per call, as the trainer's step")
      .def(
          "snapshot",
          [](const TorchLinear& t) {
            QuantizerSnapshot s;
            for (const auto& q : t.layer.quantizers()) s.quantizers.push_back(*q.second);
            return s;
          },
          "Every quantiser as it stands, the open step included")
      .def(
          "restore",
          [](TorchLinear& t, const QuantizerSnapshot& s) {
            const auto qs = t.layer.quantizers();
            if (s.quantizers.size() != qs.size()) throw Error("linear: a snapshot of another layer");
            for (size_t i = 0; i < qs.size(); ++i) *qs[i].second = s.quantizers[i];
          },
          "snapshot"_a, "Puts every quantiser back as snapshot() found it")
      .def("state_width", &state_width, "Columns of the state rows (3 + the longest amax history)")
      .def(
          "save_state",
          [](const TorchLinear& t, StateRows rows) {
            const auto qs = t.layer.quantizers();
            if (rows.shape(0) != qs.size() || int64_t(rows.shape(1)) != state_width(t))
              throw Error("linear: the state buffer's shape does not match the recipe's quantisers");
            int64_t* out = rows.data();
            std::memset(out, 0, rows.size() * sizeof(int64_t));
            for (size_t i = 0; i < qs.size(); ++i, out += rows.shape(1)) {
              const quant::QuantizerState s = qs[i].second->state();
              out[0] = s.steps;
              out[1] = int64_t(s.history.size());
              out[2] = std::bit_cast<uint32_t>(s.scale);
              for (size_t h = 0; h < s.history.size(); ++h) out[kStateHead + int64_t(h)] = std::bit_cast<uint32_t>(s.history[h]);
            }
          },
          "rows"_a.noconvert(), nb::sig("def save_state(self, rows: typing.Any) -> None"),
          "Writes every quantiser's state into rows (int64 [6, state_width])")
      .def(
          "load_state",
          [](TorchLinear& t, StateRows rows) {
            const auto qs = t.layer.quantizers();
            if (rows.shape(0) != qs.size() || int64_t(rows.shape(1)) != state_width(t))
              throw Error("linear: the state buffer's shape does not match the recipe's quantisers");
            const int64_t* in = rows.data();
            std::vector<quant::QuantizerState> states;  // every row checked before any quantiser changes
            for (size_t i = 0; i < qs.size(); ++i, in += rows.shape(1)) {
              if (in[0] < 0 || in[1] < 0 || in[1] > int64_t(rows.shape(1)) - kStateHead || in[1] > int64_t(qs[i].second->config().history))
                throw Error("linear '" + t.name + "': quantiser " + qs[i].first + "'s saved state is not one this layer wrote");
              quant::QuantizerState s;
              s.steps = in[0];
              s.scale = std::bit_cast<float>(uint32_t(in[2]));
              for (int64_t h = 0; h < in[1]; ++h) s.history.push_back(std::bit_cast<float>(uint32_t(in[kStateHead + h])));
              states.push_back(std::move(s));
            }
            for (size_t i = 0; i < qs.size(); ++i) qs[i].second->load_state(states[i]);
          },
          "rows"_a.noconvert(), nb::sig("def load_state(self, rows: typing.Any) -> None"),
          "Restores every quantiser's state from rows (as save_state wrote them)")
      .def(
          "statistics",
          [](const TorchLinear& t) {
            nb::list out;
            for (const auto& [role, q] : t.layer.quantizers()) {
              const quant::QuantStats& s = q->last();
              nb::dict d;
              d["operand"] = role;
              d["format"] = std::string(format_name(q->config().format));
              d["scaling"] = std::string(quant::scaling_name(q->config().scaling));
              d["steps"] = q->steps();
              d["amax"] = s.amax;
              d["scale"] = s.scale;
              d["underflow"] = s.underflow;
              d["underflow_energy"] = s.underflow_energy;
              d["clipped"] = s.clipped;
              out.append(d);
            }
            return out;
          },
          nb::sig("def statistics(self) -> list[dict[str, typing.Any]]"),
          "Each operand's quantiser: its format, scaling and the statistics of its last quantisation");
  m.def(
      "linear_recipe_for",
      [](const quant::Recipe& r, const std::string& layer, int block, int blocks) { return r.linear_for(layer, block, blocks); },
      "recipe"_a, "layer"_a, "block"_a, "blocks"_a, "The recipe's LinearRecipe for a layer (f32 where its high-precision layers keep it)");
}

}  // namespace scalify::python
