#pragma once
// The byte-level BPE of a GGUF file (tokenizer.ggml.model "gpt2"), from its metadata as plain
// values, so that it does not depend on the file reader: the ids are those transformers' GGUF
// loader gives (its tokenizer of the same file), token for token.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scalify/tokenize/bpe.hpp"

namespace scalify::tokenize {

// tokenizer.ggml.token_type's values.
enum class GgufTokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct GgufTokenizerMetadata {
  std::string source;                // the file, for descriptions and errors
  std::string model;                 // tokenizer.ggml.model: "gpt2" is read here
  std::string pre;                   // tokenizer.ggml.pre, "" when absent
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, by id
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right" by rank
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type, one per token (empty: all normal)
  int64_t bos = -1, eos = -1;        // tokenizer.ggml.bos_token_id / eos_token_id, -1 when absent
};

// llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) that Scalify reads, and their rules:
// "gpt2" (GPT-2's pattern) and "smollm" (each number alone, then GPT-2's pattern). Others, and
// a missing name (llama.cpp's "default", which is not GPT-2's), are an Error naming them.
std::vector<PreTokenizeRule> gguf_pre_tokenizer(const std::string& pre, const std::string& source);

// Control and user-defined tokens are found whole in the text, as transformers does (<|im_start|>
// is one token). An Error names the file and what is wrong: another model, a merge of tokens
// not in the vocabulary, a type list of another length, an end token outside it.
std::unique_ptr<BpeTokenizer> gguf_bpe_tokenizer(const GgufTokenizerMetadata& metadata);

}  // namespace scalify::tokenize
