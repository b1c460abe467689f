#include "scalify/train/session.hpp"

#include <algorithm>
#include <cstring>
#include <charconv>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "scalify/autograd/scaling.hpp"
#include "scalify/error.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/optim/state_layout.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/quant/quantizer.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/init_record.hpp"

namespace scalify::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// 2: every tensor and the metadata carry a CRC-32C (io/safetensors.hpp); 1 (before them) still loads.
constexpr const char* kFormatVersion = "2";

void put(io::SafeTensors& st, json& any_scale, const std::string& name, const ScaledTensor& s) {
  st.tensors.emplace_back(name, s.data);
  if (s.scale.defined()) st.tensors.emplace_back(name + ".scale", s.scale);
  if (s.any_scale) any_scale.push_back(name);
}
ScaledTensor get(const io::SafeTensors& st, const json& any_scale, const std::string& name) {
  ScaledTensor s(st.at(name));
  if (st.has(name + ".scale")) s.scale = st.at(name + ".scale");
  s.any_scale = std::find(any_scale.begin(), any_scale.end(), name) != any_scale.end();
  return s;
}

// Encoded optimizer state (optim/state_format.hpp), stored as encoded, not widened: the codes in
// their layout's dtype (optim/state_layout.hpp: a non-negative moment's unsigned 8-bit codes as
// raw bytes, U8, which no reader mistakes for E4M3 or E5M2), and the f32 scales, expansion
// exponents and centres where it has them. The metadata kStateFormatsKey records both moments'
// formats, so a resume under a recipe whose formats differ is refused instead of misread.
void put_encoded(io::SafeTensors& st, const std::string& name, const optim::EncodedState& e, const optim::StateFormat& f) {
  Tensor codes = Tensor::empty({e.numel}, optim::state_layout(f).file_dtype);
  std::memcpy(codes.raw_bytes(), e.codes.data(), e.codes.size());
  st.tensors.emplace_back(name + ".codes", codes);
  for (const auto& [part, v] :
       {std::pair<const char*, const std::vector<float>&>{".scales", e.scales}, {".expand_k", e.expand_k}, {".centre", e.centre}})
    if (!v.empty()) st.tensors.emplace_back(name + part, Tensor::from_vector(v, {int64_t(v.size())}));
}
optim::EncodedState get_encoded(const io::SafeTensors& st, const std::string& name, const optim::StateFormat& f) {
  optim::EncodedState e;
  const Tensor& codes = st.at(name + ".codes");
  // Checkpoints from before the layouts labelled unsigned codes with their storage's dtype.
  const optim::StateLayout layout = optim::state_layout(f);
  if (codes.dtype() != layout.file_dtype && codes.dtype() != dtype_of(f.storage))
    throw Error("checkpoint: tensor '" + name + ".codes' holds " + std::string(dtype_name(codes.dtype())) + ", the recipe's " +
                layout.name + " codes are " + std::string(dtype_name(layout.file_dtype)));
  e.numel = codes.numel();
  e.codes.resize(size_t(codes.numel()) * size_t(dtype_size(codes.dtype())));
  std::memcpy(e.codes.data(), codes.raw_bytes(), e.codes.size());
  auto floats = [&](const char* part) { return st.has(name + part) ? st.at(name + part).to_floats() : std::vector<float>{}; };
  e.scales = floats(".scales");
  e.expand_k = floats(".expand_k");
  e.centre = floats(".centre");
  return e;
}

// Metadata of a checkpoint written with CheckpointContents::model ("model"); absent in resumable ones.
constexpr const char* kContentsKey = "scalify.contents";
// Metadata of a resumable checkpoint with encoded moments: {"first_moment": ..., "second_moment":
// ...}, each the moment's format as its recipe JSON object (quant::state_format_json); absent in
// checkpoints of plain (f32 or scaled_state) moments and in those written before it.
constexpr const char* kStateFormatsKey = "scalify.state_formats";
json state_formats(const optim::AdamWConfig& c) {
  return {{"first_moment", json::parse(quant::state_format_json(c.m_format))},
          {"second_moment", json::parse(quant::state_format_json(c.v_format))}};
}
// A resume continues from moments in the formats the checkpoint says they are in, or not at all.
void check_state_formats(const io::SafeTensors& st, const optim::AdamW& opt) {
  const auto it = st.metadata.find(kStateFormatsKey);
  if (it == st.metadata.end()) return;
  const json stored = io::parse_json(it->second, std::string("checkpoint metadata '") + kStateFormatsKey + "'");
  const bool encoded = opt.encodes_state();
  if (!encoded || stored != state_formats(opt.config()))
    throw Error("checkpoint: its optimizer state is stored as " + stored.dump() + ", the recipe's state formats are " +
                (encoded ? state_formats(opt.config()).dump() : std::string("plain (f32 first_moment and second_moment)")) +
                "; resume with the recipe the checkpoint was written with");
}
bool holds_model_only(const io::SafeTensors& st) {
  const auto it = st.metadata.find(kContentsKey);
  return it != st.metadata.end() && it->second == "model";
}

std::string gigabytes(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3g GB", bytes / 1e9);
  return s;
}

}  // namespace

namespace {
// Bytes the quantised linear layers' scaled f16 master weights (Recipe::linear_master_weight) save
// against master_weight: 2-byte data instead of master_weight's, their gradients f32 either way
// (QLinear); negative where master_weight is narrower than f32.
double scaled_master_saving(const nn::GptConfig& m, const quant::Recipe& r) {
  if (r.linear_master_weight != quant::LinearMaster::scaled_f16) return 0;
  const nn::BlockSpec b = m.block();
  const int64_t D = m.d_model, qkv = D + 2 * D / m.heads * b.kv_heads, fc = (m.swiglu ? 2 : 1) * b.mlp_hidden;
  const std::pair<const char*, int64_t> linears[] = {
      {"attn.qkv", D * qkv}, {"attn.proj", D * D}, {"mlp.fc", D * fc}, {"mlp.out", b.mlp_hidden * D}};
  double weights = 0;
  for (int l = 0; l < m.layers; ++l)
    for (const auto& [name, count] : linears)
      if (r.linear_for("h" + std::to_string(l) + "." + name, l, m.layers).quantized) weights += double(count);
  // Their data is 2 bytes instead of master_weight's, and their gradients stay f32 (QLinear) where
  // master_weight's would be its size.
  return weights * (2.0 * dtype_size(r.master_weight) - (2.0 + 4.0));
}
}  // namespace

double estimated_memory_bytes(const TrainConfig& cfg, const quant::Recipe& r, bool with_optimizer) {
  const nn::GptConfig m = Session::model_config(cfg, r);  // the model that trains (u-μP's keys)
  const double params = double(m.parameter_count()), tokens = double(cfg.batch) * double(m.seq);
  // Attention's probabilities, f32 [batch, heads, seq, seq]: per token heads x seq values, kept for
  // the backward in every layer, one layer's at a time without one. At seq 8192 they outweigh the rest.
  const double attention = double(m.heads) * double(m.seq) * 4;
  // A model loaded for inference is checked before its evaluation's context is chosen (`eval
  // --context`, sampling's window): its attention is that context's, not the longest the model
  // allows, so only the parameters and one window of logits are counted here.
  if (!with_optimizer) return 4 * params + tokens * double(m.vocab) * 4;
  // Master weights and gradients, and the moments: scaled tensors of optimizer_state under
  // SCALIFY, else in their own formats (f32 by default; optim/state_layout.hpp).
  const double moments = r.scaled_state ? 2.0 * dtype_size(r.optimizer_state)
                                        : optim::state_bytes_per_value(r.first_moment) + optim::state_bytes_per_value(r.second_moment);
  const double state = 2.0 * dtype_size(r.master_weight) + moments;
  const double activations =
      double(m.layers) * (16 * double(m.d_model) * dtype_size(r.data_storage) + attention) + 3.0 * 4 * double(m.vocab);
  return state * params - scaled_master_saving(m, r) + tokens * activations;
}

void check_fits_in_memory(const TrainConfig& cfg, const quant::Recipe& r, bool with_optimizer) {
  const nn::GptConfig m = Session::model_config(cfg, r);
  const double bytes = estimated_memory_bytes(cfg, r, with_optimizer), limit = double(platform::memory_limit_bytes());
  if (bytes > limit)
    throw Error("model: d_model=" + std::to_string(m.d_model) + ", layers=" + std::to_string(m.layers) + " (" +
                std::to_string(m.parameter_count()) + " parameters) at batch " + std::to_string(cfg.batch) + " x seq " +
                std::to_string(m.seq) + " under recipe " + r.name + " needs at least " + gigabytes(bytes) + ", more than the " +
                gigabytes(limit) + " of memory this process may use (attention alone holds batch x heads x seq^2 f32 values per layer)");
}

const std::vector<const char*>& run_file_names() {
  static const std::vector<const char*> names = {
      "checkpoint.safetensors", "model.safetensors", "initial.safetensors", "config.toml", "recipe.json", "metrics.jsonl", "train.log"};
  return names;
}

std::unique_ptr<Session> make_session(const TrainConfig& cfg, const io::SafeTensors* ckpt) {
  quant::Recipe recipe = quant::load_recipe(cfg.recipe);
  check_fits_in_memory(cfg, recipe, true);
  // A new run from a pretrained model starts from its weights, never drawn at random.
  const bool pretrained = !ckpt && !cfg.init.empty();
  auto s = std::make_unique<Session>(cfg, std::move(recipe), pretrained ? nn::Weights::unset : nn::Weights::random);
  const json any_scale =
      ckpt ? io::parse_json(ckpt->metadata.at("scalify.any_scale"), "checkpoint metadata 'scalify.any_scale'") : json::array();
  std::vector<Var> raw;
  for (const auto& [name, v] : s->model.parameters()) {
    s->names.push_back(name);
    raw.push_back(v);
  }
  if (ckpt) {
    for (size_t i = 0; i < raw.size(); ++i) {
      const ScaledTensor v = get(*ckpt, any_scale, "param." + s->names[i]);
      if (v.shape() != raw[i].shape())
        throw Error("checkpoint: parameter '" + s->names[i] + "' has shape " + shape_str(v.shape()) + ", the config says " +
                    shape_str(raw[i].shape()));
      s->params.push_back(Var(v, true));
    }
  } else {
    if (pretrained) {
      const std::map<std::string, Tensor> values = hub::load_hf_weights(cfg.init, hub::read_hf_config(cfg.init));
      for (size_t i = 0; i < raw.size(); ++i) {
        const auto v = values.find(s->names[i]);
        Tensor value = v == values.end() ? Tensor() : v->second;
        // Learned positions of a fine-tune on windows shorter than the model's context: the first seq rows.
        if (s->names[i] == "wpe" && value.defined() && value.dim() == 2 && value.size(0) > cfg.model.seq)
          value = value.slice(0, 0, cfg.model.seq).contiguous();
        if (!value.defined() || value.shape() != raw[i].shape())
          throw Error("init '" + cfg.init + "': no weights of shape " + shape_str(raw[i].shape()) + " for parameter '" + s->names[i] + "'");
        raw[i] = Var(value, true);
      }
    }
    // The weight matrices of the linear layers the recipe quantises (linear_master_weight's).
    std::vector<bool> quantized_weight;
    const auto quantized = s->model.quantized_linears();
    for (const std::string& n : s->names)
      quantized_weight.push_back(std::any_of(quantized.begin(), quantized.end(), [&](const auto& q) { return n == q.first + ".w"; }));
    s->params = quant::prepare_parameters(raw, s->recipe, quantized_weight);
  }
  nn::NamedParams named;
  for (size_t i = 0; i < raw.size(); ++i) named.push_back({s->names[i], s->params[i]});
  s->model.set_parameters(named);
  optim::AdamWConfig base;
  base.lr = cfg.lr;
  base.beta1 = cfg.beta1;
  base.beta2 = cfg.beta2;
  base.eps = cfg.eps;
  const bool umup = s->model.config().umup;
  base.weight_decay = umup ? cfg.independent_weight_decay : cfg.weight_decay;  // u-μP: the decay per step
  std::vector<double> lr_scale, decay_scale;
  std::vector<bool> decay;
  for (const std::string& n : s->names) {
    lr_scale.push_back(s->model.lr_multiplier(n));
    // u-μP's independent weight decay (unit-scaling's optim.scaled_parameters): every parameter
    // decays by independent_weight_decay x lr(t) / lr per step, whatever its learning rate.
    decay.push_back(umup || nn::Gpt::decays(n));
    // Its scale only where there is a decay to scale (an lr near the smallest double overflows it).
    decay_scale.push_back(umup && base.weight_decay > 0 ? 1 / (cfg.lr * lr_scale.back()) : 1.0);
    if (!std::isfinite(decay_scale.back()))
      throw Error("config: 'lr' is too small for independent_weight_decay: 1 / (lr x " + n + "'s lr factor) overflows");
  }
  s->opt = std::make_unique<optim::AdamW>(s->params, quant::optimizer_config(s->recipe, base), lr_scale, decay, decay_scale);
  if (s->recipe.loss_scaling.kind != quant::LossScalerConfig::Kind::none)
    s->scaler = std::make_unique<quant::LossScaler>(s->recipe.loss_scaling);
  if (ckpt) {
    const json meta = io::parse_json(ckpt->metadata.at("scalify.state"), "checkpoint metadata 'scalify.state'");
    if (!holds_model_only(*ckpt)) {  // a final model.safetensors: no moments, nothing trains on from it
      const auto steps = meta.at("optimizer_steps").get<int64_t>();
      check_state_formats(*ckpt, *s->opt);
      if (s->opt->encodes_state()) {
        std::vector<optim::EncodedState> m, v;
        for (const std::string& n : s->names) {
          m.push_back(get_encoded(*ckpt, "optim.m." + n, s->opt->config().m_format));
          v.push_back(get_encoded(*ckpt, "optim.v." + n, s->opt->config().v_format));
        }
        s->opt->load_encoded_state(steps, std::move(m), std::move(v));
      } else {
        std::vector<ScaledTensor> m, v;
        for (const std::string& n : s->names) {
          m.push_back(get(*ckpt, any_scale, "optim.m." + n));
          v.push_back(get(*ckpt, any_scale, "optim.v." + n));
        }
        s->opt->load_state(steps, std::move(m), std::move(v));
      }
    }
    if (s->scaler) {
      const json& l = meta.at("loss_scaler");
      s->scaler->load_state(
          {l.at("scale").get<double>(), l.at("skipped").get<int64_t>(), l.at("steps").get<int64_t>(), l.at("clean").get<int64_t>()});
    }
    for (const auto& [layer, q] : s->model.quantized_linears())
      for (auto& [role, quantizer] : q->quantizers()) {
        const std::string key = "quant." + layer + "." + role;
        const json& qs = meta.at("quantizers").at(key);
        const Tensor h = ckpt->at(key + ".history");
        const std::vector<float> hist = h.to_floats();
        quantizer->load_state({hist, qs.at("scale").get<float>(), qs.at("steps").get<int64_t>()});
      }
  }
  return s;
}

void save_checkpoint(const Session& s, const std::string& path, int64_t step, int64_t skipped, CheckpointContents contents) {
  io::SafeTensors st;
  json any_scale = json::array(), quantizers = json::object();
  for (size_t i = 0; i < s.params.size(); ++i) {
    put(st, any_scale, "param." + s.names[i], s.params[i].scaled());
    if (contents == CheckpointContents::model) continue;
    if (s.opt->encodes_state()) {
      put_encoded(st, "optim.m." + s.names[i], s.opt->encoded_first_moment(i), s.opt->config().m_format);
      put_encoded(st, "optim.v." + s.names[i], s.opt->encoded_second_moment(i), s.opt->config().v_format);
      continue;
    }
    put(st, any_scale, "optim.m." + s.names[i], s.opt->first_moment(i));
    put(st, any_scale, "optim.v." + s.names[i], s.opt->second_moment(i));
  }
  for (const auto& [layer, q] : s.model.quantized_linears())
    for (const auto& [role, quantizer] : q->quantizers()) {
      const std::string key = "quant." + layer + "." + role;
      const quant::QuantizerState qs = quantizer->state();
      st.tensors.emplace_back(key + ".history", Tensor::from_vector(qs.history, {int64_t(qs.history.size())}));
      quantizers[key] = {{"scale", qs.scale}, {"steps", qs.steps}};
    }
  json state = {{"step", step}, {"skipped", skipped}, {"optimizer_steps", s.opt->steps()}, {"quantizers", quantizers}};
  if (s.scaler) {
    const quant::LossScaler::State l = s.scaler->state();
    state["loss_scaler"] = {{"scale", l.scale}, {"skipped", l.skipped}, {"steps", l.steps}, {"clean", l.clean}};
  }
  st.metadata = {{"format_version", kFormatVersion}, {"step", std::to_string(step)},  {"config", s.cfg.to_toml()},
                 {"recipe", s.recipe.to_json()},     {"scalify.state", state.dump()}, {"scalify.any_scale", any_scale.dump()}};
  if (contents == CheckpointContents::model) st.metadata[kContentsKey] = "model";
  if (contents != CheckpointContents::model && s.opt->encodes_state())
    st.metadata[kStateFormatsKey] = state_formats(s.opt->config()).dump();
  io::write_safetensors(path, st);
}

std::string checkpoint_file(const std::string& path) {
  if (!fs::is_directory(path)) return path;
  const fs::path file = fs::path(path) / "checkpoint.safetensors";
  if (!fs::exists(file)) throw Error("'" + path + "' holds no checkpoint.safetensors (not a run folder, or a run that saved none yet)");
  return file.string();
}

void require_checksums(const io::SafeTensors& st, const std::string& file) {
  if (!st.verified)
    throw Error("checkpoint '" + file +
                "' lacks the checksums its format version carries (metadata 'scalify.crc32c'): the file is corrupt");
}

TrainConfig checkpoint_config(const io::SafeTensors& st, const std::string& file) {
  if (!st.metadata.count("config")) throw Error("'" + file + "' lacks metadata 'config' (not a scalify checkpoint?)");
  TrainConfig cfg = parse_config(st.metadata.at("config"), file + " (config)");
  cfg.validate();
  return cfg;
}

std::pair<io::SafeTensors, TrainConfig> read_checkpoint(const std::string& path) {
  const std::string file = checkpoint_file(path);
  io::SafeTensors st = io::read_safetensors(file);
  TrainConfig cfg = training_checkpoint_config(st, file);
  return {std::move(st), cfg};
}

int64_t checkpoint_step(const io::SafeTensors& st, const std::string& file) {
  const auto it = st.metadata.find("step");
  const std::string text = it == st.metadata.end() ? "" : it->second;
  int64_t step = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || step < 0)
    throw Error("checkpoint '" + file + "': metadata 'step' is not a step number ('" + text + "')");
  return step;
}

TrainConfig training_checkpoint_config(io::SafeTensors& st, const std::string& file) {
  if (st.metadata.count("scalify.ptq"))
    throw Error("'" + file +
                "' is a quantised checkpoint (from scalify quantize), which only eval reads; give the training checkpoint or run folder");
  for (const char* k : {"format_version", "config", "scalify.state", "scalify.any_scale"})
    if (!st.metadata.count(k)) throw Error("checkpoint '" + file + "' lacks metadata '" + k + "' (not a scalify checkpoint?)");
  const std::string version = st.metadata["format_version"];
  if (version != "1" && version != kFormatVersion)
    throw Error("checkpoint '" + file + "' has format version " + version + ", this build reads 1 and " + kFormatVersion);
  if (version == kFormatVersion) require_checksums(st, file);
  TrainConfig cfg = checkpoint_config(st, file);
  const int64_t step = checkpoint_step(st, file);
  for (const char* k : {"scalify.state", "scalify.any_scale"})
    if (io::try_parse_json(st.metadata[k]).is_discarded()) throw Error("checkpoint '" + file + "': corrupt metadata '" + k + "'");
  // The counters a resume continues from: whole numbers >= 0, the step the same as the metadata's.
  const json state = io::parse_json(st.metadata["scalify.state"], "checkpoint '" + file + "': metadata 'scalify.state'");
  for (const char* k : {"step", "skipped", "optimizer_steps"})
    if (!state.is_object() || !state.contains(k) || !state[k].is_number_integer() || state[k].get<int64_t>() < 0)
      throw Error("checkpoint '" + file + "': metadata 'scalify.state' lacks a whole number '" + k + "' >= 0");
  if (state["step"].get<int64_t>() != step)
    throw Error("checkpoint '" + file + "': 'scalify.state' step " + io::json_excerpt(state["step"]) + " differs from metadata step " +
                st.metadata["step"]);
  return cfg;
}

std::unique_ptr<Session> inference_session(const TrainConfig& cfg, quant::Recipe recipe, const std::map<std::string, Tensor>& values) {
  check_fits_in_memory(cfg, recipe, false);
  auto s = std::make_unique<Session>(cfg, std::move(recipe), nn::Weights::unset);
  nn::NamedParams named = s->model.parameters();
  for (auto& [name, p] : named) {
    const auto v = values.find(name);
    if (v == values.end()) throw Error("model: no value for parameter '" + name + "'");
    if (v->second.shape() != p.shape())
      throw Error("model: parameter '" + name + "' has shape " + shape_str(v->second.shape()) + ", the config says " +
                  shape_str(p.shape()));
    p = Var(v->second, false);
    s->names.push_back(name);
    s->params.push_back(p);
  }
  s->model.set_parameters(named);
  return s;
}

namespace {
bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// The names of the parameters whose represented values hold NaN or infinities.
std::vector<std::string> nonfinite_parameters(const Session& s) {
  std::vector<std::string> bad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    try {
      if (!all_finite(s.params[i].value().to_floats())) bad.push_back(s.names[i]);
    } catch (const Error&) {  // data times scale past f32's range
      bad.push_back(s.names[i]);
    }
  }
  return bad;
}
}  // namespace

std::unique_ptr<Session> load_session(const io::SafeTensors& st, const TrainConfig& cfg, const std::string& file, NonFinite nonfinite) {
  // Scales must be finite and positive for anything to compute with them, inspection included.
  // So must encoded moments' per-group scales, expansion exponents (within expansion_for's clamp)
  // and centres.
  for (const auto& [key, t] : st.tensors) {
    if (!(key.starts_with("param.") || key.starts_with("optim."))) continue;
    const bool scale = key.ends_with(".scale") || (key.starts_with("optim.") && (key.ends_with(".scales") || key.ends_with(".centre")));
    const bool exponent = key.starts_with("optim.") && key.ends_with(".expand_k");
    if (!scale && !exponent) continue;
    const std::vector<float> v = t.to_floats();
    if (scale && !std::all_of(v.begin(), v.end(), [](float x) { return x > 0 && std::isfinite(x); }))
      throw Error("checkpoint '" + file + "': tensor '" + key + "' is not a finite positive scale");
    if (exponent && !std::all_of(v.begin(), v.end(), [](float k) { return k > 0 && k <= float(optim::kMaxExpansion); }))
      throw Error("checkpoint '" + file + "': tensor '" + key + "' holds an expansion exponent outside (0, " +
                  std::to_string(int(optim::kMaxExpansion)) + "]");
  }
  std::unique_ptr<Session> s;
  try {
    s = make_session(cfg, &st);
  } catch (const json::exception& e) {
    throw Error("checkpoint '" + file + "': corrupt state metadata (" + e.what() + ")");
  }
  if (nonfinite == NonFinite::allow) return s;
  std::vector<std::string> bad;
  for (const std::string& name : nonfinite_parameters(*s)) bad.push_back("parameter '" + name + "'");
  // The optimizer state a resume continues from; encoded moments' codes are read through their
  // format (a non-negative moment's unsigned codes are no NaN of the storage dtype).
  for (const auto& [key, t] : st.tensors)
    if (key.starts_with("optim.") && !key.ends_with(".scale") && !key.ends_with(".codes") && !all_finite(t.to_floats()))
      bad.push_back("tensor '" + key + "'");
  if (s->opt->encodes_state())
    for (size_t i = 0; i < s->names.size(); ++i)
      for (const auto& [which, e, f] : {std::tuple<const char*, const optim::EncodedState&, const optim::StateFormat&>{
                                            "m", s->opt->encoded_first_moment(i), s->opt->config().m_format},
                                        {"v", s->opt->encoded_second_moment(i), s->opt->config().v_format}}) {
        std::vector<float> values(size_t(e.numel));
        optim::decode_state(e, f, values);
        if (!all_finite(values)) bad.push_back("tensor 'optim." + std::string(which) + "." + s->names[i] + ".codes'");
      }
  if (!bad.empty())
    throw Error("checkpoint '" + file + "': " + bad[0] + " holds NaN or infinite values" +
                (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more)" : std::string()) +
                "; `scalify inspect` shows which parameters");
  return s;
}

std::map<std::string, Tensor> parameter_values(const Session& s) {
  std::map<std::string, Tensor> v;
  for (size_t i = 0; i < s.params.size(); ++i) v[s.names[i]] = s.params[i].value().to(DType::f32).contiguous();
  return v;
}

double batch_loss(const Session& s, const std::vector<int32_t>& bytes, const std::vector<size_t>& starts) {
  const Batch b = make_batch(bytes, starts, s.cfg.model.seq);
  return s.forward_model().loss(b.ids, b.targets).value().item();
}

EvalResult eval_session(const Session& s, const Corpus& corpus, const platform::World& world) {
  const NoGrad no_grad;
  const std::vector<int32_t>& val = corpus.val;
  const std::vector<size_t> starts = eval_starts(val.size(), s.cfg.model.seq, size_t(s.cfg.eval_windows));
  if (starts.empty()) throw Error("eval: validation data shorter than one window of " + std::to_string(s.cfg.model.seq + 1) + " bytes");
  // Batch k of the windows is rank k mod N's; the batches' losses are summed in batch order on
  // every rank, the same double as one process's sum.
  const size_t batches = (starts.size() + size_t(s.cfg.batch) - 1) / size_t(s.cfg.batch), ranks = size_t(world.size());
  const size_t per_rank = (batches + ranks - 1) / ranks;
  std::vector<double> mine(per_rank, 0.0), all(per_rank * ranks);
  const auto batch_size = [&](size_t k) { return double(std::min(size_t(s.cfg.batch), starts.size() - k * size_t(s.cfg.batch))); };
  for (size_t j = 0; j < per_rank && j * ranks + size_t(world.rank()) < batches; ++j) {
    const size_t i = (j * ranks + size_t(world.rank())) * size_t(s.cfg.batch);
    const std::vector<size_t> chunk(starts.begin() + std::ptrdiff_t(i),
                                    starts.begin() + std::ptrdiff_t(std::min(starts.size(), i + size_t(s.cfg.batch))));
    mine[j] = batch_loss(s, val, chunk) * double(chunk.size());
  }
  world.allgather(mine.data(), per_rank * sizeof(double), all.data());
  double total = 0;
  EvalResult r;
  for (size_t k = 0; k < batches; ++k) {
    total += all[(k % ranks) * per_rank + k / ranks];
    r.batch_losses.push_back(all[(k % ranks) * per_rank + k / ranks] / batch_size(k));
  }
  r.windows = starts.size();
  r.loss = total / double(starts.size());
  r.bits_per_byte = r.loss / std::log(2.0);
  if (!corpus.token_bytes.empty()) {  // tokens: the loss in bits over the bytes the targets stand for
    double bytes = 0;
    for (size_t start : starts)
      for (int64_t t = 1; t <= s.cfg.model.seq; ++t) bytes += corpus.token_bytes[size_t(val[start + size_t(t)])];
    r.bits_per_byte = bytes > 0 ? total * double(s.cfg.model.seq) / std::log(2.0) / bytes : std::nan("");
  }
  return r;
}

Corpus corpus_for(const TrainConfig& cfg) {
  const size_t window = size_t(cfg.model.seq) + 1;
  const std::string data = cfg.data.empty() ? default_corpus_path() : cfg.data;
  if (cfg.init.empty()) return load_corpus(data, cfg.val_fraction, window * size_t(cfg.batch));
  const std::unique_ptr<tokenize::Tokenizer> tokenizer = run_tokenizer(cfg, cfg.out);
  // The windows are the model's context unless seq was set: say so, the likelier fix than more text.
  const std::string reason = "one batch: " + std::to_string(cfg.batch) + " window(s) of seq + 1 = " + std::to_string(window) +
                             " tokens; seq " + std::to_string(cfg.model.seq) +
                             (cfg.given.count("seq") ? " as set" : " is the context of init '" + cfg.init + "' (its config.json)") +
                             ": a smaller seq (--set seq=N) or batch needs fewer";
  return load_token_corpus(data, tokenizer.get(), cfg.model.vocab, cfg.val_fraction, window * size_t(cfg.batch), reason);
}

}  // namespace scalify::train
