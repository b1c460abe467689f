// Recipes: QuantizerConfig, the GEMMs' LinearRecipe, HighPrecisionLayers, the optimizer state's
// StateFormat and Recipe, with presets.
// Each is plain data that behaves as Python values do: a keyword constructor (every field optional,
// an unknown keyword a TypeError), a docstring per field naming its allowed values (written from
// the name tables the parsers read, so the two cannot drift), ==, a repr that evaluates back to an
// equal object, pickling and copy.deepcopy (independent copies: the state is the fields' values,
// rebuilt through the keyword constructor, or the JSON form for Recipe).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "scalify/error.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::python {

using namespace nb::literals;
using quant::QuantizerConfig, quant::LinearRecipe, quant::HighPrecisionLayers, quant::Recipe;

namespace {

// The names of an enum's values 0..last, quoted and comma-separated, from the enum's name table.
template <class Enum, class NameOf>
std::string quoted_names(Enum last, NameOf name_of) {
  std::string out;
  for (int i = 0; i <= int(last); ++i) out.append(out.empty() ? "" : ", ").append("'").append(name_of(Enum(i))).append("'");
  return out;
}

// The fields of `self` that differ from a default-constructed object's, as name=repr(value).
std::string changed_fields(nb::handle self, const std::vector<const char*>& fields) {
  const nb::object defaults = nb::borrow(self.type())();
  std::string out;
  for (const char* f : fields) {
    const nb::object value = self.attr(f);
    if (!value.equal(defaults.attr(f))) out.append(out.empty() ? "" : ", ").append(f).append("=").append(nb::repr(value).c_str());
  }
  return out;
}

// ==, unhashable (mutable), repr, and pickling through the keyword constructor: the state is a
// dict of every field's value (nested configs pickle or deep-copy as themselves), and
// __setstate__ builds a new object from it, so a copy shares nothing with its original.
template <class T>
void plain_data(nb::class_<T>& cls, const char* name, std::vector<const char*> fields) {
  cls.def(
         "__eq__",
         [](const T& a, nb::handle b) -> nb::object {
           if (!nb::isinstance<T>(b)) return nb::not_implemented();
           return nb::bool_(a == nb::cast<const T&>(b));
         },
         nb::arg("other").none(), nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def("__repr__", [name, fields](nb::handle self) { return std::string(name) + "(" + changed_fields(self, fields) + ")"; })
      .def(
          "__getstate__",
          [fields](nb::handle self) {
            nb::dict state;
            for (const char* f : fields) state[f] = self.attr(f);
            return state;
          },
          nb::sig("def __getstate__(self) -> dict[str, object]"))
      .def(
          "__setstate__",
          [](T& self, const nb::dict& state) {
            const nb::object built = nb::type<T>()(**state);
            new (&self) T(nb::cast<const T&>(built));
          },
          nb::sig("def __setstate__(self, state: dict[str, object], /) -> None"));
  cls.attr("__hash__") = nb::none();
}

// The setters, shared by the properties and the keyword constructor.
void set_block(QuantizerConfig& c, std::pair<size_t, size_t> b) {
  quant::check_block_size(b.first, b.second);
  c.block.rows = b.first;
  c.block.cols = b.second;
}

DType Recipe::*const kDTypeFields[] = {&Recipe::master_weight, &Recipe::optimizer_state, &Recipe::data_storage};

void set_allreduce(Recipe& r, const std::optional<std::string>& s) {
  r.gradient_allreduce = s ? std::optional<Format>(parse_format(*s)) : std::nullopt;
}

void bind_quantizer_config(nb::module_& m) {
  using quant::Scaling, quant::Transform, quant::HistoryReduce;
  const std::string formats = "Allowed: " + valid_format_names() + " (aliases in parentheses).";
  const std::string scaling_doc =
      "The scaling strategy. Allowed: " + quoted_names(Scaling::mx, quant::scaling_name) +
      ". none: a plain cast; scalify: the propagated scale; current / delayed: per-tensor amax now / from a history; "
      "amax_bias / constant_bias: a power-of-two bias; block: generic blocks with f32 scales; mx: OCP MX blocks.";
  const std::string format_doc = "The element format of the quantised operand. " + formats;
  const std::string reduce_doc =
      "delayed: how the amax history becomes one amax. Allowed: " + quoted_names(HistoryReduce::most_recent, quant::reduce_name) + ".";
  const std::string block_doc = "The block (rows, cols) for block and mx scaling, each in [1, " + std::to_string(quant::kMaxBlockSize) +
                                "]. mx: (1, 32) or (32, 1); NVFP4 (block_scale 'nvfp4' or 'e4m3_amax'): (1, 16), (16, 1) or (16, 16) "
                                "(Recipe.validate() checks).";
  const std::string block_scale_doc =
      "How a block's scale is chosen. Allowed: " + quoted_names(BlockScaleRule::e4m3_amax, block_rule_name) +
      ". mx_floor / mx_ceil: E8M0 powers of two (mx scaling); f32_amax: f32 scales (block scaling); nvfp4 / e4m3_amax: E4M3 scales "
      "of e2m1 blocks, with / without NVFP4's f32 tensor scale.";
  const std::string rounding_doc = "How values round into the format. Allowed: " + quoted_names(Rounding::toward_zero, rounding_name) +
                                   " ('nearest_even' also reads as 'nearest').";
  const std::string transform_doc = "A transform of the operand before its cast (the weight-gradient GEMM's only). Allowed: " +
                                    quoted_names(Transform::hadamard16, quant::transform_name) + ".";
  nb::class_<QuantizerConfig> cls(m, "QuantizerConfig",
                                  "How one GEMM operand is quantised: QuantizerConfig(format='e4m3', scaling='current', ...), every field "
                                  "a keyword (see each field's docstring for its allowed values).");
  cls.def(
         "__init__",
         [](QuantizerConfig* self, std::optional<std::string> scaling, std::optional<std::string> format, std::optional<int> margin,
            std::optional<int> history, std::optional<std::string> reduce, std::optional<int> update_interval, std::optional<int> bias,
            std::optional<std::pair<size_t, size_t>> block, std::optional<std::string> block_scale, std::optional<std::string> rounding,
            std::optional<bool> saturate, std::optional<std::string> transform) {
           QuantizerConfig c;
           if (scaling) c.scaling = quant::parse_scaling(*scaling);
           if (format) c.format = parse_format(*format);
           if (margin) c.margin = *margin;
           if (history) c.history = *history;
           if (reduce) c.reduce = quant::parse_reduce(*reduce);
           if (update_interval) c.update_interval = *update_interval;
           if (bias) c.bias = *bias;
           if (block) set_block(c, *block);
           if (block_scale) c.block.rule = parse_block_rule(*block_scale);
           if (rounding) c.rounding = parse_rounding(*rounding);
           if (saturate) c.saturate = *saturate;
           if (transform) c.transform = quant::parse_transform(*transform);
           new (self) QuantizerConfig(c);
         },
         nb::kw_only(), "scaling"_a = nb::none(), "format"_a = nb::none(), "margin"_a = nb::none(), "history"_a = nb::none(),
         "reduce"_a = nb::none(), "update_interval"_a = nb::none(), "bias"_a = nb::none(), "block"_a = nb::none(),
         "block_scale"_a = nb::none(), "rounding"_a = nb::none(), "saturate"_a = nb::none(), "transform"_a = nb::none(),
         "A quantiser configuration: the defaults (current scaling, e4m3, nearest) with the fields given changed.")
      .def_prop_rw(
          "scaling", [](const QuantizerConfig& c) { return std::string(quant::scaling_name(c.scaling)); },
          [](QuantizerConfig& c, const std::string& s) { c.scaling = quant::parse_scaling(s); }, scaling_doc.c_str())
      .def_prop_rw(
          "format", [](const QuantizerConfig& c) { return std::string(format_name(c.format)); },
          [](QuantizerConfig& c, const std::string& s) { c.format = parse_format(s); }, format_doc.c_str())
      .def_rw("margin", &QuantizerConfig::margin, "current, delayed, amax_bias: powers of two of headroom, in [-64, 64]")
      .def_rw("history", &QuantizerConfig::history, "delayed: the amax history's length, at least 1")
      .def_prop_rw(
          "reduce", [](const QuantizerConfig& c) { return std::string(quant::reduce_name(c.reduce)); },
          [](QuantizerConfig& c, const std::string& s) { c.reduce = quant::parse_reduce(s); }, reduce_doc.c_str())
      .def_rw("update_interval", &QuantizerConfig::update_interval, "delayed: the scale is recomputed every N quantisations, N >= 1")
      .def_rw("bias", &QuantizerConfig::bias, "constant_bias: the scaling bias b (x * 2^b), in [-64, 64]")
      .def_prop_rw(
          "block", [](const QuantizerConfig& c) { return std::pair(c.block.rows, c.block.cols); }, set_block, block_doc.c_str())
      .def_prop_rw(
          "block_scale", [](const QuantizerConfig& c) { return std::string(block_rule_name(c.block.rule)); },
          [](QuantizerConfig& c, const std::string& s) { c.block.rule = parse_block_rule(s); }, block_scale_doc.c_str())
      .def_prop_rw(
          "rounding", [](const QuantizerConfig& c) { return std::string(rounding_name(c.rounding)); },
          [](QuantizerConfig& c, const std::string& s) { c.rounding = parse_rounding(s); }, rounding_doc.c_str())
      .def_rw("saturate", &QuantizerConfig::saturate,
              "True: overflow saturates to the format's largest value; False: it gives inf or NaN, as a plain hardware cast does")
      .def_prop_rw(
          "transform", [](const QuantizerConfig& c) { return std::string(quant::transform_name(c.transform)); },
          [](QuantizerConfig& c, const std::string& s) { c.transform = quant::parse_transform(s); }, transform_doc.c_str());
  plain_data(cls, "QuantizerConfig",
             {"scaling", "format", "margin", "history", "reduce", "update_interval", "bias", "block", "block_scale", "rounding", "saturate",
              "transform"});
}

// A GEMM's two operands: a class with a keyword constructor taking both QuantizerConfigs.
template <class Gemm>
void bind_gemm(nb::module_& m, const char* name, const char* doc, QuantizerConfig Gemm::*first, const char* first_name,
               const char* first_doc, QuantizerConfig Gemm::*second, const char* second_name, const char* second_doc) {
  nb::class_<Gemm> cls(m, name, doc);
  cls.def(
         "__init__",
         [first, second](Gemm* self, std::optional<QuantizerConfig> a, std::optional<QuantizerConfig> b) {
           Gemm g;
           if (a) g.*first = *a;
           if (b) g.*second = *b;
           new (self) Gemm(g);
         },
         nb::kw_only(), nb::arg(first_name) = nb::none(), nb::arg(second_name) = nb::none())
      .def_rw(first_name, first, first_doc)
      .def_rw(second_name, second, second_doc);
  plain_data(cls, name, {first_name, second_name});
}

void bind_linear_recipe(nb::module_& m) {
  const char* operand = "A QuantizerConfig (changed in place through this attribute: r.linear.forward.activation.format = 'e5m2')";
  bind_gemm<LinearRecipe::Forward>(m, "ForwardGemm", "y = x w: the activation's and the weight's quantisation",
                                   &LinearRecipe::Forward::activation, "activation", operand, &LinearRecipe::Forward::weight, "weight",
                                   operand);
  bind_gemm<LinearRecipe::InputGrad>(m, "InputGradGemm", "dx = g w^T: the output gradient's and the weight's quantisation",
                                     &LinearRecipe::InputGrad::gradient, "gradient", operand, &LinearRecipe::InputGrad::weight, "weight",
                                     operand);
  bind_gemm<LinearRecipe::WeightGrad>(m, "WeightGradGemm", "dw = x^T g: the activation's and the output gradient's quantisation",
                                      &LinearRecipe::WeightGrad::activation, "activation", operand, &LinearRecipe::WeightGrad::gradient,
                                      "gradient", operand);
  nb::class_<LinearRecipe> cls(m, "LinearRecipe", "How a linear layer quantises the operands of its three GEMMs");
  cls.def(
         "__init__",
         [](LinearRecipe* self, std::optional<bool> quantized, std::optional<LinearRecipe::Forward> forward,
            std::optional<LinearRecipe::InputGrad> input_grad, std::optional<LinearRecipe::WeightGrad> weight_grad) {
           LinearRecipe r;
           if (quantized) r.quantized = *quantized;
           if (forward) r.forward = *forward;
           if (input_grad) r.input_grad = *input_grad;
           if (weight_grad) r.weight_grad = *weight_grad;
           new (self) LinearRecipe(r);
         },
         nb::kw_only(), "quantized"_a = nb::none(), "forward"_a = nb::none(), "input_grad"_a = nb::none(), "weight_grad"_a = nb::none())
      .def_rw("quantized", &LinearRecipe::quantized, "False: a plain matmul in the data's precision (the other fields unused)")
      .def_rw("forward", &LinearRecipe::forward, "ForwardGemm: y = x w")
      .def_rw("input_grad", &LinearRecipe::input_grad, "InputGradGemm: dx = g w^T")
      .def_rw("weight_grad", &LinearRecipe::weight_grad, "WeightGradGemm: dw = x^T g")
      .def_static("uniform", &LinearRecipe::uniform, "weight"_a, "activation"_a, "gradient"_a,
                  "The same configuration for each tensor in every GEMM it enters");
  plain_data(cls, "LinearRecipe", {"quantized", "forward", "input_grad", "weight_grad"});
}

void bind_high_precision(nb::module_& m) {
  nb::class_<HighPrecisionLayers> cls(m, "HighPrecisionLayers", "Linear layers left unquantised: first / last blocks, name patterns");
  cls.def(
         "__init__",
         [](HighPrecisionLayers* self, std::optional<int> first_blocks, std::optional<int> last_blocks,
            std::optional<std::vector<std::string>> layers) {
           HighPrecisionLayers h;
           if (first_blocks) h.first_blocks = *first_blocks;
           if (last_blocks) h.last_blocks = *last_blocks;
           if (layers) h.layers = *layers;
           new (self) HighPrecisionLayers(h);
         },
         nb::kw_only(), "first_blocks"_a = nb::none(), "last_blocks"_a = nb::none(), "layers"_a = nb::none())
      .def_rw("first_blocks", &HighPrecisionLayers::first_blocks, "How many of the first decoder blocks stay in high precision")
      .def_rw("last_blocks", &HighPrecisionLayers::last_blocks, "How many of the last decoder blocks stay in high precision")
      .def_rw("layers", &HighPrecisionLayers::layers,
              "Name patterns of layers kept in high precision ('*' matches any run of characters: '*.attn.qkv'); 1 to 256 characters "
              "each");
  plain_data(cls, "HighPrecisionLayers", {"first_blocks", "last_blocks", "layers"});
}

// The fields of an optimizer-state format: each setter refuses a value no format takes, naming
// the field. The rules are optim::validate's: a value is accepted when some format with it passes.
void check_state_field(const char* field, std::initializer_list<optim::StateFormat> candidates) {
  std::string why;
  for (const optim::StateFormat& f : candidates) try {
      optim::validate(f, std::string("StateFormat.") + field);
      return;
    } catch (const Error& e) {
      why = e.what();
    }
  throw Error(why);
}
void set_state_storage(optim::StateFormat& f, const std::string& name) {
  Format storage;
  try {
    storage = parse_format(name);
  } catch (const Error& e) {
    throw Error(std::string("StateFormat.storage: ") + e.what());
  }
  // f32 and bf16 take no scale, f16 and FP8 need one: the storage is valid with one of the two.
  check_state_field("storage", {{.storage = storage}, {.storage = storage, .scaling = optim::StateScaling::per_tensor}});
  f.storage = storage;
}
// The state roles' rounding as their JSON spells it ('nearest_even', where QuantizerConfig says 'nearest').
std::string state_rounding_name(Rounding r) { return r == Rounding::nearest_even ? "nearest_even" : rounding_name(r); }
void set_state_rounding(optim::StateFormat& f, const std::string& name) {
  const Rounding r = parse_rounding(name);
  check_state_field("rounding", {{.storage = Format::bf16, .rounding = r}});
  f.rounding = r;
}
template <class Int>
void set_in_range(Int& field, int64_t value, const char* name, int64_t hi) {
  if (value < 1 || value > hi)
    throw Error(std::string("StateFormat.") + name + " must be in [1, " + std::to_string(hi) + "], got " + std::to_string(value));
  field = Int(value);
}
void set_group_size(optim::StateFormat& f, int64_t n) { set_in_range(f.group_size, n, "group_size", quant::kMaxStateGroupSize); }
void set_expand_min(optim::StateFormat& f, int64_t n) { set_in_range(f.expand_min, n, "expand_min", quant::kMaxExpandMin); }

void bind_state_format(nb::module_& m) {
  using optim::StateFormat;
  const std::string group_doc = "per_group scaling: elements per scale, in [1, " + std::to_string(quant::kMaxStateGroupSize) +
                                "] (default 128; set with other scalings, Recipe.validate() refuses it as unused)";
  const std::string expand_min_doc = "The expansion's exponent k is a multiple of 1 / expand_min, in [1, " +
                                     std::to_string(quant::kMaxExpandMin) +
                                     "] (default 16; set without expand, Recipe.validate() refuses it as unused)";
  nb::class_<StateFormat> cls(m, "StateFormat",
                              "How an optimizer moment is stored (a recipe's first_moment and second_moment): "
                              "StateFormat(storage='e4m3', scaling='per_group', group_size=128, ...), every field a keyword. "
                              "Recipe.validate() checks the fields together (f16 and FP8 need a scale, f32 and bf16 take none, "
                              "the expansion needs FP8 per-group scales).");
  cls.def(
         "__init__",
         [](StateFormat* self, std::optional<std::string> storage, std::optional<std::string> scaling, std::optional<int64_t> group_size,
            std::optional<std::string> rounding, std::optional<bool> non_negative, std::optional<bool> expand,
            std::optional<int64_t> expand_min) {
           StateFormat f;
           if (storage) set_state_storage(f, *storage);
           if (scaling) f.scaling = quant::parse_state_scaling(*scaling, "StateFormat.scaling");
           if (group_size) set_group_size(f, *group_size);
           if (rounding) set_state_rounding(f, *rounding);
           if (non_negative) f.non_negative = *non_negative;
           if (expand) f.expand = *expand;
           if (expand_min) set_expand_min(f, *expand_min);
           new (self) StateFormat(f);
         },
         nb::kw_only(), "storage"_a = nb::none(), "scaling"_a = nb::none(), "group_size"_a = nb::none(), "rounding"_a = nb::none(),
         "non_negative"_a = nb::none(), "expand"_a = nb::none(), "expand_min"_a = nb::none(),
         "A state format: the defaults (f32, no scale, nearest_even) with the fields given changed.")
      .def_prop_rw(
          "storage", [](const StateFormat& f) { return std::string(format_name(f.storage)); }, set_state_storage,
          "The codes' format. Allowed: 'f32', 'bf16', 'f16' (with a scale), 'e4m3', 'e5m2' (FP8, with a scale).")
      .def_prop_rw(
          "scaling", [](const StateFormat& f) { return std::string(quant::state_scaling_name(f.scaling)); },
          [](StateFormat& f, const std::string& s) { f.scaling = quant::parse_state_scaling(s, "StateFormat.scaling"); },
          "The scale. Allowed: 'none' (f32, bf16), 'per_tensor' (one power of two, MS-AMP's), 'per_group' (one f32 scale per "
          "group_size elements, COAT's).")
      .def_prop_rw(
          "group_size", [](const StateFormat& f) { return f.group_size; }, set_group_size, group_doc.c_str())
      .def_prop_rw(
          "rounding", [](const StateFormat& f) { return state_rounding_name(f.rounding); }, set_state_rounding,
          "How values round into the codes. Allowed: 'nearest_even', 'stochastic' (seeded: a resumed run repeats it; not into f32).")
      .def_rw("non_negative", &StateFormat::non_negative,
              "True for values >= 0 (the second moment): 8-bit codes spend the sign bit on mantissa (unsigned e4m4 / e5m3)")
      .def_rw("expand", &StateFormat::expand, "COAT's per-group dynamic range expansion (e4m3 or e5m2 with per_group scaling)")
      .def_prop_rw(
          "expand_min", [](const StateFormat& f) { return f.expand_min; }, set_expand_min, expand_min_doc.c_str());
  plain_data(cls, "StateFormat", {"storage", "scaling", "group_size", "rounding", "non_negative", "expand", "expand_min"});
}

void set_master_rounding(Recipe& r, const std::string& name) {
  const Rounding rounding = parse_rounding(name);
  if (rounding != Rounding::nearest_even && rounding != Rounding::stochastic)
    throw Error("Recipe.master_rounding must be nearest_even or stochastic, got '" + name + "'");
  r.master_rounding = rounding;
}

void bind_recipe(nb::module_& m) {
  const std::string dtypes = quoted_names(DType::u8, dtype_name);
  const std::string master_doc =
      "Storage of the master weights: a floating-point dtype (Recipe.validate() checks; the names read: " + dtypes + ").";
  const std::string state_doc =
      "Storage of AdamW's m and v under scaled_state: a floating-point dtype (Recipe.validate() checks; the names read: " + dtypes + ").";
  const std::string data_doc =
      "Storage of every activation and gradient: 'f32', 'f16' or 'bf16' (Recipe.validate() checks; the names "
      "read: " +
      dtypes + ").";
  const std::string wgrad_doc = "Cast of the weight gradients before the update ('f32': none). Allowed: " + valid_format_names() + ".";
  const std::string allreduce_doc =
      "None: gradients exchanged in their own storage; 'f16', 'bf16', 'e4m3' or 'e5m2': cast with a shared power of two "
      "(Recipe.validate() checks; the names read: " +
      valid_format_names() + ").";
  // A recipe's storage fields as their dtype names.
  auto dtype_get = [](DType Recipe::*field) { return [field](const Recipe& r) { return std::string(dtype_name(r.*field)); }; };
  auto dtype_set = [](DType Recipe::*field) { return [field](Recipe& r, const std::string& s) { r.*field = parse_dtype(s); }; };
  nb::class_<Recipe> cls(m, "Recipe",
                         "A training recipe: how every tensor role is stored and scaled. Recipe(name='mine', linear=LinearRecipe(...), "
                         "...), every field a keyword; Recipe.preset(name) and Recipe.from_json(text) give the others.");
  cls.def(
         "__init__",
         [](Recipe* self, std::optional<std::string> name, std::optional<LinearRecipe> linear,
            std::optional<HighPrecisionLayers> high_precision, std::optional<std::string> master_weight, std::optional<bool> scaled_state,
            std::optional<std::string> optimizer_state, std::optional<std::string> weight_gradient, std::optional<int> rescale_every,
            std::optional<bool> rescale_norm_grad, std::optional<bool> rescale_gradients, std::optional<bool> unit_scaled,
            std::optional<bool> umup, std::optional<std::string> data_storage, std::optional<std::string> gradient_allreduce,
            std::optional<std::string> linear_master_weight, std::optional<optim::StateFormat> first_moment,
            std::optional<optim::StateFormat> second_moment, std::optional<std::string> master_rounding) {
           Recipe r;
           if (name) r.name = *name;
           if (linear) r.linear = *linear;
           if (high_precision) r.high_precision = *high_precision;
           const std::optional<std::string>* dtypes[] = {&master_weight, &optimizer_state, &data_storage};
           for (size_t i = 0; i < std::size(kDTypeFields); ++i)
             if (*dtypes[i]) r.*kDTypeFields[i] = parse_dtype(**dtypes[i]);
           if (scaled_state) r.scaled_state = *scaled_state;
           if (weight_gradient) r.weight_gradient = parse_format(*weight_gradient);
           if (rescale_every) r.rescale_every = *rescale_every;
           if (rescale_norm_grad) r.rescale_norm_grad = *rescale_norm_grad;
           if (rescale_gradients) r.rescale_gradients = *rescale_gradients;
           if (unit_scaled) r.unit_scaled = *unit_scaled;
           if (umup) r.umup = *umup;
           set_allreduce(r, gradient_allreduce);
           if (linear_master_weight) r.linear_master_weight = quant::parse_linear_master(*linear_master_weight);
           if (first_moment) r.first_moment = *first_moment;
           if (second_moment) r.second_moment = *second_moment;
           if (master_rounding) set_master_rounding(r, *master_rounding);
           new (self) Recipe(r);
         },
         nb::kw_only(), "name"_a = nb::none(), "linear"_a = nb::none(), "high_precision"_a = nb::none(), "master_weight"_a = nb::none(),
         "scaled_state"_a = nb::none(), "optimizer_state"_a = nb::none(), "weight_gradient"_a = nb::none(), "rescale_every"_a = nb::none(),
         "rescale_norm_grad"_a = nb::none(), "rescale_gradients"_a = nb::none(), "unit_scaled"_a = nb::none(), "umup"_a = nb::none(),
         "data_storage"_a = nb::none(), "gradient_allreduce"_a = nb::none(), "linear_master_weight"_a = nb::none(),
         "first_moment"_a = nb::none(), "second_moment"_a = nb::none(), "master_rounding"_a = nb::none(),
         "A recipe: f32 training (the defaults) with the fields given changed.")
      .def_rw("name", &Recipe::name, "The recipe's name, as run logs and reports show it")
      .def_rw("linear", &Recipe::linear, "LinearRecipe: the operands of every quantised linear layer's three GEMMs")
      .def_rw("high_precision", &Recipe::high_precision, "HighPrecisionLayers: the linear layers left out of `linear`")
      .def_rw("scaled_state", &Recipe::scaled_state, "SCALIFY: master weights and optimizer state as scaled tensors")
      .def_rw("rescale_every", &Recipe::rescale_every, "SCALIFY: rescale the scaled state every N steps (0: never; needs scaled_state)")
      .def_rw("rescale_norm_grad", &Recipe::rescale_norm_grad, "SCALIFY #2-#4: rescale the gradient before every norm")
      .def_rw("rescale_gradients", &Recipe::rescale_gradients,
              "SCALIFY #4: rescale scaled weight gradients before their cast (needs scaled_state)")
      .def_rw("unit_scaled", &Recipe::unit_scaled, "Unit scaling: the model is unit-scaled, its casts need no scale")
      .def_rw("umup", &Recipe::umup, "u-μP (unit-scaling 0.3.5): the model is u-μP's, its casts need no scale")
      .def_prop_rw("master_weight", dtype_get(&Recipe::master_weight), dtype_set(&Recipe::master_weight), master_doc.c_str())
      .def_prop_rw("optimizer_state", dtype_get(&Recipe::optimizer_state), dtype_set(&Recipe::optimizer_state), state_doc.c_str())
      .def_prop_rw("data_storage", dtype_get(&Recipe::data_storage), dtype_set(&Recipe::data_storage), data_doc.c_str())
      .def_prop_rw(
          "linear_master_weight", [](const Recipe& r) { return std::string(quant::linear_master_name(r.linear_master_weight)); },
          [](Recipe& r, const std::string& s) { r.linear_master_weight = quant::parse_linear_master(s); },
          "Master weights of the quantised linear layers' weight matrices: 'master_weight' (stored as master_weight) or "
          "'scaled_f16' (MS-AMP O2: f16 data and one power-of-two scale per tensor, chosen from the new weights' amax after every "
          "update, margin 0; not with scaled_state)")
      .def_prop_rw(
          "weight_gradient", [](const Recipe& r) { return std::string(format_name(r.weight_gradient)); },
          [](Recipe& r, const std::string& s) { r.weight_gradient = parse_format(s); }, wgrad_doc.c_str())
      .def_prop_rw(
          "gradient_allreduce",
          [](const Recipe& r) -> std::optional<std::string> {
            if (!r.gradient_allreduce) return std::nullopt;
            return std::string(format_name(*r.gradient_allreduce));
          },
          set_allreduce, allreduce_doc.c_str())
      .def_rw("first_moment", &Recipe::first_moment,
              "StateFormat of AdamW's first moment m (unscaled parameters; changed in place through this attribute: "
              "r.first_moment.storage = 'e4m3')")
      .def_rw("second_moment", &Recipe::second_moment,
              "StateFormat of AdamW's second moment v (non_negative: True lets 8-bit codes drop the sign bit)")
      .def_prop_rw(
          "master_rounding", [](const Recipe& r) { return state_rounding_name(r.master_rounding); }, set_master_rounding,
          "How new master weights round into a storage narrower than f32 (master_weight 'bf16' or 'f16', unscaled). Allowed: "
          "'nearest_even', 'stochastic'.")
      .def("to_json", &Recipe::to_json)
      .def_static("from_json", &Recipe::from_json, "text"_a)
      .def("validate", &Recipe::validate, "Raises ValueError naming the parts that cannot be meant together")
      .def_static("preset", &quant::preset, "name"_a)
      .def(
          "__eq__",
          [](const Recipe& a, nb::handle b) -> nb::object {
            if (!nb::isinstance<Recipe>(b)) return nb::not_implemented();
            return nb::bool_(a.to_json() == nb::cast<const Recipe&>(b).to_json());
          },
          nb::arg("other").none(), nb::sig("def __eq__(self, other: object, /) -> bool"))
      // The fields that differ from Recipe(); Recipe.from_json(...) where those cannot say it all
      // (loss scaling has no field here).
      .def("__repr__",
           [](nb::handle self) {
             const std::string text =
                 "Recipe(" +
                 changed_fields(self,
                                {"name", "linear", "high_precision", "master_weight", "scaled_state", "optimizer_state", "weight_gradient",
                                 "rescale_every", "rescale_norm_grad", "rescale_gradients", "unit_scaled", "umup", "data_storage",
                                 "gradient_allreduce", "linear_master_weight", "first_moment", "second_moment", "master_rounding"}) +
                 ")";
             const Recipe& r = nb::cast<const Recipe&>(self);
             // The field with no keyword here: loss scaling.
             Recipe keywords_only = r;
             keywords_only.loss_scaling = Recipe{}.loss_scaling;
             if (keywords_only.to_json() == r.to_json()) return text;
             return "Recipe.from_json(" + std::string(nb::repr(nb::str(r.to_json().c_str())).c_str()) + ")";
           })
      // The JSON form is the state: every field, loss scaling included.
      .def("__getstate__", &Recipe::to_json)
      .def("__setstate__", [](Recipe& self, const std::string& json) { new (&self) Recipe(Recipe::from_json(json)); });
  cls.attr("__hash__") = nb::none();
}

}  // namespace

void bind_recipes(nb::module_& m) {
  bind_quantizer_config(m);
  bind_state_format(m);
  bind_linear_recipe(m);
  bind_high_precision(m);
  bind_recipe(m);
  m.def("preset_names", &quant::preset_names);
  m.def("load_recipe", &quant::load_recipe, "name_or_file"_a, "A preset by name, or a recipe JSON file (a path ending in .json)");
}

}  // namespace scalify::python
