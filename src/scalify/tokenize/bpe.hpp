#pragma once
// GPT-2's byte-level BPE (vocab.json + merges.txt), written to give the ids Hugging Face's GPT-2
// tokenizers give, token for token. Text is cut into words (pretokenize.hpp); each byte of a word
// starts as the token of its stand-in character (byte_to_unicode), and adjacent tokens merge by
// the rank of their pair in merges.txt, the lowest rank first (the leftmost pair on a tie), until
// no pair has a merge.
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "scalify/tokenize/tokenizer.hpp"

namespace scalify::tokenize {

// GPT-2's stand-in character for each byte, so that every token is printable text: the printable
// bytes of Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves, the other
// 68 bytes for U+0100.. in byte order (space is U+0120 'Ġ', newline U+010A 'Ċ').
std::array<char32_t, 256> byte_to_unicode();

// The byte-level vocabulary of Scalify's own GPT (256 tokens, id = byte value) as vocab.json text;
// with a merges.txt holding no merges it is a GPT-2 tokenizer that maps every byte to itself, so
// an exported byte-level model opens with its tokenizer in transformers.
std::string byte_vocab_json();

class BpeTokenizer : public Tokenizer {
 public:
  // Reads both files; errors name the file (and the line of merges.txt).
  BpeTokenizer(const std::string& vocab_path, const std::string& merges_path);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(bytes_.size()); }
  size_t token_bytes(int32_t id) const override;
  std::string description() const override;

 private:
  struct Merge {
    int32_t rank;    // the line's place in merges.txt: lower merges first
    int32_t result;  // the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;  // an Error naming an id outside the vocabulary

  std::string vocab_path_, merges_path_;
  std::vector<std::string> bytes_;      // by id: the bytes of text the token stands for
  std::array<int32_t, 256> byte_id_{};  // the token of each single byte
  std::unordered_map<uint64_t, Merge> merges_;
  // Tokens that text can encode to (the bytes' and the merges'): the others, special tokens such
  // as <|endoftext|>, stand for no text (token_bytes 0), though decode writes their names.
  std::vector<bool> encodable_;
};

}  // namespace scalify::tokenize
