#pragma once
// Using a trained model: its validation loss (any checkpoint: training, run folder, or quantised)
// and text sampled from it. Neither changes the checkpoint or any training state.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/tokenize/tokenizer.hpp"

namespace scalify::train {

struct Session;

struct EvalResult {
  double loss = 0, bits_per_byte = 0;
  size_t windows = 0;
  std::vector<double> batch_losses;  // the mean loss of each batch of windows, in order (their spread: the window-sampling error)
};
// Throws unless `loss` is finite; `what` names it ("eval: the validation loss of 'x'"). The loss
// kernel makes a loss that cannot be right NaN (logits beyond what f32 resolves), so this one check
// serves every path that reports a loss.
void require_finite_loss(double loss, const std::string& what);

// Validation loss of a checkpoint (a checkpoint file, a run folder, or a quantised checkpoint
// of train/ptq.hpp) on `data` ("" = the run's).
EvalResult evaluate(const std::string& checkpoint, const std::string& data = "");

struct SampleOptions {
  int64_t tokens = 200;  // at most this many
  double temperature = 0.8;
  int64_t top_k = 40;  // 0: all
  uint64_t seed = 1;
  std::vector<int32_t> eos_ids;  // the model's end-of-sequence ids (hub::HfConfig's): sampling one ends the text, without it
  bool ignore_eos = false;       // true: run to `tokens` through eos ids
};
// A checkpoint fine-tuned from a pretrained model stops at that model's eos ids.
std::string sample(const std::string& checkpoint, const std::string& prompt, const SampleOptions& options);
// The loop itself, on any session: up to `options.tokens` ids continuing `prompt` (ids), ending
// before the first of `options.eos_ids` (unless ignore_eos); `what` names the model in errors. Incremental: the
// prompt's forward once, then one token per step against the cached keys and values (nn::KvCache;
// a model whose quantised layers refuse the cache recomputes the window each step). Past the
// model's context (seq) the window slides: each token from the last `seq` ids, recomputed.
std::vector<int32_t> sample_ids(const Session& s, const std::vector<int32_t>& prompt, const SampleOptions& options,
                                const std::string& what);
// Text in, text out: through `tokenizer`, or as bytes when it is null (the byte-level GPT); an
// empty prompt is a newline.
std::string sample_text(const Session& s, const tokenize::Tokenizer* tokenizer, const std::string& prompt, const SampleOptions& options,
                        const std::string& what);

}  // namespace scalify::train
