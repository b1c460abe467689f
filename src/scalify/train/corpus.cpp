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

Corpus load_corpus(const std::string& path, double val_fraction, size_t min_bytes_each) {
  if (!(val_fraction > 0 && val_fraction < 1))
    throw Error("data: validation fraction must be in (0, 1), got " + std::to_string(val_fraction));
  Corpus c;
  c.source = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw Error("data: '" + path + "' does not exist" +
                (path == default_corpus_path() ? " (the default corpus; scripts/setup.sh installs Debian's fortunes)" : ""));
  std::vector<uint8_t> all;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path());
    if (ec) throw Error("data: cannot list '" + path + "': " + ec.message());
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
    if (!fs::is_regular_file(st)) throw Error("data: '" + path + "' is neither a regular file nor a folder");
    const std::string error = read_bytes(path, all);
    if (!error.empty()) throw Error("data: cannot read '" + path + "': " + error);
    if (all.empty()) throw Error("data: '" + path + "' is empty");
    if (!is_text(all)) throw Error("data: '" + path + "' is not text (it contains NUL bytes)");
    c.files.push_back(path);
  }
  const size_t n_val = size_t(std::ceil(double(all.size()) * val_fraction));
  c.train.assign(all.begin(), all.end() - std::ptrdiff_t(n_val));
  c.val.assign(all.end() - std::ptrdiff_t(n_val), all.end());
  if (c.train.size() < min_bytes_each || c.val.size() < min_bytes_each)
    throw Error("data: '" + path + "' is too short: " + std::to_string(all.size()) + " bytes give " + std::to_string(c.train.size()) +
                " training and " + std::to_string(c.val.size()) + " validation bytes; each needs at least " +
                std::to_string(min_bytes_each) + " (one batch of windows)");
  return c;
}

Batch make_batch(const std::vector<uint8_t>& bytes, const std::vector<size_t>& starts, int64_t T) {
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
