// GGUF writing (issue 46, `scalify export --format gguf`): the writer's bytes parsed by hand as
// ggml's docs/gguf.md lays them out (header, metadata, tensor infos with ne[0] the fastest
// dimension, offsets aligned to 32, zero padding), Q8_0 blocks against values worked out by hand,
// and the refusals. The `gguf` package reading whole exported models is python/tests/test_gguf_export.py.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "scalify/hub/gguf_export.hpp"
#include "scalify/hub/gguf_writer.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/hub/model_tokenizer.hpp"
#include "scalify/tokenize/tokenizer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

using hub::GgufWriter;

// Reads little-endian fields off a byte string, failing the test past its end.
struct Cursor {
  const std::string& b;
  size_t at = 0;
  template <typename T>
  T get() {
    T v{};
    EXPECT_LE(at + sizeof(T), b.size());
    if (at + sizeof(T) <= b.size()) std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = get<uint64_t>();
    std::string s = b.substr(at, size_t(n));
    at += size_t(n);
    return s;
  }
};

TEST(GgufWriter, BytesFollowTheSpec) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_strings("tokenizer.ggml.tokens", {"a", "bc"});
  w.add_i32s("tokenizer.ggml.token_type", {1, 3});
  const Tensor norm = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});             // 12 bytes: padded to 32
  const Tensor matrix = Tensor::from_vector(std::vector<float>(2 * 32, 0.5f), {2, 32});  // [rows, cols]
  w.add_tensor("a.weight", norm, GgufWriter::Type::f32);
  w.add_tensor("b.weight", matrix, GgufWriter::Type::f16);
  w.add_tensor("c.weight", matrix, GgufWriter::Type::q8_0);
  const std::string bytes = w.bytes();
  Cursor c{bytes};
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  c.at = 4;
  EXPECT_EQ(c.get<uint32_t>(), 3u);  // version
  EXPECT_EQ(c.get<uint64_t>(), 3u);  // tensors
  EXPECT_EQ(c.get<uint64_t>(), 6u);  // key/values: general.alignment first
  EXPECT_EQ(c.str(), "general.alignment");
  EXPECT_EQ(c.get<uint32_t>(), 4u);  // UINT32
  EXPECT_EQ(c.get<uint32_t>(), 32u);
  EXPECT_EQ(c.str(), "general.architecture");
  EXPECT_EQ(c.get<uint32_t>(), 8u);  // STRING
  EXPECT_EQ(c.str(), "llama");
  EXPECT_EQ(c.str(), "llama.block_count");
  EXPECT_EQ(c.get<uint32_t>(), 4u);
  EXPECT_EQ(c.get<uint32_t>(), 2u);
  EXPECT_EQ(c.str(), "llama.rope.freq_base");
  EXPECT_EQ(c.get<uint32_t>(), 6u);  // FLOAT32
  EXPECT_EQ(c.get<float>(), 10000.0f);
  EXPECT_EQ(c.str(), "tokenizer.ggml.tokens");
  EXPECT_EQ(c.get<uint32_t>(), 9u);  // ARRAY of STRING, 2
  EXPECT_EQ(c.get<uint32_t>(), 8u);
  EXPECT_EQ(c.get<uint64_t>(), 2u);
  EXPECT_EQ(c.str(), "a");
  EXPECT_EQ(c.str(), "bc");
  EXPECT_EQ(c.str(), "tokenizer.ggml.token_type");
  EXPECT_EQ(c.get<uint32_t>(), 9u);  // ARRAY of INT32, 2
  EXPECT_EQ(c.get<uint32_t>(), 5u);
  EXPECT_EQ(c.get<uint64_t>(), 2u);
  EXPECT_EQ(c.get<int32_t>(), 1);
  EXPECT_EQ(c.get<int32_t>(), 3);
  // Tensor infos: name, n_dims, ne (fastest first), type, offset into the data section.
  struct Info {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    uint64_t offset, size;
  };
  const Info expected[] = {{"a.weight", {3}, 0, 0, 12}, {"b.weight", {32, 2}, 1, 32, 128}, {"c.weight", {32, 2}, 8, 160, 68}};
  for (const Info& e : expected) {
    EXPECT_EQ(c.str(), e.name);
    const auto dims = c.get<uint32_t>();
    ASSERT_EQ(dims, e.ne.size());
    for (uint64_t n : e.ne) EXPECT_EQ(c.get<uint64_t>(), n);
    EXPECT_EQ(c.get<uint32_t>(), e.type);
    EXPECT_EQ(c.get<uint64_t>(), e.offset);
  }
  const size_t data = (c.at + 31) / 32 * 32;  // the data section starts aligned, zero padding before it
  EXPECT_EQ(bytes.substr(c.at, data - c.at), std::string(data - c.at, '\0'));
  EXPECT_EQ(bytes.size(), data + 160 + 96);  // the last tensor padded to 32 too
  float f[3];
  std::memcpy(f, bytes.data() + data, 12);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[2], 3.0f);
  EXPECT_EQ(bytes.substr(data + 12, 20), std::string(20, '\0'));
  uint16_t h;
  std::memcpy(&h, bytes.data() + data + 32 + 126, 2);
  EXPECT_EQ(h, 0x3800);  // 0.5 as f16
  std::memcpy(&h, bytes.data() + data + 160, 2);
  EXPECT_EQ(h, 0x1C08);  // Q8_0's d = 0.5 / 127 as f16 (0.003936767578125)
  EXPECT_EQ(int8_t(bytes[data + 162]), 127);
}

TEST(GgufWriter, Q8_0MatchesValuesWorkedOutByHand) {
  std::vector<float> x(96, 0.0f);
  // Block 0: amax 127, so d = 1 and q = round(x), halves away from zero (C's roundf).
  x[0] = 127;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -126.6f;
  // Block 1: all zeros, d = 0 and q = 0. Block 2: amax 254, d = 2, q = round(x / 2).
  x[64] = -254;
  x[65] = 3;
  x[66] = -5;
  x[67] = 1;
  const std::string q = hub::quantize_q8_0(x.data(), x.size());
  ASSERT_EQ(q.size(), 3u * 34);
  auto d_bits = [&](size_t block) {
    uint16_t h;
    std::memcpy(&h, q.data() + block * 34, 2);
    return h;
  };
  auto qs = [&](size_t block, size_t j) { return int(int8_t(q[block * 34 + 2 + j])); };
  EXPECT_EQ(d_bits(0), 0x3C00);  // 1.0
  EXPECT_EQ(qs(0, 0), 127);
  EXPECT_EQ(qs(0, 1), 3);
  EXPECT_EQ(qs(0, 2), -3);
  EXPECT_EQ(qs(0, 3), 0);
  EXPECT_EQ(qs(0, 4), -127);
  EXPECT_EQ(qs(0, 5), 0);
  EXPECT_EQ(d_bits(1), 0x0000);
  for (size_t j = 0; j < 32; ++j) EXPECT_EQ(qs(1, j), 0);
  EXPECT_EQ(d_bits(2), 0x4000);  // 2.0
  EXPECT_EQ(qs(2, 0), -127);
  EXPECT_EQ(qs(2, 1), 2);   // 1.5 away from zero
  EXPECT_EQ(qs(2, 2), -3);  // -2.5
  EXPECT_EQ(qs(2, 3), 1);   // 0.5
}

TEST(GgufWriter, Refusals) {
  GgufWriter w;
  EXPECT_ERROR(w.add_u32("general.alignment", 64), "metadata key 'general.alignment' given twice");
  EXPECT_ERROR(w.add_tensor("x", Tensor::zeros({2, 48}), GgufWriter::Type::q8_0), "rows of 48 values; Q8_0 needs a multiple of 32");
  w.add_tensor("y", Tensor::zeros({4}), GgufWriter::Type::f32);
  EXPECT_ERROR(w.add_tensor("y", Tensor::zeros({4}), GgufWriter::Type::f32), "tensor 'y' given twice");
  EXPECT_ERROR(hub::gguf_type("q4_0"), "f32, f16, bf16 or q8_0, not 'q4_0'");
}

TEST(GgufExport, ByteVocabularyIsTheByteLevelAlphabet) {
  const hub::GgufVocabulary v = hub::byte_vocabulary();
  ASSERT_EQ(v.tokens.size(), 256u);
  EXPECT_EQ(v.tokens[size_t('A')], "A");
  EXPECT_EQ(v.tokens[size_t(' ')], "\xC4\xA0");  // GPT-2's printable stand-in for the space, U+0120
  EXPECT_EQ(v.tokens[0], "\xC4\x80");            // byte 0 is U+0100
  EXPECT_TRUE(v.merges.empty());
}

TEST(GgufExport, ReadsBpeFoldersRefusesSentencePiece) {
  EXPECT_ERROR(hub::read_bpe_vocabulary(std::string(SCALIFY_HF_DATA_DIR) + "/tiny_llama_gqa"),
               "a SentencePiece tokenizer (tokenizer.model)");
  const std::optional<hub::GgufVocabulary> g = hub::read_bpe_vocabulary(std::string(SCALIFY_HF_DATA_DIR) + "/tiny_gpt2");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->pre, "gpt-2");
  EXPECT_FALSE(g->merges.empty());
  const auto empty = testing::scratch("no_tokenizer");
  std::filesystem::create_directories(empty);
  EXPECT_FALSE(hub::read_bpe_vocabulary(empty.string()).has_value());
  EXPECT_ERROR(hub::read_bpe_vocabulary((empty / "model.gguf").string()), "cannot open");
  EXPECT_ERROR(hub::read_bpe_vocabulary((empty / "nothing").string()), "is neither a model folder nor a GGUF file");
}

TEST(GgufExport, TheWrittenTokenizerReadsBackAsTheFolders) {
  // The exported file's tokenizer.ggml.pre is llama.cpp's "gpt-2"; Scalify's own reader takes it
  // (it refused "gpt-2" before, so `eval`/`tokenize --model` failed on every exported GGUF).
  const std::string folder = std::string(SCALIFY_HF_DATA_DIR) + "/tiny_gpt2";
  const hub::HfConfig config = hub::read_hf_config(folder);
  const hub::GgufVocabulary vocab = hub::read_bpe_vocabulary(folder).value();
  const std::string path = (testing::scratch("gguf_roundtrip") / "model.gguf").string();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  hub::save_gguf_model(path, config, hub::load_hf_weights(folder, config), GgufWriter::Type::f32, &vocab, "t");
  const std::unique_ptr<tokenize::Tokenizer> ours = hub::load_model_tokenizer(path), theirs = hub::load_model_tokenizer(folder);
  const std::string text = "Hello world, it's 2024: numbers 12345 and  spaces\n";
  EXPECT_EQ(ours->encode(text), theirs->encode(text));
}

TEST(GgufExport, RefusesTokenizerJsonItCannotName) {
  const auto dir = testing::scratch("gguf_tokenizer_json");
  std::filesystem::create_directories(dir);
  const std::string vocab = R"("vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"])";
  auto with = [&](const std::string& pre, const std::string& model) {
    testing::spit(dir / "tokenizer.json", "{\"pre_tokenizer\": " + pre + ", \"model\": {\"type\": \"" + model + "\", " + vocab + "}}");
    return dir.string();
  };
  const std::string byte_level = R"({"type": "ByteLevel", "use_regex": true})";
  const hub::GgufVocabulary v = hub::read_bpe_vocabulary(with(byte_level, "BPE")).value();
  EXPECT_EQ(v.tokens, (std::vector<std::string>{"a", "b", "ab"}));
  EXPECT_EQ(v.merges, (std::vector<std::string>{"a b"}));
  EXPECT_ERROR(hub::read_bpe_vocabulary(with(byte_level, "Unigram")), "not a BPE tokenizer");
  EXPECT_ERROR(hub::read_bpe_vocabulary(with(R"({"type": "Sequence", "pretokenizers": []})", "BPE")),
               "has no llama.cpp name this export knows");
  EXPECT_ERROR(hub::read_bpe_vocabulary(with(R"({"type": "ByteLevel", "use_regex": false})", "BPE")),
               "has no llama.cpp name this export knows");
  testing::spit(dir / "tokenizer.json",
                R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0, "c": 2}, "merges": []}})");
  EXPECT_ERROR(hub::read_bpe_vocabulary(dir.string()), "has no token with the id 1");
}

}  // namespace
}  // namespace scalify
