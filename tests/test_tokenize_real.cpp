// The real model's tokenizer (issue 46): SmolLM2-135M-Instruct.Q4_1.gguf's byte-level BPE (49,152
// tokens, 21 bytes without a token, <|im_start|> and friends as control tokens, pre-tokenizer
// "smollm") gives the ids of transformers' tokenizer of the same file, token for token, on the
// hand-picked lines and the first corpus lines (tests/data/tokenizer/smollm2_lines.jsonl) and on
// every line and every whole file of the default corpus (counts and FNV-1a hashes in
// smollm2_corpus.json), all made by tests/data/tokenizer/make_reference.py. Labelled real_model;
// each test skips with a message when the model (or the corpus) is absent.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "scalify/hub/model_tokenizer.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/tokenizer.hpp"
#include "real_model.hpp"
#include "train_fixtures.hpp"

namespace scalify::tokenize {
namespace {

namespace fs = std::filesystem;
const fs::path kData = fs::path(SCALIFY_HF_DATA_DIR).parent_path() / "tokenizer";

// FNV-1a 64 of id lists: each id as 4 little-endian bytes, 0xFFFFFFFF after each list (as make_reference.py).
class Fnv1a {
 public:
  void add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) add_id(uint32_t(id));
    add_id(0xFFFFFFFFu);
  }
  std::string hex() const {
    char s[17];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h_));
    return s;
  }

 private:
  void add_id(uint32_t v) {
    for (int i = 0; i < 4; ++i) h_ = (h_ ^ ((v >> (8 * i)) & 0xFF)) * 0x100000001B3ull;
  }
  uint64_t h_ = 0xCBF29CE484222325ull;
};

TEST(Smollm2Tokenizer, TheGgufFilesTokenizerGivesTransformersIdsOnTheReferenceLines) {
  REQUIRE_SMOLLM2(path);
  ASSERT_TRUE(hub::has_model_tokenizer(path));
  const std::unique_ptr<Tokenizer> tok = hub::load_model_tokenizer(path);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_NE(tok->description().find("byte-level BPE (GGUF), 49152 tokens"), std::string::npos) << tok->description();
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(bpe->bos_id(), 1);  // <|im_start|>
  EXPECT_EQ(bpe->eos_id(), 2);  // <|im_end|>
  std::istringstream lines(testing::slurp((kData / "smollm2_lines.jsonl").string()));
  size_t n = 0, reported = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::vector<int32_t> ids = tok->encode(j["text"].get<std::string>());
    if (ids != j["ids"].get<std::vector<int32_t>>() && reported++ < 5)
      ADD_FAILURE() << "text " << j["text"].dump() << "\n  ids      " << nlohmann::json(ids).dump() << "\n  expected " << j["ids"].dump();
  }
  EXPECT_EQ(reported, 0u);
  EXPECT_GT(n, 200u);
}

TEST(Smollm2Tokenizer, EveryLineAndFileOfTheDefaultCorpusGivesTransformersIds) {
  REQUIRE_SMOLLM2(path);
  const nlohmann::json ref = nlohmann::json::parse(testing::slurp((kData / "smollm2_corpus.json").string()));
  const fs::path corpus = ref["corpus"].get<std::string>();
  if (!fs::exists(corpus)) GTEST_SKIP() << corpus << " is absent (scripts/setup.sh installs Debian's fortunes)";
  const std::unique_ptr<Tokenizer> tok = hub::load_model_tokenizer(path);
  for (const nlohmann::json& f : ref["files"]) {
    const std::string name = f["file"];
    SCOPED_TRACE(name);
    const std::string text = testing::slurp((corpus / name).string());
    Fnv1a per_line, whole;
    size_t lines = 0, line_tokens = 0;
    for (size_t pos = 0;; ++lines) {  // Python's text.split("\n")
      const size_t end = text.find('\n', pos);
      const std::vector<int32_t> ids =
          tok->encode(std::string_view(text).substr(pos, end == std::string::npos ? std::string::npos : end - pos));
      per_line.add(ids);
      line_tokens += ids.size();
      if (end == std::string::npos) {
        ++lines;
        break;
      }
      pos = end + 1;
    }
    EXPECT_EQ(lines, f["lines"].get<size_t>());
    EXPECT_EQ(line_tokens, f["line_tokens"].get<size_t>());
    EXPECT_EQ(per_line.hex(), f["line_fnv1a"].get<std::string>());
    const std::vector<int32_t> ids = tok->encode(text);
    whole.add(ids);
    EXPECT_EQ(ids.size(), f["tokens"].get<size_t>());
    EXPECT_EQ(whole.hex(), f["fnv1a"].get<std::string>());
  }
}

}  // namespace
}  // namespace scalify::tokenize
