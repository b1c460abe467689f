// Low-precision optimizer state in checkpoints (issue 48): stored in its own format (codes in the
// storage dtype, f32 scales and expansion parameters, each tensor checksummed like every
// checkpoint tensor), and a resumed run bit-identical to an uninterrupted one for every preset
// that encodes its moments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "scalify/inspect/inspect.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/quant/recipe.hpp"
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

TEST(StateCheckpoint, MomentsAreStoredInTheirOwnFormat) {
  const fs::path run = scratch("coat_state");
  train::train(tiny_run(text_corpus(), run, "coat"), false);
  const io::SafeTensors st = io::read_safetensors((run / "checkpoint.safetensors").string());
  int moments = 0;
  for (const auto& [name, t] : st.tensors) {
    if (!name.starts_with("optim.")) continue;
    EXPECT_FALSE(name.ends_with(".codes") && t.dtype() != DType::e4m3) << name << " holds " << dtype_name(t.dtype());
    if (name.ends_with(".codes")) {
      ++moments;
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

  // inspect: the moments' code values, one row per parameter and moment, in E4M3, every value counted.
  const inspect::Inspection in = inspect::inspect_checkpoint(run.string(), {});
  int firsts = 0, seconds = 0;
  for (const inspect::InspectedTensor& t : in.tensors) {
    if (t.kind != inspect::TensorKind::first_moment && t.kind != inspect::TensorKind::second_moment) continue;
    (t.kind == inspect::TensorKind::first_moment ? firsts : seconds) += 1;
    EXPECT_EQ(t.storage, DType::e4m3) << t.name;
    EXPECT_EQ(t.histogram.count, st.at("optim.m." + t.name + ".codes").numel()) << t.name;
    EXPECT_EQ(t.histogram.nonfinite, 0) << t.name;
  }
  EXPECT_EQ(firsts, moments / 2);
  EXPECT_EQ(seconds, moments / 2);
}

}  // namespace
}  // namespace scalify
