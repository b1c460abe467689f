#pragma once
// A pretrained Hugging Face model (a folder hub/ reads) as a Session, and its loss on token data:
// `scalify eval --model DIR --data FILE`.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scalify/hub/hf_config.hpp"
#include "scalify/tokenize/tokenizer.hpp"
#include "scalify/train/session.hpp"

namespace scalify::train {

struct Pretrained {
  hub::HfConfig hf;
  std::unique_ptr<tokenize::Tokenizer> tokenizer;  // null when the folder holds none
  std::unique_ptr<Session> session;                // the weights in the recipe's model, no optimizer
};
// DIR's config, weights (f32) and tokenizer, in the model `recipe` builds (f32 by default).
Pretrained load_pretrained(const std::string& dir, const quant::Recipe& recipe = {});

// The default evaluation context of a model: its longest, at most 2048 tokens (attention's memory
// grows with the square of the context; a longer one is --context's to ask for).
int64_t default_context(const nn::GptConfig& model);

struct TokenEval {
  double loss = 0;           // mean next-token cross-entropy, nats per token
  double perplexity = 0;     // exp(loss)
  double bits_per_byte = 0;  // total loss in bits over the text bytes the predicted tokens stand for; NaN without a tokenizer
  size_t windows = 0, tokens = 0, bytes = 0;
  int64_t context = 0;
};
// The loss of consecutive non-overlapping windows of `context` + 1 tokens (window i: inputs
// tokens[i c, i c + c), targets shifted by one), at most `max_windows` of them (0: all), as the
// trainer's validation windows: every token but the first of each window is predicted once.
// `progress(done, total)` is called after each batch of windows.
TokenEval evaluate_tokens(const Session& s, const std::vector<int32_t>& tokens, const tokenize::Tokenizer* tokenizer, int64_t context,
                          size_t max_windows, const std::function<void(size_t, size_t)>& progress = {});

// A fine-tune's peak learning rate where the config gives none: AdamW's 5e-5, the default of
// Hugging Face's Trainer, and min_lr a tenth of it. The pre-training default (2e-3) moves a
// pretrained model far from its weights in a few steps.
constexpr double kFineTuneLr = 5e-5;

// A config with `init` set takes its model's shape from that folder's config.json (a new run's
// config has the default shape there; a resumed run's has that very shape) with the config's seq
// where one was given (TrainConfig::given), at most the model's context: a fine-tune on shorter
// windows. A config that sets another shape, or a unit-scaling recipe (it would change what the
// weights compute), is an error. lr and min_lr not given take kFineTuneLr's. Without `init`, the
// config as it is.
TrainConfig with_pretrained_model(const TrainConfig& config);

// FILE's text through DIR's tokenizer, written as an llm.c token file `out` (atomically).
struct Tokenized {
  size_t tokens = 0, bytes = 0;
  std::string tokenizer;  // its description
};
Tokenized tokenize_file(const std::string& model_dir, const std::string& path, const std::string& out);

// A training checkpoint (file or run folder; any recipe: its parameters' represented values, in
// f32 or `dtype`) as a Hugging Face model folder: config.json and model.safetensors in the layout
// of the family the model's shape is (hub::family_of: the byte-level GPT is GPT-2-shaped, with a
// vocabulary of 256, and a byte vocabulary as its tokenizer), which transformers opens. A model
// fine-tuned from a pretrained one (`init`) takes that folder's tokenizer files along.
hub::Family export_checkpoint(const std::string& checkpoint, const std::string& dir, DType dtype = DType::f32);

// The same checkpoint as one GGUF file `path` (hub/gguf_export; written atomically) whose matrices
// are stored as `dtype` (f32, f16, bf16 or q8_0), with its tokenizer as metadata: a model
// fine-tuned from a folder, that folder's byte-level BPE tokenizer (a SentencePiece one is refused;
// a folder without one gives none); from a GGUF file, that file's tokenizer metadata; the
// byte-level GPT, its 256 bytes.
struct GgufExport {
  hub::Family family;
  bool with_tokenizer = false;
  std::vector<std::string> f16_fallback;  // q8_0: the matrices stored as F16 (rows not a multiple of 32)
};
GgufExport export_gguf(const std::string& checkpoint, const std::string& path, const std::string& dtype);

}  // namespace scalify::train
