#include "scalify/hub/gguf_export.hpp"

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "scalify/error.hpp"
#include "scalify/hub/gguf_file.hpp"
#include "scalify/hub/gguf_model.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/utf8.hpp"

namespace scalify::hub {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;  // llama.cpp's llama_token_type
constexpr uint64_t kMaxTokenizerFile = uint64_t(1) << 30;

json read_json(const fs::path& p, const std::string& what) {
  return io::parse_json(io::read_input_file(p.string(), what, kMaxTokenizerFile), p.string());
}

// Places `token` at `id`, growing the list; a second token at one id is an error naming the file.
void place(GgufVocabulary& v, int64_t id, const std::string& token, int32_t type, const std::string& file) {
  if (id < 0 || id >= (int64_t(1) << 24)) throw Error(file + ": token '" + token + "' has the id " + std::to_string(id) + ", out of range");
  if (size_t(id) >= v.tokens.size()) {
    v.tokens.resize(size_t(id) + 1);
    v.types.resize(size_t(id) + 1, 0);
  }
  if (v.types[size_t(id)] != 0 && v.tokens[size_t(id)] != token)
    throw Error(file + ": the id " + std::to_string(id) + " is both '" + v.tokens[size_t(id)] + "' and '" + token + "'");
  v.tokens[size_t(id)] = token;
  v.types[size_t(id)] = type;
}

void read_vocab_object(GgufVocabulary& v, const json& vocab, const std::string& file) {
  if (!vocab.is_object()) throw Error(file + ": the vocabulary is not a JSON object of token: id");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) throw Error(file + ": token '" + token + "' has the id " + io::json_excerpt(id) + ", not an integer");
    place(v, id.get<int64_t>(), token, kNormal, file);
  }
}

// Special and added tokens (tokenizer.json's added_tokens; tokenizer_config.json's added_tokens_decoder).
void mark_added(GgufVocabulary& v, int64_t id, const json& entry, const std::string& file) {
  if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
    throw Error(file + ": an added token is " + io::json_excerpt(entry) + ", not an object with a \"content\" string");
  const bool special = entry.value("special", false);
  place(v, id, entry["content"].get<std::string>(), special ? kControl : kUserDefined, file);
}

void check_complete(const GgufVocabulary& v, const std::string& dir) {
  for (size_t i = 0; i < v.types.size(); ++i)
    if (v.types[i] == 0) throw Error(dir + ": the vocabulary has no token with the id " + std::to_string(i));
}

// 1-D tensors (norms, biases) stay F32 as llama.cpp wants them. // Matrices take the chosen type, except Q8_0 on rows that are no whole
// number of its 32-value blocks: F16, as convert_hf_to_gguf.py falls back.
GgufWriter::Type type_of(const Tensor& t, GgufWriter::Type matrices) {
  if (t.dim() < 2) return GgufWriter::Type::f32;
  if (matrices == GgufWriter::Type::q8_0 && t.shape().back() % 32 != 0) return GgufWriter::Type::f16;
  return matrices;
}

// convert_hf_to_gguf.py's LlamaModel.permute: each head's rows [half, i] (rotate-half order) to
// [i, half] (interleaved pairs). Row r = h hd + half hd/2 + i goes to h hd + 2 i + half.
Tensor permute_heads(const Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), hd = rows / heads;
  Shape split = {heads, 2, hd / 2};
  for (int d = 1; d < w.dim(); ++d) split.push_back(w.size(d));
  std::vector<int> order = {0, 2, 1};
  for (int d = 1; d < w.dim(); ++d) order.push_back(d + 2);
  return w.contiguous().view(split).permute(order).contiguous().view(w.shape());
}

uint32_t file_type(GgufWriter::Type t) {  // llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16
  switch (t) {
    case GgufWriter::Type::f32: return 0;
    case GgufWriter::Type::f16: return 1;
    case GgufWriter::Type::q8_0: return 7;
    case GgufWriter::Type::bf16: return 32;
  }
  return 0;
}

// A Hugging Face tensor's GGUF name (and whether it is transposed: GPT-2's Conv1D [in, out]).
std::pair<std::string, bool> gguf_name(Family family, const std::string& hf) {
  auto strip = [&](const std::string& prefix) { return hf.compare(0, prefix.size(), prefix) == 0 ? hf.substr(prefix.size()) : hf; };
  std::string n = family == Family::llama ? strip("model.") : hf;
  const std::string suffix = n.substr(n.rfind('.'));  // .weight or .bias
  n = n.substr(0, n.rfind('.'));
  static const std::map<std::string, std::string> llama = {{"embed_tokens", "token_embd"},
                                                           {"norm", "output_norm"},
                                                           {"lm_head", "output"},
                                                           {"input_layernorm", "attn_norm"},
                                                           {"self_attn.q_proj", "attn_q"},
                                                           {"self_attn.k_proj", "attn_k"},
                                                           {"self_attn.v_proj", "attn_v"},
                                                           {"self_attn.o_proj", "attn_output"},
                                                           {"post_attention_layernorm", "ffn_norm"},
                                                           {"mlp.gate_proj", "ffn_gate"},
                                                           {"mlp.up_proj", "ffn_up"},
                                                           {"mlp.down_proj", "ffn_down"}};
  static const std::map<std::string, std::string> gpt2 = {
      {"wte", "token_embd"},  {"wpe", "position_embd"},    {"ln_f", "output_norm"},        {"lm_head", "output"},
      {"ln_1", "attn_norm"},  {"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"}, {"ln_2", "ffn_norm"},
      {"mlp.c_fc", "ffn_up"}, {"mlp.c_proj", "ffn_down"}};
  const auto& names = family == Family::llama ? llama : gpt2;
  const std::string layers = family == Family::llama ? "layers." : "h.";
  std::string block;
  if (n.compare(0, layers.size(), layers) == 0) {
    const size_t dot = n.find('.', layers.size());
    block = "blk." + n.substr(layers.size(), dot - layers.size()) + ".";
    n = n.substr(dot + 1);
  }
  const auto it = names.find(n);
  if (it == names.end()) throw Error("GGUF export: no GGUF name for the tensor '" + hf + "'");
  const bool conv1d = family == Family::gpt2 && !block.empty() && suffix == ".weight" && n.find("ln_") != 0;
  return {block + it->second + suffix, conv1d};
}

}  // namespace

GgufVocabulary byte_vocabulary() {
  GgufVocabulary v;
  for (char32_t c : tokenize::byte_to_unicode()) {
    std::string s;
    tokenize::utf8_append(s, c);
    v.tokens.push_back(s);
    v.types.push_back(kNormal);
  }
  v.pre = "gpt-2";
  return v;
}

std::optional<GgufVocabulary> read_bpe_vocabulary(const std::string& dir) {
  const fs::path d(dir), vocab_json = d / "vocab.json", merges_txt = d / "merges.txt", tokenizer_json = d / "tokenizer.json";
  std::error_code ec;
  GgufVocabulary v;
  if (is_gguf(dir)) {  // a model fine-tuned from a GGUF file: its tokenizer metadata, as it is
    const GgufFile f = GgufFile::open(dir);
    if (!f.has("tokenizer.ggml.model")) return std::nullopt;
    const GgufTokenizerMetadata t = gguf_tokenizer_metadata(f);
    if (t.model != "gpt2")
      throw Error("export: '" + dir + "' holds a '" + t.model +
                  "' tokenizer; GGUF export writes byte-level BPE (\"gpt2\") tokenizers only");
    v.tokens = t.tokens;
    v.types.assign(t.token_types.begin(), t.token_types.end());
    if (v.types.empty()) v.types.assign(v.tokens.size(), 1);  // no token_type list: every token a normal one
    v.merges = t.merges;
    v.bos = t.bos ? int32_t(*t.bos) : -1;
    v.eos = t.eos ? int32_t(*t.eos) : -1;
    v.pre = t.pre;
    return v;
  }
  if (!fs::is_directory(d, ec)) throw Error("export: '" + dir + "' is neither a model folder nor a GGUF file");
  if (fs::exists(vocab_json, ec) && fs::exists(merges_txt, ec)) {
    read_vocab_object(v, read_json(vocab_json, "vocabulary"), vocab_json.string());
    const std::string text = io::read_input_file(merges_txt.string(), "merges", kMaxTokenizerFile);
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(at, end - at);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty() && !(at == 0 && line.rfind("#version", 0) == 0)) v.merges.push_back(line);
      at = end + 1;
    }
    const fs::path config = d / "tokenizer_config.json";
    if (fs::exists(config, ec)) {
      const json c = read_json(config, "tokenizer config");
      if (c.is_object() && c.contains("added_tokens_decoder") && c["added_tokens_decoder"].is_object())
        for (const auto& [id, entry] : c["added_tokens_decoder"].items()) {
          char* end = nullptr;
          const long long n = std::strtoll(id.c_str(), &end, 10);
          if (id.empty() || *end != '\0') throw Error(config.string() + ": added_tokens_decoder has the key '" + id + "', not an id");
          mark_added(v, n, entry, config.string());
        }
    }
    v.pre = "gpt-2";  // vocab.json + merges.txt is GPT-2's tokenizer, whose pre-tokenizer they imply
  } else if (fs::exists(tokenizer_json, ec)) {
    const std::string file = tokenizer_json.string();
    const json t = read_json(tokenizer_json, "tokenizer");
    if (!t.is_object() || !t.contains("model") || !t["model"].is_object() || t["model"].value("type", "") != "BPE")
      throw Error(file + ": not a BPE tokenizer; GGUF export writes byte-level BPE (\"gpt2\") tokenizers only");
    const json& pre = t.contains("pre_tokenizer") ? t["pre_tokenizer"] : json();
    if (!pre.is_object() || pre.value("type", "") != "ByteLevel" || !pre.value("use_regex", true))
      throw Error(file + ": the pre-tokenizer " + io::json_excerpt(pre) +
                  " has no llama.cpp name this export knows (a ByteLevel pre-tokenizer with GPT-2's regex: \"gpt-2\")");
    v.pre = "gpt-2";
    read_vocab_object(v, t["model"].value("vocab", json()), file);
    const json merges = t["model"].value("merges", json::array());
    if (!merges.is_array()) throw Error(file + ": model.merges is not a list");
    for (const json& m : merges) {
      if (m.is_string())
        v.merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      else
        throw Error(file + ": the merge " + io::json_excerpt(m) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    if (t.contains("added_tokens") && t["added_tokens"].is_array())
      for (const json& a : t["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer())
          throw Error(file + ": an added token is " + io::json_excerpt(a) + ", not an object with an integer \"id\"");
        mark_added(v, a["id"].get<int64_t>(), a, file);
      }
  } else if (fs::exists(d / "tokenizer.model", ec)) {
    throw Error(dir +
                ": a SentencePiece tokenizer (tokenizer.model); GGUF export writes byte-level BPE tokenizers only "
                "(vocab.json + merges.txt or tokenizer.json)");
  } else {
    return std::nullopt;
  }
  check_complete(v, dir);
  const fs::path config = d / "config.json";
  if (fs::exists(config, ec)) {
    const json c = read_json(config, "config");
    auto id = [&](const char* key) { return c.is_object() && c.contains(key) && c[key].is_number_integer() ? c[key].get<int32_t>() : -1; };
    v.bos = id("bos_token_id");
    v.eos = id("eos_token_id");
  }
  return v;
}

GgufWriter::Type gguf_type(const std::string& dtype) {
  if (dtype == "f32") return GgufWriter::Type::f32;
  if (dtype == "f16") return GgufWriter::Type::f16;
  if (dtype == "bf16") return GgufWriter::Type::bf16;
  if (dtype == "q8_0") return GgufWriter::Type::q8_0;
  throw Error("export: a GGUF file's weights are f32, f16, bf16 or q8_0, not '" + dtype + "'");
}

void save_gguf_model(const std::string& path, const HfConfig& config, const std::map<std::string, Tensor>& params,
                     GgufWriter::Type matrices, const GgufVocabulary* vocab, const std::string& name, std::vector<std::string>* fell_back) {
  const nn::GptConfig& m = config.model;
  const nn::BlockSpec b = m.block();
  if (family_of(m) != config.family) throw Error(std::string("GGUF export: the model is not ") + family_name(config.family) + "-shaped");
  if (config.family == Family::gpt2 && m.gelu_erf)
    throw Error("GGUF export: this GPT-2-shaped model uses erf GELU; llama.cpp's gpt2 architecture computes the tanh form");
  if (config.family == Family::llama && m.bias)
    throw Error("GGUF export: this Llama-shaped model has biases, which llama.cpp's llama architecture does not hold");
  if (vocab && int64_t(vocab->tokens.size()) > m.vocab)
    throw Error("GGUF export: the tokenizer has " + std::to_string(vocab->tokens.size()) + " tokens, more than the model's vocabulary of " +
                std::to_string(m.vocab));
  GgufWriter w;
  const std::string arch = config.family == Family::llama ? "llama" : "gpt2";
  w.add_string("general.architecture", arch);
  w.add_string("general.name", name);
  w.add_u32("general.file_type", file_type(matrices));
  w.add_u32(arch + ".context_length", uint32_t(m.seq));
  w.add_u32(arch + ".embedding_length", uint32_t(m.d_model));
  w.add_u32(arch + ".block_count", uint32_t(m.layers));
  w.add_u32(arch + ".feed_forward_length", uint32_t(b.mlp_hidden));
  w.add_u32(arch + ".attention.head_count", uint32_t(m.heads));
  if (config.family == Family::llama) {
    w.add_u32("llama.attention.head_count_kv", uint32_t(b.kv_heads));
    w.add_f32("llama.rope.freq_base", float(m.rope_theta));
    w.add_f32("llama.attention.layer_norm_rms_epsilon", float(b.norm_eps));
    w.add_u32("llama.rope.dimension_count", uint32_t(m.d_model / m.heads));
  } else {
    w.add_f32("gpt2.attention.layer_norm_epsilon", float(b.norm_eps));
  }
  w.add_u32(arch + ".vocab_size", uint32_t(m.vocab));  // llama.cpp's n_vocab when no token list says it
  if (!vocab) {
    w.add_string("tokenizer.ggml.model", "none");  // llama.cpp's "no vocabulary": the model still loads
  } else {
    GgufVocabulary v = *vocab;
    for (int64_t i = int64_t(v.tokens.size()); i < m.vocab; ++i) {  // an embedding wider than the tokenizer
      v.tokens.push_back("[PAD" + std::to_string(i) + "]");
      v.types.push_back(kUnused);
    }
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", v.pre);
    w.add_strings("tokenizer.ggml.tokens", v.tokens);
    w.add_i32s("tokenizer.ggml.token_type", v.types);
    w.add_strings("tokenizer.ggml.merges", v.merges);
    if (v.bos >= 0 && v.bos < m.vocab) w.add_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos));
    if (v.eos >= 0 && v.eos < m.vocab) w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos));
  }
  const int64_t kv_heads = b.kv_heads;
  for (const auto& [hf, value] : hf_tensors(config, params)) {
    auto [gguf, transpose] = gguf_name(config.family, hf);
    Tensor t = transpose ? value.permute({1, 0}).contiguous() : value;
    if (config.family == Family::llama && gguf.find(".attn_q.") != std::string::npos) t = permute_heads(t, m.heads);
    if (config.family == Family::llama && gguf.find(".attn_k.") != std::string::npos) t = permute_heads(t, kv_heads);
    const GgufWriter::Type type = type_of(t, matrices);
    if (fell_back && type != matrices && t.dim() >= 2) fell_back->push_back(gguf);
    w.add_tensor(gguf, t, type);
    if (config.family == Family::gpt2 && gguf == "token_embd.weight" && m.tied_head) w.add_tensor("output.weight", t, type);
  }
  w.write(path);
}

}  // namespace scalify::hub
