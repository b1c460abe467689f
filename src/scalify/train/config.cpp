#include "scalify/train/config.hpp"

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <numbers>
#include <optional>
#include <sstream>
#include <toml++/toml.h>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/number_text.hpp"
#include "scalify/quant/recipe.hpp"

namespace scalify::train {

namespace {
constexpr uint64_t kMaxConfigBytes = 1 << 20;  // a config is a few hundred bytes

// One entry per key: how to set it from text and how to print it.
struct Key {
  std::function<void(TrainConfig&, const std::string&)> set;
  std::function<std::string(const TrainConfig&)> get;
  bool is_string = false;
  // Written by to_toml() only when it differs from its default: a key added since (u-μP's), so a
  // run that leaves it alone still loads in a build from before it.
  bool only_if_set = false;
};

int64_t to_int(const std::string& key, const std::string& v) {
  const std::optional<int64_t> x = io::parse_number<int64_t>(v);
  if (!x) throw Error("config: '" + key + "' must be a decimal integer within 64 bits, got '" + v + "'");
  return *x;
}
double to_double(const std::string& key, const std::string& v) {
  const std::optional<double> x = io::parse_number<double>(v);
  if (!x) throw Error("config: '" + key + "' must be a finite decimal number, got '" + v + "'");
  return *x;
}
// Keys held in narrower types: range-checked before the conversion (-1 would wrap to 2^64 - 1).
uint64_t to_seed(const std::string& key, const std::string& v) {
  const int64_t x = to_int(key, v);
  if (x < 0) throw Error("config: '" + key + "' must be >= 0, got '" + v + "'");
  return uint64_t(x);
}
int to_small_int(const std::string& key, const std::string& v) {
  const int64_t x = to_int(key, v);
  if (x < -(int64_t(1) << 30) || x > (int64_t(1) << 30)) throw Error("config: '" + key + "' is out of range, got '" + v + "'");
  return int(x);
}
bool to_bool(const std::string& key, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  throw Error("config: '" + key + "' must be true or false, got '" + v + "'");
}
std::string num(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  std::string t = s.str();
  if (t.find_first_of(".eE") == std::string::npos) t += ".0";
  return t;
}

const std::map<std::string, Key>& table() {
#define INT_KEY(name, field)                                                   \
  {                                                                            \
    name, {                                                                    \
      [](TrainConfig& c, const std::string& v) { c.field = to_int(name, v); }, \
          [](const TrainConfig& c) { return std::to_string(c.field); }         \
    }                                                                          \
  }
#define DBL_KEY(name, field)                                                                                                        \
  {                                                                                                                                 \
    name, {                                                                                                                         \
      [](TrainConfig& c, const std::string& v) { c.field = to_double(name, v); }, [](const TrainConfig& c) { return num(c.field); } \
    }                                                                                                                               \
  }
#define BOOL_KEY(name, field)                                                          \
  {                                                                                    \
    name, {                                                                            \
      [](TrainConfig& c, const std::string& v) { c.field = to_bool(name, v); },        \
          [](const TrainConfig& c) { return std::string(c.field ? "true" : "false"); } \
    }                                                                                  \
  }
#define NEW_DBL_KEY(name, field)                                                                                                     \
  {                                                                                                                                  \
    name, {                                                                                                                          \
      [](TrainConfig& c, const std::string& v) { c.field = to_double(name, v); }, [](const TrainConfig& c) { return num(c.field); }, \
          false, true                                                                                                                \
    }                                                                                                                                \
  }
#define STR_KEY(name, field)                                                                                        \
  {                                                                                                                 \
    name, {                                                                                                         \
      [](TrainConfig& c, const std::string& v) { c.field = v; }, [](const TrainConfig& c) { return c.field; }, true \
    }                                                                                                               \
  }
  static const std::map<std::string, Key> t = {
      STR_KEY("data", data),
      STR_KEY("out", out),
      STR_KEY("recipe", recipe),
      STR_KEY("init", init),
      STR_KEY("init_files", init_files),
      STR_KEY("init_weights", init_weights),
      INT_KEY("vocab", model.vocab),
      {"seed",
       {[](TrainConfig& c, const std::string& v) { c.seed = to_seed("seed", v); },
        [](const TrainConfig& c) { return std::to_string(c.seed); }}},
      INT_KEY("steps", steps),
      INT_KEY("batch", batch),
      INT_KEY("accum", accum),
      INT_KEY("seq", model.seq),
      INT_KEY("d_model", model.d_model),
      {"layers",
       {[](TrainConfig& c, const std::string& v) { c.model.layers = to_small_int("layers", v); },
        [](const TrainConfig& c) { return std::to_string(c.model.layers); }}},
      {"heads",
       {[](TrainConfig& c, const std::string& v) { c.model.heads = to_small_int("heads", v); },
        [](const TrainConfig& c) { return std::to_string(c.model.heads); }}},
      {"kv_heads",
       {[](TrainConfig& c, const std::string& v) { c.model.kv_heads = to_small_int("kv_heads", v); },
        [](const TrainConfig& c) { return std::to_string(c.model.kv_heads); }}},
      INT_KEY("mlp_hidden", model.mlp_hidden),
      BOOL_KEY("bias", model.bias),
      BOOL_KEY("gelu_erf", model.gelu_erf),
      DBL_KEY("norm_eps", model.norm_eps),
      DBL_KEY("rope_theta", model.rope_theta),
      BOOL_KEY("unit_scaled", model.unit_scaled),
      NEW_DBL_KEY("residual_mult", model.residual_mult),
      NEW_DBL_KEY("residual_attn_ratio", model.residual_attn_ratio),
      NEW_DBL_KEY("act_mult", model.act_mult),
      NEW_DBL_KEY("attn_mult", model.attn_mult),
      NEW_DBL_KEY("loss_mult", model.loss_mult),
      BOOL_KEY("rms_norm", model.rms_norm),
      BOOL_KEY("swiglu", model.swiglu),
      BOOL_KEY("tied_head", model.tied_head),
      BOOL_KEY("final_norm", model.final_norm),
      DBL_KEY("lr", lr),
      DBL_KEY("min_lr", min_lr),
      DBL_KEY("weight_decay", weight_decay),
      NEW_DBL_KEY("independent_weight_decay", independent_weight_decay),
      DBL_KEY("beta1", beta1),
      DBL_KEY("beta2", beta2),
      DBL_KEY("eps", eps),
      DBL_KEY("grad_clip", grad_clip),
      INT_KEY("warmup", warmup),
      INT_KEY("eval_every", eval_every),
      INT_KEY("eval_windows", eval_windows),
      INT_KEY("checkpoint_every", checkpoint_every),
      INT_KEY("stats_every", stats_every),
      DBL_KEY("val_fraction", val_fraction),
  };
#undef INT_KEY
#undef DBL_KEY
#undef NEW_DBL_KEY
#undef BOOL_KEY
#undef STR_KEY
  return t;
}
}  // namespace

std::vector<std::string> TrainConfig::keys() {
  std::vector<std::string> k;
  for (const auto& e : table()) k.push_back(e.first);
  return k;
}

namespace {
const Key& find_key(const std::string& key) {
  const auto it = table().find(key);
  if (it == table().end()) {
    std::string valid;
    for (const std::string& k : TrainConfig::keys()) valid += (valid.empty() ? "" : ", ") + k;
    throw Error("config: unknown key '" + key + "'; valid keys: " + valid);
  }
  return it->second;
}
}  // namespace

void TrainConfig::set(const std::string& key, const std::string& value) {
  find_key(key).set(*this, value);
  given.insert(key);
}

void TrainConfig::set(const std::string& key_equals_value) {
  const size_t eq = key_equals_value.find('=');
  if (eq == std::string::npos) throw Error("--set expects KEY=VALUE, got '" + key_equals_value + "'");
  set(key_equals_value.substr(0, eq), key_equals_value.substr(eq + 1));
}

namespace {
struct FixedKey {
  const char* key;
  bool nn::GptConfig::*field;
  bool value;
};
constexpr FixedKey kUmupModel[] = {{"rms_norm", &nn::GptConfig::rms_norm, true},
                                   {"swiglu", &nn::GptConfig::swiglu, true},
                                   {"bias", &nn::GptConfig::bias, false},
                                   {"tied_head", &nn::GptConfig::tied_head, false}};
}  // namespace

void set_umup_model_keys(nn::GptConfig& m) {
  for (const FixedKey& k : kUmupModel) m.*k.field = k.value;
  if (m.mlp_hidden == 0) m.mlp_hidden = 4 * m.d_model;  // uu.MLP's
}

TrainConfig with_recipe_defaults(const TrainConfig& config) {
  TrainConfig c = config;
  bool umup = false;
  try {
    umup = quant::load_recipe(c.recipe).umup;
  } catch (const Error&) {  // validate() reports it
  }
  if (umup) {
    for (const FixedKey& k : kUmupModel)
      if (c.given.count(k.key) && c.model.*k.field != k.value)
        throw Error("config: '" + std::string(k.key) + "' must be " + (k.value ? "true" : "false") + " under u-μP (recipe '" + c.recipe +
                    "'): its transformer is unit-scaling's (RMSNorm, SwiGLU, no biases, an untied head)");
    set_umup_model_keys(c.model);
  }
  // u-μP's learning rate is O(1) (each tensor's is lr x its factors): f32's default 2e-3 leaves its
  // model barely trained (val loss 4.97 against f32's 2.58 in the README's comparison). 2^0 is the
  // transfer study's best at widths 64 and 256 (docs/RESULTS.md); min_lr keeps f32's ratio of 1/10.
  if (umup && !c.given.count("lr")) {
    c.lr = 1.0;
    if (!c.given.count("min_lr")) c.min_lr = 0.1;
  }
  if (umup && !c.given.count("weight_decay")) c.weight_decay = 0;
  if (umup && !c.given.count("grad_clip")) c.grad_clip = 0;
  return c;
}

void TrainConfig::validate() const {
  auto need = [](bool ok, const std::string& key, const std::string& what) {
    if (!ok) throw Error("config: '" + key + "' " + what);
  };
  need(steps >= 1 && steps <= 100000000, "steps", "must be in [1, 1e8]");
  need(batch >= 1 && batch <= 65536, "batch", "must be in [1, 65536]");
  need(accum >= 1 && accum <= 1024, "accum", "must be in [1, 1024]");
  need(lr > 0 && lr <= 10, "lr", "must be in (0, 10]");
  need(min_lr >= 0 && min_lr <= lr, "min_lr", "must be in [0, lr]");
  need(weight_decay >= 0 && weight_decay < 10, "weight_decay", "must be in [0, 10)");
  need(beta1 >= 0 && beta1 < 1, "beta1", "must be in [0, 1)");
  need(beta2 >= 0 && beta2 < 1, "beta2", "must be in [0, 1)");
  need(eps > 0 && eps < 1, "eps", "must be in (0, 1)");
  need(grad_clip >= 0, "grad_clip", "must be >= 0 (0: off)");
  need(warmup >= 0, "warmup", "must be >= 0");
  need(eval_every >= 1, "eval_every", "must be >= 1");
  need(eval_windows >= 1 && eval_windows <= 1000000, "eval_windows", "must be in [1, 1e6]");
  need(checkpoint_every >= 1, "checkpoint_every", "must be >= 1");
  need(stats_every >= 1, "stats_every", "must be >= 1");
  need(val_fraction > 0 && val_fraction < 1, "val_fraction", "must be in (0, 1)");
  need(independent_weight_decay >= 0 && independent_weight_decay < 1, "independent_weight_decay", "must be in [0, 1)");
  need(!out.empty(), "out", "must not be empty");
  need(model.vocab == 256 || !init.empty(), "vocab", "must be 256 (byte tokens) unless init names a pretrained model");
  bool umup = false;
  try {
    umup = quant::load_recipe(recipe).umup;
  } catch (const Error& e) {  // the recipe file itself: still a file error
    rethrow_as(e, std::string("config: 'recipe': ") + e.what());
  }
  // An untouched default is u-μP's 0 (with_recipe_defaults); a given one is a mistake.
  need(!umup || weight_decay == 0 || !given.count("weight_decay"), "weight_decay",
       "is AdamW's coupled decay, which u-μP (recipe '" + recipe +
           "') does not use: set independent_weight_decay (the decay per step) instead");
  need(umup || independent_weight_decay == 0, "independent_weight_decay",
       "is u-μP's weight decay; recipe '" + recipe + "' is not u-μP: set weight_decay instead");
  try {
    model.validate();
  } catch (const Error& e) {
    throw Error(std::string("config: ") + e.what());
  }
}

std::string TrainConfig::to_toml() const {
  std::string s = "# scalify train: the effective configuration of this run\n";
  static const TrainConfig defaults;
  for (const auto& [k, key] : table()) {
    const std::string v = key.get(*this);
    if (key.only_if_set && v == key.get(defaults)) continue;
    if (key.is_string) {
      std::ostringstream q;  // TOML quoting and escapes
      q << toml::value<std::string>(v);
      s += k + " = " + q.str() + "\n";
    } else {
      s += k + " = " + v + "\n";
    }
  }
  return s;
}

TrainConfig parse_config(const std::string& text, const std::string& what) {
  toml::table t;
  try {
    t = toml::parse(text, what);
  } catch (const toml::parse_error& e) {
    std::ostringstream m;
    m << "config: " << what << " is not valid TOML: " << e.description() << " (line " << e.source().begin.line << ")";
    throw Error(m.str());
  }
  TrainConfig c;
  for (const auto& [k, node] : t) {
    const std::string key(k.str());
    const Key& entry = find_key(key);
    if (entry.is_string != node.is_string()) throw Error("config: '" + key + "' must " + (entry.is_string ? "" : "not ") + "be a string");
    std::string v;
    if (node.is_string()) {
      v = *node.value<std::string>();
    } else if (node.is_integer()) {
      v = std::to_string(*node.value<int64_t>());
    } else if (node.is_floating_point()) {
      v = num(*node.value<double>());
    } else if (node.is_boolean()) {
      v = *node.value<bool>() ? "true" : "false";
    } else {
      throw Error("config: '" + key + "' has an unsupported value type");
    }
    entry.set(c, v);
    c.given.insert(key);
  }
  return c;
}

TrainConfig load_config_file(const std::string& path) {
  TrainConfig c = parse_config(io::read_input_file(path, "config", kMaxConfigBytes), path);
  c.validate();
  return c;
}

TrainConfig run_config(const std::string& run_dir) {
  if (!std::filesystem::exists(run_dir)) throw MissingFileError("'" + run_dir + "' does not exist (give a run folder)");
  if (!std::filesystem::is_directory(run_dir)) throw Error("'" + run_dir + "' is not a run folder");
  return load_config_file((std::filesystem::path(run_dir) / "config.toml").string());
}

TrainConfig resume_config(const std::string& run_dir, const std::function<void(TrainConfig&)>& overrides) {
  TrainConfig run = run_config(run_dir);
  // A u-μP run of an earlier version recorded the standard model keys; it trained u-μP's.
  if (quant::load_recipe(run.recipe).umup) set_umup_model_keys(run.model);
  TrainConfig c = run;
  overrides(c);
  c.out = run_dir;
  // The checkpoint holds the run's model: another shape would drop its tensors (fewer layers) or
  // read them otherwise (other heads) without a word.
  for (const auto& [key, entry] : table()) {
    TrainConfig one = run;
    entry.set(one, entry.get(c));
    if (!(one.model == run.model))
      throw Error("resume: the run in '" + run_dir + "' has " + key + " = " + entry.get(run) + ", not " + entry.get(c) +
                  "; a run keeps its model's shape: start a new run for another");
  }
  return c;
}

double learning_rate(const TrainConfig& c, int64_t step) {
  if (step < c.warmup) return c.lr * double(step + 1) / double(c.warmup);
  const double span = double(std::max<int64_t>(c.steps - c.warmup, 1));
  const double progress = std::min(1.0, double(step - c.warmup) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace scalify::train
