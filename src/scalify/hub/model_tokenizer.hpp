#pragma once
// The tokenizer of a pretrained model, wherever it lives: a Hugging Face folder's files
// (tokenize::load_tokenizer) or a GGUF file's metadata (tokenize::gguf_bpe_tokenizer over
// gguf_tokenizer_metadata). What every command that takes --model reads text with.
#include <memory>
#include <string>

#include "scalify/tokenize/tokenizer.hpp"

namespace scalify::hub {

// The model's tokenizer; an Error names what is missing or not read (a GGUF file whose
// tokenizer.ggml.model is not "gpt2", a folder without tokenizer files).
std::unique_ptr<tokenize::Tokenizer> load_model_tokenizer(const std::string& path);

// Whether the model has a tokenizer load_model_tokenizer reads: a folder with tokenizer files, a
// GGUF file whose tokenizer.ggml.model is "gpt2" (a model without one still reads token files).
bool has_model_tokenizer(const std::string& path);

}  // namespace scalify::hub
