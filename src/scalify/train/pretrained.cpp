#include "scalify/train/pretrained.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "scalify/error.hpp"
#include "scalify/hub/model_tokenizer.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/token_file.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/init_record.hpp"

namespace scalify::train {

namespace {
// Windows per forward pass: as many as keep the logits (B T vocab f32, and the softmax's copy)
// near 256 MB, from 1 to 16.
int64_t eval_batch(int64_t context, int64_t vocab) { return std::clamp<int64_t>((int64_t(1) << 28) / (context * vocab * 4), 1, 16); }
}  // namespace

Pretrained load_pretrained(const std::string& dir, const quant::Recipe& recipe) {
  Pretrained p;
  p.hf = hub::read_hf_config(dir);
  TrainConfig cfg;
  cfg.model = p.hf.model;
  cfg.batch = eval_batch(cfg.model.seq, cfg.model.vocab);
  cfg.recipe = recipe.name;
  p.session = inference_session(cfg, recipe, hub::load_hf_weights(dir, p.hf));
  if (hub::has_model_tokenizer(dir)) p.tokenizer = hub::load_model_tokenizer(dir);
  return p;
}

int64_t default_context(const nn::GptConfig& model) { return std::min<int64_t>(model.seq, 2048); }

TokenEval evaluate_tokens(const Session& s, const std::vector<int32_t>& tokens, const tokenize::Tokenizer* tokenizer, int64_t context,
                          size_t max_windows, const std::function<void(size_t, size_t)>& progress) {
  if (context < 1 || context > s.cfg.model.seq)
    throw Error("eval: context must be in [1, " + std::to_string(s.cfg.model.seq) + "] (the model's longest), got " +
                std::to_string(context));
  size_t windows = tokens.size() > size_t(context) ? (tokens.size() - 1) / size_t(context) : 0;
  if (max_windows > 0) windows = std::min(windows, max_windows);
  if (windows == 0)
    throw Error("eval: " + std::to_string(tokens.size()) + " tokens are fewer than one window of " + std::to_string(context + 1) +
                " (a smaller --context fits more windows)");
  const NoGrad no_grad;
  const nn::Gpt model = s.forward_model();
  const size_t batch = size_t(eval_batch(context, s.cfg.model.vocab));
  TokenEval r;
  r.context = context;
  r.windows = windows;
  double total = 0;  // nats over every predicted token
  for (size_t w0 = 0; w0 < windows; w0 += batch) {
    const size_t B = std::min(batch, windows - w0);
    std::vector<int64_t> ids(B * size_t(context)), targets(B * size_t(context));
    for (size_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < context; ++t) {
        const size_t at = (w0 + b) * size_t(context) + size_t(t), k = b * size_t(context) + size_t(t);
        ids[k] = tokens[at];
        targets[k] = tokens[at + 1];
        if (tokenizer) r.bytes += tokenizer->token_bytes(tokens[at + 1]);
      }
    const Shape shape{int64_t(B), context};
    const double mean = model.loss(Tensor::from_indices(ids, shape), Tensor::from_indices(targets, shape)).value().item();
    require_finite_loss(mean, "eval: the loss of windows " + std::to_string(w0) + "..");
    total += mean * double(B * size_t(context));
    if (progress) progress(w0 + B, windows);
  }
  r.tokens = windows * size_t(context);
  r.loss = total / double(r.tokens);
  r.perplexity = std::exp(r.loss);
  r.bits_per_byte = tokenizer && r.bytes > 0 ? total / std::log(2.0) / double(r.bytes) : std::numeric_limits<double>::quiet_NaN();
  return r;
}

TrainConfig with_pretrained_model(const TrainConfig& config) {
  if (config.init.empty()) return config;
  TrainConfig c = config;
  const nn::GptConfig pretrained = hub::read_hf_config(c.init).model;
  if (c.model != pretrained && c.model != nn::GptConfig{})
    throw Error("train: init '" + c.init +
                "' gives the model's shape (config.json); the config sets model keys (vocab, seq, d_model, layers, heads, ...) "
                "that differ from it: leave them out");
  if (quant::load_recipe(c.recipe).unit_scaled)
    throw Error("train: recipe '" + c.recipe + "' trains the unit-scaled model, which computes something else than the pretrained '" +
                c.init + "'");
  c.model = pretrained;
  return c;
}

Tokenized tokenize_file(const std::string& model_dir, const std::string& path, const std::string& out) {
  // The output replaces whatever file it names: never one of the inputs.
  namespace fs = std::filesystem;
  std::vector<std::string> inputs = {path, model_dir};  // and every file of the model folder
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) inputs.push_back(e.path().string());
  io::refuse_to_overwrite(out, inputs, "tokenize");
  const std::unique_ptr<tokenize::Tokenizer> tokenizer = hub::load_model_tokenizer(model_dir);
  const std::string text = io::read_input_file(path, "data", uint64_t(platform::memory_limit_bytes() / 4));
  const std::vector<int32_t> tokens = tokenizer->encode(text);
  tokenize::write_token_file(out, tokens, tokenizer->vocab_size());
  return {tokens.size(), text.size(), tokenizer->description()};
}

hub::Family export_checkpoint(const std::string& checkpoint, const std::string& dir, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) throw Error("export: the dtype must be f32, f16 or bf16");
  auto [st, cfg] = read_checkpoint(checkpoint);
  check_init_files(cfg, checkpoint);  // before anything is written
  const std::unique_ptr<Session> s = load_session(st, cfg, checkpoint_file(checkpoint));
  hub::HfConfig hf;
  hf.model = s->model.config();
  hf.family = hub::family_of(hf.model);
  hf.dtype = dtype;
  hub::save_hf_model(dir, hf, parameter_values(*s));
  const std::filesystem::path to(dir);
  if (!cfg.init.empty()) {  // fine-tuned: the pretrained model's tokenizer goes with it
    for (const char* name : tokenize::tokenizer_file_names()) {
      const std::filesystem::path from = std::filesystem::path(cfg.init) / name;
      std::error_code ec;
      if (std::filesystem::exists(from, ec))
        io::write_text_atomically((to / name).string(), io::read_input_file(from.string(), "tokenizer file", uint64_t(1) << 30));
    }
  } else if (hf.model.vocab == 256) {  // the byte-level GPT: its tokenizer, bytes as themselves
    io::write_text_atomically((to / "vocab.json").string(), tokenize::byte_vocab_json());
    io::write_text_atomically((to / "merges.txt").string(), "#version: 0.2\n");
    // transformers picks a folder's tokenizer by its model type; a Llama-shaped model's is GPT-2's too.
    io::write_text_atomically((to / "tokenizer_config.json").string(), "{\"tokenizer_class\": \"GPT2Tokenizer\"}\n");
  }
  return hf.family;
}

}  // namespace scalify::train
