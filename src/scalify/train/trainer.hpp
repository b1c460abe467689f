#pragma once
// The training loop: the GPT of nn/gpt.hpp on byte tokens of a corpus under any recipe, with
// AdamW (warmup + cosine), gradient clipping and accumulation, loss scaling when the recipe says,
// evaluation, metrics (JSON lines), atomic safetensors checkpoints and bit-exact resume.
//
// Run folder: config.toml (effective config), recipe.json, metrics.jsonl, train.log,
// checkpoint.safetensors (latest, with the optimizer state a resume continues from),
// model.safetensors (the final model alone, written at the end: no optimizer state), and
// .lock (io/folder_lock.hpp: the folder is one training process's while it runs).
// metrics.jsonl: one line per step {"step", "loss", "lr", "grad_norm", "skipped", "loss_scale",
// "scale_statistics" (RMS / amax reductions that set a scale: dynamic rescales and amax-based
// quantisers, see scaled_tensor.hpp), "tokens_per_s", and where gradients are exchanged (several
// ranks, or a recipe's gradient_allreduce) "allreduce_bytes" (sent by this rank) and
// "allreduce_s"}, every stats_every steps {"step", "quant": {"h0.attn.qkv.weight": {"scale",
// "amax", "underflow", "underflow_energy" (the flushed values' share of the squared norm),
// "clipped"}, ...}}, with a low-precision data storage also every stats_every
// steps {"step", "data_storage": {"<op>" or "<op> grad": {"values", "underflow", "subnormal", "saturated"}}}
// (fractions of the values rounded into the storage), at each evaluation {"step", "val_loss", "val_bpb",
// "val_batch_losses" (each validation batch's mean loss, EvalResult::batch_losses)}.
// Everything but tokens_per_s and allreduce_s is a pure function of the config and the thread
// count, whatever the number of ranks (train/data_parallel.hpp; rank 0 writes the folder).
#include <functional>
#include <string>

#include "scalify/error.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/train/config.hpp"
#include "scalify/train/corpus.hpp"

namespace scalify::train {

struct TrainResult {
  int64_t steps = 0, skipped = 0;
  int64_t nonfinite_steps = 0;  // steps whose loss was not finite (only possible with loss scaling: skipped)
  double train_loss = 0, val_loss = 0, val_bpb = 0, unigram_bits = 0;  // unigram_bits: per training token
  std::vector<double> val_batch_losses;                                // the last evaluation's batch means (EvalResult::batch_losses)
  int64_t val_windows = 0;                                             // and its number of windows
  // Timing (steps after the first): the median share of the cores a step's CPU time filled (CPU
  // seconds / (wall seconds x threads)), and the spread of the steps' wall times (90th over 10th
  // percentile; 0 with fewer than 5 steps). A busy host lowers the first and widens the second.
  double cpu_share = 0, step_time_spread = 0;
  bool tokenized = false;                // tokens of a pretrained model's tokenizer, not bytes
  double tokens_per_s = 0;               // median over this process's steps but its first (which warms caches), or that one alone
  double scale_statistics_per_step = 0;  // mean count of amax / RMS reductions that set a scale
  double mean_underflow = 0, max_underflow = 0, mean_clipped = 0;  // over every quantised operand's statistics
  double state_bytes_per_parameter = 0;                            // master weights + gradients + optimizer state (+ scales), measured
  int world_size = 1;                                              // the ranks that trained (data parallelism, train/data_parallel.hpp)
  double allreduce_bytes_per_step = 0;                             // the gradient all-reduce: bytes this rank sent per step
  double allreduce_share = 0;                                      // and its share of the step time
  double peak_memory_mb = 0;  // the process's peak resident memory (VmHWM, MiB) at the end: every step, evaluation and file written
  std::string run_dir;
};

// Thrown when the loss or the gradient norm is not finite with no loss scaler to skip the step:
// on every rank alike (both are computed from what the ranks share).
class Diverged : public platform::EveryRankError {
 public:
  Diverged(const std::string& message, int64_t step) : EveryRankError(message), step(step) {}
  int64_t step;
};

// Progress: called after every step (the CLI draws line() in place on a TTY).
struct StepProgress {
  int64_t step = 0, steps = 0;  // steps done, of the run's total
  double loss = 0, tokens_per_s = 0, elapsed_s = 0, eta_s = 0;
  std::string line() const;  // "step 120/300  loss 2.61  5400 tok/s  elapsed 22s  eta 33s"
};
using Progress = std::function<void(const StepProgress&)>;

// Trains from scratch into config.out (which must not hold a run with a checkpoint; a run that
// stopped before its first one is started over), or with resume continues the run in config.out
// from its checkpoint: config.steps must lie beyond the checkpoint's step and the recipe must be
// the run's. stop_after (> 0) ends the process's training early after that step, writing a
// checkpoint (what tests and Ctrl-C-like stops use). save_initial: a new run also writes its
// model at step 0, before any update, as initial.safetensors (a training checkpoint at step 0), so
// that another tool can start from the same weights.
TrainResult train(const TrainConfig& config, bool resume, const Progress& progress = {}, int64_t stop_after = 0, bool save_initial = false);

// One timed training step: its wall seconds and the process's CPU seconds (all threads).
struct StepTime {
  double wall_s = 0, cpu_s = 0;
};
// Times `steps` training steps of a new session of `config` (its model drawn from its seed, or
// its --init weights) on `corpus` (corpus_for(config)), after `warmup` untimed ones, and more
// until the timed ones add up to min_seconds (at most 10 x steps): the same
// forward, backward and update as train(), but no run folder, nothing written and no statistics
// gathered. For speed comparisons that interleave recipes in one process (compare/speed.hpp).
// Throws Diverged as train() does.
std::vector<StepTime> time_training_steps(const TrainConfig& config, const Corpus& corpus, int64_t warmup, int64_t steps,
                                          double min_seconds = 0);

}  // namespace scalify::train
