#pragma once
// The byte-level BPE of a GGUF file (tokenizer.ggml.model "gpt2"), from its tokenizer metadata as
// plain lists (hub::gguf_tokenizer_metadata reads them from a file; hub::load_model_tokenizer
// builds the tokenizer of a .gguf path): the ids are those transformers' GGUF loader gives (its
// tokenizer of the same file), token for token.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scalify/tokenize/bpe.hpp"

namespace scalify::tokenize {

// A GGUF file's tokenizer metadata (llama.cpp's tokenizer.ggml.* keys).
struct GgufTokenizerMetadata {
  std::string model;                 // tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece), ...
  std::string pre;                   // tokenizer.ggml.pre: llama.cpp's pre-tokeniser name ("smollm", "llama-bpe"); "" if absent
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, by id
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right" each, by rank; empty if absent
  std::vector<int64_t> token_types;  // tokenizer.ggml.token_type (GgufTokenType); empty if absent
  std::vector<double> scores;        // tokenizer.ggml.scores (SentencePiece); empty if absent
  std::optional<int64_t> bos, eos, unknown, padding;  // tokenizer.ggml.{bos,eos,unknown,padding}_token_id
  std::optional<bool> add_bos, add_eos;               // tokenizer.ggml.add_bos_token / add_eos_token
};

// tokenizer.ggml.token_type's values.
enum class GgufTokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) that Scalify reads, and their rules as
// transformers' GGUF loader applies them: "gpt2" and "smollm", both by GPT-2's pattern. Others,
// and a missing name (llama.cpp's "default", which is not GPT-2's), are an Error naming them.
std::vector<PreTokenizeRule> gguf_pre_tokenizer(const std::string& pre, const std::string& source);

// Control and user-defined tokens are found whole in the text, as transformers does (<|im_start|>
// is one token). An Error names `source` and what is wrong: another model, another pre-tokenizer,
// a merge of tokens not in the vocabulary.
std::unique_ptr<BpeTokenizer> gguf_bpe_tokenizer(const GgufTokenizerMetadata& metadata, const std::string& source);

// Whether a GGUF file's tokenizer is one gguf_bpe_tokenizer reads: its tokenizer.ggml.model is "gpt2".
bool gguf_tokenizer_is_read(const std::string& model);

}  // namespace scalify::tokenize
