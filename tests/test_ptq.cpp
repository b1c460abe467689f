// FP8 post-training quantisation (seed 003 §3.1, Table 3) of a model trained in f32: FP8-AMAX
// and MXFP8 keep the validation loss within 1% of f32; FP8-CSCALE does only inside a band of
// biases, bounded on both sides (underflow below it, clipping above). The quantised checkpoint
// holds e4m3 codes with power-of-two scales and evaluates exactly as the in-memory sweep; bad
// files are rejected naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "expect_error.hpp"
#include "scalify/formats/scalar.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/train/ptq.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/trainer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using testing::scratch, testing::text_corpus, testing::tiny_run;

// A model that has learnt something: the tiny config trained long enough to sit well below the
// untrained loss, so quantisation damage shows.
const train::TrainConfig& trained_f32() {
  static const train::TrainConfig c = [] {
    train::TrainConfig t = tiny_run(text_corpus(), scratch("ptq_f32"), "f32");
    t.steps = 150;
    t.eval_every = 150;
    t.checkpoint_every = 150;
    t.model.d_model = 64;
    t.model.seq = 32;
    t.batch = 8;
    t.eval_windows = 64;
    train::train(t, false);
    return t;
  }();
  return c;
}

const train::PtqSweepRow& row(const std::vector<train::PtqSweepRow>& rows, const std::string& method, int bias = 0) {
  for (const auto& r : rows)
    if (r.method == method && (!method.starts_with("fp8_cscale") || r.bias == bias)) return r;
  throw std::runtime_error("no row " + method);
}

TEST(Ptq, AmaxAndMxKeepParityAndCscaleOnlyInsideABoundedBand) {
  const std::vector<train::PtqSweepRow> rows = train::ptq_sweep(trained_f32().out, -14, 16);
  const double f32 = row(rows, "f32").eval.loss;
  ASSERT_LT(f32, 0.75 * std::log(256.0)) << "the model must have learnt something for the comparison to mean anything";
  EXPECT_LT(std::fabs(row(rows, "fp8_amax").relative), 0.01);
  EXPECT_LT(std::fabs(row(rows, "mxfp8").relative), 0.01);
  const auto [lo, hi] = train::cscale_band(rows, 0.01);
  ASSERT_LE(lo, hi) << "some constant bias reaches parity";
  EXPECT_GT(lo, -14) << "the band is bounded below inside the sweep";
  EXPECT_LT(hi, 16) << "the band is bounded above inside the sweep";
  EXPECT_GT(row(rows, "fp8_cscale", lo - 1).relative, 0.01);
  EXPECT_GT(row(rows, "fp8_cscale", hi + 1).relative, 0.01);
  EXPECT_GT(row(rows, "fp8_cscale", -14).relative, 0.1) << "far below the band every weight underflows";
  EXPECT_GT(row(rows, "fp8_cscale", 16).relative, 0.1) << "far above it the activations clip";
}

TEST(Ptq, QuantisedCheckpointHoldsFp8CodesAndEvaluatesAsTheSweep) {
  const std::string src = trained_f32().out;
  const std::vector<train::PtqSweepRow> rows = train::ptq_sweep(src, 2, 2);
  const fs::path dir = scratch("ptq_files");
  fs::create_directories(dir);
  struct Case {
    train::PtqOptions o;
    std::string row;
  };
  for (const Case& k :
       {Case{{train::PtqMethod::amax, 0}, "fp8_amax"}, Case{{train::PtqMethod::mx, 0}, "mxfp8"},
        Case{{train::PtqMethod::cscale, 2}, "fp8_cscale"}, Case{{train::PtqMethod::amax, 0, true, Format::e5m2}, "fp8_amax_e5m2"},
        Case{{train::PtqMethod::cscale, 2, true, Format::e5m2}, "fp8_cscale_e5m2"}}) {
    const std::string file = (dir / (k.row + ".safetensors")).string();
    const std::vector<train::PtqWeight> w = train::quantize_checkpoint(src, file, k.o);
    EXPECT_EQ(w.size(), size_t(4 * trained_f32().model.layers));
    const io::SafeTensors st = io::read_safetensors(file);
    EXPECT_TRUE(train::is_quantized_checkpoint(st));
    const Tensor& codes = st.at("param.h0.attn.qkv.w");
    EXPECT_EQ(codes.dtype(), dtype_of(k.o.element));
    EXPECT_EQ(st.at("param.h0.attn.qkv.w.scale").dtype(), k.o.method == train::PtqMethod::mx ? DType::e8m0 : DType::f32);
    EXPECT_EQ(st.at("param.wte").dtype(), DType::f32) << "embeddings stay f32";
    if (k.o.method == train::PtqMethod::cscale) {
      EXPECT_EQ(st.at("param.h0.attn.qkv.w.scale").item(), 0.25) << "decode scale 2^-bias";
    }
    if (k.o.method == train::PtqMethod::amax) {
      // Checked without the quantiser: the bias from the source weight's amax (seed 003:
      // b = floor(log2(max / amax)), max 448 for e4m3, 57344 for e5m2) and every code the value
      // nearest to w 2^b, found by searching all 256 codes (the decoder is checked against
      // testvectors/ elsewhere).
      const Tensor source = io::read_safetensors(src + "/model.safetensors").at("param.h0.attn.qkv.w");
      const std::vector<float> wv = source.to_floats();
      float amax = 0;
      for (float v : wv) amax = std::max(amax, std::fabs(v));
      const Format f = k.o.element;
      const int b = int(std::floor(std::log2((f == Format::e4m3 ? 448.0 : 57344.0) / amax)));
      EXPECT_EQ(st.at("param.h0.attn.qkv.w.scale").item(), std::ldexp(1.0, -b));
      const std::vector<uint8_t> code_bytes(reinterpret_cast<const uint8_t*>(codes.raw_bytes()),
                                            reinterpret_cast<const uint8_t*>(codes.raw_bytes()) + codes.numel());
      for (size_t i = 0; i < wv.size(); ++i) {
        const double x = std::ldexp(double(wv[i]), b), got = decode(f, code_bytes[i]);
        double best = std::numeric_limits<double>::infinity();
        for (uint32_t c = 0; c < 256; ++c)
          if (std::isfinite(decode(f, c))) best = std::min(best, std::fabs(decode(f, c) - x));
        ASSERT_EQ(std::fabs(got - x), best) << "element " << i;
      }
    }
    for (const train::PtqWeight& x : w) {
      if (k.o.method == train::PtqMethod::amax) {
        EXPECT_EQ(x.clipped, 0) << x.name << ": the amax bias never clips";
      }
      EXPECT_EQ(x.bias, std::round(x.bias)) << x.name;
    }
    EXPECT_EQ(train::evaluate(file).loss, row(rows, k.row, 2).eval.loss) << k.row << ": the file evaluates as the in-memory sweep";
  }
}

TEST(Ptq, UnitScaledAndUmupRunsAreEvaluatedInTheirOwnModel) {
  // A unit-scaled or u-μP run's weights mean nothing in the standard model (a u-μP run's quantised
  // file once evaluated at 16 nats where its run gave 5.6): the sweep's f32 row is `eval RUN`
  // exactly, and the quantised file evaluates as its sweep row, near f32 (MXFP8 weights and
  // activations, well inside 5 % where the standard model is off by several nats).
  for (const std::string recipe : {"umup", "unit_f32"}) {
    train::TrainConfig t = tiny_run(text_corpus(), scratch("ptq_model_" + recipe), recipe);
    t.steps = 30;
    t.eval_every = t.checkpoint_every = 30;
    train::train(t, false);
    const std::vector<train::PtqSweepRow> rows = train::ptq_sweep(t.out, 0, 0);
    const double f32 = train::evaluate(t.out).loss;
    EXPECT_EQ(row(rows, "f32").eval.loss, f32) << recipe;
    const std::string file = (scratch("ptq_model_" + recipe + "_q") / "mx.safetensors").string();
    fs::create_directories(fs::path(file).parent_path());
    train::quantize_checkpoint(t.out, file, {train::PtqMethod::mx, 0});
    const double q = train::evaluate(file).loss;
    EXPECT_EQ(q, row(rows, "mxfp8").eval.loss) << recipe;
    EXPECT_LT(std::fabs(q - f32), 0.05 * f32) << recipe << ": f32 " << f32 << ", mxfp8 " << q;
  }
}

// Seed 003 takes FP8-AMAX's activation bias per data sample (Appendix G), so the rows whose
// activation scale is a statistic of the whole tensor (FP8-AMAX's bias, NVFP4's tensor scale) are
// evaluated one window per forward pass, a batch loss per window; the rows with no such statistic
// (CSCALE, MX, weights only) keep the run's batches of windows.
TEST(Ptq, ActivationStatisticsAreTakenPerWindow) {
  using train::PtqMethod;
  auto per_window = [](const train::PtqOptions& o) { return train::activation_scale_per_window(train::ptq_inference_recipe(o)); };
  EXPECT_TRUE(per_window({PtqMethod::amax, 0}));
  EXPECT_TRUE(per_window({PtqMethod::nvfp4, 0}));
  EXPECT_FALSE(per_window({PtqMethod::amax, 0, false}));
  EXPECT_FALSE(per_window({PtqMethod::nvfp4, 0, false}));
  EXPECT_FALSE(per_window({PtqMethod::cscale, 2}));
  EXPECT_FALSE(per_window({PtqMethod::mx, 0}));
  EXPECT_FALSE(per_window({PtqMethod::mxfp4, 0}));
  EXPECT_FALSE(train::activation_scale_per_window(quant::preset("f32")));

  const std::vector<train::PtqSweepRow> rows = train::ptq_sweep(trained_f32().out, 0, 0);
  const size_t windows = row(rows, "f32").eval.windows, batch = size_t(trained_f32().batch);
  ASSERT_GT(windows, batch);
  for (const char* r : {"fp8_amax", "nvfp4"}) {
    const train::EvalResult& e = row(rows, r).eval;
    EXPECT_EQ(e.batch_losses.size(), windows) << r;
    double sum = 0;
    for (double l : e.batch_losses) sum += l;
    EXPECT_DOUBLE_EQ(e.loss, sum / double(windows)) << r;
  }
  for (const char* r : {"f32", "fp8_cscale", "mxfp8", "nvfp4_weights"})
    EXPECT_EQ(row(rows, r).eval.batch_losses.size(), (windows + batch - 1) / batch) << r;
}

// FP4 post-training quantisation: NVFP4 files hold e2m1 codes, E4M3 block scales [K/16, N] and an
// f32 tensor scale, MXFP4 files E8M0 scales [K/32, N]; each decodes to the block quantiser's values
// (checked bit for bit against the published definitions in test_fp4) and evaluates as the
// in-memory sweep's row, with and without quantised activations.
TEST(Ptq, Fp4CheckpointsHoldE2m1CodesAndEvaluateAsTheSweep) {
  const std::string src = trained_f32().out;
  const std::vector<train::PtqSweepRow> rows = train::ptq_sweep(src, 0, 0);
  const fs::path dir = scratch("ptq_fp4");
  fs::create_directories(dir);
  const Tensor w = io::read_safetensors(src + "/model.safetensors").at("param.h0.attn.qkv.w");
  const int64_t K = w.size(0), N = w.size(1);
  struct Case {
    train::PtqOptions o;
    std::string row;
  };
  for (const Case& k : {Case{{train::PtqMethod::nvfp4, 0, true}, "nvfp4"}, Case{{train::PtqMethod::nvfp4, 0, false}, "nvfp4_weights"},
                        Case{{train::PtqMethod::mxfp4, 0, true}, "mxfp4"}, Case{{train::PtqMethod::mxfp4, 0, false}, "mxfp4_weights"}}) {
    const std::string file = (dir / (k.row + ".safetensors")).string();
    train::quantize_checkpoint(src, file, k.o);
    const io::SafeTensors st = io::read_safetensors(file);
    const Tensor& codes = st.at("param.h0.attn.qkv.w");
    EXPECT_EQ(codes.dtype(), DType::e2m1);
    const bool nv = k.o.method == train::PtqMethod::nvfp4;
    const BlockSpec spec = nv ? BlockSpec{16, 1, BlockScaleRule::nvfp4} : BlockSpec{32, 1, BlockScaleRule::mx_floor};
    EXPECT_EQ(st.at("param.h0.attn.qkv.w.scale").dtype(), nv ? DType::e4m3 : DType::e8m0);
    EXPECT_EQ(st.at("param.h0.attn.qkv.w.scale").shape(), (Shape{K / int64_t(spec.rows), N}));
    const BlockQuantized q = quantize_blocks(w.to_floats(), size_t(K), size_t(N), Format::e2m1, spec);
    EXPECT_EQ(std::memcmp(codes.raw_bytes(), q.codes.data(), q.codes.size()), 0) << k.row;
    EXPECT_EQ(st.at("param.h0.attn.qkv.w.scale").to_floats(), q.scales) << k.row;
    if (nv) {
      EXPECT_EQ(st.at("param.h0.attn.qkv.w.tensor_scale").item(), q.tensor_scale);
    }
    EXPECT_EQ(train::evaluate(file).loss, row(rows, k.row, 0).eval.loss) << k.row << ": the file evaluates as the in-memory sweep";
  }
  // Every FP4 row stays within [-1 %, +10 %] of f32 on this model: FP4 costs something, but not
  // the model (a wrong scale or code layout costs far more: fp8_cscale far outside its band
  // is > 10 %).
  for (const char* r : {"nvfp4", "nvfp4_weights", "mxfp4", "mxfp4_weights"}) {
    EXPECT_LT(row(rows, r, 0).relative, 0.1) << r;
    EXPECT_GT(row(rows, r, 0).relative, -0.01) << r;
  }
}

TEST(Ptq, BadInputsNameWhatWasWrong) {
  const std::string src = trained_f32().out;
  const fs::path dir = scratch("ptq_bad");
  fs::create_directories(dir);
  EXPECT_ERROR(train::parse_ptq_method("int4"), "amax, cscale, mx");
  EXPECT_ERROR(train::quantize_checkpoint(src, (dir / "x.safetensors").string(), {train::PtqMethod::cscale, 99}), "[-64, 64]");
  EXPECT_ERROR(train::quantize_checkpoint("/nonexistent.safetensors", (dir / "x.safetensors").string(), {}), "/nonexistent.safetensors");
  EXPECT_ERROR(train::ptq_sweep(src, 3, 1), "empty bias range");
  // A quantised file whose scale is not a power of two, and one with a bad method.
  const std::string good = (dir / "good.safetensors").string();
  train::quantize_checkpoint(src, good, {});
  io::SafeTensors st = io::read_safetensors(good);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.fc.w.scale") t = Tensor::full({}, 0.3);
  io::write_safetensors((dir / "bad_scale.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "bad_scale.safetensors").string()), "param.h0.mlp.fc.w");
  st = io::read_safetensors(good);
  st.metadata["scalify.ptq"] = "{\"version\":1,\"method\":\"int4\",\"element\":\"e4m3\",\"bias\":0}";
  io::write_safetensors((dir / "bad_method.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "bad_method.safetensors").string()), "scalify.ptq");
  // An MX file with a NaN block scale (E8M0 0xFF), an f32 parameter holding NaN.
  const std::string mx = (dir / "mx.safetensors").string();
  train::quantize_checkpoint(src, mx, {train::PtqMethod::mx, 0});
  st = io::read_safetensors(mx);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.out.w.scale") t.raw_bytes()[0] = std::byte{0xFF};
  io::write_safetensors((dir / "nan_scale.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "nan_scale.safetensors").string()),
               "'param.h0.mlp.out.w' has a block scale that is negative or not finite");
  // An NVFP4 file with a byte that is no e2m1 code, and one with a negative E4M3 block scale.
  const std::string nv = (dir / "nv.safetensors").string();
  train::quantize_checkpoint(src, nv, {train::PtqMethod::nvfp4, 0});
  st = io::read_safetensors(nv);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.fc.w") t.raw_bytes()[5] = std::byte{0xFF};
  io::write_safetensors((dir / "bad_code.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "bad_code.safetensors").string()), "'param.h0.mlp.fc.w' holds a byte that is no e2m1 code");
  st = io::read_safetensors(nv);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.fc.w.scale") t.raw_bytes()[0] |= std::byte{0x80};  // the E4M3 sign bit
  io::write_safetensors((dir / "negative_scale.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "negative_scale.safetensors").string()), "'param.h0.mlp.fc.w' has a block scale that is negative");
  st = io::read_safetensors(good);
  for (auto& [name, t] : st.tensors)
    if (name == "param.lnf.w") t.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  io::write_safetensors((dir / "nan_param.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "nan_param.safetensors").string()), "'param.lnf.w' holds NaN or infinite values");
  // A scale of the wrong dtype, one past f32's range.
  st = io::read_safetensors(good);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.fc.w.scale") t = Tensor::full({}, 0.5).to(DType::f16);
  io::write_safetensors((dir / "f16_scale.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "f16_scale.safetensors").string()), "'param.h0.mlp.fc.w' needs an f32 scalar scale, has f16");
  st = io::read_safetensors(good);
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.fc.w.scale") t = Tensor::full({}, std::ldexp(1.0, 127));
  io::write_safetensors((dir / "huge_scale.safetensors").string(), st);
  EXPECT_ERROR(train::evaluate((dir / "huge_scale.safetensors").string()), "param.h0.mlp.fc.w");
  // Only eval reads a quantised checkpoint; quantising or resuming from it is refused by name.
  EXPECT_ERROR(train::quantize_checkpoint(good, (dir / "x.safetensors").string(), {}), "is a quantised checkpoint");
  EXPECT_FALSE(fs::exists(dir / "x.safetensors")) << "a failed quantisation leaves no file";
  // The output may not be the input checkpoint, nor a folder.
  const std::string ckpt = (fs::path(src) / "checkpoint.safetensors").string();
  EXPECT_ERROR(train::quantize_checkpoint(src, ckpt, {}), "which this command reads or the run owns");
  EXPECT_ERROR(train::quantize_checkpoint(src, dir.string(), {}), "is a folder");
  EXPECT_NO_THROW(io::read_safetensors(ckpt).metadata.at("scalify.state")) << "the training checkpoint is intact";
}

// A training checkpoint whose weights hold NaN (a corrupt file: the trainer stops before saving
// one) is refused by evaluation, quantisation and the sweep, naming the parameter; inspection
// still reads it.
TEST(Ptq, NonFiniteTrainingCheckpointIsRefusedByName) {
  const fs::path dir = scratch("ptq_nan");
  fs::create_directories(dir);
  io::SafeTensors st = io::read_safetensors((fs::path(trained_f32().out) / "checkpoint.safetensors").string());
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.attn.qkv.w") t.data<float>()[5] = std::numeric_limits<float>::infinity();
  const std::string nan = (dir / "nan.safetensors").string();
  io::write_safetensors(nan, st);
  const std::string why = "parameter 'h0.attn.qkv.w' holds NaN or infinite values";
  EXPECT_ERROR(train::evaluate(nan), why);
  EXPECT_ERROR(train::quantize_checkpoint(nan, (dir / "q.safetensors").string(), {}), why);
  EXPECT_ERROR(train::ptq_sweep(nan, 0, 1), why);
  EXPECT_FALSE(fs::exists(dir / "q.safetensors"));
  st.metadata["step"] = "12x";
  io::write_safetensors(nan, st);
  EXPECT_ERROR(train::evaluate(nan), "metadata 'step' is not a step number ('12x')");
  // Finite weights whose activations overflow: evaluation, the sweep and sampling say so instead
  // of printing NaN.
  st = io::read_safetensors((fs::path(trained_f32().out) / "checkpoint.safetensors").string());
  for (auto& [name, t] : st.tensors)
    if (name == "param.h0.mlp.fc.w") t = Tensor::full(t.shape(), 3e38);
  const std::string big = (dir / "big.safetensors").string();
  io::write_safetensors(big, st);
  EXPECT_ERROR(train::evaluate(big), "is not finite");
  EXPECT_ERROR(train::ptq_sweep(big, 0, 0), "f32 validation loss");
  EXPECT_ERROR(train::sample(big, "the ", {}), "logits");
}

TEST(Ptq, SweepTableSaysWhyARowHasNoLoss) {
  const train::EvalResult f32{2.0, 2.0 / std::log(2.0), 8, {}};
  const std::vector<train::PtqSweepRow> rows = {{"f32", 0, f32, 0, ""},
                                                {"mxfp8", 0, {NAN, NAN, 0, {}}, NAN, "a reduction dimension is not a multiple of 32"},
                                                {"fp8_cscale", 0, {NAN, NAN, 8, {}}, NAN, ""},
                                                {"fp8_cscale", 1, {2.01, 2.9, 8, {}}, 0.005, ""}};
  const std::string md = train::ptq_sweep_markdown(rows);
  EXPECT_NE(md.find("| mxfp8 |  | n/a (a reduction dimension is not a multiple of 32) | |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fp8_cscale | 0 | not finite | |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fp8_cscale | 1 | 2.0100 | +0.50% |"), std::string::npos) << md;
  EXPECT_NE(md.find("biases [1, 1]"), std::string::npos) << md;
}

}  // namespace
}  // namespace scalify
