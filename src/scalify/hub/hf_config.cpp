#include "scalify/hub/hf_config.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "scalify/error.hpp"
#include "scalify/hub/gguf_model.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"

namespace scalify::hub {

using json = nlohmann::json;

const char* family_name(Family f) { return f == Family::gpt2 ? "gpt2" : "llama"; }

namespace {

// Field access with errors that name the file and the field.
struct Fields {
  const json& j;
  std::string file;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const { throw Error(file + ": \"" + key + "\" " + what); }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    if (!j.contains(key)) fail(key, "is missing");
    const json& v = j[key];
    if (!v.is_number_integer()) fail(key, "must be an integer, got " + io::json_excerpt(v));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + io::json_excerpt(v));
    return x;
  }
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
    return j.contains(key) && !j[key].is_null() ? integer(key, lo, hi) : fallback;
  }
  double number_or(const std::string& key, double fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) fail(key, "must be a number, got " + io::json_excerpt(j[key]));
    return j[key].get<double>();
  }
  bool boolean_or(const std::string& key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) fail(key, "must be true or false, got " + io::json_excerpt(j[key]));
    return j[key].get<bool>();
  }
  std::string text_or(const std::string& key, const std::string& fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_string()) fail(key, "must be a string, got " + io::json_excerpt(j[key]));
    return j[key].get<std::string>();
  }
};

// An epsilon: a number above 0 (0 would be the engine's "default" sentinel, and a norm needs one).
double positive(const Fields& f, const std::string& key, double fallback) {
  const double v = f.number_or(key, fallback);
  if (!(v > 0) || !(v < 1)) f.fail(key, "must be in (0, 1), got " + std::to_string(v));
  return v;
}

constexpr int64_t kMaxWidth = int64_t(1) << 16, kMaxVocab = int64_t(1) << 20, kMaxSeq = 65536;

DType weights_dtype(const Fields& f) {
  const std::string name = f.text_or("dtype", f.text_or("torch_dtype", "float32"));
  if (name == "float32") return DType::f32;
  if (name == "float16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  f.fail(f.j.contains("dtype") ? "dtype" : "torch_dtype", "must be float32, float16 or bfloat16, got \"" + name + "\"");
}

nn::GptConfig gpt2(const Fields& f) {
  nn::GptConfig m;
  m.vocab = f.integer("vocab_size", 2, kMaxVocab);
  m.seq = f.integer("n_positions", 1, kMaxSeq);
  m.d_model = f.integer("n_embd", 1, kMaxWidth);
  m.layers = int(f.integer("n_layer", 1, 1024));
  m.heads = int(f.integer("n_head", 1, 1024));
  m.mlp_hidden = f.integer_or("n_inner", 4 * m.d_model, 1, kMaxWidth * 8);
  m.norm_eps = positive(f, "layer_norm_epsilon", 1e-5);
  m.tied_head = f.boolean_or("tie_word_embeddings", true);
  const std::string act = f.text_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu")
    f.fail("activation_function", "must be gelu_new (GPT-2's tanh GELU) or gelu (erf: Cerebras-GPT), got \"" + act + "\"");
  m.gelu_erf = act == "gelu";
  if (!f.boolean_or("scale_attn_weights", true)) f.fail("scale_attn_weights", "must be true (scores divided by sqrt(head width))");
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false)) f.fail("scale_attn_by_inverse_layer_idx", "must be false");
  return m;
}

nn::GptConfig llama(const Fields& f) {
  nn::GptConfig m;
  m.vocab = f.integer("vocab_size", 2, kMaxVocab);
  m.seq = f.integer("max_position_embeddings", 1, kMaxSeq);
  m.d_model = f.integer("hidden_size", 1, kMaxWidth);
  m.layers = int(f.integer("num_hidden_layers", 1, 1024));
  m.heads = int(f.integer("num_attention_heads", 1, 1024));
  m.kv_heads = int(f.integer_or("num_key_value_heads", m.heads, 1, m.heads));
  m.mlp_hidden = f.integer("intermediate_size", 1, kMaxWidth * 8);
  m.rms_norm = m.swiglu = true;
  m.bias = f.boolean_or("attention_bias", false);
  if (f.boolean_or("mlp_bias", false) != m.bias)
    f.fail("mlp_bias", "must equal attention_bias (this engine's linear layers have biases all or none)");
  m.norm_eps = positive(f, "rms_norm_eps", 1e-6);
  m.tied_head = f.boolean_or("tie_word_embeddings", false);
  if (m.d_model % m.heads == 0 && f.integer_or("head_dim", m.d_model / m.heads, 1, kMaxWidth) != m.d_model / m.heads)
    f.fail("head_dim", "must be hidden_size / num_attention_heads = " + std::to_string(m.d_model / m.heads));
  const std::string act = f.text_or("hidden_act", "silu");
  if (act != "silu") f.fail("hidden_act", "must be silu, got \"" + act + "\"");
  // rope_theta at the top (transformers 4) or in rope_parameters (transformers 5); only the plain
  // rotation: a scaled rope (linear, dynamic, yarn, llama3) would change the angles.
  const json* rope = f.j.contains("rope_parameters") && !f.j["rope_parameters"].is_null() ? &f.j["rope_parameters"] : nullptr;
  if (rope) {
    if (!rope->is_object()) f.fail("rope_parameters", "must be an object, got " + io::json_excerpt(*rope));
    const Fields r{*rope, f.file + " rope_parameters"};
    m.rope_theta = r.number_or("rope_theta", 10000.0);
    if (!(m.rope_theta > 1)) r.fail("rope_theta", "must be above 1, got " + std::to_string(m.rope_theta));
    const std::string type = r.text_or("rope_type", "default");
    if (type != "default") r.fail("rope_type", "must be default (scaled rotary embeddings are not supported), got \"" + type + "\"");
  } else {
    m.rope_theta = f.number_or("rope_theta", 10000.0);
    if (!(m.rope_theta > 1)) f.fail("rope_theta", "must be above 1, got " + std::to_string(m.rope_theta));
  }
  if (f.j.contains("rope_scaling") && !f.j["rope_scaling"].is_null())
    f.fail("rope_scaling", "must be null (scaled rotary embeddings are not supported)");
  return m;
}

}  // namespace

HfConfig read_hf_config(const std::string& dir) {
  if (is_gguf(dir)) return gguf_config(GgufFile::open(dir));
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw FileError(dir + ": not a model folder (expected a folder holding config.json and *.safetensors)");
  const std::string file = (fs::path(dir) / "config.json").string();
  const json j = io::parse_json(io::read_input_file(file, "model config", 1 << 20), file);
  if (!j.is_object()) throw Error(file + ": not a JSON object");
  const Fields f{j, file};
  HfConfig c;
  const std::string type = f.text_or("model_type", "");
  if (type == "gpt2") {
    c.family = Family::gpt2;
    c.model = gpt2(f);
  } else if (type == "llama") {
    c.family = Family::llama;
    c.model = llama(f);
  } else {
    f.fail("model_type", "must be gpt2 or llama (the architectures this engine runs), got \"" + type + "\"");
  }
  c.dtype = weights_dtype(f);
  try {
    c.model.validate();
  } catch (const Error& e) {
    throw Error(file + ": " + e.what());
  }
  return c;
}

std::string hf_config_json(const HfConfig& c) {
  const nn::GptConfig& m = c.model;
  const nn::BlockSpec b = m.block();
  const char* dtype = c.dtype == DType::bf16 ? "bfloat16" : c.dtype == DType::f16 ? "float16" : "float32";
  json j;
  if (c.family == Family::gpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", m.vocab},
         {"n_positions", m.seq},
         {"n_embd", m.d_model},
         {"n_layer", m.layers},
         {"n_head", m.heads},
         {"n_inner", b.mlp_hidden},
         {"activation_function", m.gelu_erf ? "gelu" : "gelu_new"},
         {"layer_norm_epsilon", b.norm_eps},
         {"tie_word_embeddings", m.tied_head},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"dtype", dtype}};
    // GPT-2's <|endoftext|> (transformers' default 50256) where the vocabulary holds it; none in
    // a smaller one, such as the byte-level GPT's.
    if (m.vocab <= 50256) j["bos_token_id"] = j["eos_token_id"] = nullptr;
  } else {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"vocab_size", m.vocab},
         {"max_position_embeddings", m.seq},
         {"hidden_size", m.d_model},
         {"num_hidden_layers", m.layers},
         {"num_attention_heads", m.heads},
         {"num_key_value_heads", b.kv_heads},
         {"head_dim", m.d_model / m.heads},
         {"intermediate_size", b.mlp_hidden},
         {"hidden_act", "silu"},
         {"rms_norm_eps", b.norm_eps},
         {"rope_theta", m.rope_theta},
         {"attention_bias", m.bias},
         {"mlp_bias", m.bias},
         {"tie_word_embeddings", m.tied_head},
         {"dtype", dtype}};
  }
  return j.dump(2) + "\n";
}

}  // namespace scalify::hub
