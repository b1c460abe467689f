// scalify._scalify: the Python bindings (nanobind). Arrays cross without a copy where their dtype
// and layout already fit (NumPy arrays, any DLPack tensor on the CPU); scalify::Error becomes
// ValueError with the same message; long calls release the GIL. The Python package
// (python/scalify/__init__.py) wraps these with documented, keyword-friendly functions.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/autograd/scaling.hpp"
#include "scalify/compare/compare.hpp"
#include "scalify/formats/format.hpp"
#include "scalify/inspect/inspect.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/unit/unit_ops.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"

namespace nb = nanobind;
namespace fs = std::filesystem;
using namespace nb::literals;

namespace scalify::python {
namespace {

using FloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using CodeArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

Rounding parse_rounding(const std::string& r) {
  if (r == "nearest" || r == "nearest_even") return Rounding::nearest_even;
  if (r == "stochastic") return Rounding::stochastic;
  if (r == "toward_zero") return Rounding::toward_zero;
  throw Error("rounding must be 'nearest', 'stochastic' or 'toward_zero', got '" + r + "'");
}
const char* rounding_name(Rounding r) {
  return r == Rounding::nearest_even ? "nearest" : r == Rounding::stochastic ? "stochastic" : "toward_zero";
}

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

// Codes of `fmt` in their storage type (uint8, uint16 or uint32 per code).
// Buffers the bindings fill completely: not zeroed first (a wasted pass over 16M values).
using Bytes = std::vector<std::byte, DefaultInitAllocator<std::byte>>;
using Floats = std::vector<float, DefaultInitAllocator<float>>;

nb::object codes_array(Bytes bytes, Format fmt, const std::vector<size_t>& shape) {
  switch (info(fmt).storage_bytes()) {
    case 1: return owned_array<uint8_t>(std::move(bytes), shape);
    case 2: return owned_array<uint16_t>(std::move(bytes), shape);
    default: return owned_array<uint32_t>(std::move(bytes), shape);
  }
}

std::span<const std::byte> code_bytes(const CodeArray& codes, Format fmt) {
  const size_t cb = size_t(info(fmt).storage_bytes());
  if (codes.itemsize() != cb)
    throw Error(std::string("codes of ") + std::string(format_name(fmt)) + " take " + std::to_string(cb) +
                " byte(s) each, got an array of " + std::to_string(codes.itemsize()) + "-byte items");
  return {static_cast<const std::byte*>(codes.data()), codes.size() * cb};
}

nb::object quantize(FloatArray x, const std::string& format, float scale, const std::string& rounding, uint64_t seed, bool saturate) {
  const Format fmt = parse_format(format);
  QuantizeOptions o;
  o.rounding = parse_rounding(rounding);
  o.seed = seed;
  o.overflow = saturate ? Overflow::saturate : Overflow::non_saturating;
  Bytes out(x.size() * size_t(info(fmt).storage_bytes()));
  {
    nb::gil_scoped_release release;
    scalify::quantize(std::span(x.data(), x.size()), fmt, scale, out, o);
  }
  return codes_array(std::move(out), fmt, shape_of(x));
}

nb::object dequantize(CodeArray codes, const std::string& format, float scale) {
  const Format fmt = parse_format(format);
  const std::span<const std::byte> bytes = code_bytes(codes, fmt);
  Floats out(codes.size());
  {
    nb::gil_scoped_release release;
    scalify::dequantize(bytes, fmt, scale, out);
  }
  return owned_array<float>(std::move(out), shape_of(codes));
}

nb::tuple block_quantize(FloatArray x, const std::string& format, std::pair<size_t, size_t> block, const std::string& rule,
                         const std::string& rounding, uint64_t seed) {
  if (x.ndim() != 2) throw Error("block_quantize: needs a 2-D array, got " + std::to_string(x.ndim()) + " dimensions");
  const Format fmt = parse_format(format);
  BlockQuantized q;
  {
    nb::gil_scoped_release release;
    q = quantize_blocks(std::span(x.data(), x.size()), x.shape(0), x.shape(1), fmt,
                        BlockSpec{block.first, block.second, parse_block_rule(rule)}, parse_rounding(rounding), seed);
  }
  Bytes codes(q.codes.begin(), q.codes.end());
  const std::vector<size_t> scale_shape{q.scale_rows(), q.scale_cols()};
  return nb::make_tuple(codes_array(std::move(codes), fmt, shape_of(x)), owned_array<float>(std::move(q.scales), scale_shape),
                        q.tensor_scale);
}

nb::object block_dequantize(CodeArray codes, FloatArray scales, const std::string& format, std::pair<size_t, size_t> block,
                            const std::string& rule, float tensor_scale) {
  if (codes.ndim() != 2) throw Error("block_dequantize: codes must be a 2-D array");
  const Format fmt = parse_format(format);
  BlockQuantized q;
  q.element = fmt;
  q.rows = codes.shape(0);
  q.cols = codes.shape(1);
  q.block = BlockSpec{block.first, block.second, parse_block_rule(rule)};
  const std::span<const std::byte> bytes = code_bytes(codes, fmt);
  q.codes.assign(bytes.begin(), bytes.end());
  q.scales.assign(scales.data(), scales.data() + scales.size());
  q.tensor_scale = tensor_scale;
  Floats out(q.rows * q.cols);
  dequantize_blocks(q, out);
  return owned_array<float>(std::move(out), {q.rows, q.cols});
}

nb::list formats() {
  nb::list out;
  for (const FormatInfo& f : kFormats) {
    nb::dict d;
    d["name"] = std::string(f.name);
    d["bits"] = f.bits;
    d["exponent_bits"] = f.exp_bits;
    d["mantissa_bits"] = f.man_bits;
    d["max"] = max_value(f.id);
    d["min_normal"] = f.is_float() ? min_normal(f.id) : 1.0;
    d["min_subnormal"] = f.is_float() ? min_subnormal(f.id) : 1.0;
    d["has_inf"] = f.has_inf();
    d["has_nan"] = f.has_nan();
    out.append(d);
  }
  return out;
}

nb::dict train_result(const train::TrainResult& r);

// Trains as `scalify train --set KEY=VALUE ...` does; progress(step, steps, loss) after every
// step, with the GIL held only for it. Ctrl-C stops the run between steps (KeyboardInterrupt): its
// files are as an interrupted CLI run leaves them, resumable from the last checkpoint.
// Python drives one process: under mpirun its ranks could not stop together (Ctrl-C, a Python
// error in a callback), so several ranks are refused; `mpirun scalify train` is the way there.
void refuse_several_ranks() {
  if (platform::world().size() > 1)
    throw Error("the Python package trains on one process; for several, run `mpirun -np N scalify train` (docs/DATA_PARALLEL.md)");
}

// Python strings may hold NUL, which the file system reads as their end ("runs/a\0b" would be the
// folder "runs/a"): refused by name wherever text becomes a path or a config value.
const std::string& without_nul(const std::string& text, const std::string& what) {
  if (text.find('\0') == std::string::npos) return text;
  std::string shown;
  for (char ch : text) shown += ch == '\0' ? std::string("\\0") : std::string(1, ch);
  throw Error(what + " holds a NUL character: '" + shown + "'");
}

// Train config keys given as text (--set KEY=VALUE).
void apply_settings(train::TrainConfig& c, const std::map<std::string, std::string>& settings) {
  for (const auto& [k, v] : settings) {
    without_nul(k, "a config key");
    c.set(k, without_nul(v, "config key '" + k + "'"));
  }
}

// Where a new run's Recipe object goes for its config.toml to name: the run folder's recipe.json,
// which the trainer writes there for every new run anyway (the same text) and which stays with
// the run; never a path made from the recipe's name. One found there must be this recipe: another
// run's is refused, never overwritten.
std::string recipe_file_in_run(const std::string& out, const quant::Recipe& recipe) {
  const std::string file = (fs::absolute(out) / "recipe.json").lexically_normal().string();
  if (fs::exists(file)) {
    if (quant::load_recipe(file).to_json() != recipe.to_json())
      throw Error("train: '" + file + "' holds another recipe than '" + recipe.name +
                  "' (another run's); give another out, or delete it if that run is not wanted");
    return file;
  }
  io::make_folder(out);
  io::write_text_atomically(file, recipe.to_json() + "\n");
  return file;
}

// The config `scalify train` would train with: `settings` as --set KEY=VALUE; with resume, over
// the run's own config.toml as `scalify train --resume` does (train::resume_config). A Recipe
// object (`recipe`) is written into a new run's folder; on a resume it must be the run's.
train::TrainConfig train_config(const std::string& out, const std::map<std::string, std::string>& settings,
                                const std::optional<quant::Recipe>& recipe, bool resume) {
  without_nul(out, "out");
  auto apply = [&](train::TrainConfig& c) { apply_settings(c, settings); };
  if (resume) {
    train::TrainConfig c = train::resume_config(out, apply);
    if (recipe && recipe->to_json() != quant::load_recipe(c.recipe).to_json())
      throw Error("resume: recipe '" + recipe->name + "' differs from the one '" + out +
                  "' was trained with; a run keeps its recipe: start a new run to train under another");
    return c;
  }
  train::TrainConfig c;
  apply(c);
  c.out = out;
  if (recipe) {
    recipe->validate();
    c.validate();  // the other keys, before the run folder exists
    c.recipe = recipe_file_in_run(out, *recipe);
  }
  return c;
}

nb::dict train(const std::string& out, const std::map<std::string, std::string>& settings, const std::optional<quant::Recipe>& recipe,
               bool resume, std::function<void(int64_t, int64_t, double)> progress, bool save_initial) {
  refuse_several_ranks();
  const train::TrainConfig c = train_config(out, settings, recipe, resume);
  train::TrainResult r;
  {
    nb::gil_scoped_release release;
    r = train::train(
        c, resume,
        [&](const train::StepProgress& p) {
          nb::gil_scoped_acquire acquire;
          if (PyErr_CheckSignals() != 0) throw nb::python_error();
          if (progress) progress(p.step, p.steps, p.loss);
        },
        0, save_initial);
  }
  return train_result(r);
}

nb::dict train_result(const train::TrainResult& r) {
  nb::dict d;
  d["run_dir"] = r.run_dir;
  d["steps"] = r.steps;
  d["skipped"] = r.skipped;
  d["train_loss"] = r.train_loss;
  d["val_loss"] = r.val_loss;
  d["val_bpb"] = r.val_bpb;
  d["tokens_per_s"] = r.tokens_per_s;
  d["mean_underflow"] = r.mean_underflow;
  d["max_underflow"] = r.max_underflow;
  d["mean_clipped"] = r.mean_clipped;
  d["scale_statistics_per_step"] = r.scale_statistics_per_step;
  d["state_bytes_per_parameter"] = r.state_bytes_per_parameter;
  return d;
}

// `scalify compare` on `recipes` (a list spec: "seeds", "fp4", "f32,nvfp4", ...): one dict per
// recipe (its TrainResult's fields and the comparison's status, baseline and delta).
nb::list run_compare(const std::map<std::string, std::string>& settings, const std::string& recipes, const std::string& out, bool resume,
                     const std::string& seeds, int speed_rounds, std::function<void(const std::string&)> progress) {
  scalify::compare::CompareConfig c;
  refuse_several_ranks();
  without_nul(out, "compare: out");
  without_nul(recipes, "compare: recipes");
  if (resume) {
    c = scalify::compare::comparison_config(out);
  } else {
    apply_settings(c.base, settings);
    if (!settings.count("eval_every")) c.base.eval_every = scalify::compare::default_eval_every(c.base.steps);  // as the CLI
    c.recipes = scalify::compare::recipe_list(recipes);
    if (!seeds.empty()) c.seeds = scalify::compare::seed_list(seeds, c.base.seed);
    if (speed_rounds < 0 || speed_rounds > 100) throw scalify::Error("compare: speed_rounds must be 0 to 100");
    c.speed.rounds = speed_rounds;
  }
  c.out = out;
  scalify::compare::CompareReport rep;
  try {
    nb::gil_scoped_release release;
    rep = scalify::compare::compare(
        c, resume,
        [&](const std::string& line) {
          nb::gil_scoped_acquire acquire;
          try {
            if (PyErr_CheckSignals() != 0) throw nb::python_error();
            if (progress) progress(line);
          } catch (const nb::python_error&) {  // Ctrl-C, the callback's own error: the whole comparison stops
            throw scalify::compare::Stopped(std::current_exception());
          }
        },
        "python: scalify.compare");
  } catch (const scalify::compare::Stopped& stopped) {  // the GIL held again: raised as itself
    std::rethrow_exception(stopped.cause);
  }
  nb::list rows;
  for (const scalify::compare::RecipeOutcome& o : rep.rows) {
    nb::dict d = train_result(o.result);
    d["recipe"] = o.recipe;
    d["status"] = o.status;
    d["note"] = o.note;
    d["baseline"] = o.baseline;
    d["seeds"] = o.seeds;
    d["val_delta"] = o.val_delta;
    d["val_delta_ci95"] = o.noise.half_width;
    d["window_ci95"] = o.noise.window_half_width;
    d["seed_ci95"] = o.noise.seed_half_width;
    d["verdict"] = o.verdict;
    if (o.speed.vs_f32 > 0) {  // the interleaved timing (one thread), beside the training run's tokens_per_s
      d["speed_vs_f32"] = o.speed.vs_f32;
      d["speed_vs_f32_low"] = o.speed.vs_f32_low;
      d["speed_vs_f32_high"] = o.speed.vs_f32_high;
    }
    d["seconds"] = o.seconds;
    d["peak_memory_mb"] = o.peak_memory_mb;
    rows.append(d);
  }
  return rows;
}

// A safetensors file (a checkpoint, a quantised checkpoint): every tensor's values as float32
// (codes decoded: FP8 / FP4 codes as their format values, without their scales), and the metadata.
nb::tuple load_checkpoint(const std::string& path) {
  without_nul(path, "load_checkpoint: the path");
  const io::SafeTensors st = io::read_safetensors(path);
  nb::dict tensors;
  for (const auto& [name, t] : st.tensors) {
    std::vector<size_t> shape;
    for (int64_t d : t.shape()) shape.push_back(size_t(d));
    tensors[name.c_str()] = owned_array<float>(t.to_floats(), shape);
  }
  nb::dict meta;
  for (const auto& [k, v] : st.metadata) meta[k.c_str()] = v;
  return nb::make_tuple(tensors, meta);
}

// --- Tensors and autograd: the engine's Var (a value, possibly scaled, with its graph). ---

using AnyArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

Shape shape_from(const std::vector<size_t>& s) {
  Shape out;
  for (size_t d : s) out.push_back(int64_t(d));
  return out;
}
std::vector<size_t> shape_to(const Shape& s) {
  std::vector<size_t> out;
  for (int64_t d : s) out.push_back(size_t(d));
  return out;
}

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
Tensor ids_from(const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& a) {
  return Tensor::from_indices(std::vector<int64_t>(a.data(), a.data() + a.size()), shape_from(shape_of(a)));
}

void bind_autograd(nb::module_& m) {
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

// The trainer's GPT, built for a recipe from train config keys (d_model, layers, heads, seq, ...).
struct PyGpt {
  nn::Gpt model;
};

void bind_gpt(nb::module_& m) {
  nb::class_<PyGpt>(m, "Gpt", "The trainer's GPT (`nn::Gpt`), built from train config keys and a recipe")
      .def(
          "__init__",
          [](PyGpt* g, const std::map<std::string, std::string>& settings, const quant::Recipe& recipe) {
            train::TrainConfig c;
            apply_settings(c, settings);
            c.validate();
            recipe.validate();
            train::check_fits_in_memory(c, recipe, false);  // the CLI's refusal, not std::bad_alloc
            new (g) PyGpt{nn::Gpt(train::Session::model_config(c, recipe), c.seed, recipe)};
          },
          "settings"_a, "recipe"_a)
      .def(
          "parameters",
          [](const PyGpt& g) {
            nb::dict d;
            for (const auto& [name, v] : g.model.parameters()) d[name.c_str()] = v;
            return d;
          },
          "Every parameter by name, in the model's order (Tensors that require gradients)")
      .def(
          "loss",
          [](const PyGpt& g, const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& ids,
             const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& targets) {
            const Tensor i = ids_from(ids), t = ids_from(targets);
            nb::gil_scoped_release release;
            return g.model.loss(i, t);
          },
          "ids"_a, "targets"_a, "Mean next-token cross-entropy of ids [B, T] against targets [B, T]");
  m.def(
      "training_batch",
      [](const std::map<std::string, std::string>& settings, uint64_t index) {
        train::TrainConfig c;
        apply_settings(c, settings);
        const train::Corpus corpus = train::corpus_for(c);
        const train::Batch b =
            train::make_batch(corpus.train, train::train_starts(corpus.train.size(), c.batch, c.model.seq, c.seed, index), c.model.seq);
        auto ints = [](const Tensor& t) {
          std::vector<int64_t> v;
          for (double x : t.to_vector()) v.push_back(int64_t(x));
          return owned_array<int64_t>(std::move(v), shape_to(t.shape()));
        };
        return nb::make_tuple(ints(b.ids), ints(b.targets));
      },
      "settings"_a, "index"_a, "The ids and targets of the trainer's batch `index` for a config (its corpus, seed, batch, seq)");
}

// `scalify inspect` as data: one dict per tensor (name, kind, storage, scale_log2, rms, the
// counts against the format's range) with its exponent histogram as (exponents, counts) arrays.
nb::dict run_inspect(const std::string& checkpoint, const std::string& format, bool initial, uint64_t batch, const std::string& data) {
  without_nul(checkpoint, "inspect: the checkpoint");
  without_nul(data, "inspect: data");
  inspect::InspectOptions o;
  o.format = parse_format(format);
  o.initial = initial;
  o.batch = batch;
  o.data = data;
  inspect::Inspection r;
  {
    nb::gil_scoped_release release;
    r = inspect::inspect_checkpoint(checkpoint, o);
  }
  nb::list tensors;
  for (const inspect::InspectedTensor& t : r.tensors) {
    nb::dict d;
    d["name"] = t.name;
    d["kind"] = inspect::kind_name(t.kind);
    d["storage"] = std::string(dtype_name(t.storage));
    d["scale_log2"] = t.scale_log2;
    d["rms"] = t.rms;
    const inspect::ExponentHistogram& h = t.histogram;
    for (const auto& [key, n] : {std::pair("count", h.count), std::pair("zeros", h.zeros), std::pair("nonfinite", h.nonfinite),
                                 std::pair("underflow", h.underflow), std::pair("subnormal", h.subnormal), std::pair("normal", h.normal),
                                 std::pair("clipped", h.clipped)})
      d[key] = n;
    std::vector<int64_t> exps, counts;
    for (int e = h.lowest(); e <= h.highest(); ++e) {
      exps.push_back(e);
      counts.push_back(h.at(e));
    }
    const size_t n = exps.size();
    d["exponents"] = owned_array<int64_t>(std::move(exps), {n});
    d["counts"] = owned_array<int64_t>(std::move(counts), {n});
    tensors.append(d);
  }
  nb::dict out;
  out["recipe"] = r.recipe;
  out["step"] = r.step;
  out["format"] = std::string(format_name(r.format));
  out["tensors"] = tensors;
  return out;
}

void bind_recipes(nb::module_& m) {
  using quant::QuantizerConfig, quant::LinearRecipe, quant::HighPrecisionLayers, quant::Recipe;
  nb::class_<QuantizerConfig>(m, "QuantizerConfig", "How one GEMM operand is quantised: format, scaling, block, rounding, ...")
      .def(nb::init<>())
      .def_prop_rw(
          "scaling", [](const QuantizerConfig& c) { return std::string(quant::scaling_name(c.scaling)); },
          [](QuantizerConfig& c, const std::string& s) { c.scaling = quant::parse_scaling(s); })
      .def_prop_rw(
          "format", [](const QuantizerConfig& c) { return std::string(format_name(c.format)); },
          [](QuantizerConfig& c, const std::string& s) { c.format = parse_format(s); })
      .def_rw("margin", &QuantizerConfig::margin)
      .def_rw("history", &QuantizerConfig::history)
      .def_rw("update_interval", &QuantizerConfig::update_interval)
      .def_rw("bias", &QuantizerConfig::bias)
      .def_prop_rw(
          "block", [](const QuantizerConfig& c) { return std::pair(c.block.rows, c.block.cols); },
          [](QuantizerConfig& c, std::pair<size_t, size_t> b) {
            c.block.rows = b.first;
            c.block.cols = b.second;
          })
      .def_prop_rw(
          "block_scale", [](const QuantizerConfig& c) { return std::string(block_rule_name(c.block.rule)); },
          [](QuantizerConfig& c, const std::string& s) { c.block.rule = parse_block_rule(s); })
      .def_prop_rw(
          "rounding", [](const QuantizerConfig& c) { return std::string(rounding_name(c.rounding)); },
          [](QuantizerConfig& c, const std::string& s) { c.rounding = parse_rounding(s); })
      .def_rw("saturate", &QuantizerConfig::saturate)
      .def_prop_rw(
          "transform", [](const QuantizerConfig& c) { return std::string(quant::transform_name(c.transform)); },
          [](QuantizerConfig& c, const std::string& s) { c.transform = quant::parse_transform(s); })
      .def("__eq__", [](const QuantizerConfig& a, const QuantizerConfig& b) { return a == b; })
      .def("__repr__", [](const QuantizerConfig& c) {
        return "QuantizerConfig(scaling='" + std::string(quant::scaling_name(c.scaling)) + "', format='" +
               std::string(format_name(c.format)) + "', block=(" + std::to_string(c.block.rows) + ", " + std::to_string(c.block.cols) +
               "), rounding='" + rounding_name(c.rounding) + "')";
      });
  nb::class_<LinearRecipe::Forward>(m, "ForwardGemm", "y = x w: the activation's and the weight's quantisation")
      .def_rw("activation", &LinearRecipe::Forward::activation)
      .def_rw("weight", &LinearRecipe::Forward::weight);
  nb::class_<LinearRecipe::InputGrad>(m, "InputGradGemm", "dx = g w^T: the output gradient's and the weight's quantisation")
      .def_rw("gradient", &LinearRecipe::InputGrad::gradient)
      .def_rw("weight", &LinearRecipe::InputGrad::weight);
  nb::class_<LinearRecipe::WeightGrad>(m, "WeightGradGemm", "dw = x^T g: the activation's and the output gradient's quantisation")
      .def_rw("activation", &LinearRecipe::WeightGrad::activation)
      .def_rw("gradient", &LinearRecipe::WeightGrad::gradient);
  nb::class_<LinearRecipe>(m, "LinearRecipe", "How a linear layer quantises the operands of its three GEMMs")
      .def(nb::init<>())
      .def_rw("quantized", &LinearRecipe::quantized)
      .def_rw("forward", &LinearRecipe::forward)
      .def_rw("input_grad", &LinearRecipe::input_grad)
      .def_rw("weight_grad", &LinearRecipe::weight_grad)
      .def_static("uniform", &LinearRecipe::uniform, "weight"_a, "activation"_a, "gradient"_a,
                  "The same configuration for each tensor in every GEMM it enters")
      .def("__eq__", [](const LinearRecipe& a, const LinearRecipe& b) { return a == b; });
  nb::class_<HighPrecisionLayers>(m, "HighPrecisionLayers", "Linear layers left unquantised: first / last blocks, name patterns")
      .def(nb::init<>())
      .def_rw("first_blocks", &HighPrecisionLayers::first_blocks)
      .def_rw("last_blocks", &HighPrecisionLayers::last_blocks)
      .def_rw("layers", &HighPrecisionLayers::layers);
  // A recipe's storage fields as their dtype names.
  auto dtype_get = [](DType Recipe::*field) { return [field](const Recipe& r) { return std::string(dtype_name(r.*field)); }; };
  auto dtype_set = [](DType Recipe::*field) { return [field](Recipe& r, const std::string& s) { r.*field = parse_dtype(s); }; };
  nb::class_<Recipe>(m, "Recipe", "A training recipe: how every tensor role is stored and scaled")
      .def(nb::init<>())
      .def_rw("name", &Recipe::name)
      .def_rw("linear", &Recipe::linear)
      .def_rw("high_precision", &Recipe::high_precision)
      .def_rw("scaled_state", &Recipe::scaled_state)
      .def_rw("rescale_every", &Recipe::rescale_every)
      .def_rw("rescale_norm_grad", &Recipe::rescale_norm_grad)
      .def_rw("rescale_gradients", &Recipe::rescale_gradients)
      .def_rw("unit_scaled", &Recipe::unit_scaled)
      .def_prop_rw("master_weight", dtype_get(&Recipe::master_weight), dtype_set(&Recipe::master_weight))
      .def_prop_rw("optimizer_state", dtype_get(&Recipe::optimizer_state), dtype_set(&Recipe::optimizer_state))
      .def_prop_rw("data_storage", dtype_get(&Recipe::data_storage), dtype_set(&Recipe::data_storage))
      .def_prop_rw(
          "weight_gradient", [](const Recipe& r) { return std::string(format_name(r.weight_gradient)); },
          [](Recipe& r, const std::string& s) { r.weight_gradient = parse_format(s); })
      .def_prop_rw(
          "gradient_allreduce",
          [](const Recipe& r) -> std::optional<std::string> {
            if (!r.gradient_allreduce) return std::nullopt;
            return std::string(format_name(*r.gradient_allreduce));
          },
          [](Recipe& r, const std::optional<std::string>& s) {
            r.gradient_allreduce = s ? std::optional<Format>(parse_format(*s)) : std::nullopt;
          },
          "None: gradients exchanged in their own storage; 'f16', 'bf16', 'e4m3' or 'e5m2': cast with a shared power of two")
      .def("to_json", &Recipe::to_json)
      .def_static("from_json", &Recipe::from_json, "text"_a)
      .def("validate", &Recipe::validate, "Raises ValueError naming the parts that cannot be meant together")
      .def_static("preset", &quant::preset, "name"_a)
      .def("__eq__", [](const Recipe& a, const Recipe& b) { return a.to_json() == b.to_json(); })
      .def("__repr__", [](const Recipe& r) { return "Recipe('" + r.name + "')"; });
  m.def("preset_names", &quant::preset_names);
}

}  // namespace
}  // namespace scalify::python

NB_MODULE(_scalify, m) {
  using namespace scalify::python;
  m.doc() = "Scalify's C++ core (see the scalify package for the documented API)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const scalify::FileError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    } catch (const scalify::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("quantize", &quantize, "x"_a, "format"_a, "scale"_a = 1.0f, "rounding"_a = "nearest", "seed"_a = 0, "saturate"_a = true);
  m.def("dequantize", &dequantize, "codes"_a, "format"_a, "scale"_a = 1.0f);
  m.def(
      "amax", [](FloatArray x) { return scalify::amax(std::span(x.data(), x.size())); }, "x"_a);
  m.def("block_quantize", &block_quantize, "x"_a, "format"_a, "block"_a, "rule"_a, "rounding"_a = "nearest", "seed"_a = 0);
  m.def("block_dequantize", &block_dequantize, "codes"_a, "scales"_a, "format"_a, "block"_a, "rule"_a, "tensor_scale"_a = 1.0f);
  m.def("formats", &formats);
  m.def("train", &train, "out"_a, "settings"_a, "recipe"_a = nb::none(), "resume"_a = false, "progress"_a = nb::none(),
        "save_initial"_a = false);
  m.def("compare", &run_compare, "settings"_a, "recipes"_a, "out"_a, "resume"_a = false, "seeds"_a = "", "speed_rounds"_a = 5,
        "progress"_a = nb::none());
  m.def("load_checkpoint", &load_checkpoint, "path"_a);
  m.def("inspect", &run_inspect, "checkpoint"_a, "format"_a = "e4m3", "initial"_a = false, "batch"_a = 0, "data"_a = "");
  m.def("recipe_lists", &scalify::compare::recipe_list_names);
  // The address of the memory the bindings read for x: equal to x's own when no copy was made.
  m.def(
      "data_pointer", [](FloatArray x) { return reinterpret_cast<uintptr_t>(x.data()); }, "x"_a);
  bind_recipes(m);
  bind_autograd(m);
  bind_gpt(m);
}
