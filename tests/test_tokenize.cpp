// Tokenizers of pretrained models (issue 34): GPT-2's byte-level BPE and SentencePiece give the
// reference tokenizers' ids, token for token, on the committed lines of tests/data/hf (made by
// make_reference.py with transformers and sentencepiece), and decode them back; bad files are
// errors naming the file; llm.c token files round-trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "expect_error.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/pretokenize.hpp"
#include "scalify/tokenize/token_file.hpp"
#include "scalify/tokenize/tokenizer.hpp"
#include "scalify/tokenize/unicode_classes.hpp"
#include "train_fixtures.hpp"

namespace scalify::tokenize {
namespace {

namespace fs = std::filesystem;

const fs::path kData = SCALIFY_HF_DATA_DIR;

using testing::slurp;
using testing::spit;
// A fresh folder of this test process.
fs::path scratch(const std::string& name) {
  const fs::path p = testing::scratch(name);
  fs::create_directories(p);
  return p;
}

struct Reference {
  std::string text, decoded;
  std::vector<int32_t> ids;
};
std::vector<Reference> read_reference(const fs::path& jsonl) {
  std::vector<Reference> out;
  std::istringstream lines(slurp(jsonl));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out.push_back({j["text"], j["decoded"], j["ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

// Every reference line encodes to its ids and decodes to its text; returns how many matched.
size_t check_reference(const Tokenizer& tok, const std::vector<Reference>& lines) {
  size_t matched = 0, reported = 0;
  for (const Reference& r : lines) {
    const std::vector<int32_t> ids = tok.encode(r.text);
    const std::string decoded = tok.decode(r.ids);
    if (ids == r.ids && decoded == r.decoded) {
      ++matched;
    } else if (reported++ < 5) {
      ADD_FAILURE() << "text " << nlohmann::json(r.text).dump() << "\n  ids      " << nlohmann::json(ids).dump() << "\n  expected "
                    << nlohmann::json(r.ids).dump() << "\n  decoded "
                    << nlohmann::json(decoded).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n  expected "
                    << nlohmann::json(r.decoded).dump();
    }
  }
  return matched;
}

TEST(Gpt2Bpe, EveryReferenceLineGivesTransformersIdsAndDecodesBack) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_gpt2").string());
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_NE(tok->description().find("GPT-2 byte-level BPE, 1000 tokens"), std::string::npos) << tok->description();
  const std::vector<Reference> lines = read_reference(kData / "bpe_encodings.jsonl");
  ASSERT_EQ(lines.size(), 3000u);
  EXPECT_EQ(check_reference(*tok, lines), lines.size());
  for (const Reference& r : lines) {
    ASSERT_EQ(r.decoded, r.text);  // byte-level BPE loses nothing
    size_t bytes = 0;
    for (int32_t id : r.ids) bytes += tok->token_bytes(id);
    ASSERT_EQ(bytes, r.text.size()) << r.text;
  }
  // <|endoftext|> (id 0) is no text: bits per byte over llm.c's files, which put it before every
  // document, must not count its 13 letters.
  EXPECT_EQ(tok->decode({0}), "<|endoftext|>");
  EXPECT_EQ(tok->token_bytes(0), 0u);
}

TEST(SentencePiece, EveryReferenceLineGivesTheSentencepieceIdsAndDecodesBack) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_llama").string());
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_NE(tok->description().find("SentencePiece, 1000 tokens"), std::string::npos) << tok->description();
  const std::vector<Reference> lines = read_reference(kData / "spm_encodings.jsonl");
  ASSERT_EQ(lines.size(), 3000u);
  EXPECT_EQ(check_reference(*tok, lines), lines.size());
}

TEST(SentencePiece, TokenBytesCountTheWordStartAsOneSpaceAndControlsAsNothing) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_llama").string());
  EXPECT_EQ(tok->token_bytes(0), 0u);  // <unk>
  EXPECT_EQ(tok->token_bytes(1), 0u);  // <s>
  EXPECT_EQ(tok->token_bytes(2), 0u);  // </s>
  EXPECT_EQ(tok->token_bytes(3), 1u);  // <0x00>, the first byte-fallback piece
  // A text with a dummy prefix: the pieces' bytes are the text's and one space.
  const std::string text = "Nice guys get sick.";
  size_t bytes = 0;
  for (int32_t id : tok->encode(text)) bytes += tok->token_bytes(id);
  EXPECT_EQ(bytes, text.size() + 1);
}

TEST(Gpt2Bpe, ByteStandInsAreGpt2s) {
  const std::array<char32_t, 256> map = byte_to_unicode();
  EXPECT_EQ(map['!'], U'!');
  EXPECT_EQ(map['~'], U'~');
  EXPECT_EQ(map[0xE9], U'é');
  EXPECT_EQ(map[0], U'\u0100');
  EXPECT_EQ(map[' '], U'\u0120');   // Ġ
  EXPECT_EQ(map['\n'], U'\u010A');  // Ċ
  EXPECT_EQ(map[0x7F], U'\u0121');
  EXPECT_EQ(map[0xAD], U'\u0143');  // the soft hyphen, the last non-printable byte
}

TEST(Gpt2Bpe, PretokenisationFollowsThePattern) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pretokenize("Hello  world's 123 !!x"), (V{"Hello", " ", " world", "'s", " 123", " !!", "x"}));
  EXPECT_EQ(gpt2_pretokenize("DON'T it'll"), (V{"DON", "'", "T", " it", "'ll"}));  // contractions are lower case
  EXPECT_EQ(gpt2_pretokenize("a\t\tb   "), (V{"a", "\t", "\t", "b", "   "}));      // a run keeps its last space for the word
  EXPECT_EQ(gpt2_pretokenize("x\u00a0y"), (V{"x", "\u00a0", "y"}));                // NBSP is a space, not ' '
  EXPECT_EQ(gpt2_pretokenize("sep\x1c"
                             "file"),
            (V{"sep", "\x1c", "file"}));           // U+001C is not a space
  EXPECT_EQ(gpt2_pretokenize("½²٣"), (V{"½²٣"}));  // numbers of No and Nd
  EXPECT_EQ(gpt2_pretokenize(""), V{});
}

TEST(Gpt2Bpe, InvalidUtf8StillEncodesByteForByteAndRoundTrips) {
  using V = std::vector<std::string_view>;
  // Each byte outside well-formed UTF-8 counts as a character of its own, like punctuation.
  EXPECT_EQ(gpt2_pretokenize("ab\xff\xfe cd"), (V{"ab", "\xff\xfe", " cd"}));
  EXPECT_EQ(gpt2_pretokenize("a \xc3"), (V{"a", " \xc3"}));                // truncated sequence
  EXPECT_EQ(gpt2_pretokenize("\xed\xa0\x80x"), (V{"\xed\xa0\x80", "x"}));  // a surrogate
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_gpt2").string());
  for (const std::string& text : std::vector<std::string>{"ab\xff\xfe cd", "\xc0\xaf overlong", "caf\xc3", std::string("nul\0byte", 8)}) {
    const std::vector<int32_t> ids = tok->encode(text);
    EXPECT_EQ(tok->decode(ids), text);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += tok->token_bytes(id);
    EXPECT_EQ(bytes, text.size());
  }
}

TEST(UnicodeClasses, AgreeWithTheStandard) {
  // Letters: general category L*.
  EXPECT_TRUE(is_letter(U'a'));
  EXPECT_TRUE(is_letter(U'\u00AA'));      // ª FEMININE ORDINAL INDICATOR, Lo
  EXPECT_TRUE(is_letter(U'\u01C5'));      // ǅ, Lt
  EXPECT_TRUE(is_letter(U'\u02B0'));      // ʰ MODIFIER LETTER SMALL H, Lm
  EXPECT_TRUE(is_letter(U'\u65E5'));      // 日, Lo
  EXPECT_TRUE(is_letter(U'\U0001D518'));  // 𝔘 MATHEMATICAL FRAKTUR CAPITAL U, Lu
  EXPECT_FALSE(is_letter(U'\u0301'));     // COMBINING ACUTE ACCENT, Mn
  EXPECT_FALSE(is_letter(U'_'));
  EXPECT_FALSE(is_letter(U'\u00D7'));      // ×, Sm
  EXPECT_FALSE(is_letter(U'\U0001F600'));  // 😀, So
  // Numbers: N*.
  EXPECT_TRUE(is_number(U'7'));
  EXPECT_TRUE(is_number(U'\u00B2'));  // ² SUPERSCRIPT TWO, No
  EXPECT_TRUE(is_number(U'\u00BD'));  // ½, No
  EXPECT_TRUE(is_number(U'\u0661'));  // ١ ARABIC-INDIC DIGIT ONE, Nd
  EXPECT_TRUE(is_number(U'\u2167'));  // Ⅷ ROMAN NUMERAL EIGHT, Nl
  EXPECT_FALSE(is_number(U'a'));
  EXPECT_FALSE(is_letter(U'\u2167'));
  // White_Space.
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00A0', U'\u1680', U'\u2000', U'\u200A', U'\u2028', U'\u2029',
                     U'\u202F', U'\u205F', U'\u3000'})
    EXPECT_TRUE(is_whitespace(c)) << uint32_t(c);
  for (char32_t c : {U'\u001C', U'\u001D', U'\u001E', U'\u001F', U'\u200B', U'\u180E', U'\uFEFF', U'a', U'\0'})
    EXPECT_FALSE(is_whitespace(c)) << uint32_t(c);
  EXPECT_FALSE(is_letter(U'\u200B'));  // ZERO WIDTH SPACE is a format character, Cf
  EXPECT_FALSE(is_letter(U'\u0378'));  // unassigned
  EXPECT_FALSE(is_letter(char32_t(0x110000)));
}

// A copy of the tiny GPT-2 tokenizer with `merges` as its merges.txt.
fs::path bpe_folder(const std::string& name, const std::string& vocab, const std::string& merges) {
  const fs::path dir = scratch(name);
  spit(dir / "vocab.json", vocab);
  spit(dir / "merges.txt", merges);
  return dir;
}

TEST(Gpt2Bpe, BrokenFilesAreErrorsNamingTheFileAndLine) {
  const std::string vocab = slurp(kData / "tiny_gpt2" / "vocab.json");
  const std::string merges = slurp(kData / "tiny_gpt2" / "merges.txt");
  ASSERT_EQ(merges.rfind("#version", 0), 0u);
  // Line 3: the second merge, broken three ways.
  const size_t second = merges.find('\n', merges.find('\n') + 1) + 1;
  const std::string rest = merges.substr(merges.find('\n', second));
  for (const std::string broken : {"Ġt", "Ġ t h", "Ġ  t", " Ġ"}) {
    const fs::path dir = bpe_folder("broken_line", vocab, merges.substr(0, second) + broken + rest);
    EXPECT_ERROR(load_tokenizer(dir.string()), (dir / "merges.txt").string() + "' line 3: expected two symbols");
  }
  fs::path dir = bpe_folder("unknown_symbol", vocab, merges.substr(0, second) + "Ġ zzzzzz" + rest);
  EXPECT_ERROR(load_tokenizer(dir.string()), "line 3: symbol 'zzzzzz' is not in '" + (dir / "vocab.json").string());
  dir = bpe_folder("not_json", "{\"a\": 0,", merges);
  EXPECT_ERROR(load_tokenizer(dir.string()), (dir / "vocab.json").string() + "': not valid JSON");
  dir = bpe_folder("not_object", "[1, 2]", merges);
  EXPECT_ERROR(load_tokenizer(dir.string()), "must be a JSON object");
  nlohmann::json v = nlohmann::json::parse(vocab);
  v["Ġt"] = v["Ġa"];
  dir = bpe_folder("duplicate_id", v.dump(), merges);
  EXPECT_ERROR(load_tokenizer(dir.string()), "have the same id");
  v = nlohmann::json::parse(vocab);
  v["Ġt"] = 5000;
  dir = bpe_folder("id_out_of_range", v.dump(), merges);
  EXPECT_ERROR(load_tokenizer(dir.string()), "the id of token 'Ġt' is 5000, not an integer in [0, 1000)");
  v = nlohmann::json::parse(vocab);
  v["Ġt"] = "x";
  dir = bpe_folder("id_not_integer", v.dump(), merges);
  EXPECT_ERROR(load_tokenizer(dir.string()), "the id of token 'Ġt' is \"x\"");
}

TEST(LoadTokenizer, AFolderWithoutATokenizerNamesWhatWasLookedFor) {
  const fs::path dir = scratch("empty_model");
  const std::string message = testing::error_of([&] { load_tokenizer(dir.string()); });
  for (const std::string& part : {dir.string(), std::string("vocab.json + merges.txt"), std::string("tokenizer.model")})
    EXPECT_NE(message.find(part), std::string::npos) << message;
  spit(dir / "vocab.json", "{}");
  EXPECT_ERROR(load_tokenizer(dir.string()), "has vocab.json but no merges.txt");
  EXPECT_ERROR(load_tokenizer((dir / "nothing").string()), "does not exist");
  EXPECT_THROW(load_tokenizer((dir / "nothing").string()), FileError);
}

TEST(SentencePiece, ABrokenModelIsAnErrorNamingTheFile) {
  const std::string model = slurp(kData / "tiny_llama" / "tokenizer.model");
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"truncated", model.substr(0, model.size() / 2)}, {"garbage", std::string(4096, '\x5a')}, {"empty", ""}}) {
    const fs::path dir = scratch("spm_" + name);
    spit(dir / "tokenizer.model", bytes);
    SCOPED_TRACE(name);
    EXPECT_ERROR(load_tokenizer(dir.string()), (dir / "tokenizer.model").string() + "' is not a SentencePiece model");
  }
}

TEST(LoadTokenizer, DecodingAnIdOutsideTheVocabularyNamesIt) {
  for (const char* model : {"tiny_gpt2", "tiny_llama"}) {
    const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / model).string());
    EXPECT_ERROR(tok->decode({5, 1000}), "token id 1000 is outside the vocabulary [0, 1000)");
    EXPECT_ERROR(tok->decode({-1}), "token id -1 is outside");
    EXPECT_ERROR(tok->token_bytes(1000), "token id 1000");
  }
}

TEST(TokenFile, RoundTripsInBothLayouts) {
  const fs::path dir = scratch("token_files");
  const std::vector<int32_t> narrow = {0, 1, 50256, 65535, 7};
  write_token_file((dir / "narrow.bin").string(), narrow, 65536);
  EXPECT_EQ(read_token_file((dir / "narrow.bin").string()), narrow);
  std::string bytes = slurp(dir / "narrow.bin");
  ASSERT_EQ(bytes.size(), 1024 + 2 * narrow.size());
  EXPECT_EQ(bytes.substr(0, 12), std::string("\x88\xd8\x34\x01\x01\x00\x00\x00\x05\x00\x00\x00", 12));  // 20240520, 1, 5
  const std::vector<int32_t> wide = {0, 65536, 128255, 3};
  write_token_file((dir / "wide.bin").string(), wide, 128256);
  EXPECT_EQ(read_token_file((dir / "wide.bin").string()), wide);
  bytes = slurp(dir / "wide.bin");
  ASSERT_EQ(bytes.size(), 1024 + 4 * wide.size());
  EXPECT_EQ(bytes.substr(0, 12), std::string("\xa1\xd9\x34\x01\x07\x00\x00\x00\x04\x00\x00\x00", 12));  // 20240801, 7, 4
  write_token_file((dir / "empty.bin").string(), {}, 10);
  EXPECT_TRUE(read_token_file((dir / "empty.bin").string()).empty());
  // Tokens of a real encoding, through a file and back.
  const std::unique_ptr<Tokenizer> tok = load_tokenizer((kData / "tiny_gpt2").string());
  const std::string text = slurp(kData / "make_reference.py");
  write_token_file((dir / "text.bin").string(), tok->encode(text), tok->vocab_size());
  EXPECT_EQ(tok->decode(read_token_file((dir / "text.bin").string())), text);
}

TEST(TokenFile, BadFilesAreErrorsNamingTheFile) {
  const fs::path dir = scratch("bad_token_files");
  const std::string good_path = (dir / "good.bin").string();
  write_token_file(good_path, {1, 2, 3, 4}, 10);
  const std::string good = slurp(good_path);
  const auto check = [&](const std::string& name, const std::string& bytes, const std::string& text) {
    const std::string path = (dir / name).string();
    spit(path, bytes);
    EXPECT_ERROR(read_token_file(path), "token file '" + path + "': ");
    EXPECT_ERROR(read_token_file(path), text);
  };
  std::string bad = good;
  bad[0] = 'x';
  check("magic.bin", bad, "magic number");
  bad = good;
  bad[4] = 3;
  check("version.bin", bad, "version 3 under magic 20240520, llm.c's is 1");
  check("truncated.bin", good.substr(0, good.size() - 1), "the header counts 4 tokens of 2 bytes, but the file holds 7 bytes");
  check("long.bin", good + "xx", "holds 10 bytes");
  check("short_header.bin", good.substr(0, 100), "100 bytes, shorter than the 1024-byte header");
  bad = good;
  bad[11] = char(0x80);  // a negative count
  check("negative.bin", bad, "the header counts -");
  EXPECT_THROW(read_token_file((dir / "missing.bin").string()), FileError);
  EXPECT_ERROR(write_token_file((dir / "out.bin").string(), {1, 10}, 10), "token 1 is 10, outside the vocabulary [0, 10)");
  EXPECT_ERROR(write_token_file((dir / "out.bin").string(), {-1}, 10), "token 0 is -1");
}

}  // namespace
}  // namespace scalify::tokenize
