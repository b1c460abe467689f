// The real model (issue 46): SmolLM2-135M-Instruct.Q4_1.gguf, which scripts/fetch_smollm2.sh
// installs (never committed). Every tensor dequantised equals the `gguf` package's (CRC-32 of the
// f32 bytes, first values) and the loss per token on two windows of 128 tokens equals
// transformers' GGUF loader's (tests/data/gguf/smollm2.json, made by make_reference.py). Labelled
// real_model; each test skips with a message when the file is absent.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "scalify/hub/gguf_file.hpp"
#include "scalify/note.hpp"
#include "scalify/hub/gguf_model.hpp"
#include "scalify/tokenize/token_file.hpp"
#include "scalify/train/pretrained.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/trainer.hpp"
#include "scalify/hub/gguf_export.hpp"
#include "real_model.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
const std::string kData = SCALIFY_GGUF_DATA_DIR;

const nlohmann::json& reference() {
  static const nlohmann::json j = nlohmann::json::parse(testing::slurp(kData + "/smollm2.json"));
  return j;
}

TEST(Smollm2, EveryTensorDequantisesAsTheGgufPackage) {
  REQUIRE_SMOLLM2(path);
  const hub::GgufFile f = hub::GgufFile::open(path);
  const nlohmann::json& tensors = reference()["tensors"];
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const hub::GgufTensorInfo& info : f.tensors()) {
    SCOPED_TRACE(info.name);
    const nlohmann::json& want = tensors.at(info.name);
    EXPECT_EQ(info.type, want["type"].get<uint32_t>());
    const Tensor t = f.dequantize(info.name);
    EXPECT_EQ(t.shape(), want["shape"].get<Shape>());
    const float* v = t.data<float>();
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(v[i], want["first"][i].get<float>());
    uLong crc = crc32(0L, Z_NULL, 0);
    const auto* bytes = reinterpret_cast<const Bytef*>(v);
    for (uint64_t at = 0, n = uint64_t(t.numel()) * 4; at < n; at += 1u << 30)
      crc = crc32(crc, bytes + at, uInt(std::min<uint64_t>(n - at, 1u << 30)));
    EXPECT_EQ(uint64_t(crc), want["crc32"].get<uint64_t>());
  }
}

TEST(Smollm2, ConfigAndTokenizerMetadata) {
  REQUIRE_SMOLLM2(path);
  const hub::GgufFile f = hub::GgufFile::open(path);
  const hub::HfConfig c = hub::gguf_config(f);
  EXPECT_EQ(c.model.vocab, 49152);
  EXPECT_EQ(c.model.seq, 8192);
  EXPECT_EQ(c.model.d_model, 576);
  EXPECT_EQ(c.model.layers, 30);
  EXPECT_EQ(c.model.heads, 9);
  EXPECT_EQ(c.model.kv_heads, 3);
  EXPECT_EQ(c.model.mlp_hidden, 1536);
  EXPECT_EQ(c.model.rope_theta, 100000.0);
  EXPECT_EQ(c.model.norm_eps, double(1e-5f));
  EXPECT_TRUE(c.model.tied_head);
  const hub::GgufTokenizerMetadata t = hub::gguf_tokenizer_metadata(f);
  EXPECT_EQ(t.model, "gpt2");
  EXPECT_EQ(t.pre, "smollm");
  EXPECT_EQ(t.tokens.size(), 49152u);
  EXPECT_EQ(t.merges.size(), 48900u);
  EXPECT_EQ(t.token_types.size(), 49152u);
  EXPECT_EQ(t.bos, 1);
  EXPECT_EQ(t.eos, 2);
  EXPECT_EQ(t.tokens[2], "<|im_end|>");
}

TEST(Smollm2, LossPerTokenEqualsTransformers) {
  REQUIRE_SMOLLM2(path);
  const nlohmann::json& ref = reference();
  const std::vector<int32_t> ids = tokenize::read_token_file(kData + "/smollm2_ids.bin");
  EXPECT_EQ(ids, ref["ids"].get<std::vector<int32_t>>());
  const train::Pretrained p = train::load_pretrained(path);
  const train::TokenEval e = train::evaluate_tokens(*p.session, ids, nullptr, ref["context"].get<int64_t>(), 0);
  EXPECT_EQ(e.windows, ref["windows"].get<size_t>());
  const double want = ref["loss"].get<double>();
  EXPECT_LT(std::abs(e.loss - want) / want, 1e-5) << "scalify " << e.loss << ", transformers " << want;
}

// Greedy decoding through the KV cache continues a prompt in English, with transformers' ids
// (generate, do_sample=False): the prompt through the GGUF's tokenizer, then every new id.
TEST(Smollm2, GreedySampleEqualsTransformersGenerate) {
  REQUIRE_SMOLLM2(path);
  const nlohmann::json& g = reference()["greedy"];
  const train::Pretrained p = train::load_pretrained(path);
  ASSERT_TRUE(p.tokenizer);
  const std::vector<int32_t> prompt = p.tokenizer->encode(g["prompt"].get<std::string>());
  ASSERT_EQ(prompt, g["prompt_ids"].get<std::vector<int32_t>>());
  train::SampleOptions o;
  o.temperature = 0;
  o.tokens = int64_t(g["ids"].size());
  o.eos_ids = p.hf.eos_ids;
  EXPECT_EQ(train::sample_ids(*p.session, prompt, o, path), g["ids"].get<std::vector<int32_t>>()) << g["text"];
}

// The flow: fine-tune the GGUF model, export the run as GGUF: the file carries the source's
// tokenizer metadata unchanged, so the export tokenizes as the source does.
TEST(Smollm2, AFineTuneExportsAsGgufWithTheSourcesTokenizer) {
  REQUIRE_SMOLLM2(path);
  REQUIRE_SCRATCH_DISK(4ull << 30);
  const fs::path run = testing::scratch("smollm2_ft"), out = testing::scratch("smollm2_ft.gguf");
  std::vector<int32_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(1000 + i * 37 % 5000);
  fs::create_directories(run.parent_path());
  tokenize::write_token_file((run.string() + ".bin"), tokens, 49152);
  train::TrainConfig c;
  c.init = path;
  c.data = run.string() + ".bin";
  c.out = run.string();
  c.steps = 1;
  c.batch = 1;
  c.model.seq = 16;
  c.given = {"seq", "batch", "steps"};
  c.eval_every = 1;
  c.eval_windows = 1;
  train::train(train::with_pretrained_model(c), false, {});
  train::export_gguf(run.string(), out.string(), "q8_0");
  const hub::GgufTokenizerMetadata from = hub::gguf_tokenizer_metadata(hub::GgufFile::open(path)),
                                   to = hub::gguf_tokenizer_metadata(hub::GgufFile::open(out.string()));
  EXPECT_EQ(to.tokens, from.tokens);
  EXPECT_EQ(to.merges, from.merges);
  EXPECT_EQ(to.token_types, from.token_types);
  EXPECT_EQ(to.pre, from.pre);
  EXPECT_EQ(to.eos, from.eos);
  const std::string text = "<|im_start|>user 12345, the capital of France?";
  EXPECT_EQ(train::load_pretrained(out.string()).tokenizer->encode(text), train::load_pretrained(path).tokenizer->encode(text));
  // As a Hugging Face folder the weights go, the tokenizer does not, and the export says so.
  std::string said;
  const auto previous = set_note_sink([&](const std::string& m) { said += m; });
  train::export_checkpoint(run.string(), (run / "hf").string());
  set_note_sink(previous);
  EXPECT_NE(said.find("whose tokenizer this export does not write as Hugging Face files"), std::string::npos) << said;
  EXPECT_FALSE(train::load_pretrained((run / "hf").string()).tokenizer);
}

}  // namespace
}  // namespace scalify
