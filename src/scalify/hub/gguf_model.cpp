#include "scalify/hub/gguf_model.hpp"

#include <string>
#include <utility>

#include "scalify/error.hpp"

namespace scalify::hub {

namespace {

constexpr int64_t kMaxWidth = int64_t(1) << 16, kMaxVocab = int64_t(1) << 20, kMaxSeq = 65536;

int64_t size_key(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const uint64_t v = f.get_uint(key);
  if (v < uint64_t(lo) || v > uint64_t(hi))
    throw Error(f.path() + ": metadata '" + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                std::to_string(v));
  return int64_t(v);
}

// llama.cpp's converter's LlamaModel.permute, undone: within each of `heads` heads of `rows / heads`
// rows, GGUF row 2i + j holds Hugging Face row j (rows / heads / 2) + i.
Tensor unpermute_rows(const Tensor& t, int64_t heads, const std::string& name, const std::string& file) {
  if (t.dim() < 1)  // a scalar has no rows (and the shape check comes after this)
    throw Error(file + ": tensor '" + name + "' has no dimensions; a projection's weight or bias has rows");
  const int64_t rows = t.shape()[0], rest = t.numel() / std::max<int64_t>(rows, 1);
  if (heads <= 0 || rows % (2 * heads) != 0)
    throw Error(file + ": tensor '" + name + "' has " + std::to_string(rows) + " rows, not a whole number of " + std::to_string(heads) +
                " heads of pairs");
  return t.contiguous().view({heads, rows / heads / 2, 2, rest}).permute({0, 2, 1, 3}).contiguous().view(t.shape());
}

// GGUF tensor name to Hugging Face name; "" when it has none.
std::string hf_name(const std::string& gguf) {
  if (gguf == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf == "output_norm.weight") return "model.norm.weight";
  if (gguf == "output.weight") return "lm_head.weight";
  if (gguf.rfind("blk.", 0) != 0) return "";
  const size_t dot = gguf.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = gguf.substr(4, dot - 4), rest = gguf.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
  static const std::pair<const char*, const char*> kParts[] = {
      {"attn_norm.", "input_layernorm."}, {"ffn_norm.", "post_attention_layernorm."},
      {"attn_q.", "self_attn.q_proj."},   {"attn_k.", "self_attn.k_proj."},
      {"attn_v.", "self_attn.v_proj."},   {"attn_output.", "self_attn.o_proj."},
      {"ffn_gate.", "mlp.gate_proj."},    {"ffn_up.", "mlp.up_proj."},
      {"ffn_down.", "mlp.down_proj."}};
  for (const auto& [from, to] : kParts) {
    const std::string f = from;
    if (rest.rfind(f, 0) == 0) {
      const std::string kind = rest.substr(f.size());
      if (kind == "weight" || kind == "bias") return "model.layers." + layer + "." + to + kind;
    }
  }
  return "";
}

}  // namespace

HfConfig gguf_config(const GgufFile& f) {
  const std::string arch = f.get_text("general.architecture");
  if (arch != "llama")
    throw Error(f.path() + ": holds a '" + arch +
                "' model (general.architecture); Scalify reads GGUF files of the llama architecture only");
  const std::string p = "llama.";
  HfConfig c;
  c.family = Family::llama;
  c.dtype = DType::f32;
  nn::GptConfig& m = c.model;
  if (f.has(p + "expert_count") && f.get_uint(p + "expert_count") > 0)
    throw Error(f.path() + ": metadata 'llama.expert_count' is " + std::to_string(f.get_uint(p + "expert_count")) +
                ": a mixture of experts, which this engine does not run");
  m.seq = size_key(f, p + "context_length", 1, kMaxSeq);
  m.d_model = size_key(f, p + "embedding_length", 1, kMaxWidth);
  m.layers = int(size_key(f, p + "block_count", 1, 1024));
  m.heads = int(size_key(f, p + "attention.head_count", 1, 1024));
  m.kv_heads = f.has(p + "attention.head_count_kv") ? int(size_key(f, p + "attention.head_count_kv", 1, m.heads)) : m.heads;
  m.mlp_hidden = size_key(f, p + "feed_forward_length", 1, kMaxWidth * 8);
  if (f.has(p + "vocab_size")) {
    m.vocab = size_key(f, p + "vocab_size", 2, kMaxVocab);
  } else if (f.has("tokenizer.ggml.tokens")) {
    m.vocab = int64_t(f.value("tokenizer.ggml.tokens").count);
    if (m.vocab < 2 || m.vocab > kMaxVocab)
      throw Error(f.path() + ": 'tokenizer.ggml.tokens' holds " + std::to_string(m.vocab) + " tokens");
  } else {
    throw Error(f.path() + ": neither metadata 'llama.vocab_size' nor 'tokenizer.ggml.tokens' gives the vocabulary's size");
  }
  m.rms_norm = m.swiglu = true;
  m.bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  m.tied_head = f.find_tensor("output.weight") == nullptr;
  m.norm_eps = f.get_real(p + "attention.layer_norm_rms_epsilon");
  if (!(m.norm_eps > 0) || !(m.norm_eps < 1))
    throw Error(f.path() + ": metadata 'llama.attention.layer_norm_rms_epsilon' must be in (0, 1), got " + std::to_string(m.norm_eps));
  m.rope_theta = f.get_real_or(p + "rope.freq_base", 10000.0);
  if (!(m.rope_theta > 1)) throw Error(f.path() + ": metadata 'llama.rope.freq_base' must be above 1, got " + std::to_string(m.rope_theta));
  if (m.d_model % m.heads == 0) {
    const uint64_t head = uint64_t(m.d_model / m.heads);
    for (const char* key : {"rope.dimension_count", "attention.key_length", "attention.value_length"})
      if (f.has(p + key) && f.get_uint(p + key) != head)
        throw Error(f.path() + ": metadata 'llama." + key + "' is " + std::to_string(f.get_uint(p + key)) +
                    "; this engine rotates and attends over whole heads of embedding_length / head_count = " + std::to_string(head));
  }
  if (f.has(p + "rope.scaling.type") && f.get_text(p + "rope.scaling.type") != "none")
    throw Error(f.path() + ": metadata 'llama.rope.scaling.type' is '" + f.get_text(p + "rope.scaling.type") +
                "' (scaled rotary embeddings are not supported)");
  if (f.has(p + "rope.scaling.factor") && f.get_real(p + "rope.scaling.factor") != 1.0 && f.get_real(p + "rope.scaling.factor") != 0.0)
    throw Error(f.path() + ": metadata 'llama.rope.scaling.factor' is " + std::to_string(f.get_real(p + "rope.scaling.factor")) +
                " (scaled rotary embeddings are not supported)");
  try {
    m.validate();
  } catch (const Error& e) {
    throw Error(f.path() + ": " + e.what());
  }
  if (f.has("tokenizer.ggml.eos_token_id")) {  // where sampling stops
    const uint64_t eos = f.get_uint("tokenizer.ggml.eos_token_id");
    if (eos >= uint64_t(m.vocab))
      throw Error(f.path() + ": metadata 'tokenizer.ggml.eos_token_id' is " + std::to_string(eos) + ", outside the vocabulary of " +
                  std::to_string(m.vocab));
    c.eos_ids = {int32_t(eos)};
  }
  return c;
}

std::map<std::string, Tensor> gguf_hf_tensors(const GgufFile& f, const HfConfig& config) {
  std::map<std::string, Tensor> out;
  const nn::BlockSpec b = config.model.block();
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string name = hf_name(t.name);
    Tensor v = f.dequantize(t.name);
    if (name.find(".self_attn.q_proj.") != std::string::npos) v = unpermute_rows(v, config.model.heads, t.name, f.path());
    if (name.find(".self_attn.k_proj.") != std::string::npos) v = unpermute_rows(v, b.kv_heads, t.name, f.path());
    out.emplace(name.empty() ? t.name : name, std::move(v));
  }
  return out;
}

GgufTokenizerMetadata gguf_tokenizer_metadata(const GgufFile& f) {
  const std::string p = "tokenizer.ggml.";
  GgufTokenizerMetadata t;
  t.model = f.get_text(p + "model");
  t.tokens = f.get_texts(p + "tokens");
  const size_t n = t.tokens.size();
  if (f.has(p + "pre")) t.pre = f.get_text(p + "pre");
  if (f.has(p + "merges")) t.merges = f.get_texts(p + "merges");
  if (f.has(p + "token_type")) t.token_types = f.get_ints(p + "token_type");
  if (f.has(p + "scores")) t.scores = f.get_reals(p + "scores");
  for (const auto& [key, size] : {std::pair{"token_type", t.token_types.size()}, std::pair{"scores", t.scores.size()}})
    if (f.has(p + key) && size != n)
      throw Error(f.path() + ": metadata 'tokenizer.ggml." + key + "' has " + std::to_string(size) + " entries for " + std::to_string(n) +
                  " tokens");
  const std::pair<const char*, std::optional<int64_t>*> ids[] = {
      {"bos_token_id", &t.bos}, {"eos_token_id", &t.eos}, {"unknown_token_id", &t.unknown}, {"padding_token_id", &t.padding}};
  for (const auto& [key, id] : ids) {
    if (!f.has(p + key)) continue;
    const uint64_t v = f.get_uint(p + key);
    if (v >= n)
      throw Error(f.path() + ": metadata 'tokenizer.ggml." + key + "' is " + std::to_string(v) + ", outside the " + std::to_string(n) +
                  " tokens");
    *id = int64_t(v);
  }
  if (f.has(p + "add_bos_token")) t.add_bos = f.get_flag(p + "add_bos_token");
  if (f.has(p + "add_eos_token")) t.add_eos = f.get_flag(p + "add_eos_token");
  return t;
}

}  // namespace scalify::hub
