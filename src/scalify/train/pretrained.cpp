#include "scalify/train/pretrained.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "scalify/error.hpp"
#include "scalify/note.hpp"
#include "scalify/hub/gguf_export.hpp"
#include "scalify/hub/gguf_file.hpp"
#include "scalify/hub/model_tokenizer.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/token_file.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/init_record.hpp"
#include "scalify/train/ptq.hpp"

namespace scalify::train {

namespace {
// Windows per forward pass: as many as keep the logits (B T vocab f32, and the softmax's copy)
// near 256 MB, from 1 to 16.
int64_t eval_batch(int64_t context, int64_t vocab) { return std::clamp<int64_t>((int64_t(1) << 28) / (context * vocab * 4), 1, 16); }
// A model folder's tokenizer files beside those Scalify reads: transformers' own tokenizer
// (tokenizer.json), and what AutoTokenizer takes its class and special tokens from.
constexpr const char* kTokenizerSideFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};

// tokenizer_config.json for a folder that has none: without it AutoTokenizer picks the tokenizer
// by the model type, and a Llama-shaped model with GPT-2's BPE files (SmolLM2's) then fails.
// "" when the folder holds no tokenizer.
std::string tokenizer_config_for(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  std::error_code ec;
  nlohmann::json c;
  if (fs::exists(dir / "tokenizer.json", ec)) {  // the whole tokenizer, special tokens included
    c["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else if (fs::exists(dir / "vocab.json", ec)) {
    c["tokenizer_class"] = "GPT2Tokenizer";
    const nlohmann::json vocab = io::try_parse_json(io::read_input_file((dir / "vocab.json").string(), "vocab.json", uint64_t(1) << 30));
    const char* end_of_text = "<|endoftext|>";  // GPT-2's one special token, where the vocabulary has it
    if (vocab.is_object() && vocab.contains(end_of_text))
      for (const char* role : {"bos_token", "eos_token", "unk_token"}) c[role] = end_of_text;
  } else if (fs::exists(dir / "tokenizer.model", ec)) {  // SentencePiece: Llama's tokenizer and its tokens
    c = {{"tokenizer_class", "LlamaTokenizer"}, {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
  } else {
    return "";
  }
  return c.dump(2) + "\n";
}

// The shape an exported model declares (Hugging Face or GGUF alike). A fine-tune on windows
// shorter than its model's context: rotary positions still reach the whole context (learned ones
// are the trained rows, seq of them).
nn::GptConfig exported_shape(const TrainConfig& cfg, const Session& s) {
  nn::GptConfig m = s.model.config();
  if (!cfg.init.empty() && !m.learned_positions()) m.seq = hub::read_hf_config(cfg.init).model.seq;
  return m;
}

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
  const size_t batch = activation_scale_per_window(s.recipe) ? 1 : size_t(eval_batch(context, s.cfg.model.vocab));
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
  // seq aside: a fine-tune may train on windows shorter than the model's context.
  nn::GptConfig shape = c.model, init_shape = pretrained, default_shape;
  shape.seq = init_shape.seq = default_shape.seq = 0;
  if (shape != init_shape && shape != default_shape)
    throw Error("train: init '" + c.init +
                "' gives the model's shape (config.json); the config sets model keys (vocab, d_model, layers, heads, ...) "
                "that differ from it: leave them out (seq alone may be set, to train on shorter windows)");
  if (const quant::Recipe r = quant::load_recipe(c.recipe); r.unit_scaled || r.umup)
    throw Error("train: recipe '" + c.recipe + "' trains the " + (r.umup ? "u-μP" : "unit-scaled") +
                " model, which computes something else than the pretrained '" + c.init + "'");
  const int64_t seq = c.given.count("seq") ? c.model.seq : pretrained.seq;
  if (seq < 1 || seq > pretrained.seq)
    throw Error("train: seq " + std::to_string(seq) + " is outside [1, " + std::to_string(pretrained.seq) + "], the context of init '" +
                c.init + "' (its config.json)");
  c.model = pretrained;
  c.model.seq = seq;  // rotary positions take any length; learned ones keep their first seq rows
  if (!c.given.count("lr")) {
    c.lr = kFineTuneLr;
    if (!c.given.count("min_lr")) c.min_lr = kFineTuneLr / 10;  // the pre-training defaults' ratio
  }
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
  hf.model = exported_shape(cfg, *s);
  hf.family = hub::family_of(hf.model);
  hf.dtype = dtype;
  hub::save_hf_model(dir, hf, parameter_values(*s));
  const std::filesystem::path to(dir);
  if (!cfg.init.empty() && hub::is_gguf(cfg.init)) {
    note("export: the model was fine-tuned from the GGUF file '" + cfg.init + "', whose tokenizer this export does not write as " +
         "Hugging Face files: '" + dir + "' has no tokenizer (export --format gguf carries it)");
  } else if (!cfg.init.empty()) {  // fine-tuned: the pretrained model's tokenizer goes with it
    std::vector<std::string> names(tokenize::tokenizer_file_names().begin(), tokenize::tokenizer_file_names().end());
    for (const char* name : kTokenizerSideFiles)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    for (const std::string& name : names) {
      const std::filesystem::path from = std::filesystem::path(cfg.init) / name;
      std::error_code ec;
      if (std::filesystem::exists(from, ec))
        io::write_text_atomically((to / name).string(), io::read_input_file(from.string(), "tokenizer file", uint64_t(1) << 30));
    }
    std::error_code ec;
    if (!std::filesystem::exists(to / "tokenizer_config.json", ec)) {
      const std::string config = tokenizer_config_for(cfg.init);
      if (!config.empty()) io::write_text_atomically((to / "tokenizer_config.json").string(), config);
    }
  } else if (hf.model.vocab == 256) {  // the byte-level GPT: its tokenizer, bytes as themselves
    io::write_text_atomically((to / "vocab.json").string(), tokenize::byte_vocab_json());
    io::write_text_atomically((to / "merges.txt").string(), "#version: 0.2\n");
    // transformers picks a folder's tokenizer by its model type; a Llama-shaped model's is GPT-2's too.
    io::write_text_atomically((to / "tokenizer_config.json").string(), "{\"tokenizer_class\": \"GPT2Tokenizer\"}\n");
  }
  return hf.family;
}

GgufExport export_gguf(const std::string& checkpoint, const std::string& path, const std::string& dtype) {
  const hub::GgufWriter::Type type = hub::gguf_type(dtype);
  auto [st, cfg] = read_checkpoint(checkpoint);
  // The file replaces whatever it names: never the checkpoint or a file of the model it was fine-tuned from.
  std::vector<std::string> inputs = {checkpoint_file(checkpoint)};
  std::error_code ec;
  if (!cfg.init.empty()) inputs.push_back(cfg.init);  // a .gguf init is a file
  if (!cfg.init.empty())
    for (const auto& e : std::filesystem::directory_iterator(cfg.init, ec)) inputs.push_back(e.path().string());
  io::refuse_to_overwrite(path, inputs, "export");
  check_init_files(cfg, checkpoint);
  const std::unique_ptr<Session> s = load_session(st, cfg, checkpoint_file(checkpoint));
  hub::HfConfig hf;
  hf.model = exported_shape(cfg, *s);
  hf.family = hub::family_of(hf.model);
  std::optional<hub::GgufVocabulary> vocab;
  if (!cfg.init.empty())
    vocab = hub::read_bpe_vocabulary(cfg.init);
  else if (hf.model.vocab == 256)
    vocab = hub::byte_vocabulary();
  GgufExport r{hf.family, vocab.has_value(), {}};
  const std::filesystem::path run =
      std::filesystem::is_directory(checkpoint, ec) ? std::filesystem::path(checkpoint) : std::filesystem::path(checkpoint).parent_path();
  const std::string name = std::filesystem::absolute(run).lexically_normal().filename().string();
  hub::save_gguf_model(path, hf, parameter_values(*s), type, vocab ? &*vocab : nullptr, name.empty() ? "scalify" : name, &r.f16_fallback);
  return r;
}

}  // namespace scalify::train
