// GGUF files (issue 46): the reader against the `gguf` package (tests/data/gguf, made by
// make_reference.py): every supported ggml type dequantised bit for bit, metadata of every value
// type, a Llama written as llama.cpp's converter writes it (q/k rows permuted) giving the
// Hugging Face folder's parameters and transformers' logits; hostile files as errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "scalify/hub/gguf_dequantize.hpp"
#include "scalify/hub/gguf_file.hpp"
#include "scalify/hub/gguf_model.hpp"
#include "scalify/hub/model_tokenizer.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/tokenize/tokenizer.hpp"
#include "scalify/train/pretrained.hpp"
#include "scalify/train/ptq.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::scratch;
using testing::slurp;
using testing::spit;

const std::string kData = SCALIFY_GGUF_DATA_DIR, kHf = SCALIFY_HF_DATA_DIR;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(GgufDequantize, EveryTypeEqualsTheGgufPackageBitForBit) {
  const hub::GgufFile f = hub::GgufFile::open(kData + "/synthetic.gguf");
  const json ref = json::parse(slurp(kData + "/synthetic.json"));
  const std::string expected = slurp(kData + "/synthetic_expected.f32");
  size_t at = 0;
  ASSERT_EQ(f.tensors().size(), ref["tensors"].size());
  for (const json& t : ref["tensors"]) {
    const std::string name = t["name"];
    SCOPED_TRACE(name);
    const hub::GgufTensorInfo& info = f.tensor(name);
    EXPECT_EQ(info.type, t["type"].get<uint32_t>());
    const Tensor values = f.dequantize(name);
    EXPECT_EQ(values.shape(), t["shape"].get<Shape>());
    std::vector<float> want(size_t(values.numel()));
    ASSERT_LE(at + want.size() * 4, expected.size());
    std::memcpy(want.data(), expected.data() + at, want.size() * 4);
    at += want.size() * 4;
    EXPECT_TRUE(same_bits(values.to_floats(), want));
  }
  EXPECT_EQ(at, expected.size());
}

TEST(GgufFile, MetadataOfEveryValueType) {
  const hub::GgufFile f = hub::GgufFile::open(kData + "/synthetic.gguf");
  const json m = json::parse(slurp(kData + "/synthetic.json"))["metadata"];
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_text("general.architecture"), "synthetic");
  for (const char* key : {"test.uint8", "test.uint16", "test.uint32", "test.uint64"}) EXPECT_EQ(f.get_uint(key), m[key].get<uint64_t>());
  for (const char* key : {"test.int8", "test.int16", "test.int32", "test.int64"}) EXPECT_EQ(f.get_int(key), m[key].get<int64_t>());
  EXPECT_EQ(f.get_real("test.float32"), m["test.float32"].get<double>());  // 0.1f, widened
  EXPECT_EQ(f.get_real("test.float64"), 0.1);
  EXPECT_TRUE(f.get_flag("test.bool"));
  EXPECT_EQ(f.get_text("test.string"), m["test.string"].get<std::string>());
  EXPECT_EQ(f.get_texts("test.strings"), m["test.strings"].get<std::vector<std::string>>());
  EXPECT_EQ(f.get_ints("test.ints"), m["test.ints"].get<std::vector<int64_t>>());
  EXPECT_EQ(f.get_reals("test.floats"), m["test.floats"].get<std::vector<double>>());
  const hub::GgufValue& nested = f.value("test.nested");
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.type_description(), "array of array of int32");
  EXPECT_EQ(nested.items[1].count, 3u);
  // Typed getters name the key, the type asked for and the type stored.
  EXPECT_ERROR(f.get_uint("test.string"), "synthetic.gguf: metadata 'test.string' must be an unsigned integer, it is string");
  EXPECT_ERROR(f.get_uint("test.int8"), "metadata 'test.int8' must be an integer >= 0, it is -100");
  EXPECT_ERROR(f.get_texts("test.ints"), "metadata 'test.ints' must be an array of string, it is array of int32");
  EXPECT_ERROR(f.get_real("nope"), "metadata 'nope' is missing");
  EXPECT_ERROR(f.tensor("nope"), "no tensor 'nope'");
  // Not a llama: refused by name; no tokenizer metadata: an error naming the key.
  EXPECT_ERROR(hub::gguf_config(f), "holds a 'synthetic' model (general.architecture)");
  EXPECT_ERROR(hub::gguf_tokenizer_metadata(f), "metadata 'tokenizer.ggml.model' is missing");
}

TEST(GgufModel, ALlamaFromTheConverterIsTheHuggingFaceFolder) {
  // tiny_llama_gqa.gguf is the folder as llama.cpp's converter writes it: BF16 tensors, q/k rows
  // permuted. Un-permuted, every parameter equals the folder's exactly.
  const std::string gguf = kData + "/tiny_llama_gqa.gguf", folder = kHf + "/tiny_llama_gqa";
  ASSERT_TRUE(hub::is_gguf(gguf));
  EXPECT_FALSE(hub::is_gguf(folder));
  const hub::HfConfig a = hub::read_hf_config(gguf);
  hub::HfConfig b = hub::read_hf_config(folder);
  EXPECT_EQ(a.family, hub::Family::llama);
  b.model.norm_eps = double(float(b.model.norm_eps));  // GGUF stores it as float32
  EXPECT_EQ(a.model, b.model);
  const std::map<std::string, Tensor> pa = hub::load_hf_weights(gguf, a), pb = hub::load_hf_weights(folder, b);
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& [name, t] : pb) {
    ASSERT_TRUE(pa.count(name)) << name;
    EXPECT_EQ(pa.at(name).shape(), t.shape()) << name;
    EXPECT_TRUE(same_bits(pa.at(name).to_floats(), t.to_floats())) << name;
  }
  // And so the logits are transformers' (the folder's reference), to the loader test's tolerance.
  nn::Gpt model(a.model, 0);
  nn::NamedParams params;
  for (const auto& [name, t] : pa) params.push_back({name, Var(t, true)});
  model.set_parameters(params);
  const io::SafeTensors ref = io::read_safetensors(folder + "/reference.safetensors", io::Unverified::quiet);
  NoGrad no_grad;
  const std::vector<double> ours = model.logits(ref.at("ids")).value().to_vector(), theirs = ref.at("logits").to_vector();
  ASSERT_EQ(ours.size(), theirs.size());
  double diff = 0, peak = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    diff = std::max(diff, std::abs(ours[i] - theirs[i]));
    peak = std::max(peak, std::abs(theirs[i]));
  }
  EXPECT_LT(diff / peak, 3e-6);
}

TEST(GgufModel, AFileWithoutATokenizerHasNoneButTokenFilesEvaluate) {
  const std::string gguf = kData + "/tiny_llama_gqa.gguf";
  EXPECT_ERROR(hub::load_model_tokenizer(gguf), "metadata 'tokenizer.ggml.model' is missing");
  const train::Pretrained p = train::load_pretrained(gguf);
  EXPECT_EQ(p.tokenizer, nullptr);
  std::vector<int32_t> tokens(2 * 16 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 37 % 1000);
  const train::TokenEval e = train::evaluate_tokens(*p.session, tokens, nullptr, 16, 0);
  EXPECT_EQ(e.windows, 2u);
  EXPECT_TRUE(std::isfinite(e.loss));
}

// A GGUF file's bytes, built field by field (hostile variants of a valid file).
struct Bytes {
  std::string b;
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  Bytes& raw(const void* p, size_t n) {
    b.append(static_cast<const char*>(p), n);
    return *this;
  }
  Bytes& pad(size_t to) {
    b.resize((b.size() + to - 1) / to * to, '\0');
    return *this;
  }
};
Bytes header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
  Bytes h;
  h.b = "GGUF";
  return h.u32(version).u64(tensors).u64(kvs);
}
// One tensor info: name, dims (ggml order), type, offset.
Bytes& tensor_info(Bytes& b, const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
  b.str(name).u32(uint32_t(dims.size()));
  for (uint64_t d : dims) b.u64(d);
  return b.u32(type).u64(offset);
}

TEST(GgufHostile, LyingFilesAreErrorsNamingWhatIsWrong) {
  auto parse = [](const Bytes& b) { return hub::GgufFile::parse(b.b, "hostile.gguf"); };
  EXPECT_ERROR(hub::GgufFile::parse("GGML\3\0\0\0", "x"), "does not start with the magic \"GGUF\"");
  EXPECT_ERROR(hub::GgufFile::parse("", "x"), "does not start with the magic");
  EXPECT_ERROR(parse(header(0, 0, 1)), "GGUF version 1");
  EXPECT_ERROR(parse(header(0, 0, 4)), "GGUF version 4 is not read");
  EXPECT_ERROR(parse(header(0, 0, 0x03000000)), "big-endian");
  EXPECT_ERROR(hub::GgufFile::parse(header(0, 0).b.substr(0, 12), "x"), "truncated: the tensor count");
  EXPECT_ERROR(parse(header(uint64_t(1) << 60, 0)), "claims 1152921504606846976 tensors");
  EXPECT_ERROR(parse(header(0, uint64_t(1) << 60)), "claims 1152921504606846976 metadata entries");
  Bytes huge_key = header(0, 1);
  huge_key.u64(uint64_t(1) << 62).u32(0).u32(0);
  EXPECT_ERROR(parse(huge_key), "metadata entry 0's key claims 4611686018427387904 bytes");
  Bytes huge_string = header(0, 1);
  huge_string.str("k").u32(8).u64(~uint64_t(0));
  EXPECT_ERROR(parse(huge_string), "metadata 'k' claims 18446744073709551615 bytes");
  Bytes bad_type = header(0, 1);
  bad_type.str("k").u32(13).u64(0);
  EXPECT_ERROR(parse(bad_type), "metadata 'k''s type is 13, not a GGUF value type");
  Bytes long_array = header(0, 1);
  long_array.str("k").u32(9).u32(0).u64(uint64_t(1) << 61);
  EXPECT_ERROR(parse(long_array), "metadata 'k' claims 2305843009213693952 elements of uint8");
  Bytes long_strings = header(0, 1);
  long_strings.str("k").u32(9).u32(8).u64(1000).u64(0);
  EXPECT_ERROR(parse(long_strings), "claims 1000 elements of string");
  Bytes deep = header(0, 1);
  deep.str("k").u32(9);
  for (int i = 0; i < 100; ++i) deep.u32(9).u64(1);
  EXPECT_ERROR(parse(deep), "arrays nested deeper than 4 levels");
  Bytes bad_bool = header(0, 1);
  bad_bool.str("k").u32(7).b += '\7';
  EXPECT_ERROR(parse(bad_bool), "metadata 'k' is a bool of value 7");
  Bytes twice = header(0, 2);
  twice.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  EXPECT_ERROR(parse(twice), "metadata 'k' appears twice");
  Bytes align = header(0, 1);
  align.str("general.alignment").u32(4).u32(24);
  EXPECT_ERROR(parse(align), "'general.alignment' is 24, not a power of two");
  Bytes align_type = header(0, 1);
  align_type.str("general.alignment").u32(8).str("32");
  EXPECT_ERROR(parse(align_type), "metadata 'general.alignment' must be an unsigned integer, it is string");

  // Tensor infos, each followed by enough data for one F32 [8] tensor at offset 0.
  auto with_tensors = [](const std::function<void(Bytes&)>& infos, uint64_t count, size_t data = 32) {
    Bytes b = header(count, 0);
    infos(b);
    b.pad(32);
    b.b.append(data, '\0');
    return b;
  };
  EXPECT_NO_THROW(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {8}, 0, 0); }, 1)));
  EXPECT_ERROR(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {1, 1, 1, 1, 1}, 0, 0); }, 1)), "tensor 't' has 5 dimensions");
  EXPECT_ERROR(parse(with_tensors(
                   [](Bytes& b) {
                     tensor_info(b, "t", {1ull << 32, 1ull << 32, 1ull << 32}, 0, 0);
                   },
                   1)),
               "tensor 't''s dimensions overflow");
  EXPECT_ERROR(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {8}, 99, 0); }, 1)),
               "tensor 't' has ggml type 99, which ggml does not define");
  EXPECT_ERROR(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {33}, 2, 0); }, 1)),
               "rows of 33 values are not a whole number of Q4_0 blocks of 32");
  EXPECT_ERROR(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {4}, 0, 16); }, 1)),
               "offset 16 is not a multiple of the alignment 32");
  EXPECT_ERROR(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {16}, 0, 0); }, 1)), "tensor 't''s data (64 bytes at offset 0");
  EXPECT_ERROR(parse(with_tensors([](Bytes& b) { tensor_info(b, "t", {8}, 0, ~uint64_t(31)); }, 1)), "runs past the end of the file");
  EXPECT_ERROR(parse(with_tensors(
                   [](Bytes& b) {
                     tensor_info(b, "a", {8}, 0, 0);
                     tensor_info(b, "b", {8}, 0, 0);
                   },
                   2)),
               "tensors 'a' and 'b' overlap");
  EXPECT_ERROR(parse(with_tensors(
                   [](Bytes& b) {
                     tensor_info(b, "a", {4}, 0, 0);
                     tensor_info(b, "a", {4}, 0, 32);
                   },
                   2, 64)),
               "tensor 'a' appears twice");
  // A type ggml defines but Scalify does not dequantise: the file reads, the tensor is refused by name.
  const hub::GgufFile q2 = parse(with_tensors([](Bytes& b) { tensor_info(b, "w", {256}, 10, 0); }, 1, 96));
  EXPECT_ERROR(q2.dequantize("w"), "tensor 'w' is Q2_K (ggml type 10), which Scalify does not dequantise (it reads F32, F16");
  EXPECT_ERROR(hub::dequantize_ggml(77, nullptr, 0, nullptr), "GGUF: type 77 is not dequantised by Scalify");
}

TEST(GgufHostile, AScalarQueryOrKeyWeightIsAnError) {
  // Un-permuting q and k comes before the shape check: a tensor of no dimensions has no rows
  // (it read past an empty shape, a segfault, before).
  const hub::HfConfig config = hub::read_hf_config(kData + "/tiny_llama_gqa.gguf");
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}) {
    Bytes b = header(1, 0);
    tensor_info(b, name, {}, 0, 0);
    b.pad(32);
    b.b.append(32, '\0');
    const hub::GgufFile f = hub::GgufFile::parse(b.b, "scalar.gguf");
    EXPECT_ERROR(hub::gguf_hf_tensors(f, config), std::string("scalar.gguf: tensor '") + name + "' has no dimensions");
  }
}

TEST(GgufModel, QuantizeRefusesToWriteOverTheGgufItReads) {
  // `quantize --model m.gguf --out m.gguf` listed only a folder's files as inputs: the model file
  // itself was replaced by the quantised safetensors.
  const fs::path dir = scratch("gguf_quantize_self");
  fs::create_directories(dir);
  const std::string model = (dir / "model.gguf").string();
  fs::copy_file(kData + "/tiny_llama_gqa.gguf", model, fs::copy_options::overwrite_existing);
  const std::string before = slurp(model);
  EXPECT_ERROR(train::quantize_pretrained(model, model, train::PtqOptions{}, 0), "which this command reads");
  EXPECT_TRUE(slurp(model) == before) << "the model file changed";
}

TEST(GgufHostile, FuzzedFilesGiveOnlyScalifyErrors) {
  int errors = 0, parsed = 0;
  for (const char* name : {"synthetic.gguf", "tiny_llama_gqa.gguf"}) {
    const std::string good = slurp(kData + "/" + name);
    auto attempt = [&](const std::string& bytes) {
      try {
        const hub::GgufFile f = hub::GgufFile::parse(bytes, "fuzz");
        for (const hub::GgufTensorInfo& t : f.tensors())
          if (hub::ggml_dequantizable(t.type)) (void)f.dequantize(t.name);
        if (f.has("general.architecture") && f.value("general.architecture").text == "llama") (void)hub::gguf_config(f);
        ++parsed;
      } catch (const Error&) {
        ++errors;
      }
    };
    for (size_t len = 0; len < std::min<size_t>(good.size(), 12000); len += 13) attempt(good.substr(0, len));  // truncations
    uint32_t s = 46;
    for (int i = 0; i < 1500; ++i) {  // flips, mostly in the header and tensor infos
      std::string b = good;
      s = s * 1664525u + 1013904223u;
      const size_t at = (s >> 8) % (i % 2 ? std::min<size_t>(b.size(), 2000) : b.size());
      b[at] = char(b[at] ^ char(1 + (s >> 24) % 255));
      attempt(b);
    }
  }
  EXPECT_GT(errors, 500);
  std::printf("fuzzed GGUF files: %d rejected, %d parsed\n", errors, parsed);
}

TEST(GgufHostile, AFileThatIsNotThereOrNotAFile) {
  EXPECT_THROW(hub::GgufFile::open(scratch("absent.gguf").string()), MissingFileError);
  const fs::path dir = scratch("folder.gguf");
  fs::create_directories(dir);
  EXPECT_THROW(hub::GgufFile::open(dir.string()), FileError);
  const fs::path bad = scratch("bad.gguf");
  spit(bad, "not a gguf at all");
  EXPECT_ERROR(hub::read_hf_config(bad.string()), "bad.gguf: not a GGUF file");
}

}  // namespace
}  // namespace scalify
