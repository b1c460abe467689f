#include "scalify/tokenize/token_file.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>

#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/input_file.hpp"

namespace scalify::tokenize {

namespace {
// llm.c's two layouts: GPT-2's uint16 tokens, and the uint32 tokens of larger vocabularies (Llama 3).
constexpr int32_t kMagic = 20240520, kVersion = 1;
constexpr int32_t kMagic32 = 20240801, kVersion32 = 7;
constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * 4;
// 2^31 tokens of uint32: the most the header's int32 count can hold.
constexpr uint64_t kMaxFileBytes = kHeaderBytes + (uint64_t(1) << 33);

uint32_t load_le32(const char* p) {
  const auto b = [&](int k) { return uint32_t(uint8_t(p[k])); };
  return b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24);
}
void store_le(std::string& out, uint32_t v, size_t bytes) {
  for (size_t k = 0; k < bytes; ++k) out += char((v >> (8 * k)) & 0xFF);
}
}  // namespace

bool is_token_file(const std::string& path) {
  // A missing path or a folder is no token file (the text reader names it); a pipe or device is
  // refused here, since waiting on it for four bytes could last forever.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) || std::filesystem::is_directory(path, ec)) return false;
  const std::string head = io::read_input_head(path, "data", 4);
  if (head.size() < 4) return false;
  const int32_t magic = int32_t(load_le32(head.data()));
  return magic == kMagic || magic == kMagic32;
}

std::vector<int32_t> read_token_file(const std::string& path) {
  const std::string bytes = io::read_input_file(path, "token file", kMaxFileBytes);
  const auto fail = [&](const std::string& why) { return Error("token file '" + path + "': " + why); };
  if (bytes.size() < kHeaderBytes)
    throw fail(std::to_string(bytes.size()) + " bytes, shorter than the " + std::to_string(kHeaderBytes) + "-byte header");
  const int32_t magic = int32_t(load_le32(bytes.data()));
  if (magic != kMagic && magic != kMagic32)
    throw fail("magic number " + std::to_string(magic) + ", not llm.c's " + std::to_string(kMagic) + " or " + std::to_string(kMagic32) +
               " (not a token file)");
  const int32_t version = int32_t(load_le32(bytes.data() + 4));
  const int32_t expected = magic == kMagic ? kVersion : kVersion32;
  if (version != expected)
    throw fail("version " + std::to_string(version) + " under magic " + std::to_string(magic) + ", llm.c's is " + std::to_string(expected));
  const int32_t count = int32_t(load_le32(bytes.data() + 8));
  const size_t width = magic == kMagic ? 2 : 4;
  if (count < 0 || bytes.size() != kHeaderBytes + uint64_t(count) * width)
    throw fail("the header counts " + std::to_string(count) + " tokens of " + std::to_string(width) + " bytes, but the file holds " +
               std::to_string(bytes.size() - kHeaderBytes) + " bytes after the header (truncated or not a token file)");
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  const char* p = bytes.data() + kHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i, p += width) {
    const uint32_t v = width == 2 ? uint32_t(uint8_t(p[0]) | (uint8_t(p[1]) << 8)) : load_le32(p);
    if (v > uint32_t(INT32_MAX)) throw fail("token " + std::to_string(i) + " is " + std::to_string(v) + ", above 2^31 - 1");
    tokens[i] = int32_t(v);
  }
  return tokens;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      throw Error("token file '" + path + "': token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                  ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  if (tokens.size() > size_t(INT32_MAX))
    throw Error("token file '" + path + "': " + std::to_string(tokens.size()) + " tokens, more than the header's int32 count holds");
  const bool narrow = std::all_of(tokens.begin(), tokens.end(), [](int32_t t) { return t < 65536; });
  const size_t width = narrow ? 2 : 4;
  std::string header;
  store_le(header, uint32_t(narrow ? kMagic : kMagic32), 4);
  store_le(header, uint32_t(narrow ? kVersion : kVersion32), 4);
  store_le(header, uint32_t(tokens.size()), 4);
  header.resize(kHeaderBytes, '\0');
  io::write_file_atomically(path, [&](const io::ByteSink& out) {
    out(header.data(), header.size());
    std::string chunk;  // written 64k tokens at a time
    for (size_t i = 0; i < tokens.size(); i += 65536) {
      chunk.clear();
      for (size_t k = i; k < std::min(tokens.size(), i + 65536); ++k) store_le(chunk, uint32_t(tokens[k]), width);
      out(chunk.data(), chunk.size());
    }
  });
}

}  // namespace scalify::tokenize
