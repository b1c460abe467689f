#include "scalify/tokenize/gguf_tokenizer.hpp"

#include "scalify/error.hpp"
#include "scalify/io/json_text.hpp"

namespace scalify::tokenize {

std::vector<PreTokenizeRule> gguf_pre_tokenizer(const std::string& pre, const std::string& source) {
  // As llama.cpp's llm_tokenizer_bpe splits them ("\p{N}" then GPT-2's pattern for smollm). On
  // SmolLM2's vocabulary the number rule changes no id (no token holds a number beside anything),
  // which is why transformers' loader, which ignores tokenizer.ggml.pre, gives the same ids.
  if (pre == "gpt2") return {PreTokenizeRule::kGpt2Pattern};
  if (pre == "smollm") return {PreTokenizeRule::kEachNumber, PreTokenizeRule::kGpt2Pattern};
  throw Error("tokenizer: '" + source + "': tokenizer.ggml.pre is " +
              (pre.empty() ? "missing (llama.cpp's \"default\")" : "'" + io::text_excerpt(pre) + "'") +
              ", a pre-tokenizer Scalify does not read (it reads \"gpt2\" and \"smollm\")");
}

std::unique_ptr<BpeTokenizer> gguf_bpe_tokenizer(const GgufTokenizerMetadata& m) {
  const std::string at = "tokenizer: '" + m.source + "': ";
  if (m.model != "gpt2") throw Error(at + "tokenizer.ggml.model is '" + io::text_excerpt(m.model) + "', not \"gpt2\" (a byte-level BPE)");
  if (!m.token_types.empty() && m.token_types.size() != m.tokens.size())
    throw Error(at + "tokenizer.ggml.token_type has " + std::to_string(m.token_types.size()) + " entries for " +
                std::to_string(m.tokens.size()) + " tokens");
  for (const auto& [name, id] : {std::pair<const char*, int64_t>{"bos", m.bos}, {"eos", m.eos}})
    if (id < -1 || id >= int64_t(m.tokens.size()))
      throw Error(at + "tokenizer.ggml." + name + "_token_id is " + std::to_string(id) + ", not a token id in [0, " +
                  std::to_string(m.tokens.size()) + ")");
  BpeParts parts;
  parts.source = m.source;
  parts.kind = "byte-level BPE (GGUF)";
  parts.pre = gguf_pre_tokenizer(m.pre, m.source);
  parts.tokens = m.tokens;
  parts.merges.reserve(m.merges.size());
  for (size_t i = 0; i < m.merges.size(); ++i) {
    const std::string& s = m.merges[i];
    // Byte-level tokens hold no space (a space is 'Ġ'), so the one space parts the two.
    const size_t space = s.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
      throw Error(at + "tokenizer.ggml.merges[" + std::to_string(i) + "] is '" + io::text_excerpt(s) + "', not two tokens \"a b\"");
    parts.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
  }
  for (size_t id = 0; id < m.token_types.size(); ++id) {
    const auto type = GgufTokenType(m.token_types[id]);
    if (type == GgufTokenType::kControl || type == GgufTokenType::kUserDefined) parts.added.push_back(int32_t(id));
  }
  parts.bos = int32_t(m.bos);
  parts.eos = int32_t(m.eos);
  return std::make_unique<BpeTokenizer>(std::move(parts));
}

}  // namespace scalify::tokenize
