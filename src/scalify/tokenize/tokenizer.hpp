#pragma once
// Tokenizers of pretrained Hugging Face models: text to token ids and back, as the model was
// trained. Two kinds: byte-level BPEs as GPT-2's, SmolLM's or Llama 3's (bpe.hpp) and SentencePiece
// models such as Llama 2's (sentencepiece.hpp). load_tokenizer picks one from the files of a model folder.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace scalify::tokenize {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text` as the reference tokenizer gives them, with no beginning-of-sequence token
  // added. Special tokens written in the text are plain text, except a tokenizer.json's added
  // tokens and a GGUF's control tokens, which are one token each (as transformers encodes them).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`; an id outside [0, vocab_size()) is a scalify::Error naming it.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // How many UTF-8 bytes of text token `id` stands for: what bits-per-byte metrics divide by.
  virtual size_t token_bytes(int32_t id) const = 0;
  // The kind, size and files, e.g. "GPT-2 byte-level BPE, 1000 tokens (DIR/vocab.json, DIR/merges.txt)".
  virtual std::string description() const = 0;
};

// The tokenizer of a Hugging Face model folder: vocab.json + merges.txt (GPT-2's byte-level BPE),
// else tokenizer.model (SentencePiece), else tokenizer.json (its byte-level BPE, with its
// pre-tokenizer and added tokens: tokenizer_json.hpp). A folder with none is a scalify::Error
// naming the folder and the files looked for. A GGUF file is hub::load_model_tokenizer's
// (gguf_tokenizer.hpp makes its tokenizer).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);
// Which GGUF tokenizers are read: what every place that needs a model's tokenizer and has none says.
const char* gguf_tokenizer_not_read();
// Whether the folder holds any of those files (a model without a tokenizer still reads token files).
bool has_tokenizer_files(const std::string& model_dir);
// The files of a model folder that load_tokenizer reads.
std::vector<std::string> tokenizer_files_read(const std::string& model_dir);
// The files of a model folder that may make its tokenizer (what has_tokenizer_files looks for, what an
// export takes along).
const std::vector<const char*>& tokenizer_file_names();

}  // namespace scalify::tokenize
