#include "scalify/hub/hf_weights.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/hub/gguf_model.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::hub {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// One engine parameter and the Hugging Face tensors it is made of: each part (stored [out, in]
// when `transpose`, else as the engine holds it) placed side by side along the output dimension.
struct Rule {
  std::string engine;
  bool transpose;
  std::vector<std::pair<std::string, Shape>> parts;
};

std::vector<Rule> layout(const HfConfig& c, const std::string& prefix) {
  const nn::GptConfig& m = c.model;
  const nn::BlockSpec b = m.block();
  const int64_t V = m.vocab, D = m.d_model, H = b.mlp_hidden, KV = D / m.heads * b.kv_heads;
  std::vector<Rule> r;
  auto add = [&](std::string engine, std::string hf, Shape shape, bool transpose = false) {
    r.push_back({std::move(engine), transpose, {{std::move(hf), std::move(shape)}}});
  };
  if (c.family == Family::gpt2) {
    add("wte", prefix + "wte.weight", {V, D});
    add("wpe", prefix + "wpe.weight", {m.seq, D});
    for (int l = 0; l < m.layers; ++l) {
      const std::string e = "h" + std::to_string(l) + ".", h = prefix + "h." + std::to_string(l) + ".";
      for (const auto& [norm, hf_norm] : {std::pair{"ln1", "ln_1"}, std::pair{"ln2", "ln_2"}}) {
        add(e + norm + ".w", h + hf_norm + ".weight", {D});
        add(e + norm + ".b", h + hf_norm + ".bias", {D});
      }
      const std::tuple<const char*, const char*, int64_t, int64_t> linears[] = {{"attn.qkv", "attn.c_attn", D, 3 * D},
                                                                                {"attn.proj", "attn.c_proj", D, D},
                                                                                {"mlp.fc", "mlp.c_fc", D, H},
                                                                                {"mlp.out", "mlp.c_proj", H, D}};
      for (const auto& [engine, hf, in, out] : linears) {
        add(e + engine + ".w", h + hf + ".weight", {in, out});
        add(e + engine + ".b", h + hf + ".bias", {out});
      }
    }
    add("lnf.w", prefix + "ln_f.weight", {D});
    add("lnf.b", prefix + "ln_f.bias", {D});
  } else {
    add("wte", prefix + "embed_tokens.weight", {V, D});
    for (int l = 0; l < m.layers; ++l) {
      const std::string e = "h" + std::to_string(l) + ".", h = prefix + "layers." + std::to_string(l) + ".";
      add(e + "ln1.w", h + "input_layernorm.weight", {D});
      add(e + "ln2.w", h + "post_attention_layernorm.weight", {D});
      const std::string a = h + "self_attn.", p = h + "mlp.";
      r.push_back(
          {e + "attn.qkv.w", true, {{a + "q_proj.weight", {D, D}}, {a + "k_proj.weight", {KV, D}}, {a + "v_proj.weight", {KV, D}}}});
      add(e + "attn.proj.w", a + "o_proj.weight", {D, D}, true);
      r.push_back({e + "mlp.fc.w", true, {{p + "gate_proj.weight", {H, D}}, {p + "up_proj.weight", {H, D}}}});
      add(e + "mlp.out.w", p + "down_proj.weight", {D, H}, true);
      if (m.bias) {
        r.push_back({e + "attn.qkv.b", false, {{a + "q_proj.bias", {D}}, {a + "k_proj.bias", {KV}}, {a + "v_proj.bias", {KV}}}});
        add(e + "attn.proj.b", a + "o_proj.bias", {D});
        r.push_back({e + "mlp.fc.b", false, {{p + "gate_proj.bias", {H}}, {p + "up_proj.bias", {H}}}});
        add(e + "mlp.out.b", p + "down_proj.bias", {D});
      }
    }
    add("lnf.w", prefix + "norm.weight", {D});
  }
  if (!m.tied_head) r.push_back({"head", true, {{"lm_head.weight", {V, D}}}});  // outside the base model: no prefix
  return r;
}

// Buffers some checkpoints carry that are not parameters: GPT-2's causal masks, old Llama
// checkpoints' rotary frequencies.
bool is_buffer(const std::string& name) {
  auto ends = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

}  // namespace

std::vector<std::string> weight_files(const std::string& dir, std::map<std::string, std::string>* listed) {
  if (is_gguf(dir)) return {dir};
  const fs::path index = fs::path(dir) / "model.safetensors.index.json", single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::exists(index, ec) && fs::exists(single, ec))
    throw Error(dir + ": holds both model.safetensors and model.safetensors.index.json; which are the weights? Remove the other");
  if (fs::exists(index, ec)) {
    const json j = io::parse_json(io::read_input_file(index.string(), "weight index", 64 << 20), index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": not a safetensors index (a JSON object with a \"weight_map\" object)");
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw Error(index.string() + ": \"" + name + "\" maps to " + io::json_excerpt(file) + ", not a file name in the folder");
      files.insert(file.get<std::string>());
      (*listed)[name] = file.get<std::string>();
    }
    std::vector<std::string> paths;
    for (const std::string& f : files) {
      const fs::path p = fs::path(dir) / f;
      if (!fs::exists(p, ec)) throw FileError(index.string() + " names the shard " + f + ", which is missing from " + dir);
      paths.push_back(p.string());
    }
    return paths;
  }
  if (!fs::exists(single, ec))
    throw FileError(dir + ": no model.safetensors or model.safetensors.index.json (only safetensors weights are read; " +
                    "transformers' save_pretrained(..., safe_serialization=True) writes them)");
  return {single.string()};
}

std::map<std::string, Tensor> load_hf_weights(const std::string& dir, const HfConfig& config) {
  std::map<std::string, std::pair<Tensor, std::string>> stored;  // name -> tensor, file
  const bool gguf = is_gguf(dir);
  const std::string described_by = gguf ? "its metadata" : "config.json";
  if (gguf) {
    for (auto& [name, t] : gguf_hf_tensors(GgufFile::open(dir), config)) stored.emplace(name, std::pair{std::move(t), dir});
  } else {
    std::map<std::string, std::string> listed;  // index: tensor name -> shard
    for (const std::string& file : weight_files(dir, &listed)) {
      const io::SafeTensors st = io::read_safetensors(file, io::Unverified::quiet);
      for (const auto& [name, t] : st.tensors) {
        if (t.dtype() != DType::f32 && t.dtype() != DType::f16 && t.dtype() != DType::bf16)
          throw Error(file + ": tensor '" + name + "' is " + std::string(dtype_name(t.dtype())) + "; weights must be F32, F16 or BF16");
        if (!stored.emplace(name, std::pair{t, file}).second) throw Error(file + ": tensor '" + name + "' is stored twice in " + dir);
        if (!listed.empty() && (!listed.count(name) || fs::path(file).filename() != listed[name]))
          throw Error(file + ": tensor '" + name + "' is not where model.safetensors.index.json says");
      }
    }
    for (const auto& [name, file] : listed)
      if (!stored.count(name)) throw Error(file + ": tensor '" + name + "' is listed in model.safetensors.index.json but missing");
  }
  // The causal-LM's names carry the base model's prefix; a base model saved alone has none.
  const std::string prefix = config.family == Family::llama           ? (stored.count("model.embed_tokens.weight") ? "model." : "")
                             : stored.count("transformer.wte.weight") ? "transformer."
                                                                      : "";
  std::map<std::string, Tensor> params;
  std::set<std::string> used;
  for (const Rule& rule : layout(config, prefix)) {
    std::vector<Tensor> parts;
    for (const auto& [name, shape] : rule.parts) {
      const auto it = stored.find(name);
      if (it == stored.end())
        throw Error(dir + ": tensor '" + name + "' is missing (config.json describes a " + family_name(config.family) + " model with " +
                    std::to_string(config.model.layers) + " layers)");
      const Tensor t = it->second.first;
      const std::string& file = it->second.second;
      if (t.shape() != shape)
        throw Error(file + ": tensor '" + name + "' has shape " + shape_str(t.shape()) + ", " + described_by + " implies " +
                    shape_str(shape));
      parts.push_back(rule.transpose ? t.to(DType::f32).permute({1, 0}).contiguous() : t.to(DType::f32));
      used.insert(name);
      it->second.first = Tensor();  // placed: its memory goes (a model's weights are held once, not twice)
    }
    params[rule.engine] = parts.size() == 1 ? parts[0] : ops::concat(parts, int(parts[0].dim()) - 1);
  }
  for (const auto& [name, entry] : stored)
    // A tied head stored anyway is the embedding again (transformers ties it and ignores the copy).
    if (!used.count(name) && !is_buffer(name) && !(config.model.tied_head && name == "lm_head.weight"))
      throw Error(entry.second + ": tensor '" + name + "' has no place in the " + family_name(config.family) + " model " + described_by +
                  " describes");
  return params;
}

Family family_of(const nn::GptConfig& m) {
  if (m.unit_scaled || m.umup) throw Error("a unit-scaled or u-μP model has no Hugging Face layout");
  const bool gpt2 = !m.rms_norm && !m.swiglu && m.learned_positions() && m.bias && m.final_norm && m.kv_heads == 0;
  const bool llama = m.rms_norm && m.swiglu && !m.learned_positions() && m.final_norm && !m.gelu_erf;
  if (gpt2) return Family::gpt2;
  if (llama) return Family::llama;
  throw Error(
      "this model is neither GPT-2-shaped (LayerNorm, GELU, learned positions, biases) nor Llama-shaped (RMSNorm, SwiGLU, "
      "rotary positions): it has no Hugging Face layout");
}

std::vector<std::pair<std::string, Tensor>> hf_tensors(const HfConfig& config, const std::map<std::string, Tensor>& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Rule& rule : layout(config, config.family == Family::llama ? "model." : "")) {
    const auto it = params.find(rule.engine);
    if (it == params.end()) throw Error("hf_tensors: no parameter '" + rule.engine + "'");
    const Tensor value = it->second.to(DType::f32);
    std::vector<int64_t> sizes;
    for (const auto& part : rule.parts) sizes.push_back(part.second[0]);  // the output dimension, as stored
    const std::vector<Tensor> split = rule.parts.size() == 1 ? std::vector<Tensor>{value} : ops::split(value, sizes, value.dim() - 1);
    for (size_t i = 0; i < rule.parts.size(); ++i) {
      const Tensor t = rule.transpose ? split[i].permute({1, 0}).contiguous() : split[i].contiguous();
      if (t.shape() != rule.parts[i].second)
        throw Error("hf_tensors: parameter '" + rule.engine + "' has shape " + shape_str(value.shape()) + ", which does not fit " +
                    rule.parts[i].first);
      out.emplace_back(rule.parts[i].first, t);
    }
  }
  return out;
}

void save_hf_model(const std::string& dir, const HfConfig& config, const std::map<std::string, Tensor>& params) {
  if (family_of(config.model) != config.family)
    throw Error(std::string("save_hf_model: the model is not ") + family_name(config.family) + "-shaped");
  // Into a fresh folder only: another model's shards or tokenizer beside these files would be
  // read in their place.
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    throw Error("export: '" + dir + "' exists and is not an empty folder; give a new folder");
  io::SafeTensors out;
  out.metadata["format"] = "pt";  // transformers reads PyTorch-format safetensors
  for (const auto& [name, t] : hf_tensors(config, params)) out.tensors.emplace_back(name, t.to(config.dtype));
  io::make_folder(dir);
  io::write_text_atomically((fs::path(dir) / "config.json").string(), hf_config_json(config));
  io::write_safetensors((fs::path(dir) / "model.safetensors").string(), out);
}

}  // namespace scalify::hub
