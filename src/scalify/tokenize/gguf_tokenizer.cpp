#include "scalify/tokenize/gguf_tokenizer.hpp"

#include "scalify/error.hpp"
#include "scalify/io/json_text.hpp"

namespace scalify::tokenize {

std::vector<PreTokenizeRule> gguf_pre_tokenizer(const std::string& pre, const std::string& source) {
  // transformers' GGUF loader, the reference, ignores tokenizer.ggml.pre: it pre-tokenizes every
  // "gpt2" model by GPT-2's pattern (a ByteLevel with its regex). llama.cpp isolates each number
  // first for "smollm", which moves ids where numbers follow spaces ("  99": Ġ Ġ 9 9 in
  // transformers, ĠĠ 9 9 in llama.cpp); Scalify gives transformers' ids.
  // "gpt-2" is llama.cpp's name for GPT-2's pattern (what convert_hf_to_gguf.py and Scalify's own
  // export write); "gpt2" as before.
  if (pre == "gpt-2" || pre == "gpt2" || pre == "smollm") return {PreTokenizeRule::kGpt2Pattern};
  throw Error("tokenizer: '" + source + "': tokenizer.ggml.pre is " +
              (pre.empty() ? "missing (llama.cpp's \"default\")" : "'" + io::text_excerpt(pre) + "'") +
              ", a pre-tokenizer Scalify does not read (it reads \"gpt-2\", \"gpt2\" and \"smollm\")");
}

bool gguf_tokenizer_is_read(const std::string& model) { return model == "gpt2"; }

std::unique_ptr<BpeTokenizer> gguf_bpe_tokenizer(const GgufTokenizerMetadata& m, const std::string& source) {
  const std::string at = "tokenizer: '" + source + "': ";
  if (!gguf_tokenizer_is_read(m.model))
    throw Error(at + "tokenizer.ggml.model is '" + io::text_excerpt(m.model) + "', not \"gpt2\" (a byte-level BPE), the one Scalify reads");
  BpeParts parts;
  parts.source = source;
  parts.kind = "byte-level BPE (GGUF)";
  parts.pre = gguf_pre_tokenizer(m.pre, source);
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
    if (m.token_types[id] < 0 || m.token_types[id] > int64_t(GgufTokenType::kByte))  // llama.cpp's 0 (undefined) to 6
      throw Error(at + "tokenizer.ggml.token_type[" + std::to_string(id) + "] is " + std::to_string(m.token_types[id]) +
                  ", not one of llama.cpp's token types 0-6");
    const auto type = GgufTokenType(m.token_types[id]);
    if (type == GgufTokenType::kControl || type == GgufTokenType::kUserDefined) parts.added.push_back(int32_t(id));
  }
  parts.bos = m.bos ? int32_t(*m.bos) : -1;
  parts.eos = m.eos ? int32_t(*m.eos) : -1;
  return std::make_unique<BpeTokenizer>(std::move(parts));
}

}  // namespace scalify::tokenize
