// Deeply nested JSON wherever Scalify reads JSON: checkpoint metadata, recipes, model folders'
// config.json, shard index and vocab.json, run logs. Each must be an error naming the file, never
// a stack overflow (a value 100,000 levels deep crashed the error message that quoted it).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "expect_error.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/platform/crc32c.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/tokenizer_json.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

using namespace scalify::testing;
const std::string kHf = SCALIFY_HF_DATA_DIR;

std::string nested(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }
const std::string kDeep = nested(100000);

// The header of a safetensors file as JSON, and the file rebuilt around a new header.
nlohmann::json header_of(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, n));
}
std::string with_header(const std::string& bytes, const nlohmann::json& header) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string text = header.dump();
  std::string out(8, '\0');
  const uint64_t m = text.size();
  std::memcpy(out.data(), &m, 8);
  return out + text + bytes.substr(8 + n);
}

fs::path trained_run(const std::string& name) {
  const fs::path run = scratch(name);
  train::TrainConfig c = tiny_run(text_corpus(), run, "f32");
  c.steps = 2;
  c.eval_every = 2;
  train::train(c, false);
  return run;
}

TEST(HostileJson, DepthIsBoundedButRealNestingParses) {
  // 64 levels is the bound: files Scalify reads nest a few levels.
  const fs::path p = scratch("depth");
  fs::create_directories(p);
  const std::string ok = nested(10);
  EXPECT_ERROR(quant::Recipe::from_json("{\"name\": \"x\", \"linear\": " + nested(65) + "}"), "nested deeper than 64 levels");
  EXPECT_ERROR(quant::Recipe::from_json("{\"name\": \"x\", \"linear\": " + ok + "}"), "linear");  // parsed, then refused by its field
  // Brackets inside strings do not count.
  EXPECT_ERROR(quant::Recipe::from_json("{\"name\": \"" + std::string(200, '[') + "\", \"nope\": 1}"), "unknown field 'nope'");
}

TEST(HostileJson, DeepChecksumMetadataOfACheckpointIsAnErrorForEveryReader) {
  // The checksums' own key was outside the metadata checksum: no forging needed to reach its parse.
  const fs::path run = trained_run("deep_crc");
  const std::string model = slurp(run / "model.safetensors");
  for (const char* file : {"checkpoint.safetensors", "model.safetensors"}) {
    const std::string bytes = slurp(run / file);
    nlohmann::json h = header_of(bytes);
    h["__metadata__"]["scalify.crc32c"] = kDeep;
    spit(run / file, with_header(bytes, h));
  }
  EXPECT_ERROR(train::read_checkpoint((run / "model.safetensors").string()), "scalify.crc32c is not a JSON object");
  EXPECT_ERROR(train::read_checkpoint((run / "checkpoint.safetensors").string()), "scalify.crc32c is not a JSON object");
  train::TrainConfig c = tiny_run(text_corpus(), run, "f32");
  c.steps = 4;
  EXPECT_ERROR(train::train(c, true), "scalify.crc32c is not a JSON object");
  // One tensor's entry nested deep, the metadata's entry intact: the tensor check quoted it.
  nlohmann::json h = header_of(model);
  nlohmann::json sums = nlohmann::json::parse(h["__metadata__"]["scalify.crc32c"].get<std::string>());
  sums["param.wte"] = nlohmann::json::parse(nested(60));
  std::string text = sums.dump();
  text.replace(text.find(nested(60)), nested(60).size(), kDeep);
  h["__metadata__"]["scalify.crc32c"] = text;
  spit(run / "model.safetensors", with_header(model, h));
  EXPECT_ERROR(train::read_checkpoint((run / "model.safetensors").string()), "scalify.crc32c is not a JSON object");
}

TEST(HostileJson, EveryMetadataKeyOfAValidlyChecksummedFileIsBounded) {
  // Written with valid checksums, so only the depth bound stands between the value and the parser.
  const fs::path run = trained_run("deep_keys");
  const io::SafeTensors good = io::read_safetensors((run / "checkpoint.safetensors").string());
  // The keys read as JSON, each with the error its reader gives once the depth bound refuses it
  // (without the bound each parsed, and failed later for another reason, or not at all).
  const std::pair<const char*, const char*> keys[] = {{"scalify.state", "corrupt metadata 'scalify.state'"},
                                                      {"scalify.any_scale", "corrupt metadata 'scalify.any_scale'"},
                                                      {"scalify.ptq", "nested deeper than 64 levels"}};
  for (const auto& [key, message] : keys) {
    io::SafeTensors st = good;
    st.metadata[key] = kDeep;
    const fs::path p = run / "checkpoint.safetensors";
    io::write_safetensors(p.string(), st);
    EXPECT_ERROR(train::evaluate(p.string()), message);  // a quantised checkpoint's metadata is read by eval
    io::write_safetensors(p.string(), good);
  }
  // The header itself nested deep (a file another tool could have written).
  std::string bytes(8, '\0');
  const std::string text = "{\"a\":" + kDeep + "}";
  const uint64_t n = text.size();
  std::memcpy(bytes.data(), &n, 8);
  EXPECT_ERROR(io::parse_safetensors(bytes + text, "deep"), "nested deeper than 64 levels");
}

TEST(HostileJson, TheHeaderChecksumCoversEveryTensorEntry) {
  const fs::path p = scratch("cover.safetensors");
  io::SafeTensors st;
  st.tensors = {{"a", Tensor::randn({4, 4}, 1)}, {"e", Tensor::randn({4, 4}, 2).to(DType::e4m3)}};
  st.metadata = {{"k", "v"}};
  io::write_safetensors(p.string(), st);
  const std::string bytes = slurp(p);
  const nlohmann::json good = header_of(bytes);
  // Another dtype of the same width: every tensor's bytes and the metadata still match their CRCs.
  nlohmann::json h = good;
  ASSERT_EQ(h["e"]["dtype"], "F8_E4M3");
  h["e"]["dtype"] = "F8_E5M2";
  spit(p, with_header(bytes, h));
  EXPECT_ERROR(io::read_safetensors(p.string()), "the header fails its checksum");
  // Another shape of the same size.
  h = good;
  h["a"]["shape"] = {2, 8};
  spit(p, with_header(bytes, h));
  EXPECT_ERROR(io::read_safetensors(p.string()), "the header fails its checksum");
  // One more checksum entry, well formed.
  h = good;
  nlohmann::json sums = nlohmann::json::parse(h["__metadata__"]["scalify.crc32c"].get<std::string>());
  sums["b"] = "00000000";
  h["__metadata__"]["scalify.crc32c"] = sums.dump();
  spit(p, with_header(bytes, h));
  EXPECT_ERROR(io::read_safetensors(p.string()), "names tensors the file does not hold");
  // A checksum that is not 8 hex digits is named, quoted by a bounded excerpt.
  sums.erase("b");
  sums["a"] = nested(50);
  h["__metadata__"]["scalify.crc32c"] = sums.dump();
  spit(p, with_header(bytes, h));
  const std::string e = error_of([&] { io::read_safetensors(p.string()); });
  EXPECT_NE(e.find("not a CRC-32C in 8 hex digits"), std::string::npos) << e;
  EXPECT_LT(e.size(), 300u) << e;
  // Untrusted names reach messages cut and with control bytes escaped.
  h = good;
  h[std::string(100000, 'n') + "\x01"] = h["a"];
  h.erase("a");
  spit(p, with_header(bytes, h));
  const std::string named = error_of([&] { io::read_safetensors(p.string()); });
  EXPECT_LT(named.size(), 400u) << named.substr(0, 400);
}

TEST(HostileJson, AFileOfTheEarlierChecksumLayoutStillVerifies) {
  // Before this version a file had no header checksum: its "__metadata__" entry covered the
  // other metadata keys only. The new layout keeps that entry, so earlier readers read new files.
  const fs::path p = scratch("legacy.safetensors");
  io::SafeTensors st;
  st.tensors = {{"a", Tensor::randn({4, 4}, 1)}};
  st.metadata = {{"k", "v"}};
  io::write_safetensors(p.string(), st);
  const std::string bytes = slurp(p);
  nlohmann::json h = header_of(bytes);
  ASSERT_TRUE(h["__metadata__"].contains("scalify.crc32c.header"));
  h["__metadata__"].erase("scalify.crc32c.header");
  nlohmann::json sums = nlohmann::json::parse(h["__metadata__"]["scalify.crc32c"].get<std::string>());
  uint32_t c = platform::crc32c("k", 2);  // key and value, each with its NUL
  c = platform::crc32c("v", 2, c);
  sums["__metadata__"] = platform::crc32c_text(c);
  h["__metadata__"]["scalify.crc32c"] = sums.dump();
  spit(p, with_header(bytes, h));
  const io::SafeTensors back = io::read_safetensors(p.string());
  EXPECT_TRUE(back.verified);
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  // ... and its metadata checksum still catches a changed value.
  std::string changed = slurp(p);
  changed[changed.find("\"v\"") + 1] = 'w';
  spit(p, changed);
  EXPECT_ERROR(io::read_safetensors(p.string()), "the metadata fails its checksum");
}

TEST(HostileJson, DeepModelFolderFilesAreErrorsNamingTheFile) {
  const fs::path dir = scratch("deep_model");
  fs::copy(kHf + "/tiny_gpt2", dir);
  spit(dir / "config.json", "{\"model_type\": \"gpt2\", \"n_embd\": " + kDeep + "}");
  EXPECT_ERROR(hub::read_hf_config(dir.string()), (dir / "config.json").string() + ": JSON nested deeper than 64 levels");
  fs::copy_file(kHf + "/tiny_gpt2/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  spit(dir / "vocab.json", "{\"a\": " + kDeep + "}");
  EXPECT_ERROR(tokenize::BpeTokenizer((dir / "vocab.json").string(), (dir / "merges.txt").string()), "nested deeper than 64 levels");
  spit(dir / "tokenizer.json", "{\"model\": " + kDeep + "}");
  EXPECT_ERROR(tokenize::read_tokenizer_json((dir / "tokenizer.json").string()),
               (dir / "tokenizer.json").string() + "': JSON nested deeper than 64 levels");

  const fs::path sharded = scratch("deep_index");
  fs::copy(kHf + "/tiny_llama", sharded);
  const hub::HfConfig config = hub::read_hf_config(sharded.string());
  spit(sharded / "model.safetensors.index.json", "{\"weight_map\": {\"a\": " + kDeep + "}}");
  EXPECT_ERROR(hub::load_hf_weights(sharded.string(), config), "model.safetensors.index.json: JSON nested deeper than 64 levels");
}

TEST(HostileJson, ADeepMetricsLineIsNamedByTheResume) {
  const fs::path run = trained_run("deep_metrics");
  std::ofstream(run / "metrics.jsonl", std::ios::app) << "{\"step\": 1, \"x\": " << kDeep << "}\n";
  train::TrainConfig c = tiny_run(text_corpus(), run, "f32");
  c.steps = 4;
  EXPECT_ERROR(train::train(c, true), "corrupt metrics line");
}

}  // namespace
}  // namespace scalify
