#pragma once
// The training text: a file or a folder of text files, read as bytes (vocabulary 256), split
// deterministically into training and validation bytes.
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

namespace scalify::train {

struct Corpus {
  std::string source;                // what was read (path)
  std::vector<uint8_t> train, val;   // the split
  std::vector<std::string> files;    // text files used
  std::vector<std::string> skipped;  // files in a folder that were not text (NUL bytes) or unreadable
  size_t total_bytes() const { return train.size() + val.size(); }
};

// The default corpus: the plain-text files of Debian's `fortunes` package.
std::string default_corpus_path();

// Reads `path`. Errors (scalify::Error, before any training): missing or unreadable path, an
// empty corpus, a single file that is binary (NUL bytes), a folder with no text file, and a split
// too short for one batch of windows (either part shorter than `min_bytes_each`).
Corpus load_corpus(const std::string& path, double val_fraction, size_t min_bytes_each);

// Ids [B, T] and targets [B, T] (i64): windows starting at `starts`.
struct Batch {
  Tensor ids, targets;
};
Batch make_batch(const std::vector<uint8_t>& bytes, const std::vector<size_t>& starts, int64_t T);
// The starts of training batch `index` of a run seeded with `seed`: B positions uniform in
// [0, size - T - 1], a pure function of (seed, index), so a resumed run draws the same batches.
std::vector<size_t> train_starts(size_t size, int64_t B, int64_t T, uint64_t seed, uint64_t index);
// The validation windows' starts (see above), at most max_windows of them.
std::vector<size_t> eval_starts(size_t size, int64_t T, size_t max_windows);

}  // namespace scalify::train
