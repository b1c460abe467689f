#pragma once
// The byte-level BPE of a GGUF file (tokenizer.ggml.model "gpt2"), from its tokenizer metadata
// (hub::GgufTokenizerMetadata: plain lists, so a test or another reader can build one): the ids
// are those transformers' GGUF loader gives (its tokenizer of the same file), token for token.
#include <memory>
#include <string>
#include <vector>

#include "scalify/hub/gguf_model.hpp"
#include "scalify/tokenize/bpe.hpp"

namespace scalify::tokenize {

// tokenizer.ggml.token_type's values.
enum class GgufTokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) that Scalify reads, and their rules as
// transformers' GGUF loader applies them: "gpt2" and "smollm", both by GPT-2's pattern. Others,
// and a missing name (llama.cpp's "default", which is not GPT-2's), are an Error naming them.
std::vector<PreTokenizeRule> gguf_pre_tokenizer(const std::string& pre, const std::string& source);

// Control and user-defined tokens are found whole in the text, as transformers does (<|im_start|>
// is one token). An Error names `source` and what is wrong: another model, another pre-tokenizer,
// a merge of tokens not in the vocabulary.
std::unique_ptr<BpeTokenizer> gguf_bpe_tokenizer(const hub::GgufTokenizerMetadata& metadata, const std::string& source);

// Whether a GGUF file's tokenizer is one gguf_bpe_tokenizer reads: its tokenizer.ggml.model is "gpt2".
bool gguf_tokenizer_is_read(const std::string& model);

// The tokenizer of the GGUF file at `path`.
std::unique_ptr<BpeTokenizer> read_gguf_tokenizer(const std::string& path);

}  // namespace scalify::tokenize
