// The trainer and what it stands on: the GPT's gradients, safetensors (independent reader, fuzz),
// atomic checkpoint writes under a kill, bit-exact resume, bad data and config.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "expect_error.hpp"
#include "gradcheck.hpp"
#include "train_fixtures.hpp"
#include "scalify/error.hpp"
#include "scalify/inspect/inspect.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using testing::scratch, testing::slurp, testing::spit, testing::text_corpus, testing::tiny_run;

TEST(Gpt, GradientsMatchFiniteDifferencesInEveryVariant) {
  struct Variant {
    const char* name;
    bool unit, rms, swiglu, tied, umup = false;
  };
  // The unit-scaled variant's backward scales each op's gradient on purpose (Table A.2; test_unit
  // checks those factors), so it is checked here with ExactGradients: same forward, beta = alpha.
  const Variant variants[] = {{"standard", false, false, false, true},
                              {"untied head", false, false, false, false},
                              {"rmsnorm+swiglu", false, true, true, true},
                              {"unit-scaled", true, false, false, true},
                              {"u-μP", false, true, true, false, true}};
  for (const Variant& v : variants) {
    nn::GptConfig c;
    c.vocab = 7;
    c.seq = 3;
    c.d_model = 4;
    c.layers = 1;
    c.heads = 2;
    c.unit_scaled = v.unit;
    c.rms_norm = v.rms;
    c.swiglu = v.swiglu;
    c.tied_head = v.tied;
    c.umup = v.umup;
    c.bias = !v.umup;
    if (v.umup) {  // every hyperparameter away from 1, so each enters the check
      c.residual_mult = 0.7, c.residual_attn_ratio = 1.3, c.act_mult = 1.6, c.attn_mult = 0.8, c.loss_mult = 1.2;
    }
    nn::Gpt model(c, 3);
    std::optional<unit::ExactGradients> exact;
    if (v.unit || v.umup) exact.emplace();
    const Tensor ids = Tensor::from_indices({1, 5, 2, 6, 0, 3}, {2, 3}), targets = Tensor::from_indices({5, 2, 4, 0, 3, 1}, {2, 3});
    std::vector<std::string> names;
    std::vector<Tensor> values;
    for (const auto& [n, p] : model.parameters()) {
      names.push_back(n);
      // Non-zero biases and gains away from 1, so every parameter's gradient is exercised.
      values.push_back(ops::add(p.value(), Tensor::randn(p.shape(), values.size() + 11, 0.3)));
    }
    testing::gradcheck(
        v.name,
        [&](const std::vector<Var>& ps) {
          nn::NamedParams np;
          for (size_t i = 0; i < ps.size(); ++i) np.push_back({names[i], ps[i]});
          model.set_parameters(np);
          return model.loss(ids, targets);
        },
        values);
  }
}

TEST(SafeTensors, AnIndependentReaderSeesTheNamesDtypesShapesAndBytes) {
  const fs::path p = scratch("t.safetensors");
  io::SafeTensors st;
  st.tensors = {{"w", Tensor::randn({3, 4}, 1)},
                {"h", Tensor::randn({5}, 2).to(DType::f16)},
                {"q", Tensor::randn({2, 2}, 3).to(DType::e4m3)},
                {"m", Tensor::randn({4}, 4).to(DType::e2m1)}};
  st.metadata = {{"step", "7"}};
  io::write_safetensors(p.string(), st);
  // Minimal reader written from the format's description, not the project's parser.
  const std::string b = slurp(p);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  const auto h = nlohmann::json::parse(b.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["step"], "7");
  const std::map<std::string, std::pair<std::string, std::vector<int64_t>>> want = {
      {"w", {"F32", {3, 4}}}, {"h", {"F16", {5}}}, {"q", {"F8_E4M3", {2, 2}}}, {"m", {"U8", {4}}}};
  for (const auto& [name, t] : st.tensors) {
    ASSERT_TRUE(h.contains(name)) << name;
    EXPECT_EQ(h[name]["dtype"], want.at(name).first) << name;
    EXPECT_EQ(h[name]["shape"].get<std::vector<int64_t>>(), want.at(name).second) << name;
    const uint64_t begin = h[name]["data_offsets"][0], end = h[name]["data_offsets"][1];
    const size_t bytes = size_t(t.numel()) * size_t(dtype_size(t.dtype()));
    ASSERT_EQ(end - begin, bytes) << name;
    EXPECT_EQ(std::memcmp(b.data() + 8 + n + begin, t.contiguous().raw_bytes(), bytes), 0) << name;
  }
  // And the project's reader round-trips dtypes (the custom e2m1 included).
  const io::SafeTensors back = io::read_safetensors(p.string());
  EXPECT_EQ(back.at("m").dtype(), DType::e2m1);
  EXPECT_EQ(back.at("q").to_vector(), st.tensors[2].second.to_vector());
}

// u8: raw bytes (a non-negative optimizer moment's E4M4 / E5M3 codes), the format's U8, read back
// as the same bytes; as numbers they are the integers 0..255.
TEST(SafeTensors, RawBytesAreU8) {
  const fs::path p = scratch("u8.safetensors");
  const Tensor bytes = Tensor::from_vector(std::vector<float>{0, 1, 127, 128, 254, 255}, {6}).to(DType::u8);
  io::SafeTensors st;
  st.tensors = {{"codes", bytes}};
  io::write_safetensors(p.string(), st);
  const std::string b = slurp(p);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  const auto h = nlohmann::json::parse(b.substr(8, n));
  EXPECT_EQ(h["codes"]["dtype"], "U8");
  EXPECT_FALSE(h["__metadata__"].contains("scalify.dtypes"));
  const uint64_t begin = h["codes"]["data_offsets"][0];
  EXPECT_EQ(b.substr(8 + n + begin, 6), std::string("\x00\x01\x7f\x80\xfe\xff", 6));
  const Tensor back = io::read_safetensors(p.string()).at("codes");
  EXPECT_EQ(back.dtype(), DType::u8);
  EXPECT_EQ(back.to_vector(), (std::vector<double>{0, 1, 127, 128, 254, 255}));
}

TEST(SafeTensors, CorruptTruncatedAndHostileFilesAreErrorsNotCrashes) {
  const fs::path p = scratch("f.safetensors");
  io::SafeTensors st;
  st.tensors = {{"a", Tensor::randn({8, 8}, 1)}, {"b", Tensor::randn({16}, 2).to(DType::bf16)}};
  st.metadata = {{"k", "v"}};
  io::write_safetensors(p.string(), st);
  const std::string good = slurp(p);
  int errors = 0, parsed = 0;
  auto attempt = [&](const std::string& bytes) {
    try {
      io::parse_safetensors(bytes, "fuzz");
      ++parsed;
    } catch (const Error&) {
      ++errors;
    }
  };
  for (size_t len = 0; len < good.size(); len += 7) attempt(good.substr(0, len));  // truncations
  uint32_t s = 1;
  for (int i = 0; i < 3000; ++i) {  // random byte flips, mostly in the header
    std::string b = good;
    s = s * 1664525u + 1013904223u;
    const size_t at = (s >> 8) % (i % 2 ? 200 : b.size());
    b[at] = char(b[at] ^ char(1 + (s >> 24) % 255));
    attempt(b);
  }
  auto with_header = [](const std::string& h) {
    std::string b(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(b.data(), &n, 8);
    return b + h + std::string(64, '\0');
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']'), deep_header = "{\"a\":" + deep + "}",
                    deep_checksums = R"({"__metadata__":{"scalify.crc32c":"{\"a\":)" + deep + "}\"}}";
  const char* hostile[] = {
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,64]}})",
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}})", R"({"a":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})",
      R"({"a":[1,2,3]})", R"([1,2])", R"({"__metadata__":{"k":5}})",
      // Nested 100,000 deep, in the header and inside a metadata value that is itself JSON.
      deep_header.c_str(), deep_checksums.c_str(), R"({"a":{"dtype":"F32","shape":[1]}})"};
  for (const char* h : hostile) {
    EXPECT_THROW(io::parse_safetensors(with_header(h), "hostile"), Error) << h;
  }
  std::string huge(8, '\xff');
  EXPECT_THROW(io::parse_safetensors(huge + "{}", "huge"), Error);
  EXPECT_GT(errors, 100);
  std::printf("fuzz: %d rejected, %d parsed (flips in tensor bytes are valid files)\n", errors, parsed);
}

TEST(Checkpoint, AKilledWriteLeavesThePreviousFileReadable) {
  const fs::path p = scratch("ckpt.safetensors");
  io::SafeTensors first;
  first.tensors = {{"w", Tensor::full({1000}, 1.5)}};
  io::write_safetensors(p.string(), first);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setenv("SCALIFY_TEST_DIE_DURING_WRITE", "ckpt.safetensors", 1);
    io::SafeTensors second;
    second.tensors = {{"w", Tensor::full({100000}, 2.5)}};
    io::write_safetensors(p.string(), second);
    ::_exit(0);  // not reached: the hook kills the process halfway through the write
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was not killed mid-write";
  const io::SafeTensors back = io::read_safetensors(p.string());
  EXPECT_EQ(back.at("w").numel(), 1000);
  EXPECT_EQ(back.at("w").at({999}), 1.5);
  io::write_safetensors(p.string(), first);  // the next write clears the dead writer's temporary
  for (const auto& e : fs::directory_iterator(p.parent_path())) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

// An atomic write streams to disk: while the content is still being produced, what was given
// beyond the 4 MB buffer is already in the temporary file (the whole-file buffer this replaced
// wrote nothing before the end, and raised a GPT-2-size run's peak by 1.3 x its checkpoint).
TEST(Checkpoint, AWriteDoesNotHoldTheFileInMemory) {
  const fs::path p = scratch("streamed.bin");
  const std::string temporary = p.string() + ".tmp." + std::to_string(::getpid());
  const std::vector<char> piece(size_t(1) << 20, 'x');  // 1 MB pieces: each goes through the buffer
  std::vector<int64_t> on_disk;                         // the temporary's size after each 8 MB given
  io::write_file_atomically(p.string(), [&](const io::ByteSink& out) {
    for (int i = 1; i <= 32; ++i) {
      out(piece.data(), piece.size());
      if (i % 8 == 0) on_disk.push_back(int64_t(fs::file_size(temporary)));
    }
  });
  ASSERT_EQ(on_disk.size(), 4u);
  for (size_t k = 0; k < on_disk.size(); ++k) {
    const int64_t given = int64_t(8 * (k + 1)) << 20;
    EXPECT_GE(on_disk[k], given - (int64_t(4) << 20)) << "after " << (given >> 20) << " MB given";
  }
  EXPECT_EQ(int64_t(fs::file_size(p)), int64_t(32) << 20);
  EXPECT_FALSE(fs::exists(temporary));
}

// The interleaved speed timing's steps (compare/speed): the steps asked for after the warm-up,
// more until min_seconds but never past 10 x steps, each timed; nothing is written.
TEST(Trainer, TimedStepsWriteNothingAndStopAtTenTimesTheStepsAsked) {
  const train::TrainConfig c = tiny_run(text_corpus(), scratch("timed_steps"), "current");
  const train::Corpus corpus = train::corpus_for(c);
  const std::vector<train::StepTime> t = train::time_training_steps(c, corpus, 1, 3);
  ASSERT_EQ(t.size(), 3u);
  for (const train::StepTime& s : t) {
    EXPECT_GT(s.wall_s, 0);
    EXPECT_GT(s.cpu_s, 0);
  }
  EXPECT_EQ(train::time_training_steps(c, corpus, 0, 2, 1e9).size(), 20u);
  EXPECT_FALSE(fs::exists(c.out)) << "timing wrote a run folder";
}

TEST(Trainer, ResumeIsBitIdenticalToAnUninterruptedRun) {
  const fs::path data = text_corpus();
  // Every preset: scaled master weights and moments (SCALIFY), f16 state, amax histories,
  // block and MX quantisers, dynamic loss scaling, the unit-scaled model.
  for (const std::string& recipe : quant::preset_names()) {
    const fs::path a = scratch("whole_" + recipe), b = scratch("split_" + recipe);
    train::train(tiny_run(data, a, recipe), false);
    train::train(tiny_run(data, b, recipe), false, {}, /*stop_after=*/4);
    EXPECT_FALSE(fs::exists(b / "model.safetensors"));
    train::train(train::run_config(b.string()), true);
    const io::SafeTensors wa = io::read_safetensors((a / "model.safetensors").string()),
                          wb = io::read_safetensors((b / "model.safetensors").string());
    ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
    for (size_t i = 0; i < wa.tensors.size(); ++i) {
      const Tensor& x = wa.tensors[i].second;
      const Tensor& y = wb.tensors[i].second;
      ASSERT_EQ(wa.tensors[i].first, wb.tensors[i].first);
      ASSERT_EQ(x.shape(), y.shape());
      EXPECT_EQ(std::memcmp(x.raw_bytes(), y.raw_bytes(), size_t(x.numel()) * size_t(dtype_size(x.dtype()))), 0)
          << recipe << " " << wa.tensors[i].first;
    }
    EXPECT_EQ(wa.metadata.at("scalify.state"), wb.metadata.at("scalify.state")) << recipe;
    EXPECT_EQ(testing::metrics_records(a), testing::metrics_records(b)) << recipe;
  }
}

// A resume continues from the checkpoint's optimizer state and counters: a NaN moment, a step
// that disagrees with the metadata or a missing counter is refused by name, before the run's
// metrics are touched; a SCALIFY parameter's scale must be finite and positive even to inspect.
TEST(Trainer, ResumeRefusesCorruptStateByName) {
  const fs::path run = scratch("resume_corrupt");
  train::train(tiny_run(text_corpus(), run, "scalify_fp16_2"), false, {}, /*stop_after=*/2);
  const std::string file = (run / "checkpoint.safetensors").string();
  const io::SafeTensors good = io::read_safetensors(file);
  const std::string metrics = slurp(run / "metrics.jsonl");
  auto resume_with = [&](const std::function<void(io::SafeTensors&)>& corrupt, const std::string& why) {
    io::SafeTensors st = good;
    corrupt(st);
    io::write_safetensors(file, st);
    EXPECT_ERROR(train::train(train::run_config(run.string()), true), why);
    EXPECT_EQ(slurp(run / "metrics.jsonl"), metrics) << why;
  };
  auto set_state = [](const std::string& key, const nlohmann::json& value) {
    return [=](io::SafeTensors& st) {
      nlohmann::json state = nlohmann::json::parse(st.metadata.at("scalify.state"));
      if (value.is_null()) {
        state.erase(key);
      } else {
        state[key] = value;
      }
      st.metadata["scalify.state"] = state.dump();
    };
  };
  resume_with(
      [](io::SafeTensors& st) {
        for (auto& [name, t] : st.tensors)
          if (name == "optim.m.wte") t = ops::binary(ops::Binary::mul, t.to(DType::f32), Tensor::full({}, NAN)).to(t.dtype());
      },
      "tensor 'optim.m.wte' holds NaN or infinite values");
  resume_with(set_state("step", -5), "lacks a whole number 'step' >= 0");
  resume_with(set_state("step", 100), "'scalify.state' step 100 differs from metadata step 2");
  resume_with(set_state("skipped", "x"), "lacks a whole number 'skipped' >= 0");
  resume_with(set_state("optimizer_steps", nullptr), "lacks a whole number 'optimizer_steps' >= 0");
  resume_with(
      [](io::SafeTensors& st) {
        for (auto& [name, t] : st.tensors)
          if (name == "param.h0.mlp.fc.w.scale") t = Tensor::full({}, -1.0);
      },
      "tensor 'param.h0.mlp.fc.w.scale' is not a finite positive scale");
  EXPECT_ERROR(inspect::inspect_checkpoint(run.string(), {}), "tensor 'param.h0.mlp.fc.w.scale' is not a finite positive scale");
}

TEST(Trainer, BadDataAndConfigAreClearErrorsBeforeAnyRunFolder) {
  const fs::path dir = scratch("bad");
  fs::create_directories(dir);
  spit(dir / "empty.txt", "");
  spit(dir / "binary.bin", std::string("abc\0def", 7));
  spit(dir / "short.txt", "too short");
  fs::create_directories(dir / "no_text");
  spit(dir / "no_text" / "x.dat", std::string("\0\1\2", 3));
  const std::pair<std::string, std::string> cases[] = {
      {(dir / "missing.txt").string(), "does not exist"},
      {(dir / "empty.txt").string(), "is empty"},
      {(dir / "binary.bin").string(), "not text"},
      {(dir / "short.txt").string(), "too short"},
      {(dir / "no_text").string(), "no text file"},
      // A file that opens but fails to read (EIO at offset 0, for root too, which chmod cannot stop).
      {"/proc/self/mem", "cannot read"}};
  for (const auto& [path, message] : cases) {
    const fs::path out = scratch("bad_out");
    try {
      train::train(tiny_run(path, out, "f32"), false);
      ADD_FAILURE() << path << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(out)) << "a run folder was left for " << path;
  }
  train::TrainConfig c;
  EXPECT_THROW(c.set("stpes", "3"), Error);
  EXPECT_THROW(c.set("steps", "three"), Error);
  EXPECT_THROW(train::parse_config("lr = \"fast\"\n", "t"), Error);
  EXPECT_THROW(train::parse_config("bogus = 1\n", "t"), Error);
  c.set("lr", "-1");
  EXPECT_THROW(c.validate(), Error);
  c = train::TrainConfig();
  c.recipe = "fp7";
  EXPECT_THROW(c.validate(), Error);
  // The effective config written to a run folder reads back the same.
  const train::TrainConfig d = tiny_run(dir / "x", dir / "y", "delayed");
  EXPECT_EQ(train::parse_config(d.to_toml(), "roundtrip").to_toml(), d.to_toml());
}

TEST(Trainer, LearnsWellBelowTheUnigramEntropyOfTheDefaultCorpus) {
  // The main job's corpus and a small model (d = 64, 2 layers) for 300 steps of f32.
  train::TrainConfig c;
  c.out = scratch("learns").string();
  c.model.d_model = 64;
  c.model.layers = 2;
  c.model.heads = 2;
  c.steps = 300;
  c.warmup = 30;
  c.eval_every = 300;
  c.eval_windows = 256;
  const train::TrainResult r = train::train(c, false);
  std::printf("default corpus: validation %.3f bits per byte, unigram entropy %.3f bits per byte\n", r.val_bpb, r.unigram_bits);
  EXPECT_LT(r.val_bpb, r.unigram_bits - 1.0);
}

TEST(Config, NarrowKeysAreRangeCheckedNotWrapped) {
  EXPECT_ERROR(train::parse_config("seed = -1\n", "t"), "'seed' must be >= 0");
  EXPECT_ERROR(train::parse_config("layers = 3000000000\n", "t"), "'layers' is out of range");
  EXPECT_ERROR(train::parse_config("heads = -5000000000\n", "t"), "'heads' is out of range");
  EXPECT_EQ(train::parse_config("seed = 9223372036854775807\n", "t").seed, 9223372036854775807u);
}

// Random byte strings and mutations of a valid config (byte flips, truncations, values replaced by
// huge, negative, NaN, non-integer or wrongly typed ones) into parse_config and validate():
// scalify::Error is the only exception allowed.
TEST(Config, FuzzedTomlGivesOnlyScalifyErrors) {
  std::mt19937_64 rng(13);
  const std::vector<std::string> values = {"1e308",
                                           "-1e308",
                                           "nan",
                                           "inf",
                                           "-inf",
                                           "-1",
                                           "0",
                                           "0.5",
                                           "3000000000",
                                           "9223372036854775807",
                                           "-9223372036854775808",
                                           "99999999999999999999",
                                           "\"x\"",
                                           "true",
                                           "[1, 2]",
                                           "{a = 1}",
                                           "1979-05-27",
                                           "0x7FFFFFFF",
                                           "''",
                                           "\"\\u0000\""};
  train::TrainConfig base;
  base.data = "corpus.txt";
  const std::string seed_doc = base.to_toml();
  int accepted = 0, rejected = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000 && std::chrono::steady_clock::now() - start < std::chrono::seconds(3); ++i) {
    std::string text;
    if (i % 10 == 0) {
      text.resize(rng() % 200);
      for (char& c : text) c = char(rng());
    } else {
      text = seed_doc;
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !text.empty(); ++e) {
        const size_t at = rng() % text.size();
        switch (rng() % 4) {
          case 0: text[at] = char(text[at] ^ (1 << (rng() % 8))); break;
          case 1: text.resize(at); break;
          case 2: text[at] = "[]{}\"'=.,#\n0123456789-+eE_tfn"[rng() % 30]; break;
          default: {  // the value of one line replaced
            const size_t eq = text.find(" = ", at) == std::string::npos ? text.find(" = ") : text.find(" = ", at);
            if (eq == std::string::npos) break;
            const size_t end = text.find('\n', eq);
            text.replace(eq + 3, end == std::string::npos ? std::string::npos : end - eq - 3, values[rng() % values.size()]);
          }
        }
      }
    }
    try {
      train::parse_config(text, "fuzz").validate();
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a scalify::Error: " << e.what() << "\n" << text;
    }
  }
  std::printf("fuzzed configs: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace scalify
