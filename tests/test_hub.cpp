// Pretrained Hugging Face models (issue 34): rotary positions and grouped-query attention, the
// loader's logits against transformers' on the committed tiny models (tests/data/hf, made by
// make_reference.py), export and re-import, and bad model folders.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "expect_error.hpp"
#include "gradcheck.hpp"
#include "scalify/hub/gguf_file.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/platform/crc32c.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/nn/rope.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/token_file.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/pretrained_ptq.hpp"
#include "scalify/train/trainer.hpp"
#include "train_fixtures.hpp"

namespace scalify {
namespace {

namespace fs = std::filesystem;
using testing::scratch;
using testing::slurp;
using testing::spit;

const std::string kData = SCALIFY_HF_DATA_DIR;

double dot_at(const Tensor& x, int64_t t, int64_t h, int64_t hd, const Tensor& y, int64_t s) {
  const std::vector<double> a = x.to_vector(), b = y.to_vector();
  const int64_t H = x.size(2);
  double d = 0;
  for (int64_t i = 0; i < hd; ++i) d += a[size_t((t * H + h) * hd + i)] * b[size_t((s * H + h) * hd + i)];
  return d;
}

TEST(Rotary, IsTheIdentityAtPositionZeroAndKeepsNorms) {
  const Tensor x = Tensor::randn({1, 6, 2, 8}, 1, 1.0, DType::f64);
  const Tensor y = nn::rotary(Var(x), 10000.0).value();
  // cos and sin are f32 values (as Hugging Face's), so cos^2 + sin^2 is 1 to about 1e-7.
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t h = 0; h < 2; ++h) {
      const double norm2 = dot_at(x, t, h, 8, x, t);
      EXPECT_NEAR(dot_at(y, t, h, 8, y, t), norm2, 1e-7 * norm2) << t;
    }
  const std::vector<double> xv = x.to_vector(), yv = y.to_vector();
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(yv[i], xv[i]);  // position 0: every angle is 0
}

TEST(Rotary, ScoresDependOnlyOnTheDistance) {
  // The same query and key vector placed at every position: q_t . k_s is a function of t - s,
  // which is what rotary embeddings are for (a wrong sign or angle breaks it).
  const Tensor v = Tensor::randn({1, 1, 1, 16}, 2, 1.0, DType::f64);
  const Tensor w = Tensor::randn({1, 1, 1, 16}, 3, 1.0, DType::f64);
  const Tensor q = nn::rotary(Var(v.expand({1, 9, 1, 16}).contiguous()), 500.0).value();
  const Tensor k = nn::rotary(Var(w.expand({1, 9, 1, 16}).contiguous()), 500.0).value();
  for (int64_t d = 0; d < 4; ++d)
    for (int64_t s = 0; s + d < 9; ++s) EXPECT_NEAR(dot_at(q, s + d, 0, 16, k, s), dot_at(q, d, 0, 16, k, 0), 1e-5) << d << " " << s;
  EXPECT_GT(std::abs(dot_at(q, 1, 0, 16, k, 0) - dot_at(q, 0, 0, 16, k, 0)), 1e-3);  // and it does rotate
}

TEST(Rotary, GradientMatchesFiniteDifferences) {
  testing::gradcheck("rotary", [](auto& v) { return nn::rotary(v[0], 10000.0); }, {Tensor::randn({2, 5, 3, 6}, 4, 1.0, DType::f64)});
}

TEST(Rotary, RefusesAnOddHeadWidth) { EXPECT_ERROR(nn::rotary(Var(Tensor::zeros({1, 2, 1, 3})), 10000.0), "hd even"); }

// The model of DIR with its weights.
nn::Gpt load(const std::string& dir) {
  const hub::HfConfig c = hub::read_hf_config(dir);
  nn::Gpt model(c.model, 0);
  nn::NamedParams params;
  for (const auto& [name, t] : hub::load_hf_weights(dir, c)) params.push_back({name, Var(t, true)});
  model.set_parameters(params);
  return model;
}

// Largest |ours - reference| over the largest |reference|.
double relative_error(const Tensor& ours, const Tensor& reference) {
  const std::vector<double> a = ours.to_vector(), b = reference.to_vector();
  double diff = 0, peak = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    peak = std::max(peak, std::abs(b[i]));
  }
  return diff / peak;
}

class ReferenceLogits : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceLogits, MatchTransformers) {
  const std::string dir = kData + "/" + GetParam();
  const nn::Gpt model = load(dir);
  const io::SafeTensors ref = io::read_safetensors(dir + "/reference.safetensors", io::Unverified::quiet);
  NoGrad no_grad;
  const Tensor logits = model.logits(ref.at("ids")).value();
  ASSERT_EQ(logits.shape(), ref.at("logits").shape());
  // f32 sums in another order than PyTorch's: measured 8.0e-7 (GPT-2), 9.6e-7 / 1.06e-6 (Llama),
  // 9.7e-7 / 9.9e-7 (GQA Llama), 5.3e-7 (erf GPT-2) of the largest logit, natively / with the AVX2
  // and f32-GEMM paths.
  EXPECT_LT(relative_error(logits, ref.at("logits")), 3e-6);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ReferenceLogits, ::testing::Values("tiny_gpt2", "tiny_llama", "tiny_llama_gqa", "tiny_gpt2_erf"));

TEST(HfConfig, ReadsEachFamily) {
  const hub::HfConfig g = hub::read_hf_config(kData + "/tiny_gpt2");
  EXPECT_EQ(g.family, hub::Family::gpt2);
  EXPECT_EQ(g.model.vocab, 1000);
  EXPECT_EQ(g.model.seq, 64);
  EXPECT_TRUE(g.model.tied_head && g.model.bias && g.model.learned_positions());
  const hub::HfConfig l = hub::read_hf_config(kData + "/tiny_llama_gqa");
  EXPECT_EQ(l.family, hub::Family::llama);
  EXPECT_EQ(l.model.kv_heads, 2);
  EXPECT_EQ(l.model.mlp_hidden, 160);
  EXPECT_EQ(l.model.rope_theta, 500000.0);
  EXPECT_EQ(l.model.norm_eps, 1e-5);
  EXPECT_EQ(l.dtype, DType::bf16);
  EXPECT_TRUE(l.model.tied_head && !l.model.bias);
}

TEST(HfExport, RoundTripsEveryParameter) {
  for (const char* name : {"tiny_gpt2", "tiny_llama", "tiny_llama_gqa"}) {
    const hub::HfConfig c = hub::read_hf_config(kData + "/" + name);
    const std::map<std::string, Tensor> params = hub::load_hf_weights(kData + "/" + name, c);
    const fs::path out = scratch(std::string("export_") + name);
    hub::save_hf_model(out.string(), c, params);
    const hub::HfConfig back = hub::read_hf_config(out.string());
    EXPECT_EQ(back.family, c.family);
    EXPECT_EQ(back.model.parameter_count(), c.model.parameter_count());
    EXPECT_EQ(back.dtype, c.dtype);
    const std::map<std::string, Tensor> again = hub::load_hf_weights(out.string(), back);
    ASSERT_EQ(again.size(), params.size()) << name;
    for (const auto& [n, t] : params) EXPECT_EQ(again.at(n).to_vector(), t.to_vector()) << name << " " << n;
  }
}

TEST(HfExport, TheEnginesOwnByteModelIsGpt2Shaped) {
  nn::GptConfig c;
  c.d_model = 32;
  c.layers = 1;
  EXPECT_EQ(hub::family_of(c), hub::Family::gpt2);
  c.rope_theta = 10000;
  EXPECT_ERROR(hub::family_of(c), "no Hugging Face layout");
  c = {};
  c.unit_scaled = true;
  EXPECT_ERROR(hub::family_of(c), "unit-scaled");
}

// Scalify's own models, GPT-2-shaped (the byte-level GPT) and Llama-shaped, give the same logits
// after a trip through the Hugging Face layout.
TEST(HfExport, AnEngineModelKeepsItsLogits) {
  nn::GptConfig gpt;
  gpt.vocab = 256;
  gpt.seq = 16;
  gpt.d_model = 32;
  gpt.layers = 2;
  gpt.heads = 2;
  nn::GptConfig llama = gpt;
  llama.rms_norm = llama.swiglu = true;
  llama.bias = llama.tied_head = false;
  llama.rope_theta = 10000;
  llama.kv_heads = 1;
  llama.mlp_hidden = 48;
  for (const nn::GptConfig& c : {gpt, llama}) {
    const nn::Gpt model(c, 7);
    std::map<std::string, Tensor> params;
    for (const auto& [name, v] : model.parameters()) params[name] = v.value();
    hub::HfConfig hf;
    hf.model = c;
    hf.family = hub::family_of(c);
    const fs::path out = scratch(std::string("engine_") + hub::family_name(hf.family));
    hub::save_hf_model(out.string(), hf, params);
    const nn::Gpt back = load(out.string());
    const Tensor ids = Tensor::from_indices({3, 200, 17, 255, 0, 9, 9, 64}, {2, 4});
    NoGrad no_grad;
    EXPECT_EQ(back.logits(ids).value().to_vector(), model.logits(ids).value().to_vector()) << hub::family_name(hf.family);
  }
}

// Seed 003's study on a pretrained model: the f32 row is the model's own loss on the tokens, and
// FP8-AMAX's biases follow the rule b = floor(log2(448 / amax)), computed here from the weights
// and, for the first layer's qkv input (the first norm's output, before any quantised layer), from
// a probe of the f32 model on the same single window.
TEST(PretrainedPtq, SweepAndAmaxBiases) {
  const train::Pretrained p = train::load_pretrained(kData + "/tiny_llama");
  std::vector<int32_t> tokens(65);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % 1000);
  const train::PretrainedPtq study = train::pretrained_ptq(p, tokens, 64, 1, -1, 1);
  ASSERT_EQ(study.rows.size(), 8u + 2 * 3u);  // f32, AMAX e4m3 and e5m2, MXFP8, four FP4; CSCALE e4m3 and e5m2 at 3 biases
  EXPECT_EQ(study.rows[0].method, "f32");
  EXPECT_EQ(study.rows[0].eval.loss, train::evaluate_tokens(*p.session, tokens, p.tokenizer.get(), 64, 1).loss);
  const auto rule = [](double amax) { return int(std::floor(std::log2(448.0 / amax))); };
  const std::map<std::string, Tensor> f32 = train::parameter_values(*p.session);
  ASSERT_EQ(study.biases.size(), 8u);
  for (const train::LayerScalingBias& b : study.biases) {
    const char* engine = b.kind == "attn qkv"          ? "attn.qkv"
                         : b.kind == "attn out"        ? "attn.proj"
                         : b.kind == "ff intermediate" ? "mlp.fc"
                                                       : "mlp.out";
    double amax = 0;
    for (double v : f32.at(std::string("h").append(std::to_string(b.layer)).append(".").append(engine).append(".w")).to_vector())
      amax = std::max(amax, std::abs(v));
    EXPECT_EQ(b.weight, rule(amax)) << b.layer << " " << b.kind;
  }
  nn::ScaleProbe probe;
  double input_amax = 0;
  probe.observe = [&](const std::string& name, bool gradient, const ScaledTensor& t) {
    if (name == "h0.ln1" && !gradient)
      for (double v : t.value().to_vector()) input_amax = std::max(input_amax, std::abs(v));
  };
  std::vector<int64_t> ids(tokens.begin(), tokens.begin() + 64);
  {
    NoGrad no_grad;
    p.session->model.logits(Tensor::from_indices(ids, {1, 64}), &probe);
  }
  ASSERT_GT(input_amax, 0);
  EXPECT_EQ(study.biases[0].kind, "attn qkv");
  EXPECT_EQ(study.biases[0].activation, rule(input_amax));
  const fs::path out = scratch("ptq_study");
  train::write_pretrained_ptq(out.string(), study);
  EXPECT_NE(slurp(out / "scaling_biases.csv").find("0,attn qkv," + std::to_string(study.biases[0].weight) + ","), std::string::npos);
  EXPECT_NE(slurp(out / "report.md").find("within 0.5% of f32"), std::string::npos);
}

train::TrainConfig fine_tuning(const std::string& model, const fs::path& out, const std::string& recipe = "f32") {
  train::TrainConfig c;
  c.init = kData + "/" + model;
  c.data = testing::text_corpus().string();
  c.out = out.string();
  c.recipe = recipe;
  c.steps = 4;
  c.batch = 2;
  c.warmup = 1;
  c.eval_every = 2;
  c.eval_windows = 4;
  c.checkpoint_every = 2;
  c.lr = 1e-3;
  return c;
}

// The tensors of a safetensors file by name (its metadata, which names the run folder, aside).
std::map<std::string, std::vector<double>> tensors_of(const fs::path& file) {
  std::map<std::string, std::vector<double>> t;
  for (const auto& [name, v] : io::read_safetensors(file.string()).tensors) t[name] = v.to_vector();
  return t;
}

// Fine-tuning (scalify train --init DIR): step 0 is the pretrained model, the text goes through
// its tokenizer, and a resumed run equals an uninterrupted one.
TEST(FineTune, StartsFromThePretrainedWeightsAndResumesBitForBit) {
  for (const char* model : {"tiny_gpt2", "tiny_llama_gqa"}) {
    const fs::path a = scratch(std::string("ft_a_") + model), b = scratch(std::string("ft_b_") + model);
    const train::TrainResult r = train::train(fine_tuning(model, a, "fp8_amax"), false, {}, 0, /*save_initial=*/true);
    EXPECT_TRUE(std::isfinite(r.val_loss) && r.val_loss > 0) << model;
    const hub::HfConfig hf = hub::read_hf_config(kData + "/" + model);
    const std::map<std::string, std::vector<double>> initial = tensors_of(a / "initial.safetensors");
    for (const auto& [name, t] : hub::load_hf_weights(kData + "/" + model, hf))
      EXPECT_EQ(initial.at("param." + name), t.to_vector()) << model << " " << name;
    train::TrainConfig half = fine_tuning(model, b, "fp8_amax");
    train::train(half, false, {}, 2);
    train::train(train::run_config(b.string()), true, {});
    EXPECT_EQ(tensors_of(b / "checkpoint.safetensors"), tensors_of(a / "checkpoint.safetensors")) << model;
    EXPECT_NE(slurp(a / "train.log").find("validation tokens, "), std::string::npos) << model;
    // Exported, it is a folder with the pretrained model's tokenizer.
    train::export_checkpoint(a.string(), (a / "hf").string());
    EXPECT_TRUE(fs::exists(a / "hf" / (std::string(model) == "tiny_gpt2" ? "merges.txt" : "tokenizer.model"))) << model;
  }
}

// A fine-tune on windows shorter than the model's context declares the model's context when
// exported, as a Hugging Face folder and as GGUF alike (GGUF wrote the training windows' length).
TEST(FineTune, ExportsDeclareThePretrainedContextNotTheTrainingWindow) {
  const fs::path model = scratch("ft_short_model"), run = scratch("ft_short_run");
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kData + "/tiny_llama_gqa/" + f, model / f);  // no tokenizer
  const hub::HfConfig hf = hub::read_hf_config(model.string());
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 37 % uint64_t(hf.model.vocab));
  tokenize::write_token_file((model / "tokens.bin").string(), tokens, hf.model.vocab);
  train::TrainConfig c = fine_tuning("", run);
  c.init = model.string();
  c.data = (model / "tokens.bin").string();
  c.steps = 1;
  c.model.seq = hf.model.seq / 4;
  c.given.insert("seq");
  train::train(c, false, {});
  train::export_checkpoint(run.string(), (run / "hf").string());
  EXPECT_EQ(hub::read_hf_config((run / "hf").string()).model.seq, hf.model.seq);
  train::export_gguf(run.string(), (run / "model.gguf").string(), "f32");
  EXPECT_EQ(hub::GgufFile::open((run / "model.gguf").string()).get_uint("llama.context_length"), uint64_t(hf.model.seq));
}

// A fine-tuned run records what it was trained from (the init folder's absolute path and a
// CRC-32C of each tokenizer and weight file) and refuses a folder that changed, naming the file,
// where it used a different tokenizer in silence (and an export came out without one).
TEST(FineTune, ARunRefusesAnInitFolderThatChangedNamingTheFile) {
  const fs::path model = scratch("ft_source"), run = scratch("ft_recorded");
  fs::copy(kData + "/tiny_gpt2", model);
  train::TrainConfig c = fine_tuning("tiny_gpt2", run);
  c.init = fs::relative(model).string();  // as typed, relative to this directory
  train::train(c, false, {}, 2);
  const train::TrainConfig recorded = train::run_config(run.string());
  EXPECT_EQ(recorded.init, fs::absolute(model).lexically_normal().string());
  EXPECT_EQ(
      nlohmann::json::parse(recorded.init_files),
      (nlohmann::json{
          {"config.json",
           platform::crc32c_text(platform::crc32c(slurp(model / "config.json").data(), slurp(model / "config.json").size()))},
          {"merges.txt", platform::crc32c_text(platform::crc32c(slurp(model / "merges.txt").data(), slurp(model / "merges.txt").size()))},
          {"vocab.json",
           platform::crc32c_text(platform::crc32c(slurp(model / "vocab.json").data(), slurp(model / "vocab.json").size()))}}));
  EXPECT_EQ(nlohmann::json::parse(recorded.init_weights).size(), 1u) << "model.safetensors alone: " << recorded.init_weights;
  const double loss = train::evaluate(run.string()).loss;
  {  // from another directory the run still finds its model
    struct InDirectory {
      fs::path before = fs::current_path();
      ~InDirectory() { fs::current_path(before); }
    } restore;
    fs::current_path("/");
    EXPECT_EQ(train::evaluate(run.string()).loss, loss);
  }
  // The tokenizer changed: every use of the run refuses, naming the file.
  const std::string merges = slurp(model / "merges.txt");
  spit(model / "merges.txt", merges + "a b\n");
  const std::string changed = (model / "merges.txt").string() + "' changed";
  EXPECT_ERROR(train::evaluate(run.string()), changed);
  EXPECT_ERROR(train::sample(run.string(), "the", {}), changed);
  EXPECT_ERROR(train::export_checkpoint(run.string(), (run / "hf").string()), changed);
  EXPECT_FALSE(fs::exists(run / "hf")) << "the refused export wrote a folder";
  train::TrainConfig resume = recorded;
  resume.steps = 4;
  EXPECT_ERROR(train::train(resume, true), changed);
  fs::remove(model / "merges.txt");
  EXPECT_ERROR(train::evaluate(run.string()), (model / "merges.txt").string() + "' is missing");
  spit(model / "merges.txt", merges);
  spit(model / "tokenizer.model", "x");
  EXPECT_ERROR(train::evaluate(run.string()), (model / "tokenizer.model").string() + "' appeared");
  fs::remove(model / "tokenizer.model");
  EXPECT_EQ(train::evaluate(run.string()).loss, loss) << "restored, the run evaluates as before";
  // config.json gives a resumed run its shape: a changed one is named, not blamed on the config.
  const std::string config = slurp(model / "config.json");
  spit(model / "config.json", config + " ");
  EXPECT_ERROR(train::train(resume, true), (model / "config.json").string() + "' changed");
  // A new run from the recorded config records the folder as it now is.
  train::TrainConfig again = recorded;
  again.out = scratch("ft_again").string();
  again.steps = 1;
  train::train(again, false);
  EXPECT_NE(train::run_config(again.out).init_files, recorded.init_files);
  spit(model / "config.json", config);
  fs::remove_all(model);
  EXPECT_ERROR(train::evaluate(run.string()), model.string() + "' that '" + run.string() + "' was fine-tuned from no longer exists");
}

// Tokens as bytes (a byte vocabulary): the tokenised corpus's bits per byte are the loss in bits.
TEST(FineTune, BitsPerByteOfByteTokensAreTheLossInBits) {
  nn::GptConfig c;
  c.seq = 16;
  c.d_model = 16;
  c.layers = 1;
  c.heads = 2;
  const nn::Gpt model(c, 3);
  hub::HfConfig hf;
  hf.model = c;
  std::map<std::string, Tensor> params;
  for (const auto& [name, v] : model.parameters()) params[name] = v.value();
  const fs::path dir = scratch("byte_model");
  hub::save_hf_model(dir.string(), hf, params);
  spit(dir / "vocab.json", tokenize::byte_vocab_json());
  spit(dir / "merges.txt", "#version: 0.2\n");
  train::TrainConfig cfg = fine_tuning("", scratch("byte_ft"));
  cfg.init = dir.string();
  cfg = train::with_pretrained_model(cfg);
  const train::Corpus corpus = train::corpus_for(cfg);
  ASSERT_EQ(corpus.token_bytes, std::vector<uint32_t>(256, 1));
  const train::Pretrained p = train::load_pretrained(dir.string());
  const train::EvalResult e = train::eval_session(*p.session, corpus);
  EXPECT_NEAR(e.bits_per_byte, e.loss / std::log(2.0), 1e-12 * e.loss);
}

TEST(FineTune, BadConfigsAreClearErrors) {
  train::TrainConfig c = fine_tuning("tiny_gpt2", scratch("ft_bad"));
  c.model.d_model = 32;
  EXPECT_ERROR(train::with_pretrained_model(c), "gives the model's shape");
  c = fine_tuning("tiny_gpt2", scratch("ft_bad"), "unit_f32");
  EXPECT_ERROR(train::with_pretrained_model(c), "unit-scaled model");
  c = fine_tuning("tiny_gpt2", scratch("ft_bad"));
  c.init.clear();
  c.model.vocab = 1000;
  EXPECT_ERROR(c.validate(), "must be 256 (byte tokens) unless init");
  c = train::with_pretrained_model(fine_tuning("tiny_llama", scratch("ft_bad")));
  c.data = (kData + "/tiny_gpt2/model.safetensors");  // binary: neither text nor a token file
  EXPECT_ERROR(train::corpus_for(c), "not text");
}

// Greedy sampling picks the most likely next token after the whole prompt, step after step.
TEST(FineTune, GreedySamplingFollowsTheLogits) {
  const train::Pretrained p = train::load_pretrained(kData + "/tiny_llama");
  train::SampleOptions o;
  o.temperature = 0;
  o.tokens = 3;
  const std::vector<int32_t> prompt = {5, 17, 400, 9};
  const std::vector<int32_t> out = train::sample_ids(*p.session, prompt, o, "tiny_llama");
  ASSERT_EQ(out.size(), 3u);
  std::vector<int64_t> ctx(prompt.begin(), prompt.end());
  NoGrad no_grad;
  for (int32_t next : out) {
    const int64_t T = int64_t(ctx.size());
    const std::vector<double> l = p.session->model.logits(Tensor::from_indices(ctx, {1, T})).value().to_vector();
    const auto last = l.begin() + std::ptrdiff_t((T - 1) * 1000);
    EXPECT_EQ(next, std::max_element(last, last + 1000) - last);
    ctx.push_back(next);
  }
}

// A model built without drawing its weights runs only once every parameter has a value.
TEST(HfLoad, AnUnsetParameterStopsTheModel) {
  nn::GptConfig c;
  c.d_model = 16;
  c.layers = 1;
  c.heads = 2;
  nn::Gpt model(c, 0, {}, nn::Weights::unset);
  nn::NamedParams all = nn::Gpt(c, 1).parameters();
  all.pop_back();  // lnf.b stays unset
  model.set_parameters(all);
  EXPECT_ERROR(model.logits(Tensor::from_indices({1, 2}, {1, 2})), "parameter 'lnf.b' was never given a value");
}

// A copy of a tiny model's folder to damage.
fs::path copy_of(const std::string& name, const std::string& as) {
  const fs::path dst = scratch(as);
  fs::copy(kData + "/" + name, dst, fs::copy_options::recursive);
  return dst;
}

void set_config(const fs::path& dir, const std::string& key, const nlohmann::json& value) {
  nlohmann::json j = nlohmann::json::parse(slurp(dir / "config.json"));
  j[key] = value;
  spit(dir / "config.json", j.dump());
}

std::string load_error(const fs::path& dir) {
  return testing::error_of([&] { hub::load_hf_weights(dir.string(), hub::read_hf_config(dir.string())); });
}

// A model's longest context need not fit in memory to evaluate it at a shorter one: loading for
// inference counts the parameters and a window of logits, not attention at the model's context
// (at 65536 positions that alone would be 4 heads x 65536^2 f32 values, 69 GB, per window).
TEST(HfLoad, ALongContextModelEvaluatesAtAShortOne) {
  const fs::path dir = copy_of("tiny_llama", "long_context");
  set_config(dir, "max_position_embeddings", 65536);
  const train::Pretrained p = train::load_pretrained(dir.string());
  EXPECT_EQ(p.hf.model.seq, 65536);
  std::vector<int32_t> tokens(33);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 37 % uint64_t(p.hf.model.vocab));
  const train::Pretrained short_one = train::load_pretrained((kData + "/tiny_llama"));
  EXPECT_EQ(train::evaluate_tokens(*p.session, tokens, nullptr, 32, 1).loss,
            train::evaluate_tokens(*short_one.session, tokens, nullptr, 32, 1).loss)
      << "rotary positions: the same weights give the same loss whatever the longest context";
}

TEST(HfBadInput, ConfigErrorsNameTheFileAndField) {
  EXPECT_ERROR(hub::read_hf_config("/nonexistent/model"), "not a model folder");
  const fs::path d = copy_of("tiny_gpt2", "bad_config");
  set_config(d, "model_type", "bert");
  EXPECT_ERROR(hub::read_hf_config(d.string()), "\"model_type\" must be gpt2 or llama");
  set_config(d, "model_type", "gpt2");
  set_config(d, "activation_function", "relu");
  EXPECT_ERROR(hub::read_hf_config(d.string()), "activation_function");
  set_config(d, "activation_function", "gelu_new");
  set_config(d, "n_embd", "64");
  EXPECT_ERROR(hub::read_hf_config(d.string()), "\"n_embd\" must be an integer");
  set_config(d, "n_embd", 66);  // not divisible by 4 heads
  EXPECT_ERROR(hub::read_hf_config(d.string()), "heads must divide d_model");
  spit(d / "config.json", "{not json");
  EXPECT_ERROR(hub::read_hf_config(d.string()), (d / "config.json").string() + ": not valid JSON");
  const fs::path l = copy_of("tiny_llama", "bad_llama_config");
  set_config(l, "rope_scaling", nlohmann::json{{"type", "linear"}, {"factor", 2.0}});
  EXPECT_ERROR(hub::read_hf_config(l.string()), "rope_scaling");
  set_config(l, "rope_scaling", nullptr);
  set_config(l, "num_key_value_heads", 3);
  EXPECT_ERROR(hub::read_hf_config(l.string()), "kv_heads must divide heads");
  set_config(l, "num_key_value_heads", 4);
  set_config(l, "rms_norm_eps", 0);
  EXPECT_ERROR(hub::read_hf_config(l.string()), "\"rms_norm_eps\" must be in (0, 1)");
  set_config(l, "rms_norm_eps", 1e-6);
  set_config(l, "rope_parameters", nlohmann::json{{"rope_theta", 0}});
  EXPECT_ERROR(hub::read_hf_config(l.string()), "\"rope_theta\" must be above 1");
  set_config(l, "rope_parameters", nlohmann::json::array({1, 2}));
  EXPECT_ERROR(hub::read_hf_config(l.string()), "\"rope_parameters\" must be an object");
}

TEST(HfBadInput, AConfigThatLiesAboutTheWeights) {
  const fs::path d = copy_of("tiny_gpt2", "lying_config");
  set_config(d, "n_layer", 3);
  EXPECT_NE(load_error(d).find("tensor 'h.2.ln_1.weight' is missing"), std::string::npos) << load_error(d);
  set_config(d, "n_layer", 1);
  EXPECT_NE(load_error(d).find("tensor 'h.1."), std::string::npos) << load_error(d);
  EXPECT_NE(load_error(d).find("has no place in the gpt2 model config.json describes"), std::string::npos) << load_error(d);
  set_config(d, "n_layer", 2);
  set_config(d, "n_inner", 128);
  EXPECT_NE(load_error(d).find("'h.0.mlp.c_fc.weight' has shape [64, 256], config.json implies [64, 128]"), std::string::npos)
      << load_error(d);
}

TEST(HfBadInput, ShardsMissingOrTruncated) {
  const fs::path d = copy_of("tiny_llama", "bad_shards");
  const std::string shard = slurp(d / "model-00002-of-00004.safetensors");
  spit(d / "model-00002-of-00004.safetensors", shard.substr(0, shard.size() / 2));
  EXPECT_NE(load_error(d).find("model-00002-of-00004.safetensors"), std::string::npos) << load_error(d);
  fs::remove(d / "model-00002-of-00004.safetensors");
  EXPECT_NE(load_error(d).find("names the shard model-00002-of-00004.safetensors, which is missing"), std::string::npos) << load_error(d);
  fs::remove(d / "model.safetensors.index.json");
  EXPECT_NE(load_error(d).find("no model.safetensors"), std::string::npos) << load_error(d);
}

// What transformers also reads: a Llama base model saved alone (no "model." prefix), a tied head
// stored anyway. What it would misread: model.safetensors beside an index of shards.
TEST(HfLoad, BaseModelNamesAndAStoredTiedHead) {
  const fs::path d = copy_of("tiny_llama_gqa", "llama_base");
  io::SafeTensors st = io::read_safetensors((d / "model.safetensors").string(), io::Unverified::quiet);
  for (auto& [name, t] : st.tensors)
    if (name.starts_with("model.")) name = name.substr(6);
  st.tensors.emplace_back("lm_head.weight", st.at("embed_tokens.weight"));
  io::write_safetensors((d / "model.safetensors").string(), st);
  const auto weights = hub::load_hf_weights(d.string(), hub::read_hf_config(d.string()));
  EXPECT_EQ(weights.at("wte").to_vector(),
            hub::load_hf_weights(kData + "/tiny_llama_gqa", hub::read_hf_config(d.string())).at("wte").to_vector());
  const fs::path both = copy_of("tiny_llama", "both_weights");
  fs::copy_file(kData + "/tiny_gpt2/model.safetensors", both / "model.safetensors");
  EXPECT_NE(load_error(both).find("holds both model.safetensors and model.safetensors.index.json"), std::string::npos) << load_error(both);
  const hub::HfConfig c = hub::read_hf_config(kData + "/tiny_gpt2");
  EXPECT_ERROR(hub::save_hf_model(both.string(), c, hub::load_hf_weights(kData + "/tiny_gpt2", c)), "is not an empty folder");
}

TEST(HfBadInput, WrongDtypeNamesTheTensor) {
  const fs::path d = copy_of("tiny_gpt2", "bad_dtype");
  io::SafeTensors st = io::read_safetensors((d / "model.safetensors").string(), io::Unverified::quiet);
  for (auto& [name, t] : st.tensors)
    if (name == "wpe.weight") t = t.to(DType::f64);
  io::write_safetensors((d / "model.safetensors").string(), st);
  EXPECT_NE(load_error(d).find("tensor 'wpe.weight' is f64; weights must be F32, F16 or BF16"), std::string::npos) << load_error(d);
}

}  // namespace
}  // namespace scalify
