// The engine's ops as functions (scalify.matmul, scalify.softmax, ...), SCALIFY's scale primitives
// and unit scaling's ops (scalify.unit). Every op takes keywords; Tensor methods call the same ops.
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

using namespace nb::literals;

void bind_ops(nb::module_& m) {
  m.def(
      "as_scaled",
      [](nb::handle values, const std::string& dtype, bool requires_grad) {
        return Var(as_scaled(tensor_from_object(values, "as_scaled"), parse_dtype(dtype)), requires_grad);
      },
      "values"_a, "dtype"_a = "f32", "requires_grad"_a = true,
      nb::sig("def as_scaled(values: numpy.typing.ArrayLike, dtype: str = 'f32', requires_grad: bool = True) -> Tensor"),
      "A scaled tensor of unit-RMS data (scale = pow2(rms)), its data stored in dtype (f32, f16, bf16, ...)");
  m.def(
      "matmul", [](const Var& a, nb::handle b) { return matmul(a, operand(b, a)); }, "a"_a, "b"_a,
      nb::sig("def matmul(a: Tensor, b: Tensor | numpy.typing.ArrayLike) -> Tensor"),
      "a @ b over the last two dimensions, batch dimensions broadcast");
  m.def(
      "add", [](const Var& a, nb::handle b) { return a + operand(b, a); }, "a"_a, "b"_a,
      nb::sig("def add(a: Tensor, b: Tensor | float | numpy.typing.ArrayLike) -> Tensor"), "a + b, broadcast");
  m.def(
      "mul", [](const Var& a, nb::handle b) { return a * operand(b, a); }, "a"_a, "b"_a,
      nb::sig("def mul(a: Tensor, b: Tensor | float | numpy.typing.ArrayLike) -> Tensor"), "a * b, broadcast");
  struct UnaryOp {
    const char* name;
    ops::Unary op;
    const char* doc;
  };
  for (const UnaryOp& u : {UnaryOp{"relu", ops::Unary::relu, "max(x, 0), elementwise"},
                           UnaryOp{"gelu", ops::Unary::gelu_tanh, "GELU, tanh approximation (GPT-2's), elementwise"},
                           UnaryOp{"gelu_erf", ops::Unary::gelu_erf, "GELU, exact (erf), elementwise"},
                           UnaryOp{"silu", ops::Unary::silu, "x sigmoid(x), elementwise"},
                           UnaryOp{"tanh", ops::Unary::tanh, "The hyperbolic tangent, elementwise"},
                           UnaryOp{"sigmoid", ops::Unary::sigmoid, "1 / (1 + exp(-x)), elementwise"},
                           UnaryOp{"exp", ops::Unary::exp, "e to the power x, elementwise"},
                           UnaryOp{"log", ops::Unary::log, "The natural logarithm, elementwise"}})
    m.def(
        u.name, [op = u.op](const Var& x) { return unary(op, x); }, "x"_a, u.doc);
  m.def(
      "softmax", [](const Var& x, int dim) { return softmax(x, dim); }, "x"_a, "dim"_a = -1, "Softmax over dimension dim");
  m.def(
      "log_softmax", [](const Var& x, int dim) { return log_softmax(x, dim); }, "x"_a, "dim"_a = -1,
      "log(softmax(x)) over dimension dim, computed stably");
  m.def(
      "layer_norm",
      [](const Var& x, std::optional<Var> w, std::optional<Var> b, double eps) {
        return layer_norm(x, w.value_or(Var()), b.value_or(Var()), eps);
      },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5,
      "Layer normalisation over the last dimension, then x weight + bias when given");
  m.def(
      "cross_entropy",
      [](const Var& logits, const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& targets) {
        return cross_entropy(logits, ids_from(targets));
      },
      "logits"_a, "targets"_a, "Mean cross-entropy of logits [N, V] against int64 targets [N]");
  m.def(
      "embedding", [](const Var& weight, const IdArray& ids) { return embedding(weight, ids_from(ids)); }, "weight"_a, "ids"_a,
      "The rows of weight [V, D] that int64 ids (any shape, each in [0, V)) name: [*ids.shape, D]; the weight's\n"
      "gradient sums each id's rows in order");
  m.def(
      "causal_self_attention", [](const Var& qkv, int64_t heads) { return causal_self_attention(qkv, heads); }, "qkv"_a, "heads"_a,
      "Causal multi-head attention on a packed projection qkv [B, T, 3D] = [q | k | v] -> [B, T, D]: per head\n"
      "softmax(mask(q k^T / sqrt(D / heads))) v, one fused kernel forward and one backward (the engine GPT's)");
  m.def(
      "sum", [](const Var& x, nb::handle dim, bool keepdim) { return sum(x, dims_from(dim, x.shape().size()), keepdim); }, "x"_a,
      "dim"_a = nb::none(), "keepdim"_a = false,
      nb::sig("def sum(x: Tensor, dim: int | collections.abc.Sequence[int] | None = None, keepdim: bool = False) -> Tensor"),
      "The sum over dim (every dimension when None)");
  m.def(
      "mean", [](const Var& x, nb::handle dim, bool keepdim) { return mean(x, dims_from(dim, x.shape().size()), keepdim); }, "x"_a,
      "dim"_a = nb::none(), "keepdim"_a = false,
      nb::sig("def mean(x: Tensor, dim: int | collections.abc.Sequence[int] | None = None, keepdim: bool = False) -> Tensor"),
      "The mean over dim (every dimension when None)");
  m.def(
      "reshape", [](const Var& x, nb::handle shape) { return reshape(x, shape_argument(shape, x.scaled().data.numel())); }, "x"_a,
      "shape"_a, nb::sig("def reshape(x: Tensor, shape: collections.abc.Sequence[int]) -> Tensor"),
      "The same values in `shape` (one dimension may be -1)");
  m.def(
      "transpose", [](const Var& x, int dim0, int dim1) { return transpose(x, dim0, dim1); }, "x"_a, "dim0"_a, "dim1"_a,
      "x with dimensions dim0 and dim1 swapped");
  // SCALIFY's primitives (seed 000): no-ops on the represented value.
  m.def(
      "set_scaling", [](const Var& x, float s) { return set_scaling(x, s); }, "x"_a, "scale"_a,
      "SCALIFY's set_scaling: the same value with its data re-expressed against `scale`; backward: identity");
  m.def(
      "rebalance", [](const Var& x, float d) { return rebalance(x, d); }, "x"_a, "delta"_a,
      "SCALIFY's rebalance: scale x delta, data / delta (the same value); backward: identity");
  m.def(
      "dynamic_rescale", [](const Var& x) { return dynamic_rescale_l2(x); }, "x"_a,
      "SCALIFY's dynamic rescaling: rebalance by the power of two nearest rms(data); backward: identity");
  m.def(
      "dynamic_rescale_grad", [](const Var& x) { return dynamic_rescale_l2_grad(x); }, "x"_a,
      "Forward: identity; backward: the gradient rebalanced by the power of two nearest its data's rms");
  m.def(
      "cast_on_forward", [](const Var& x, const std::string& f) { return cast_on_forward(x, parse_format(f)); }, "x"_a, "format"_a,
      "The data quantised into `format` (nearest even, saturating), the scale kept; backward: identity");
  m.def(
      "cast_on_backward", [](const Var& x, const std::string& f) { return cast_on_backward(x, parse_format(f)); }, "x"_a, "format"_a,
      "Forward: identity; backward: the gradient's data quantised into `format`");

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
      "x"_a, "w"_a, "constrain"_a = "x",
      "x [..., m] @ w [m, n] with Table A.2's factors: output m^-1/2, x's gradient n^-1/2, w's gradient\n"
      "rows^-1/2; `constrain` (none, x, w, both) names the non-cut edges whose factors are tied");
  u.def(
      "gelu", [](const Var& x, bool constrained) { return unit::gelu(x, constrained); }, "x"_a, "constrained"_a = false,
      "GELU with Table A.2's factors; constrained: one factor forward and backward (their geometric mean)");
  u.def(
      "relu", [](const Var& x, bool constrained) { return unit::relu(x, constrained); }, "x"_a, "constrained"_a = false,
      "ReLU with Table A.2's factors; constrained: one factor forward and backward (their geometric mean)");
  u.def(
      "softmax", [](const Var& x) { return unit::softmax(x); }, "x"_a,
      "Softmax over the last dimension of size s, scaled by s forward and backward (an output of ~ones)");
  u.def(
      "layer_norm",
      [](const Var& x, std::optional<Var> w, std::optional<Var> b) { return unit::layer_norm(x, w.value_or(Var()), b.value_or(Var())); },
      "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(),
      "Layer normalisation over the last dimension; the weight and bias gradients scaled by rows^-1/2");
  u.def(
      "softmax_cross_entropy",
      [](const Var& logits, const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& targets) {
        return unit::softmax_cross_entropy(logits, ids_from(targets));
      },
      "logits"_a, "targets"_a, "Cross-entropy of logits [N, V] against int64 targets [N] scaled by s / sqrt(s - 1) backward (s classes)");
  u.def(
      "weighted_add", [](const std::vector<Var>& xs, const std::vector<double>& gammas) { return unit::weighted_add(xs, gammas); }, "xs"_a,
      "gammas"_a, "sum_i gammas[i] xs[i] scaled by (sum gammas^2)^-1/2; each gradient by 1 / gammas[i]");
}

}  // namespace scalify::python
