#pragma once
// Pre-tokenised data in llm.c's layouts (.bin), so text tokenised elsewhere trains and evaluates
// here: a header of 256 little-endian int32 — [0] the magic, [1] the version, [2] the number of
// tokens — then the tokens, little-endian: magic 20240520 version 1 with uint16 tokens (GPT-2), or
// magic 20240801 version 7 with uint32 tokens (larger vocabularies, Llama 3).
#include <cstdint>
#include <string>
#include <vector>

namespace scalify::tokenize {

// The tokens of `path`; a wrong magic, an unknown version or a size that disagrees with the
// header's count is a scalify::Error naming the file.
std::vector<int32_t> read_token_file(const std::string& path);
// Whether `path` begins with one of the magics: a token file, as opposed to text (no text starts with
// those four bytes: they hold a NUL).
bool is_token_file(const std::string& path);

// Writes `tokens` (each in [0, vocab_size)) atomically: the uint16 layout when every token is below
// 65536, else the uint32 one.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size);

}  // namespace scalify::tokenize
