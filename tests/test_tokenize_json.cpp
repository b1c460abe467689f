// Real vocabularies as transformers takes them (issue 46): byte-level BPEs whose vocabulary lacks
// some of the 256 bytes (dropped, or the unknown token, as Hugging Face's tokenizers does),
// tokenizer.json folders (their BPE model, pre-tokenizer rules and added tokens) and the BPE of a
// GGUF file's metadata give the ids of `tokenizers`, token for token, on the committed lines of
// tests/data/tokenizer (made by make_reference.py); files Scalify does not read are errors naming
// what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>

#include "expect_error.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/gguf_tokenizer.hpp"
#include "scalify/tokenize/pretokenize.hpp"
#include "scalify/tokenize/tokenizer.hpp"
#include "scalify/tokenize/tokenizer_json.hpp"
#include "train_fixtures.hpp"

namespace scalify::tokenize {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(SCALIFY_HF_DATA_DIR).parent_path() / "tokenizer";
// The bytes make_reference.py's tiny vocabularies have no token for.
const std::string kMissingBytes = "\x04\x06\x13\x1f\xc0\xc1\xf5\xff";

using testing::slurp;
using testing::spit;
// A fresh, empty folder of this test process (train_fixtures' scratch names it; this creates it).
fs::path scratch(const std::string& name) {
  const fs::path p = testing::scratch("tokenize_json_" + name);
  fs::create_directories(p);
  return p;
}

struct Line {
  std::string text;
  std::vector<int32_t> ids;
};
std::vector<Line> read_lines(const fs::path& jsonl) {
  std::vector<Line> out;
  std::istringstream lines(slurp(jsonl));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out.push_back({j["text"], j["ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

// Every line encodes to its reference ids; the first few that do not are reported.
void expect_reference_ids(const Tokenizer& tok, const std::vector<Line>& lines) {
  size_t reported = 0, matched = 0;
  for (const Line& r : lines) {
    const std::vector<int32_t> ids = tok.encode(r.text);
    if (ids == r.ids) {
      ++matched;
    } else if (reported++ < 5) {
      ADD_FAILURE() << "text " << nlohmann::json(r.text).dump() << "\n  ids      " << nlohmann::json(ids).dump() << "\n  expected "
                    << nlohmann::json(r.ids).dump();
    }
  }
  EXPECT_EQ(matched, lines.size());
}

bool has_missing_byte(const std::string& text) { return text.find_first_of(kMissingBytes) != std::string::npos; }

TEST(ByteLevelBpe, AVocabularyWithoutSomeBytesDropsThemAsTokenizersDoes) {
  // GPT-2's two files of a vocabulary that lacks 8 bytes, as transformers 4 saved SmolLM2's (which
  // lacks 21): Scalify refused it ("has no token for byte 4").
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_vocab").string());
  const std::vector<Line> lines = read_lines(kData / "tiny_vocab_encodings.jsonl");
  ASSERT_GT(lines.size(), 300u);
  expect_reference_ids(*tok, lines);
  size_t with_missing = 0;
  for (const Line& r : lines) {
    if (has_missing_byte(r.text)) {
      ++with_missing;
      continue;
    }
    EXPECT_EQ(tok->decode(r.ids), r.text);  // the other lines lose nothing
  }
  EXPECT_GE(with_missing, 10u);
  // Special tokens in the text stay plain text in GPT-2's files (bit-identical to before).
  EXPECT_GT(tok->encode("<|im_start|>").size(), 1u);
}

TEST(TokenizerJson, PreTokenizerRulesAndAddedTokensGiveTokenizersIds) {
  // Sequence[Digits(individual_digits), ByteLevel], added tokens, missing bytes dropped.
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_json").string());
  EXPECT_NE(tok->description().find("byte-level BPE, 596 tokens (" + (kData / "tiny_json" / "tokenizer.json").string()), std::string::npos)
      << tok->description();
  const std::vector<Line> lines = read_lines(kData / "tiny_json_encodings.jsonl");
  expect_reference_ids(*tok, lines);
  for (const Line& r : lines) {
    if (!has_missing_byte(r.text)) {
      EXPECT_EQ(tok->decode(r.ids), r.text);
    }
  }
  // Added tokens are one token each and count their text's bytes; the longest match wins.
  EXPECT_EQ(tok->encode("<|im_start|><|im_end|>x<|endoftext|>"), (std::vector<int32_t>{1, 2, tok->encode("x")[0], 0}));
  EXPECT_EQ(tok->encode("<|im"), std::vector<int32_t>{3});
  EXPECT_EQ(tok->token_bytes(1), std::string("<|im_start|>").size());
  EXPECT_EQ(tok->decode({1}), "<|im_start|>");
}

TEST(TokenizerJson, NonNormalizedAddedTokensSplitFirstAsTokenizersDoes) {
  // tokenizers splits off the non-normalized added tokens (special ones by default) first, and
  // matches the normalized ones in the text between: with "a<" (normalized) and "<b>" (not),
  // "xa<b>y" is x, a, <b>, y in tokenizers ([91, 68, 597, 92] with these ids); one leftmost
  // pass over both gave x, a<, b, >, y.
  nlohmann::json doc = nlohmann::json::parse(slurp(kData / "tiny_json" / "tokenizer.json"));
  const int64_t n = 596;
  doc["added_tokens"].push_back({{"id", n}, {"content", "a<"}, {"normalized", true}, {"special", false}});
  doc["added_tokens"].push_back({{"id", n + 1}, {"content", "<b>"}, {"normalized", false}, {"special", true}});
  const fs::path dir = scratch("normalized_added");
  spit(dir / "tokenizer.json", doc.dump());
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(dir.string());
  EXPECT_EQ(tok->encode("xa<b>y"), (std::vector<int32_t>{91, 68, 597, 92}));
  EXPECT_EQ(tok->encode("xa<y"), (std::vector<int32_t>{91, 596, 92}));
}

TEST(TokenizerJson, SplitByGpt2sPatternDigitRunsUnknownTokenAndIgnoreMerges) {
  // Sequence[Split(GPT-2's pattern), Digits, ByteLevel(use_regex false)], merges as "a b"
  // strings, unk_token with fuse_unk: a run of bytes without a token is one <unk>.
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_json_split").string());
  const std::vector<Line> lines = read_lines(kData / "tiny_json_split_encodings.jsonl");
  expect_reference_ids(*tok, lines);
  const std::vector<int32_t> ids = tok->encode("\x04\x06\x13");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(tok->decode(ids), "<unk>");
}

TEST(TokenizerJson, SplitByLlama3sPatternGivesTokenizersIds) {
  // Sequence[Split(Llama 3's pattern), ByteLevel(use_regex false)] with ignore_merges, as Llama 3's file.
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_json_llama3").string());
  expect_reference_ids(*tok, read_lines(kData / "tiny_json_llama3_encodings.jsonl"));
}

TEST(PreTokenize, Llama3sPatternCutsAsItsAlternatives) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(llama3_pretokenize("I'M 12345 x"), (V{"I", "'M", " ", "123", "45", " x"}));  // contractions in any case; 3 digits
  EXPECT_EQ(llama3_pretokenize("a!!\n\nb ?x"), (V{"a", "!!\n\n", "b", " ?", "x"}));      // punctuation takes its line breaks
  EXPECT_EQ(llama3_pretokenize("x \n\n  y"), (V{"x", " \n\n", " ", " y"}));              // spaces up to the last line break
  EXPECT_EQ(llama3_pretokenize("(x)\r\n"), (V{"(x", ")\r\n"}));                          // one character before letters goes with them
  EXPECT_EQ(llama3_pretokenize(""), V{});
}

TEST(PreTokenize, RulesCutInTurn) {
  using V = std::vector<std::string_view>;
  using R = PreTokenizeRule;
  EXPECT_EQ(pretokenize("ab 123x", {R::kEachNumber, R::kGpt2Pattern}), (V{"ab", " ", "1", "2", "3", "x"}));
  EXPECT_EQ(pretokenize("ab 123x", {R::kGpt2Pattern}), (V{"ab", " 123", "x"}));
  EXPECT_EQ(pretokenize("ab 12½x٣", {R::kNumberRuns}), (V{"ab ", "12½", "x", "٣"}));
  EXPECT_EQ(pretokenize("ab 12", {}), (V{"ab 12"}));
  EXPECT_EQ(pretokenize("", {R::kGpt2Pattern}), V{});
}

// tiny_json's tokenizer as GGUF's metadata holds it: tokens by id, merges "a b", added tokens control.
GgufTokenizerMetadata tiny_gguf_metadata() {
  const nlohmann::json doc = nlohmann::json::parse(slurp(kData / "tiny_json" / "tokenizer.json"));
  GgufTokenizerMetadata m;
  m.model = "gpt2";
  m.pre = "smollm";
  m.tokens.resize(doc["model"]["vocab"].size());
  for (const auto& [token, id] : doc["model"]["vocab"].items()) m.tokens[id.get<size_t>()] = token;
  for (const auto& pair : doc["model"]["merges"]) m.merges.push_back(pair[0].get<std::string>() + " " + pair[1].get<std::string>());
  m.token_types.assign(m.tokens.size(), int64_t(GgufTokenType::kNormal));
  for (const auto& a : doc["added_tokens"])
    m.token_types[a["id"].get<size_t>()] = int64_t(a["special"].get<bool>() ? GgufTokenType::kControl : GgufTokenType::kUserDefined);
  m.bos = 1;
  m.eos = 2;
  return m;
}

TEST(GgufTokenizer, MetadataGivesTheIdsOfTheSameVocabulary) {
  // Without control tokens, the ids of GPT-2's files of the same vocabulary: "smollm" pre-tokenizes
  // by GPT-2's pattern as transformers' GGUF loader does (not isolating numbers as llama.cpp).
  GgufTokenizerMetadata m = tiny_gguf_metadata();
  m.token_types.assign(m.tokens.size(), int64_t(GgufTokenType::kNormal));
  for (const char* pre : {"smollm", "gpt2"}) {
    m.pre = pre;
    expect_reference_ids(*gguf_bpe_tokenizer(m, "tiny.gguf"), read_lines(kData / "tiny_vocab_encodings.jsonl"));
  }
  // Control and user-defined tokens are one token each in the text.
  const std::unique_ptr<BpeTokenizer> tok = gguf_bpe_tokenizer(tiny_gguf_metadata(), "tiny.gguf");
  const std::vector<int32_t> x = tok->encode("x");
  EXPECT_EQ(tok->encode("<|im_start|>x<|im<|endoftext|>"), (std::vector<int32_t>{1, x[0], 3, 0}));
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->description(), "byte-level BPE (GGUF), 596 tokens (tiny.gguf)");
}

TEST(GgufTokenizer, MetadataScalifyDoesNotReadIsAnErrorNamingIt) {
  GgufTokenizerMetadata m = tiny_gguf_metadata();
  m.pre = "llama-bpe";
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "'tiny.gguf': tokenizer.ggml.pre is 'llama-bpe', a pre-tokenizer Scalify does not read");
  m.pre = "";
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "tokenizer.ggml.pre is missing (llama.cpp's \"default\")");
  m = tiny_gguf_metadata();
  m.model = "llama";
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "tokenizer.ggml.model is 'llama', not \"gpt2\"");
  m = tiny_gguf_metadata();
  m.merges[3] = "nospace";
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "tokenizer.ggml.merges[3] is 'nospace', not two tokens");
  m = tiny_gguf_metadata();
  m.merges[3] = "zz qq";
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "merge 3 ('zz qq'): 'zz' is not a token");
  m = tiny_gguf_metadata();
  m.token_types.assign(m.tokens.size(), 1);
  m.token_types[7] = -5;
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"),
               "'tiny.gguf': tokenizer.ggml.token_type[7] is -5, not one of llama.cpp's token types 0-6");
  m.token_types[7] = 7;
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "tokenizer.ggml.token_type[7] is 7");
  m = tiny_gguf_metadata();
  m.eos = 596;
  EXPECT_ERROR(gguf_bpe_tokenizer(m, "tiny.gguf"), "'tiny.gguf': the end-of-sequence token 596 is not a token id in [0, 596)");
}

// A copy of tiny_json's tokenizer.json changed by `edit`, in a folder of its own.
fs::path edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json doc = nlohmann::json::parse(slurp(kData / "tiny_json" / "tokenizer.json"));
  edit(doc);
  const fs::path dir = scratch(name);
  spit(dir / "tokenizer.json", doc.dump());
  return dir;
}

TEST(TokenizerJson, WhatScalifyDoesNotReadIsAnErrorNamingIt) {
  const auto error = [](const fs::path& dir) { return testing::error_of([&] { load_tokenizer(dir.string()); }); };
  const auto expect = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit, const std::string& text) {
    const fs::path dir = edited(name, edit);
    const std::string message = error(dir);
    EXPECT_NE(message.find("'" + (dir / "tokenizer.json").string() + "': "), std::string::npos) << message;
    EXPECT_NE(message.find(text), std::string::npos) << name << ": " << message;
  };
  expect(
      "unigram", [](nlohmann::json& d) { d["model"]["type"] = "Unigram"; }, "the model is \"Unigram\", not a BPE");
  expect(
      "no_model", [](nlohmann::json& d) { d.erase("model"); }, "the file has no \"model\"");
  expect(
      "byte_fallback", [](nlohmann::json& d) { d["model"]["byte_fallback"] = true; }, "model.byte_fallback is true");
  expect(
      "dropout", [](nlohmann::json& d) { d["model"]["dropout"] = 0.1; }, "model.dropout is 0.1");
  expect(
      "metaspace",
      [](nlohmann::json& d) {
        d["pre_tokenizer"] = {{"type", "Metaspace"}};
      },
      "pre_tokenizer is a Metaspace pre-tokenizer");
  expect(
      "nested_unknown",
      [](nlohmann::json& d) {
        d["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
      },
      "pre_tokenizer.pretokenizers[0] is a Whitespace pre-tokenizer");
  expect(
      "no_byte_level",
      [](nlohmann::json& d) {
        d["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
      },
      "the pre_tokenizer has no ByteLevel: not a byte-level BPE");
  expect(
      "prefix_space", [](nlohmann::json& d) { d["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
      "ByteLevel with add_prefix_space");
  expect(
      "other_split",
      [](nlohmann::json& d) {
        d["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}};
      },
      "is a Split by \\p{N}{1,3} (Isolated), which Scalify does not read");
  expect(
      "normalizer",
      [](nlohmann::json& d) {
        d["normalizer"] = {{"type", "NFC"}};
      },
      "normalizer is a NFC, which Scalify does not read");
  expect(
      "lstrip", [](nlohmann::json& d) { d["added_tokens"][1]["lstrip"] = true; }, "added_tokens[1] has lstrip set");
  expect(
      "gap", [](nlohmann::json& d) { d["model"]["vocab"]["<|im"] = 700; }, "the id of \"<|im\" is 700, not an integer in [0, 600)");
  expect(
      "same_id", [](nlohmann::json& d) { d["model"]["vocab"]["<|im"] = 9; }, "have the same id 9");
  expect(
      "merge",
      [](nlohmann::json& d) {
        d["model"]["merges"][2] = {"zz", "y"};
      },
      "merge 2 ('zz y'): 'zz' is not a token");
  expect(
      "merge_shape", [](nlohmann::json& d) { d["model"]["merges"][2] = 5; }, "model.merges[2] is 5, not two tokens");
  expect(
      "vocab_type",
      [](nlohmann::json& d) {
        d["model"]["vocab"] = {1, 2};
      },
      "model.vocab is [1,2], not an object");
  expect(
      "unk", [](nlohmann::json& d) { d["model"]["unk_token"] = "<nope>"; }, "model.unk_token \"<nope>\" is not in model.vocab");
  expect(
      "added_type", [](nlohmann::json& d) { d["added_tokens"] = "x"; }, "added_tokens is \"x\", not a list");
  // Not JSON, and JSON nested deeper than any tokenizer: errors naming the file.
  const fs::path dir = scratch("deep");
  spit(dir / "tokenizer.json", std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_ERROR(load_tokenizer(dir.string()), (dir / "tokenizer.json").string() + "': JSON nested deeper than 64 levels");
  spit(dir / "tokenizer.json", "{\"model\": ");
  EXPECT_ERROR(load_tokenizer(dir.string()), (dir / "tokenizer.json").string() + "': not valid JSON");
  spit(dir / "tokenizer.json", "[]");
  EXPECT_ERROR(load_tokenizer(dir.string()), "not a tokenizer.json: the file is [], not an object");
}

TEST(TokenizerJson, DamagedFilesAreErrorsOrTokenizersNeverCrashes) {
  // A fuzzer (run under the sanitizers by scripts/sanitize.sh): bytes of tiny_json's file changed
  // at random, and GGUF metadata with merges and types changed at random; each either reads (and
  // then encodes) or is a scalify::Error.
  const std::string good = slurp(kData / "tiny_json" / "tokenizer.json");
  const fs::path dir = scratch("fuzz");
  std::mt19937 rng(46);
  size_t read = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    for (int k = 0, n = 1 + int(rng() % 8); k < n; ++k) bytes[rng() % bytes.size()] = char("\"{}[],:0123456789 aZ\\\x00\xff"[rng() % 24]);
    spit(dir / "tokenizer.json", bytes);
    try {
      const std::unique_ptr<Tokenizer> tok = load_tokenizer(dir.string());
      (void)tok->encode("<|im_start|>Hello 123 w\x04rld\n");
      ++read;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(read + refused, 300u);
  for (int i = 0; i < 300; ++i) {
    GgufTokenizerMetadata m = tiny_gguf_metadata();
    std::string& merge = m.merges[rng() % m.merges.size()];
    merge[rng() % merge.size()] = char("Ġ \x00ab"[rng() % 5]);
    m.token_types[rng() % m.token_types.size()] = int64_t(rng() % 8) - 1;
    m.tokens[rng() % m.tokens.size()] = std::string(rng() % 3, 'x');
    try {
      (void)gguf_bpe_tokenizer(m, "fuzz.gguf")->encode("<|im_start|>Hello 123 w\x04rld\n");
    } catch (const Error&) {}
  }
}

TEST(LoadTokenizer, GptTwosFilesAndTokenizerModelComeBeforeTokenizerJson) {
  // A folder with both keeps reading what it read before (bit-identical ids).
  const fs::path dir = scratch("both");
  for (const char* name : {"vocab.json", "merges.txt"}) fs::copy_file(kData / "tiny_vocab" / name, dir / name);
  fs::copy_file(kData / "tiny_json" / "tokenizer.json", dir / "tokenizer.json");
  EXPECT_NE(load_tokenizer(dir.string())->description().find("GPT-2 byte-level BPE"), std::string::npos);
  fs::remove(dir / "vocab.json");
  fs::remove(dir / "merges.txt");
  EXPECT_TRUE(has_tokenizer_files(dir.string()));
  EXPECT_EQ(load_tokenizer(dir.string())->encode("<|im_start|>"), std::vector<int32_t>{1});
  using N = std::vector<std::string>;
  EXPECT_EQ(tokenizer_files_read(dir.string()), N{"tokenizer.json"});
  EXPECT_EQ(tokenizer_files_read((kData / "tiny_vocab").string()), (N{"vocab.json", "merges.txt"}));
  EXPECT_EQ(tokenizer_files_read(scratch("none").string()), N{});
}

}  // namespace
}  // namespace scalify::tokenize
