// Recipes: QuantizerConfig, the GEMMs' LinearRecipe, HighPrecisionLayers and Recipe, with presets.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

#include "bindings.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::python {

using namespace nb::literals;

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

}  // namespace scalify::python
