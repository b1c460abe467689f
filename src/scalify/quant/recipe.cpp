#include "scalify/quant/recipe.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/scaled/scaled_ops.hpp"

namespace scalify::quant {

namespace {

using json = nlohmann::json;
constexpr int kCscaleBias = 4;
constexpr uint64_t kMaxRecipeBytes = 1 << 20;  // a recipe is about 2 kB

constexpr std::pair<Rounding, const char*> kRoundings[] = {
    {Rounding::nearest_even, "nearest_even"}, {Rounding::stochastic, "stochastic"}, {Rounding::toward_zero, "toward_zero"}};
static_assert(std::size(kRoundings) == size_t(Rounding::toward_zero) + 1, "a JSON name for every Rounding");

// The block scale rule a config has when its JSON names none (every recipe before the field):
// f32 scales for block scaling, the OCP floor for MX (QuantizerConfig's default, which MX reads
// as floor).
BlockScaleRule default_block_rule(Scaling s) { return s == Scaling::block ? BlockScaleRule::f32_amax : QuantizerConfig{}.block.rule; }

json role_json(const QuantizerConfig& c) {
  json j = {{"scaling", scaling_name(c.scaling)},
            {"format", std::string(format_name(c.format))},
            {"margin", c.margin},
            {"history", c.history},
            {"reduce", reduce_name(c.reduce)},
            {"update_interval", c.update_interval},
            {"bias", c.bias},
            {"block", {int(c.block.rows), int(c.block.cols)}},
            {"saturate", c.saturate}};
  // Written only when not the default, so the JSON of every recipe that rounds to nearest (and the
  // recipe recorded in every checkpoint before the field existed) is unchanged.
  for (const auto& [r, name] : kRoundings)
    if (r == c.rounding && r != Rounding::nearest_even) j["rounding"] = name;
  // The block scale rule, only where it is not the scaling's default (MX reads any rule but
  // mx_ceil as the OCP floor).
  const bool rule_named = c.scaling == Scaling::mx ? c.block.rule == BlockScaleRule::mx_ceil
                                                   : c.scaling == Scaling::block && c.block.rule != BlockScaleRule::f32_amax;
  if (rule_named) j["block_scale"] = block_rule_name(c.block.rule);
  if (c.transform != Transform::none) j["transform"] = transform_name(c.transform);
  return j;
}

template <class T>
T field(const json& j, const char* key, const char* where) {
  if (!j.contains(key)) throw Error(std::string("recipe: missing field '") + key + "' in " + where);
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw Error(std::string("recipe: field '") + key + "' in " + where + " has the wrong type");
  }
}

// An integer field in [lo, hi]: get<int>() would narrow 1e20 or 3e9 silently (or with UB).
int int_field(const json& j, const char* key, const char* where, int64_t lo, int64_t hi) {
  if (!j.contains(key)) throw Error(std::string("recipe: missing field '") + key + "' in " + where);
  const json& v = j.at(key);
  const std::string range = std::string("[").append(std::to_string(lo)).append(", ").append(std::to_string(hi)).append("]");
  if (!v.is_number_integer())
    throw Error(std::string("recipe: field '") + key + "' in " + where + " must be an integer in " + range + ", got " +
                io::json_excerpt(v));
  // nlohmann keeps non-negative integers unsigned (up to 2^64 - 1): compare them as such.
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi) && int64_t(v.get<uint64_t>()) >= lo
                                           : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!fits) throw Error(std::string("recipe: field '") + key + "' in " + where + " must be in " + range + ", got " + io::json_excerpt(v));
  return int(v.get<int64_t>());
}

// A misspelt field ("histroy") would otherwise be ignored and its default used in silence.
void only_known_fields(const json& j, std::initializer_list<const char*> known, const std::string& where) {
  if (!j.is_object()) throw Error("recipe: " + where + " must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (std::any_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) continue;
    std::string valid;
    for (const char* k : known) valid.append(valid.empty() ? "" : ", ").append(k);
    throw Error("recipe: unknown field '" + key + "' in " + where + "; valid fields: " + valid);
  }
}

// Parses JSON text, refusing an object that names a key twice (which JSON parsers settle by
// keeping one of the values in silence).
json parse_without_duplicate_keys(const std::string& text) {
  io::check_json_depth(text, "recipe");
  std::vector<std::set<std::string>> open;  // the keys of each object being parsed, innermost last
  return json::parse(text, [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end) open.pop_back();
    if (event == json::parse_event_t::key && !open.back().insert(parsed.get<std::string>()).second)
      throw Error("recipe: the field '" + parsed.get<std::string>() + "' appears twice in one object");
    return true;
  });
}

constexpr std::pair<optim::StateScaling, const char*> kStateScalings[] = {
    {optim::StateScaling::none, "none"}, {optim::StateScaling::per_tensor, "per_tensor"}, {optim::StateScaling::per_group, "per_group"}};

json state_json(const optim::StateFormat& f) {
  json j = {{"storage", std::string(format_name(f.storage))}};
  for (const auto& [s, name] : kStateScalings)
    if (s == f.scaling) j["scaling"] = name;
  if (f.scaling == optim::StateScaling::per_group) j["group_size"] = f.group_size;
  for (const auto& [r, name] : kRoundings)
    if (r == f.rounding) j["rounding"] = name;
  j["non_negative"] = f.non_negative;
  if (f.expand) {
    j["expand"] = true;
    j["expand_min"] = f.expand_min;
  }
  return j;
}

optim::StateFormat state_from(const json& j, const char* where) {
  only_known_fields(j, {"storage", "scaling", "group_size", "rounding", "non_negative", "expand", "expand_min"}, where);
  optim::StateFormat f;
  f.storage = parse_format(field<std::string>(j, "storage", where));
  if (j.contains("scaling"))
    f.scaling = parse_state_scaling(field<std::string>(j, "scaling", where), std::string("recipe: field 'scaling' in ") + where);
  if (j.contains("group_size")) f.group_size = int_field(j, "group_size", where, 1, kMaxStateGroupSize);
  if (j.contains("rounding")) {
    const std::string name = field<std::string>(j, "rounding", where);
    if (name == "nearest_even")
      f.rounding = Rounding::nearest_even;
    else if (name == "stochastic")
      f.rounding = Rounding::stochastic;
    else
      throw Error(std::string("recipe: field 'rounding' in ") + where + " must be nearest_even or stochastic, got '" + name + "'");
  }
  f.non_negative = j.contains("non_negative") && field<bool>(j, "non_negative", where);
  f.expand = j.contains("expand") && field<bool>(j, "expand", where);
  if (j.contains("expand_min")) f.expand_min = int_field(j, "expand_min", where, 1, kMaxExpandMin);
  // A field that only applies with another would otherwise be dropped in silence.
  if (j.contains("group_size") && f.scaling != optim::StateScaling::per_group)
    throw Error(std::string("recipe: field 'group_size' in ") + where + " applies only to per_group scaling, and scaling is " +
                state_scaling_name(f.scaling) + " (remove it, or set scaling per_group)");
  if (j.contains("expand_min") && !f.expand)
    throw Error(std::string("recipe: field 'expand_min' in ") + where +
                " applies only with the expansion, and expand is false (remove it, or set expand true)");
  return f;
}

QuantizerConfig role_from(const json& j, const char* where) {
  only_known_fields(j,
                    {"scaling", "format", "margin", "history", "reduce", "update_interval", "bias", "block", "saturate", "rounding",
                     "block_scale", "transform"},
                    where);
  QuantizerConfig c;
  c.scaling = parse_scaling(field<std::string>(j, "scaling", where));
  c.format = parse_format(field<std::string>(j, "format", where));
  c.margin = int_field(j, "margin", where, -64, 64);
  c.history = int_field(j, "history", where, 1, 1 << 20);
  const std::string reduce = field<std::string>(j, "reduce", where);
  try {
    c.reduce = parse_reduce(reduce);
  } catch (const Error& e) {
    throw Error(std::string("recipe: ") + e.what() + " in " + where);
  }
  c.update_interval = int_field(j, "update_interval", where, 1, 1 << 30);
  c.bias = int_field(j, "bias", where, -64, 64);
  const json block = field<json>(j, "block", where);
  if (!block.is_array() || block.size() != 2) throw Error(std::string("recipe: block must be [rows, cols] in ") + where);
  const json dims = {{"rows", block[0]}, {"cols", block[1]}};
  const std::string in_block = std::string(where) + ".block";
  c.block.rows = size_t(int_field(dims, "rows", in_block.c_str(), 1, 4096));
  c.block.cols = size_t(int_field(dims, "cols", in_block.c_str(), 1, 4096));
  c.block.rule = default_block_rule(c.scaling);
  if (j.contains("block_scale")) {
    try {
      c.block.rule = parse_block_rule(field<std::string>(j, "block_scale", where));
    } catch (const Error& e) {
      throw Error(std::string("recipe: ") + e.what() + " in " + where);
    }
  }
  if (j.contains("transform")) {
    try {
      c.transform = parse_transform(field<std::string>(j, "transform", where));
    } catch (const Error& e) {
      throw Error(std::string("recipe: ") + e.what() + " in " + where);
    }
  }
  c.saturate = !j.contains("saturate") || field<bool>(j, "saturate", where);
  if (j.contains("rounding")) {
    const std::string rounding = field<std::string>(j, "rounding", where);
    const auto* known = std::find_if(std::begin(kRoundings), std::end(kRoundings), [&](const auto& e) { return rounding == e.second; });
    if (known == std::end(kRoundings))
      throw Error(std::string("recipe: rounding must be nearest_even, stochastic or toward_zero in ") + where + ", got '" + rounding + "'");
    c.rounding = known->first;
  }
  return c;
}

const char* loss_kind(LossScalerConfig::Kind k) {
  return k == LossScalerConfig::Kind::none ? "none" : k == LossScalerConfig::Kind::fixed ? "static" : "dynamic";
}

json linear_json(const LinearRecipe& l) {
  json j = {{"quantized", l.quantized}};
  // Every seeded recipe configures each tensor the same in every GEMM: its three roles, as
  // recorded in every checkpoint before per-GEMM recipes existed. Others: each GEMM's operands.
  if (const std::optional<LinearRecipe::Roles> roles = l.roles()) {
    j["weight"] = role_json(roles->weight);
    j["activation"] = role_json(roles->activation);
    j["gradient"] = role_json(roles->gradient);
    return j;
  }
  j["forward"] = {{"activation", role_json(l.forward.activation)}, {"weight", role_json(l.forward.weight)}};
  j["input_grad"] = {{"gradient", role_json(l.input_grad.gradient)}, {"weight", role_json(l.input_grad.weight)}};
  j["weight_grad"] = {{"activation", role_json(l.weight_grad.activation)}, {"gradient", role_json(l.weight_grad.gradient)}};
  return j;
}

}  // namespace

const char* state_scaling_name(optim::StateScaling scaling) {
  for (const auto& [s, name] : kStateScalings)
    if (s == scaling) return name;
  return "?";
}

optim::StateScaling parse_state_scaling(const std::string& name, const std::string& what) {
  for (const auto& [s, n] : kStateScalings)
    if (name == n) return s;
  throw Error(what + " must be none, per_tensor or per_group, got '" + name + "'");
}

std::string state_format_json(const optim::StateFormat& f) { return state_json(f).dump(); }

std::string unused_state_field(const optim::StateFormat& f) {
  const optim::StateFormat defaults;
  if (f.scaling != optim::StateScaling::per_group && f.group_size != defaults.group_size)
    return "group_size " + std::to_string(f.group_size) + " applies only to per_group scaling, and scaling is " +
           state_scaling_name(f.scaling);
  if (!f.expand && f.expand_min != defaults.expand_min)
    return "expand_min " + std::to_string(f.expand_min) + " applies only with the expansion, and expand is false";
  return "";
}

std::string Recipe::to_json() const {
  json j = {{"name", name},
            {"linear", linear_json(linear)},
            {"master_weight", std::string(dtype_name(master_weight))},
            {"scaled_state", scaled_state},
            {"optimizer_state", std::string(dtype_name(optimizer_state))},
            {"weight_gradient", std::string(format_name(weight_gradient))},
            {"rescale_every", rescale_every},
            {"rescale_norm_grad", rescale_norm_grad},
            {"rescale_gradients", rescale_gradients},
            {"unit_scaled", unit_scaled},
            {"data_storage", std::string(dtype_name(data_storage))},
            {"loss_scaling",
             {{"kind", loss_kind(loss_scaling.kind)}, {"scale", loss_scaling.scale}, {"growth_interval", loss_scaling.growth_interval}}}};
  if (umup) j["umup"] = true;                   // written only when set: every earlier recipe's JSON is unchanged
  if (high_precision != HighPrecisionLayers{})  // written only when set: every earlier recipe's JSON is unchanged
    j["high_precision"] = {
        {"first_blocks", high_precision.first_blocks}, {"last_blocks", high_precision.last_blocks}, {"layers", high_precision.layers}};
  if (gradient_allreduce) j["gradient_allreduce"] = format_name(*gradient_allreduce);      // likewise
  if (first_moment != optim::StateFormat{}) j["first_moment"] = state_json(first_moment);  // likewise
  if (second_moment != optim::StateFormat{}) j["second_moment"] = state_json(second_moment);
  if (master_rounding == Rounding::stochastic) j["master_rounding"] = "stochastic";
  if (linear_master_weight != LinearMaster::master_weight)
    j["linear_master_weight"] = linear_master_name(linear_master_weight);  // likewise
  return j.dump(2);
}

namespace {
Recipe from_parsed(const json& j);
}  // namespace

Recipe Recipe::from_json(const std::string& text) {
  json j;
  try {
    j = parse_without_duplicate_keys(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
    throw Error(std::string("recipe: not valid JSON: ") + e.what());
  }
  try {
    return from_parsed(j);
  } catch (const json::exception& e) {  // any other mismatch the checks above did not name
    throw Error(std::string("recipe: malformed: ") + e.what());
  }
}

namespace {
// Either form linear_json writes: three roles, or each GEMM's two operands.
LinearRecipe linear_from(const json& lin) {
  if (lin.is_object() && lin.contains("forward")) {
    only_known_fields(lin, {"quantized", "forward", "input_grad", "weight_grad"}, "linear");
    LinearRecipe l;
    l.quantized = field<bool>(lin, "quantized", "linear");
    auto gemm = [&](const char* name, const char* a, const char* b) {
      const json g = field<json>(lin, name, "linear");
      const std::string where = std::string("linear.") + name;
      only_known_fields(g, {a, b}, where);
      return std::pair(role_from(field<json>(g, a, where.c_str()), (where + "." + a).c_str()),
                       role_from(field<json>(g, b, where.c_str()), (where + "." + b).c_str()));
    };
    std::tie(l.forward.activation, l.forward.weight) = gemm("forward", "activation", "weight");
    std::tie(l.input_grad.gradient, l.input_grad.weight) = gemm("input_grad", "gradient", "weight");
    std::tie(l.weight_grad.activation, l.weight_grad.gradient) = gemm("weight_grad", "activation", "gradient");
    return l;
  }
  only_known_fields(lin, {"quantized", "weight", "activation", "gradient"}, "linear");
  LinearRecipe l = LinearRecipe::uniform(role_from(field<json>(lin, "weight", "linear"), "linear.weight"),
                                         role_from(field<json>(lin, "activation", "linear"), "linear.activation"),
                                         role_from(field<json>(lin, "gradient", "linear"), "linear.gradient"));
  l.quantized = field<bool>(lin, "quantized", "linear");
  return l;
}

Recipe from_parsed(const json& j) {
  only_known_fields(j,
                    {"name", "linear", "master_weight", "scaled_state", "optimizer_state", "weight_gradient", "rescale_every",
                     "rescale_norm_grad", "rescale_gradients", "unit_scaled", "umup", "data_storage", "loss_scaling", "high_precision",
                     "gradient_allreduce", "first_moment", "second_moment", "master_rounding", "linear_master_weight"},
                    "the recipe");
  Recipe r;
  r.name = field<std::string>(j, "name", "recipe");
  r.linear = linear_from(field<json>(j, "linear", "recipe"));
  r.master_weight = parse_dtype(field<std::string>(j, "master_weight", "recipe"));
  r.scaled_state = field<bool>(j, "scaled_state", "recipe");
  r.optimizer_state = parse_dtype(field<std::string>(j, "optimizer_state", "recipe"));
  r.weight_gradient = parse_format(field<std::string>(j, "weight_gradient", "recipe"));
  r.rescale_every = int_field(j, "rescale_every", "recipe", 0, 1 << 30);
  r.rescale_norm_grad = j.contains("rescale_norm_grad") && field<bool>(j, "rescale_norm_grad", "recipe");
  r.rescale_gradients = j.contains("rescale_gradients") && field<bool>(j, "rescale_gradients", "recipe");
  r.unit_scaled = j.contains("unit_scaled") && field<bool>(j, "unit_scaled", "recipe");
  r.umup = j.contains("umup") && field<bool>(j, "umup", "recipe");
  r.data_storage = j.contains("data_storage") ? parse_dtype(field<std::string>(j, "data_storage", "recipe")) : DType::f32;
  const json ls = field<json>(j, "loss_scaling", "recipe");
  only_known_fields(ls, {"kind", "scale", "growth_interval"}, "loss_scaling");
  const std::string kind = field<std::string>(ls, "kind", "loss_scaling");
  if (kind == "none")
    r.loss_scaling.kind = LossScalerConfig::Kind::none;
  else if (kind == "static")
    r.loss_scaling.kind = LossScalerConfig::Kind::fixed;
  else if (kind == "dynamic")
    r.loss_scaling.kind = LossScalerConfig::Kind::dynamic;
  else
    throw Error("recipe: loss_scaling.kind must be none, static or dynamic, got '" + kind + "'");
  r.loss_scaling.scale = field<double>(ls, "scale", "loss_scaling");
  if (!(r.loss_scaling.scale > 0) || !std::isfinite(r.loss_scaling.scale))
    throw Error("recipe: field 'scale' in loss_scaling must be finite and > 0, got " + io::json_excerpt(ls.at("scale")));
  r.loss_scaling.growth_interval = int_field(ls, "growth_interval", "loss_scaling", 1, 1 << 30);
  if (j.contains("high_precision")) {
    const json hp = field<json>(j, "high_precision", "recipe");
    only_known_fields(hp, {"first_blocks", "last_blocks", "layers"}, "high_precision");
    r.high_precision.first_blocks = int_field(hp, "first_blocks", "high_precision", 0, 1 << 20);
    r.high_precision.last_blocks = int_field(hp, "last_blocks", "high_precision", 0, 1 << 20);
    r.high_precision.layers = field<std::vector<std::string>>(hp, "layers", "high_precision");
  }
  if (j.contains("gradient_allreduce")) r.gradient_allreduce = parse_format(field<std::string>(j, "gradient_allreduce", "recipe"));
  if (j.contains("first_moment")) r.first_moment = state_from(field<json>(j, "first_moment", "recipe"), "first_moment");
  if (j.contains("second_moment")) r.second_moment = state_from(field<json>(j, "second_moment", "recipe"), "second_moment");
  if (j.contains("master_rounding")) {
    const std::string name = field<std::string>(j, "master_rounding", "recipe");
    if (name != "nearest_even" && name != "stochastic")
      throw Error("recipe: field 'master_rounding' must be nearest_even or stochastic, got '" + name + "'");
    r.master_rounding = name == "stochastic" ? Rounding::stochastic : Rounding::nearest_even;
  }
  if (j.contains("linear_master_weight")) {
    const std::string name = field<std::string>(j, "linear_master_weight", "recipe");
    try {
      r.linear_master_weight = parse_linear_master(name);
    } catch (const Error& e) {
      throw Error(std::string("recipe: ") + e.what());
    }
  }
  return r;
}
}  // namespace

void Recipe::validate() const {
  auto refuse = [&](const std::string& why) { throw Error("recipe '" + name + "': " + why); };
  for (const auto& [role, d] : {std::pair<const char*, DType>{"master_weight", master_weight},
                                {"optimizer_state", optimizer_state},
                                {"data_storage", data_storage}})
    if (is_integer(d)) refuse(std::string(role) + " must be a floating-point dtype, got " + std::string(dtype_name(d)));
  for (const auto& [role, f] :
       {std::pair<const char*, const optim::StateFormat&>{"first_moment", first_moment}, {"second_moment", second_moment}})
    try {
      optim::validate(f, role);
    } catch (const Error& e) {
      refuse(e.what());
    }
  for (const auto& [role, f] :
       {std::pair<const char*, const optim::StateFormat&>{"first_moment", first_moment}, {"second_moment", second_moment}})
    if (const std::string unused = unused_state_field(f); !unused.empty()) refuse(std::string(role) + ": " + unused);
  if (first_moment.non_negative) refuse("first_moment: the first moment takes both signs (non_negative must be false)");
  if (master_rounding == Rounding::stochastic && (scaled_state || dtype_size(master_weight) >= 4))
    refuse("master_rounding stochastic rounds unscaled master weights narrower than f32 (master_weight bf16 or f16), got " +
           std::string(scaled_state ? "scaled_state" : "master_weight " + std::string(dtype_name(master_weight))));
  if (linear_master_weight == LinearMaster::scaled_f16 && scaled_state)
    refuse(
        "linear_master_weight scaled_f16 is MS-AMP's per-tensor scale for unscaled parameters; with scaled_state SCALIFY's scaled "
        "master weights already carry their own scales (set master_weight instead)");
  if (linear_master_weight == LinearMaster::scaled_f16 && (unit_scaled || umup))
    refuse(std::string("linear_master_weight scaled_f16 needs the standard model: ") + (umup ? "u-μP" : "unit scaling") +
           " passes each weight through a scaling op of its own before the GEMM, and that op would round the weight's gradient "
           "into the master's f16 data, which has no scale for it");
  if (linear_master_weight == LinearMaster::scaled_f16 && !linear.quantized)
    refuse("linear_master_weight scaled_f16 applies to the weights of the quantised linear layers, and linear.quantized is false");
  if (scaled_state && (!first_moment.is_plain_f32() || !second_moment.is_plain_f32()))
    refuse("first_moment / second_moment apply to unscaled parameters; with scaled_state the moments are set by optimizer_state");
  // Every activation and gradient is rounded into the data storage after every op: below 16 bits
  // (FP8, FP6, FP4) nothing survives that without a scale per op, and the model learns nothing.
  if (!dtype_format(data_storage) || dtype_size(data_storage) < 2)
    refuse(
        "data_storage must be f32, f16 or bf16 (every activation and gradient is held in it; for FP8 or FP4 matmuls set the "
        "linear roles' formats), got " +
        std::string(dtype_name(data_storage)));
  if (gradient_allreduce && *gradient_allreduce != Format::f16 && *gradient_allreduce != Format::bf16 &&
      *gradient_allreduce != Format::e4m3 && *gradient_allreduce != Format::e5m2)
    refuse("gradient_allreduce must be f16, bf16, e4m3 or e5m2 (leave it out to exchange gradients in their own storage), got " +
           std::string(format_name(*gradient_allreduce)));
  for (const auto& [operand, config] : linear.operands()) {
    if (!linear.quantized) break;  // an unquantised linear layer uses none of its operands
    const QuantizerConfig& c = *config;
    const std::string where = std::string("linear.") + operand;
    // MX blocks scale elements of the OCP MX formats by E8M0 powers of two (OCP MX v1.0).
    const bool mx_element = c.format == Format::e4m3 || c.format == Format::e5m2 || c.format == Format::e2m3 || c.format == Format::e3m2 ||
                            c.format == Format::e2m1 || c.format == Format::int8;
    if (c.scaling == Scaling::mx && !mx_element)
      refuse(where + ": MX scaling needs an MX element format (e4m3, e5m2, e2m3, e3m2, e2m1, int8), got " +
             std::string(format_name(c.format)));
    if (c.scaling == Scaling::scalify && !scaled_state)
      refuse(where + ": SCALIFY scaling propagates the parameters' scales, so it needs scaled_state");
    if (c.scaling == Scaling::mx && c.block.rule != BlockScaleRule::mx_floor && c.block.rule != BlockScaleRule::mx_ceil &&
        c.block.rule != QuantizerConfig{}.block.rule)
      refuse(where + ": MX scales are powers of two: block_scale must be mx_floor or mx_ceil");
    const bool e4m3_scales = c.block.rule == BlockScaleRule::nvfp4 || c.block.rule == BlockScaleRule::e4m3_amax;
    if (e4m3_scales && (c.scaling != Scaling::block || c.format != Format::e2m1))
      refuse(where + ": NVFP4's E4M3 block scales (block_scale nvfp4, e4m3_amax) are for block scaling of e2m1 elements");
    try {
      check_block_size(c.block.rows, c.block.cols);
    } catch (const Error& e) {
      refuse(where + ": " + e.what());
    }
    const std::string block_shown = "[" + std::to_string(c.block.rows) + ", " + std::to_string(c.block.cols) + "]";
    // An MX block is 32 elements along the reduction (OCP MX v1.0): [1, 32], or [32, 1] for a
    // quantiser used on its own. The quantiser reads no other size, so another would be silently
    // replaced. The untouched default [1, 128] is read as [1, 32]: the MX presets and every MX
    // recipe written so far hold it (a run resumes only under the very recipe it was started with).
    const BlockSpec default_block = QuantizerConfig{}.block;
    const bool mx_block = (c.block.rows == 1 && c.block.cols == 32) || (c.block.rows == 32 && c.block.cols == 1) ||
                          (c.block.rows == default_block.rows && c.block.cols == default_block.cols);
    if (c.scaling == Scaling::mx && !mx_block)
      refuse(where + ": MX blocks are 32 elements: block must be [1, 32] or [32, 1], got " + block_shown);
    // NVFP4 blocks are 16 elements along the reduction, or 16 x 16 (weights).
    const bool nvfp4_block =
        (c.block.rows == 1 || c.block.rows == 16) && (c.block.cols == 1 || c.block.cols == 16) && c.block.rows * c.block.cols > 1;
    if (e4m3_scales && !nvfp4_block)
      refuse(where + ": NVFP4 blocks are 16 elements: block must be [1, 16], [16, 1] or [16, 16], got " + block_shown);
    if (c.transform != Transform::none && c.scaling == Scaling::scalify)
      refuse(where + ": a transform changes the data, which SCALIFY's propagated scale describes");
  }
  // A transform is undone by the GEMM partner's: only the weight-gradient GEMM, whose reduction
  // runs over the tokens, takes one, on both operands alike.
  if (linear.quantized) {
    for (const QuantizerConfig* c :
         {&linear.forward.activation, &linear.forward.weight, &linear.input_grad.gradient, &linear.input_grad.weight})
      if (c->transform != Transform::none)
        refuse("a transform applies to the weight-gradient GEMM's operands only (linear.weight_grad), along the tokens");
    if (linear.weight_grad.activation.transform != linear.weight_grad.gradient.transform)
      refuse("linear.weight_grad: its activation and gradient need the same transform (the GEMM undoes it only then)");
  }
  // Scale propagation runs through a GEMM only when both its operands carry their scales.
  if (linear.quantized && !linear.all_scalify())
    for (const auto& [operand, config] : linear.operands())
      if (config->scaling == Scaling::scalify)
        refuse(std::string("linear.") + operand + ": SCALIFY scaling applies to every operand of every GEMM or to none");
  for (const std::string& pattern : high_precision.layers)
    if (pattern.empty() || pattern.size() > 256) refuse("high_precision.layers: a pattern must have 1 to 256 characters");
  if ((rescale_every > 0 || rescale_gradients) && !scaled_state)
    refuse("rescale_every and rescale_gradients rescale scaled tensors: they need scaled_state");
  if (umup && unit_scaled) refuse("unit scaling and u-μP are two parametrisations of the model: choose one");
  if (umup && scaled_state) refuse("u-μP and SCALIFY's scaled state are two models of scaling: choose one");
  if (unit_scaled && scaled_state) refuse("unit scaling and SCALIFY's scaled state are two models of scaling: choose one");
}

namespace {

// The presets, each defined once, in the order they are listed. A preset starts from f32 with its
// name; its function sets what differs. Adding a recipe is one entry here.
struct PresetDef {
  const char* name;
  void (*define)(Recipe& r);
};

// One tensor role: the strategy and format, the rest as QuantizerConfig's defaults.
QuantizerConfig role(Scaling s, Format f) {
  QuantizerConfig c;
  c.scaling = s;
  c.format = f;
  return c;
}
// The same strategy for the weight and activation in `forward`, the gradient in `backward`.
LinearRecipe roles(Scaling s, Format forward, Format backward) {
  return LinearRecipe::uniform(role(s, forward), role(s, forward), role(s, backward));
}
// Sets a field of every operand of a uniform recipe's gradient role.
template <class F>
void gradients(LinearRecipe& l, F set) {
  set(l.input_grad.gradient);
  set(l.weight_grad.gradient);
}
template <class F>
void every_operand(LinearRecipe& l, F set) {
  for (QuantizerConfig* c : {&l.forward.activation, &l.forward.weight, &l.input_grad.gradient, &l.input_grad.weight,
                             &l.weight_grad.activation, &l.weight_grad.gradient})
    set(*c);
}

// Seed 000 Table 3: #1 FP16 matmuls with propagated scales; #2 + FP16 master weights (scaled) with
// the LayerNorm backward rescale; #3 FP8 matmuls (e4m3 / e5m2), FP8 weight gradients; #4 + FP16
// optimizer state, gradients rescaled. Every row holds its parameters as scaled tensors (Table 3's
// note) and its activations and gradients in f16 data end to end, as jax-scalify's f16
// ScaledArrays: with no loss scaling, only the propagated scales keep them in f16's range.
void scalify_row(Recipe& r, Format forward, Format backward) {
  r.linear = roles(Scaling::scalify, forward, backward);
  r.scaled_state = true;
  r.data_storage = DType::f16;
}
void scalify_fp16_2(Recipe& r) {
  scalify_row(r, Format::f16, Format::f16);
  r.master_weight = DType::f16;
  r.rescale_norm_grad = true;
}
void scalify_fp8_3(Recipe& r) {
  scalify_row(r, Format::e4m3, Format::e5m2);
  r.master_weight = DType::f16;
  r.rescale_norm_grad = true;
  r.weight_gradient = Format::e5m2;
}

// Plain casts with no scale: in the unit-scaled model (seeds 001/002), which keeps every tensor
// near unit scale by construction; or in the standard model, the baselines that show what
// scaling is for.
void casts(Recipe& r, Format forward, Format backward, bool unit_scaled) {
  r.unit_scaled = unit_scaled;
  r.linear = roles(Scaling::none, forward, backward);
}

// Per-tensor FP8 (seed 003, TransformerEngine): e4m3 forward, e5m2 gradients.
void fp8(Recipe& r, Scaling s) { r.linear = roles(s, Format::e4m3, Format::e5m2); }

// FP8 GEMMs and both Adam moments in E4M3 with per-group scales, with or without COAT's expansion.
void fp8_state(Recipe& r, bool expand) {
  fp8(r, Scaling::delayed);
  r.first_moment = {.storage = Format::e4m3, .scaling = optim::StateScaling::per_group, .group_size = 128, .expand = expand};
  r.second_moment = r.first_moment;
  r.second_moment.non_negative = true;
}

// FP4 training (issue 31). NVFP4 as TransformerEngine's NVFP4BlockScaling and the NVFP4
// pretraining paper (arXiv 2509.25149) define it: E2M1 operands, E4M3 block scales under an f32
// tensor scale (BlockScaleRule::nvfp4); 1 x 16 blocks along the reduction for activations and
// gradients, 16 x 16 for weights (the forward and transposed copies are the same numbers);
// stochastic rounding on the gradients only; the 16 x 16 random Hadamard transform on both
// operands of the weight-gradient GEMM only; the last block's linear layers in high precision
// (the paper keeps about the last 16 % of the linear layers in BF16). Each piece can be taken away
// (the ablation presets); MXFP4 swaps the NVFP4 blocks for OCP MX ones (32 elements, E8M0 scales)
// and keeps the other pieces.
struct Fp4Pieces {
  bool mx = false;  // MXFP4 blocks instead of NVFP4's
  BlockScaleRule mx_rule = BlockScaleRule::mx_floor;
  bool tensor_scale = true;    // NVFP4's f32 tensor scale (else E4M3 block scales alone)
  bool square_weights = true;  // 16 x 16 weight blocks (else 1 x 16 along the reduction)
  bool stochastic_gradients = true;
  bool hadamard = true;
  bool last_block_high_precision = true;
};
void fp4(Recipe& r, const Fp4Pieces& p) {
  QuantizerConfig a;
  a.format = Format::e2m1;
  if (p.mx) {
    a.scaling = Scaling::mx;
    if (p.mx_rule == BlockScaleRule::mx_ceil) a.block.rule = p.mx_rule;  // else MX's default, the OCP floor
  } else {
    a.scaling = Scaling::block;
    a.block = {1, 16, p.tensor_scale ? BlockScaleRule::nvfp4 : BlockScaleRule::e4m3_amax};
  }
  QuantizerConfig w = a, g = a;
  if (!p.mx && p.square_weights) w.block.rows = 16;
  if (p.stochastic_gradients) g.rounding = Rounding::stochastic;
  QuantizerConfig a_wgrad = a, g_wgrad = g;
  if (p.hadamard) a_wgrad.transform = g_wgrad.transform = Transform::hadamard16;
  r.linear.quantized = true;
  r.linear.forward = {a, w};
  r.linear.input_grad = {g, w};
  r.linear.weight_grad = {a_wgrad, g_wgrad};
  if (p.last_block_high_precision) r.high_precision.last_blocks = 1;
}

const PresetDef kPresets[] = {
    {"f32", [](Recipe&) {}},
    {"scalify_fp16_1", [](Recipe& r) { scalify_row(r, Format::f16, Format::f16); }},
    {"scalify_fp16_2", scalify_fp16_2},
    {"scalify_fp8_3", scalify_fp8_3},
    {"scalify_fp8_4",
     [](Recipe& r) {
       scalify_fp8_3(r);
       r.optimizer_state = DType::f16;
       r.rescale_every = 100;
       r.rescale_gradients = true;
     }},
    {"unit_f32", [](Recipe& r) { r.unit_scaled = true; }},
    {"unit_fp16", [](Recipe& r) { casts(r, Format::f16, Format::f16, true); }},
    {"unit_fp8", [](Recipe& r) { casts(r, Format::e4m3, Format::e5m2, true); }},
    // u-μP (unit-scaling 0.3.5): f32, and plain E4M3 / E5M2 casts with no scale at all (the µnit
    // Scaling line of work: u-μP keeps every tensor near unit scale, so none is needed).
    {"umup", [](Recipe& r) { r.umup = true; }},
    {"umup_fp8",
     [](Recipe& r) {
       casts(r, Format::e4m3, Format::e5m2, false);
       r.umup = true;
     }},
    {"current", [](Recipe& r) { fp8(r, Scaling::current); }},
    // An amax history of 16 steps, reduced by max (TransformerEngine's defaults are 1024 / max).
    {"delayed", [](Recipe& r) { fp8(r, Scaling::delayed); }},
    // FP8-AMAX (seed 003): the bias from this tensor's amax, the gradients with 3 powers of two of headroom.
    {"fp8_amax",
     [](Recipe& r) {
       fp8(r, Scaling::amax_bias);
       gradients(r.linear, [](QuantizerConfig& c) { c.margin = 3; });
     }},
    // FP8-CSCALE's one constant bias comes from a sweep, as seed 003 prescribes: on the default
    // corpus b = 2..8 reach FP32 parity and b = 0 / 10 do not (docs/RESULTS.md); the preset takes 4.
    {"fp8_cscale",
     [](Recipe& r) {
       fp8(r, Scaling::constant_bias);
       every_operand(r.linear, [](QuantizerConfig& c) { c.bias = kCscaleBias; });
     }},
    // MXFP8 (seed 004): 32-element blocks along each GEMM's reduction, E8M0 scales.
    {"mxfp8", [](Recipe& r) { fp8(r, Scaling::mx); }},
    // Blockwise FP8 (DeepSeek-V3): 1 x 128 activation and gradient blocks, 128 x 128 weight blocks, f32 scales.
    {"blockwise",
     [](Recipe& r) {
       QuantizerConfig w = role(Scaling::block, Format::e4m3), a = w, g = role(Scaling::block, Format::e5m2);  // 1 x 128 by default
       w.block = {128, 128, BlockScaleRule::f32_amax};
       r.linear = LinearRecipe::uniform(w, a, g);
     }},
    // The baseline SCALIFY replaces: f16 matmuls with dynamic loss scaling; an overflowing gradient
    // is inf (no saturation), which the loss scaler must see to skip the step.
    {"f16_loss_scaled",
     [](Recipe& r) {
       casts(r, Format::f16, Format::f16, false);
       gradients(r.linear, [](QuantizerConfig& c) { c.saturate = false; });
       r.loss_scaling = LossScalerConfig{};
     }},
    {"fp16_unscaled", [](Recipe& r) { casts(r, Format::f16, Format::f16, false); }},
    {"fp8_unscaled", [](Recipe& r) { casts(r, Format::e4m3, Format::e5m2, false); }},
    {"nvfp4", [](Recipe& r) { fp4(r, {}); }},
    {"nvfp4_no_hadamard", [](Recipe& r) { fp4(r, {.hadamard = false}); }},
    {"nvfp4_no_sr", [](Recipe& r) { fp4(r, {.stochastic_gradients = false}); }},
    {"nvfp4_1x16_weights", [](Recipe& r) { fp4(r, {.square_weights = false}); }},
    {"nvfp4_no_tensor_scale", [](Recipe& r) { fp4(r, {.tensor_scale = false}); }},
    {"nvfp4_all_layers", [](Recipe& r) { fp4(r, {.last_block_high_precision = false}); }},
    {"mxfp4", [](Recipe& r) { fp4(r, {.mx = true}); }},
    {"mxfp4_rceil", [](Recipe& r) { fp4(r, {.mx = true, .mx_rule = BlockScaleRule::mx_ceil}); }},
    // f32 training whose gradients cross between ranks in a narrower format (train/data_parallel.hpp).
    {"f32_allreduce_f16", [](Recipe& r) { r.gradient_allreduce = Format::f16; }},
    {"f32_allreduce_e4m3", [](Recipe& r) { r.gradient_allreduce = Format::e4m3; }},
    {"f32_allreduce_e5m2", [](Recipe& r) { r.gradient_allreduce = Format::e5m2; }},
    // MS-AMP O2 (Azure/MS-AMP): per-tensor FP8 GEMMs with an amax history (e4m3 forward, e5m2
    // gradients), Adam's m in E4M3 and v in FP16, each with a per-tensor power-of-two scale; the
    // FP8 linear layers' weights kept in scaled FP16 (LBAdamW's master copies, cast(kfloat16)).
    {"msamp_o2",
     [](Recipe& r) {
       fp8(r, Scaling::delayed);
       r.linear_master_weight = LinearMaster::scaled_f16;
       r.first_moment = {.storage = Format::e4m3, .scaling = optim::StateScaling::per_tensor};
       r.second_moment = {.storage = Format::f16, .scaling = optim::StateScaling::per_tensor, .non_negative = true};
     }},
    // COAT (arXiv 2410.19313, NVlabs/COAT defaults): both moments E4M3 with per-group scales (128)
    // after the dynamic range expansion (k a multiple of 1/16); v's codes spend the sign bit on
    // one more mantissa bit (E4M4). Per-tensor FP8 GEMMs as msamp_o2.
    {"coat", [](Recipe& r) { fp8_state(r, true); }},
    // COAT's ablation: the same per-group E4M3 moments without the expansion.
    {"fp8_adam_no_expansion", [](Recipe& r) { fp8_state(r, false); }},
};

}  // namespace

const char* linear_master_name(LinearMaster m) { return m == LinearMaster::scaled_f16 ? "scaled_f16" : "master_weight"; }

LinearMaster parse_linear_master(const std::string& name) {
  for (LinearMaster m : {LinearMaster::master_weight, LinearMaster::scaled_f16})
    if (name == linear_master_name(m)) return m;
  throw Error("linear_master_weight must be master_weight or scaled_f16, got '" + name + "'");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const PresetDef& p : kPresets) names.emplace_back(p.name);
  return names;
}

Recipe preset(const std::string& name) {
  for (const PresetDef& p : kPresets)
    if (name == p.name) {
      Recipe r;
      r.name = name;
      p.define(r);
      r.validate();
      return r;
    }
  std::string valid;
  for (const PresetDef& p : kPresets) valid.append(valid.empty() ? "" : ", ").append(p.name);
  throw Error("unknown recipe preset '" + name + "'; valid presets: " + valid);
}

Recipe load_recipe(const std::string& name_or_file) {
  if (!name_or_file.ends_with(".json")) return preset(name_or_file);
  const std::string text = io::read_input_file(name_or_file, "recipe", kMaxRecipeBytes);
  try {
    return Recipe::from_json(text);
  } catch (const Error& e) {
    throw Error(std::string(e.what()).append(" (in '").append(name_or_file).append("')"));
  }
}

std::string quantized_layers(const Recipe& r) {
  if (!r.linear.quantized) return "none (all f32)";
  std::string kept;
  const HighPrecisionLayers& hp = r.high_precision;
  if (hp.first_blocks > 0) kept.append(", the first ").append(std::to_string(hp.first_blocks)).append(" block(s)");
  if (hp.last_blocks > 0) kept.append(", the last ").append(std::to_string(hp.last_blocks)).append(" block(s)");
  for (const std::string& p : hp.layers) kept.append(", ").append(p);
  return std::string("block linears (qkv, proj, fc, out) in ")
      .append(format_name(r.linear.forward.activation.format))
      .append("/")
      .append(format_name(r.linear.input_grad.gradient.format))
      .append("; embeddings, head, norms, attention")
      .append(kept)
      .append(" in f32");
}

namespace {
// '*' matches any run of characters, everything else itself.
// Iterative, with one backtrack point (the last '*'): linear in practice, no recursion.
bool glob_match(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace

bool HighPrecisionLayers::keeps(const std::string& layer, int block, int blocks) const {
  if (block < first_blocks || block >= blocks - last_blocks) return true;
  return std::any_of(layers.begin(), layers.end(), [&](const std::string& p) { return glob_match(p, layer); });
}

LinearRecipe Recipe::linear_for(const std::string& layer, int block, int blocks) const {
  return high_precision.keeps(layer, block, blocks) ? LinearRecipe{} : linear;
}

std::vector<Var> prepare_parameters(const std::vector<Var>& params, const Recipe& r, const std::vector<bool>& quantized_weight) {
  if (!quantized_weight.empty() && quantized_weight.size() != params.size())
    throw Error("prepare_parameters: " + std::to_string(quantized_weight.size()) + " quantised-weight flags for " +
                std::to_string(params.size()) + " parameters");
  std::vector<Var> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor v = params[i].value();
    if (r.scaled_state)
      out.emplace_back(as_scaled(v, r.master_weight), true);
    else if (r.linear_master_weight == LinearMaster::scaled_f16 && !quantized_weight.empty() && quantized_weight[i])
      out.emplace_back(optim::store_scaled_master(v, DType::f16), true);
    else
      out.emplace_back(v.to(r.master_weight), true);
  }
  return out;
}

optim::AdamWConfig optimizer_config(const Recipe& r, optim::AdamWConfig base) {
  base.state_dtype = r.optimizer_state;
  base.rescale_every = r.rescale_every;
  base.m_format = r.first_moment;
  base.v_format = r.second_moment;
  base.master_rounding = r.master_rounding;
  base.scaled_masters = r.linear_master_weight == LinearMaster::scaled_f16;
  return base;
}

void cast_weight_gradients(const std::vector<Var>& params, const Recipe& r) {
  if (r.weight_gradient == Format::f32) return;
  for (Var p : params) {
    const ScaledTensor& g = p.scaled_grad();
    if (!g.data.defined()) continue;
    // Scaled gradients are cast in their data component with the propagated scale (#3), rescaled
    // first where the recipe says (#4: "grads rescaled"); plain ones after rebalancing to unit RMS.
    const ScaledTensor ready = !g.is_scaled()        ? dynamic_rescale_l2(ScaledTensor(g.data, 1.0f))
                               : r.rescale_gradients ? dynamic_rescale_l2(g)
                                                     : g;
    p.set_grad(cast_data(ready, r.weight_gradient));
  }
}

}  // namespace scalify::quant
