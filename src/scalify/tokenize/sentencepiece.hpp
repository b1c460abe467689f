#pragma once
// SentencePiece models (tokenizer.model: Llama and its kin) through the sentencepiece library
// (Debian's libsentencepiece-dev). Its header stays out of this one, so users of the installed
// library need only link it.
#include <memory>
#include <string>
#include <vector>

#include "scalify/tokenize/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace scalify::tokenize {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads the model; a file that cannot be read or is not a SentencePiece model is an error naming it.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(bytes_.size()); }
  // The piece's bytes, its word-start mark U+2581 ('▁', the space the model put before a word)
  // counted as one space byte; a byte-fallback piece <0xAB> counts 1; control pieces (<s>, </s>)
  // and the unknown piece count 0.
  size_t token_bytes(int32_t id) const override;
  std::string description() const override;

 private:
  void check_id(int32_t id) const;  // an Error naming an id outside the vocabulary

  std::string model_path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::vector<size_t> bytes_;  // token_bytes by id
};

}  // namespace scalify::tokenize
