#pragma once
// The training text: a file or a folder of text files, read as bytes (vocabulary 256) or through
// a pretrained model's tokenizer, split deterministically into training and validation tokens.
//
// Split: the last `val_fraction` of the concatenated bytes (files in name order, each followed by
// a newline) is validation. Training batches are windows of T + 1 bytes starting at positions drawn
// from a seeded generator; evaluation uses consecutive non-overlapping windows of the validation
// bytes: window i covers bytes [i T, i T + T] (inputs the first T, targets the last T), for every i
// with i T + T < size, up to a cap — so another tool can compute the same number.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/tensor/tensor.hpp"
#include "scalify/tokenize/tokenizer.hpp"

namespace scalify::train {

struct Corpus {
  std::string source;                // what was read (path)
  std::vector<int32_t> train, val;   // the split: bytes, or a tokenizer's tokens
  std::vector<std::string> files;    // text files used
  std::vector<std::string> skipped;  // files in a folder that were not text (NUL bytes) or unreadable
  // Tokenised: the UTF-8 bytes each token id stands for (bits per byte) and the tokenizer's
  // description; both empty for bytes.
  std::vector<uint32_t> token_bytes;
  std::string tokenizer;
  const char* unit() const { return tokenizer.empty() ? "bytes" : "tokens"; }
};

// The default corpus: the plain-text files of Debian's `fortunes` package.
std::string default_corpus_path();

// Reads `path`. Errors (scalify::Error, before any training): missing or unreadable path, an
// empty corpus, a single file that is binary (NUL bytes), a folder with no text file, and a split
// too short for one batch of windows (either part shorter than `min_bytes_each`).
Corpus load_corpus(const std::string& path, double val_fraction, size_t min_bytes_each);
// The same text through `tokenizer` (its bytes split as above, then each part encoded), or an
// llm.c token file (recognised by its magic; its tokens split by the same fraction; no tokenizer
// needed). Every token must be below `vocab`; each part needs `min_tokens_each` tokens (what
// they make up, `min_reason`, says so in the error).
Corpus load_token_corpus(const std::string& path, const tokenize::Tokenizer* tokenizer, int64_t vocab, double val_fraction,
                         size_t min_tokens_each, const std::string& min_reason = "one batch of windows");

// The tokens of `path`: an llm.c token file as stored, else its text (a file or folder, as above)
// through `tokenizer` (an error when there is none). Every token must be below `vocab`.
std::vector<int32_t> read_tokens(const std::string& path, const tokenize::Tokenizer* tokenizer, int64_t vocab);
// An error naming `what`, the token and its position when one is outside [0, vocab).
void check_vocabulary(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& what);

// Ids [B, T] and targets [B, T] (i64): windows starting at `starts`.
struct Batch {
  Tensor ids, targets;
};
Batch make_batch(const std::vector<int32_t>& tokens, const std::vector<size_t>& starts, int64_t T);
// The starts of training batch `index` of a run seeded with `seed`: B positions uniform in
// [0, size - T - 1], a pure function of (seed, index), so a resumed run draws the same batches.
std::vector<size_t> train_starts(size_t size, int64_t B, int64_t T, uint64_t seed, uint64_t index);
// The validation windows' starts (see above), at most max_windows of them.
std::vector<size_t> eval_starts(size_t size, int64_t T, size_t max_windows);

}  // namespace scalify::train
