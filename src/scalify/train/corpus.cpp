#include "scalify/train/corpus.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/tokenize/token_file.hpp"

namespace scalify::train {

namespace fs = std::filesystem;

namespace {
// Reads a whole file; on failure returns the reason (open and read errors both: a stream would
// report a failed read as end of file).
std::string read_bytes(const fs::path& p, std::vector<uint8_t>& out) {
  out.clear();
  FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return std::strerror(errno);
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  return err ? std::strerror(err) : "";
}
bool is_text(const std::vector<uint8_t>& b) { return std::find(b.begin(), b.end(), uint8_t(0)) == b.end(); }
}  // namespace

std::string default_corpus_path() { return "/usr/share/games/fortunes"; }

namespace {

void check_fraction(double val_fraction) {
  if (!(val_fraction > 0 && val_fraction < 1))
    throw Error("data: validation fraction must be in (0, 1), got " + std::to_string(val_fraction));
}

// The bytes of a file, or of a folder's text files in name order each followed by a newline;
// the files used and skipped go into c.
std::vector<uint8_t> read_text(const std::string& path, Corpus& c) {
  c.source = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw MissingFileError("data: '" + path + "' does not exist" +
                           (path == default_corpus_path() ? " (the default corpus; scripts/setup.sh installs Debian's fortunes)" : ""));
  std::vector<uint8_t> all;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path());
    if (ec) throw FileError("data: cannot list '" + path + "': " + ec.message());
    std::sort(files.begin(), files.end());
    std::set<fs::path> seen;  // links to a file already read (fortunes' .u8 links) count once
    for (const fs::path& f : files) {
      const fs::path real = fs::canonical(f, ec);
      if (ec || !seen.insert(real).second) continue;
      std::vector<uint8_t> b;
      const std::string error = read_bytes(f, b);
      if (!error.empty() || !is_text(b)) {
        c.skipped.push_back(f.string().append(error.empty() ? " (not text)" : " (" + error + ")"));
        continue;
      }
      if (b.empty()) continue;
      c.files.push_back(f.string());
      all.insert(all.end(), b.begin(), b.end());
      all.push_back('\n');
    }
    if (c.files.empty())
      throw Error("data: folder '" + path + "' holds no text file (" + std::to_string(c.skipped.size()) + " binary or unreadable)");
  } else {
    // A device or pipe (/dev/zero) could be read without end.
    if (!fs::is_regular_file(st)) throw FileError("data: '" + path + "' is neither a regular file nor a folder");
    const std::string error = read_bytes(path, all);
    if (!error.empty()) throw FileError("data: cannot read '" + path + "': " + error);
    if (all.empty()) throw Error("data: '" + path + "' is empty");
    if (!is_text(all)) throw Error("data: '" + path + "' is not text (it contains NUL bytes)");
    c.files.push_back(path);
  }
  return all;
}

// Where the validation part of n items starts: the last val_fraction of them.
size_t split_point(size_t n, double val_fraction) { return n - size_t(std::ceil(double(n) * val_fraction)); }

void check_sizes(const Corpus& c, size_t total, size_t min_each, const std::string& reason = "one batch of windows") {
  if (c.train.size() < min_each || c.val.size() < min_each)
    throw Error("data: '" + c.source + "' is too short: " + std::to_string(total) + " " + c.unit() + " give " +
                std::to_string(c.train.size()) + " training and " + std::to_string(c.val.size()) + " validation " + c.unit() +
                "; each needs at least " + std::to_string(min_each) + " (" + reason + ")");
}

}  // namespace

Corpus load_corpus(const std::string& path, double val_fraction, size_t min_bytes_each) {
  check_fraction(val_fraction);
  Corpus c;
  const std::vector<uint8_t> all = read_text(path, c);
  const size_t at = split_point(all.size(), val_fraction);
  c.train.assign(all.begin(), all.begin() + std::ptrdiff_t(at));
  c.val.assign(all.begin() + std::ptrdiff_t(at), all.end());
  check_sizes(c, all.size(), min_bytes_each);
  return c;
}

std::vector<int32_t> read_tokens(const std::string& path, const tokenize::Tokenizer* tokenizer, int64_t vocab) {
  std::vector<int32_t> tokens;
  if (tokenize::is_token_file(path)) {
    tokens = tokenize::read_token_file(path);
  } else {
    if (!tokenizer)
      throw Error(path + ": text, and the model folder has no tokenizer (vocab.json + merges.txt, tokenizer.model or tokenizer.json; " +
                  tokenize::gguf_tokenizer_not_read() + ")");
    Corpus c;
    const std::vector<uint8_t> text = read_text(path, c);
    tokens = tokenizer->encode(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  }
  check_vocabulary(tokens, vocab, path);
  return tokens;
}

void check_vocabulary(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& what) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw Error(what + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                  " is outside the model's vocabulary of " + std::to_string(vocab));
}

Corpus load_token_corpus(const std::string& path, const tokenize::Tokenizer* tokenizer, int64_t vocab, double val_fraction,
                         size_t min_tokens_each, const std::string& min_reason) {
  check_fraction(val_fraction);
  Corpus c;
  size_t total = 0;
  if (tokenize::is_token_file(path)) {
    c.source = path;
    c.files.push_back(path);
    const std::vector<int32_t> all = read_tokens(path, nullptr, vocab);
    const size_t at = split_point(all.size(), val_fraction);
    c.train.assign(all.begin(), all.begin() + std::ptrdiff_t(at));
    c.val.assign(all.begin() + std::ptrdiff_t(at), all.end());
    total = all.size();
  } else {
    if (!tokenizer)
      throw Error("data: '" + path + "' is text, and the model has no tokenizer to read it with (" + tokenize::gguf_tokenizer_not_read() +
                  ")");
    // The bytes split as load_corpus splits them, then each part encoded on its own.
    const std::vector<uint8_t> all = read_text(path, c);
    const size_t at = split_point(all.size(), val_fraction);
    const std::string_view text(reinterpret_cast<const char*>(all.data()), all.size());
    c.train = tokenizer->encode(text.substr(0, at));
    c.val = tokenizer->encode(text.substr(at));
    check_vocabulary(c.train, vocab, path);
    check_vocabulary(c.val, vocab, path);
    total = c.train.size() + c.val.size();
  }
  if (tokenizer) {
    c.tokenizer = tokenizer->description();
    c.token_bytes.resize(size_t(vocab));
    for (int64_t id = 0; id < vocab && id < tokenizer->vocab_size(); ++id)
      c.token_bytes[size_t(id)] = uint32_t(tokenizer->token_bytes(int32_t(id)));
  } else {
    c.tokenizer = "pre-tokenised";
  }
  check_sizes(c, total, min_tokens_each, min_reason);
  return c;
}

Batch make_batch(const std::vector<int32_t>& bytes, const std::vector<size_t>& starts, int64_t T) {
  const int64_t B = int64_t(starts.size());
  std::vector<int64_t> ids(size_t(B * T)), targets(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const size_t s = starts[size_t(b)];
    if (s + size_t(T) >= bytes.size()) throw Error("batch: window at " + std::to_string(s) + " runs past the data");
    for (int64_t t = 0; t < T; ++t) {
      ids[size_t(b * T + t)] = bytes[s + size_t(t)];
      targets[size_t(b * T + t)] = bytes[s + size_t(t) + 1];
    }
  }
  return {Tensor::from_indices(ids, {B, T}), Tensor::from_indices(targets, {B, T})};
}

std::vector<size_t> train_starts(size_t size, int64_t B, int64_t T, uint64_t seed, uint64_t index) {
  const uint64_t range = uint64_t(size) - uint64_t(T);  // starts in [0, size - T - 1]
  std::vector<size_t> s(static_cast<size_t>(B));
  for (size_t b = 0; b < s.size(); ++b) {  // 64 counter-based random bits per start
    const uint64_t i = 2 * (index * uint64_t(B) + b);
    s[b] = size_t(((uint64_t(kernels::random_bits(seed, i)) << 32) | kernels::random_bits(seed, i + 1)) % range);
  }
  return s;
}

std::vector<size_t> eval_starts(size_t size, int64_t T, size_t max_windows) {
  std::vector<size_t> s;
  for (size_t i = 0; i * size_t(T) + size_t(T) < size && s.size() < max_windows; ++i) s.push_back(i * size_t(T));
  return s;
}

}  // namespace scalify::train
