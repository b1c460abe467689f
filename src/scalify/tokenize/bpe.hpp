#pragma once
// GPT-2's byte-level BPE (vocab.json + merges.txt), written to give the ids Hugging Face's GPT-2
// tokenizers give, token for token. Text is cut into words (pretokenize.hpp); each byte of a word
// starts as the token of its stand-in character (byte_to_unicode), and adjacent tokens merge by
// the rank of their pair in merges.txt, the lowest rank first (the leftmost pair on a tie), until
// no pair has a merge. The same engine reads the byte-level BPEs of tokenizer.json (tokenizer_json.hpp)
// and GGUF files (gguf_tokenizer.hpp), whose pre-tokenizer rules and added tokens say more.
//
// A byte with no token of its own (SmolLM2's vocabulary has none for 21 bytes that its training
// text never held) is dropped, or is the unknown token where the vocabulary names one, as in
// Hugging Face's tokenizers: the tokens on either side of it are then adjacent and may merge.
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "scalify/tokenize/pretokenize.hpp"
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

// A byte-level BPE as tokenizer.json and GGUF's metadata hold it.
struct BpeParts {
  std::vector<std::string> tokens;                          // by id, in the stand-in characters of byte_to_unicode
  std::vector<std::pair<std::string, std::string>> merges;  // by rank: the two tokens that merge
  // Tokens found whole in the text before it is pre-tokenized (tokenizer.json's added_tokens,
  // GGUF's control and user-defined tokens, e.g. <|im_start|>): their tokens are their text as written.
  std::vector<int32_t> added;
  // Added tokens matched second, in the text between the others (tokenizer.json's "normalized":
  // true ones: tokenizers' AddedVocabulary splits off the non-normalized ones first).
  std::vector<int32_t> added_normalized;
  std::vector<PreTokenizeRule> pre = {PreTokenizeRule::kGpt2Pattern};
  int32_t unk = -1;                     // the token of a byte with no token, -1 for none: such bytes are dropped
  bool fuse_unk = false;                // a run of such bytes is one unknown token
  bool ignore_merges = false;           // a word that is a token of its own is that token, merges unused
  int32_t bos = -1, eos = -1;           // the beginning- and end-of-sequence tokens, -1 where not known
  std::string kind = "byte-level BPE";  // for description(): what the parts are
  std::string source;                   // and where they came from, as in errors
};

class BpeTokenizer : public Tokenizer {
 public:
  // Reads both files; errors name the file (and the line of merges.txt). Pre-tokenizes as GPT-2;
  // special tokens written in the text are plain text.
  BpeTokenizer(const std::string& vocab_path, const std::string& merges_path);
  // Errors name parts.source and what in it is wrong (a merge of tokens not in the vocabulary).
  explicit BpeTokenizer(BpeParts parts);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(bytes_.size()); }
  size_t token_bytes(int32_t id) const override;
  std::string description() const override;
  // The beginning- and end-of-sequence tokens where the files say (GGUF's metadata), else -1.
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }

 private:
  struct Merge {
    int32_t rank;    // the line's place in merges.txt: lower merges first
    int32_t result;  // the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  // The tokens by id (their strings as the vocabulary writes them); a string given twice names the later id.
  void set_tokens(const std::vector<std::string>& tokens);
  // A pair listed twice keeps its last rank, as in both of Hugging Face's implementations.
  void add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank) { merges_[pair_key(left, right)] = Merge{rank, merged}; }
  void mark_encodable();
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;  // a text without added tokens
  // Pass 0 splits off added_[0]'s tokens, pass 1 added_[1]'s in the text between, then encode_text.
  void split_added(std::string_view text, int pass, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;  // an Error naming an id outside the vocabulary

  std::string kind_, files_, source_;             // for description() and errors
  std::unordered_map<std::string, int32_t> ids_;  // token string -> id
  std::vector<std::string> bytes_;                // by id: the bytes of text the token stands for
  std::array<int32_t, 256> byte_id_{};            // the token of each single byte, -1 for none
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<PreTokenizeRule> pre_ = {PreTokenizeRule::kGpt2Pattern};
  // Matched in the text: by their first byte, the longest first where several start at one place.
  // [0]: BpeParts::added, [1]: BpeParts::added_normalized, matched in that order.
  std::array<std::vector<int32_t>, 256> added_[2];
  bool has_added_[2] = {false, false};
  int32_t unk_ = -1, bos_ = -1, eos_ = -1;
  bool fuse_unk_ = false, ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> word_id_;  // with ignore_merges: each encodable token's bytes -> id
  // Tokens that text can encode to (the bytes' and the merges'): the others, special tokens such
  // as <|endoftext|>, stand for no text (token_bytes 0), though decode writes their names.
  std::vector<bool> encodable_;
};

}  // namespace scalify::tokenize
