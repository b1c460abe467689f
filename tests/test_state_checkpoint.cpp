// Low-precision optimizer state in checkpoints (issue 48): stored in its own format (codes in their
// layout's dtype, f32 scales and expansion parameters, each tensor checksummed like every
// checkpoint tensor, each moment's format in the metadata and checked on resume), and a resumed run
// bit-identical to an uninterrupted one for every preset that encodes its moments; `inspect`
// judges each moment against its own layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "expect_error.hpp"
#include "scalify/inspect/inspect.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using testing::scratch, testing::text_corpus, testing::tiny_run;

TEST(StateCheckpoint, ResumeIsBitIdenticalForEveryLowPrecisionStatePreset) {
  const fs::path data = text_corpus();
  for (const std::string recipe : {"msamp_o2", "coat", "fp8_adam_no_expansion"}) {
    const fs::path a = scratch("whole_" + recipe), b = scratch("split_" + recipe);
    train::train(tiny_run(data, a, recipe), false);
    train::train(tiny_run(data, b, recipe), false, {}, /*stop_after=*/4);
    train::train(train::run_config(b.string()), true);
    const io::SafeTensors wa = io::read_safetensors((a / "checkpoint.safetensors").string()),
                          wb = io::read_safetensors((b / "checkpoint.safetensors").string());
    ASSERT_EQ(wa.tensors.size(), wb.tensors.size()) << recipe;
    for (size_t i = 0; i < wa.tensors.size(); ++i) {
      const Tensor& x = wa.tensors[i].second;
      const Tensor& y = wb.tensors[i].second;
      ASSERT_EQ(wa.tensors[i].first, wb.tensors[i].first);
      ASSERT_EQ(x.dtype(), y.dtype());
      ASSERT_EQ(x.shape(), y.shape());
      EXPECT_EQ(std::memcmp(x.raw_bytes(), y.raw_bytes(), size_t(x.numel()) * size_t(dtype_size(x.dtype()))), 0)
          << recipe << " " << wa.tensors[i].first;
    }
    EXPECT_EQ(wa.metadata.at("scalify.state"), wb.metadata.at("scalify.state")) << recipe;
    EXPECT_EQ(testing::metrics_records(a), testing::metrics_records(b)) << recipe;
    if (recipe == "msamp_o2") {
      // MS-AMP's scaled f16 masters: the quantised linear layers' weights stored as f16 data and one
      // power-of-two scale, the largest that keeps the data within f16 (its amax above 65504 / 2);
      // the other parameters in f32 with no scale.
      ASSERT_TRUE(wa.has("param.h0.attn.qkv.w.scale"));
      const Tensor& data = wa.at("param.h0.attn.qkv.w");
      const Tensor& scale = wa.at("param.h0.attn.qkv.w.scale");
      EXPECT_EQ(data.dtype(), DType::f16);
      ASSERT_EQ(scale.numel(), 1);
      int e = 0;
      EXPECT_EQ(std::frexp(double(scale.to_floats()[0]), &e), 0.5) << "a power of two";
      double top = 0;
      for (float v : data.to_floats()) top = std::max(top, std::fabs(double(v)));
      EXPECT_GT(top, 65504.0 / 2);
      EXPECT_LE(top, 65504.0);
      EXPECT_EQ(wa.at("param.wte").dtype(), DType::f32);
      EXPECT_FALSE(wa.has("param.wte.scale"));
      // inspect: those weights as their f16 data and scale, judged against f16 (none clipped).
      int masters = 0;
      for (const inspect::InspectedTensor& t : inspect::inspect_checkpoint(a.string(), {}).tensors)
        if (t.kind == inspect::TensorKind::weight && t.storage == DType::f16) {
          ++masters;
          EXPECT_TRUE(std::isfinite(t.scale_log2)) << t.name;
          EXPECT_EQ(t.histogram.clipped, 0) << t.name;
          EXPECT_EQ(t.histogram.normal + t.histogram.subnormal + t.histogram.underflow + t.histogram.zeros, t.histogram.count) << t.name;
        }
      EXPECT_EQ(masters, 8);  // 4 linear layers x 2 blocks
    }
  }
}

// The codes' dtype in the file, read from the header as any safetensors reader does.
std::string file_dtype(const std::string& bytes, const std::string& tensor) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, n)).at(tensor).at("dtype").get<std::string>();
}

TEST(StateCheckpoint, MomentsAreStoredInTheirOwnFormat) {
  const fs::path run = scratch("coat_state");
  train::train(tiny_run(text_corpus(), run, "coat"), false);
  const io::SafeTensors st = io::read_safetensors((run / "checkpoint.safetensors").string());
  const std::string bytes = testing::slurp(run / "checkpoint.safetensors");
  int moments = 0;
  for (const auto& [name, t] : st.tensors) {
    if (!name.starts_with("optim.")) continue;
    if (name.ends_with(".codes")) {
      ++moments;
      // m: signed E4M3 codes, labelled so; v: unsigned E4M4 codes, which no dtype names: raw bytes.
      const bool v = name.starts_with("optim.v.");
      EXPECT_EQ(t.dtype(), v ? DType::u8 : DType::e4m3) << name << " holds " << dtype_name(t.dtype());
      EXPECT_EQ(file_dtype(bytes, name), v ? "U8" : "F8_E4M3") << name;
      const int64_t groups = (t.numel() + 127) / 128;  // one f32 scale, k and centre per 128 codes
      const std::string stem = name.substr(0, name.size() - 6);
      for (const char* part : {".scales", ".expand_k", ".centre"}) {
        ASSERT_TRUE(st.has(stem + part)) << stem << part;
        EXPECT_EQ(st.at(stem + part).dtype(), DType::f32);
        EXPECT_EQ(st.at(stem + part).numel(), groups) << stem << part;
      }
    }
  }
  EXPECT_GT(moments, 0);
  EXPECT_FALSE(st.has("optim.m.wte")) << "a widened moment";
  // Each moment's format, as the recipe JSON writes it (coat's published choices, spelt out here).
  ASSERT_TRUE(st.metadata.count("scalify.state_formats"));
  const nlohmann::json coat_m = {{"storage", "e4m3"},     {"scaling", "per_group"}, {"group_size", 128}, {"rounding", "nearest_even"},
                                 {"non_negative", false}, {"expand", true},         {"expand_min", 16}};
  nlohmann::json coat_v = coat_m;
  coat_v["non_negative"] = true;
  EXPECT_EQ(nlohmann::json::parse(st.metadata.at("scalify.state_formats")),
            (nlohmann::json{{"first_moment", coat_m}, {"second_moment", coat_v}}));

  // inspect: the moments' code values, one row per parameter and moment, every value counted,
  // each judged against its own layout: coat's v codes reach E4M4's 480, past E4M3's 448, and
  // are not clipped.
  const inspect::Inspection in = inspect::inspect_checkpoint(run.string(), {});
  int firsts = 0, seconds = 0;
  for (const inspect::InspectedTensor& t : in.tensors) {
    if (t.kind != inspect::TensorKind::first_moment && t.kind != inspect::TensorKind::second_moment) continue;
    const bool v = t.kind == inspect::TensorKind::second_moment;
    (v ? seconds : firsts) += 1;
    EXPECT_EQ(t.storage, v ? DType::u8 : DType::e4m3) << t.name;
    EXPECT_EQ(t.range_name, v ? "e4m4 (unsigned)" : "e4m3") << t.name;
    EXPECT_EQ(t.range.max, v ? 480 : 448) << t.name;
    EXPECT_EQ(t.histogram.count, st.at("optim.m." + t.name + ".codes").numel()) << t.name;
    EXPECT_EQ(t.histogram.nonfinite, 0) << t.name;
    EXPECT_EQ(t.histogram.clipped, 0) << t.name;
    if (v) {
      EXPECT_GT(t.histogram.at(8), 0) << t.name << ": no code in [256, 480]";
    }
  }
  EXPECT_EQ(firsts, moments / 2);
  EXPECT_EQ(seconds, moments / 2);
}

TEST(StateCheckpoint, InspectJudgesScaledF16MomentsAgainstF16) {
  // msamp_o2: m in E4M3 and v in f16, each with a per-tensor power of two that brings its largest
  // value into (max / 2, max]: v's codes lie far beyond E4M3's 448, inside f16's range.
  const fs::path run = scratch("msamp_state");
  train::train(tiny_run(text_corpus(), run, "msamp_o2"), false);
  const inspect::Inspection in = inspect::inspect_checkpoint(run.string(), {});
  int rows = 0;
  for (const inspect::InspectedTensor& t : in.tensors) {
    if (t.kind != inspect::TensorKind::second_moment) continue;
    ++rows;
    EXPECT_EQ(t.storage, DType::f16) << t.name;
    EXPECT_EQ(t.range_name, "f16 scaled") << t.name;
    EXPECT_EQ(t.range.max, 65504) << t.name;
    EXPECT_EQ(t.histogram.clipped, 0) << t.name;
    EXPECT_GE(t.histogram.highest(), 14) << t.name << ": the largest value in (32752, 65504]";
  }
  EXPECT_GT(rows, 0);
  // The CSV names the range each row is judged against.
  const fs::path dir = scratch("msamp_inspect");
  ASSERT_EQ(inspect::write_inspection(in, dir.string()), "") << "gnuplot is part of scripts/setup.sh";
  const std::string csv = testing::slurp(dir / "tensors.csv");
  EXPECT_NE(csv.find(",nonfinite,range\n"), std::string::npos) << csv.substr(0, 200);
  EXPECT_NE(csv.find(",second_moment,f16,"), std::string::npos);
  EXPECT_NE(csv.find(",f16 scaled\n"), std::string::npos);
}

TEST(StateCheckpoint, ResumeRefusesOtherStateFormatsAndReadsOldCheckpoints) {
  const fs::path run = scratch("coat_resume");
  train::train(tiny_run(text_corpus(), run, "coat"), false);
  const auto [st, cfg] = train::read_checkpoint(run.string());

  // The same recipe but v's codes read as signed E4M3: the bytes would be misread; refused,
  // naming both formats.
  quant::Recipe signed_v = quant::preset("coat");
  signed_v.name = "coat_signed_v";
  signed_v.second_moment.non_negative = false;
  const fs::path recipe = scratch("coat_signed_v.json");
  testing::spit(recipe, signed_v.to_json());
  train::TrainConfig other = cfg;
  other.recipe = recipe.string();
  const std::string e = testing::error_of([&] { train::make_session(other, &st); });
  const std::string stored = st.metadata.at("scalify.state_formats");
  EXPECT_NE(e.find("stored as " + stored), std::string::npos) << e;
  const size_t wanted = e.find("the recipe's state formats are ");
  ASSERT_NE(wanted, std::string::npos) << e;
  const std::string tail = e.substr(wanted);
  EXPECT_NE(tail.find("\"non_negative\":false"), tail.rfind("\"non_negative\":false")) << "both moments signed: " << e;
  // A recipe of plain f32 moments is refused as well.
  other.recipe = "f32";
  EXPECT_ERROR(train::make_session(other, &st), "the recipe's state formats are plain");

  // Codes labelled with a layout they cannot be under the recorded format are refused by name.
  io::SafeTensors mislabelled = st;
  for (auto& [name, t] : mislabelled.tensors)
    if (name == "optim.v.wte.codes") {
      Tensor relabelled = Tensor::empty(t.shape(), DType::e5m2);
      std::memcpy(relabelled.raw_bytes(), t.raw_bytes(), size_t(t.numel()));
      t = relabelled;
    }
  EXPECT_ERROR(train::make_session(cfg, &mislabelled), "tensor 'optim.v.wte.codes' holds e5m2, the recipe's e4m4 (unsigned) codes are u8");

  // A checkpoint written before the formats were recorded: no metadata, v's codes labelled
  // F8_E4M3. It still resumes, to the same codes.
  io::SafeTensors old = st;
  old.metadata.erase("scalify.state_formats");
  for (auto& [name, t] : old.tensors)
    if (name.starts_with("optim.v.") && name.ends_with(".codes")) {
      Tensor relabelled = Tensor::empty(t.shape(), DType::e4m3);
      std::memcpy(relabelled.raw_bytes(), t.raw_bytes(), size_t(t.numel()));
      t = relabelled;
    }
  const fs::path old_file = scratch("old_coat.safetensors");
  io::write_safetensors(old_file.string(), old);
  EXPECT_EQ(file_dtype(testing::slurp(old_file), "optim.v.wte.codes"), "F8_E4M3");
  const auto [read_back, old_cfg] = train::read_checkpoint(old_file.string());
  const auto s = train::load_session(read_back, old_cfg, old_file.string(), train::NonFinite::refuse);
  for (size_t i = 0; i < s->names.size(); ++i) {
    const Tensor& codes = st.at("optim.v." + s->names[i] + ".codes");
    const optim::EncodedState& v = s->opt->encoded_second_moment(i);
    ASSERT_EQ(v.codes.size(), size_t(codes.numel())) << s->names[i];
    EXPECT_EQ(std::memcmp(v.codes.data(), codes.raw_bytes(), v.codes.size()), 0) << s->names[i];
  }
}

// A tampered checkpoint (its checksums rewritten) whose moments' per-group scales are zero or
// negative, or whose expansion exponents are 0, is refused by name on load: zero scales resumed
// silently with zeroed moments, negative ones diverged a few steps later.
TEST(StateCheckpoint, BadEncodedScalesAndExponentsAreRefusedOnLoad) {
  const fs::path run = scratch("coat_tampered");
  train::train(tiny_run(text_corpus(), run, "coat"), false);
  const auto [st, cfg] = train::read_checkpoint(run.string());
  const train::TrainConfig config = cfg;
  for (const auto& [part, value, words] : {std::tuple<const char*, float, const char*>{".scales", 0.0f, "is not a finite positive scale"},
                                           {".scales", -1.0f, "is not a finite positive scale"},
                                           {".centre", INFINITY, "is not a finite positive scale"},
                                           {".expand_k", 0.0f, "holds an expansion exponent outside (0, 1024]"}}) {
    io::SafeTensors tampered = st;
    for (auto& [name, t] : tampered.tensors)
      if (name == std::string("optim.m.wte") + part) t = Tensor::full(t.shape(), value);
    const fs::path file = scratch("tampered.safetensors");
    io::write_safetensors(file.string(), tampered);
    const auto [read_back, read_cfg] = train::read_checkpoint(file.string());
    EXPECT_ERROR(train::load_session(read_back, config, file.string(), train::NonFinite::refuse),
                 std::string("tensor 'optim.m.wte") + part + "' " + words);
  }
}

}  // namespace
}  // namespace scalify
