#pragma once
// Data parallelism: one run on the ranks of platform::world() (mpirun -np N), each holding the
// whole model. A step's `accum` micro-batches are split evenly over the ranks (rank r runs
// micro-batches r A/N .. (r+1) A/N - 1 of the step's A), so a run's config says the same thing
// on any number of ranks: the global batch is batch x accum, whatever N divides accum, and a run
// resumes on another N (bit for bit where each rank takes one micro-batch on both sides: with
// several per rank the gradient sums group differently).
//
// What crosses between ranks, and when (docs/DATA_PARALLEL.md):
// - after the backward passes: every parameter gradient (allreduce_gradients), and the
//   micro-batches' losses (mean_loss);
// - then every quantiser's amax of the step, reduced by maximum, before the quantisers commit
//   the step (commit_quantizers): delayed scaling's history is the same on every rank;
// - at evaluation: each rank's share of the validation windows' losses (eval_session);
// - before every checkpoint: a checksum of every parameter (check_parameters_agree);
// - before the first step: what the run is (run_description: config, recipe, corpus) and the
//   parameters it starts from (starting_parameters), through platform::check_ranks_agree.
// Rank 0 alone writes the run folder; its statistics records (quant, data_storage,
// scale_statistics) describe rank 0's micro-batches. With one process all of it reduces to the
// plain trainer.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/formats/format.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/quant/quantizer.hpp"
#include "scalify/train/config.hpp"
#include "scalify/train/corpus.hpp"

namespace scalify::train {

struct MicroBatches {
  int64_t first = 0, count = 1;  // of the step's accum, this rank's
};
// This rank's share; throws (naming both) when the world's size does not divide accum.
MicroBatches rank_micro_batches(int64_t accum, const platform::World& world);

// What one all-reduce of the gradients cost this rank.
struct AllreduceCost {
  double bytes_sent = 0, seconds = 0;
};
// Sums every parameter's gradient over the ranks, leaving the same sum on each. Both ways are a
// reduce-scatter (rank r receives the r-th slice of every rank's gradient and sums it in rank
// order) and an all-gather of the sums: 2 (N-1)/N of the gradient bytes per rank.
// wire unset: the slices travel in the gradients' own storage and are summed with
//   accumulate_gradient, the rule backward() accumulates with (elementwise, its scale set by the
//   operands' scales alone): N ranks of one micro-batch each give the bits of one process
//   accumulating the N.
// wire f16 / bf16 / e4m3 / e5m2: the gradients' values, each tensor times one power of two shared
//   by the ranks (2^floor(log2(max / amax)), amax the maximum over the ranks), are cast to the
//   format (nearest even, saturating); each slice is summed in f32 in rank order; the sums are
//   cast again with a new shared power of two and all-gathered. Two roundings into the format, on
//   one process too. A scaled gradient comes back under the scale of the sum's RMS (as_scaled).
// A gradient that is not finite on any rank comes back NaN on every rank (a loss scaler skips
// the step; without one the trainer stops with its divergence error).
AllreduceCost allreduce_gradients(const std::vector<std::string>& names, const std::vector<Var>& params, std::optional<Format> wire,
                                  const platform::World& world);

// The mean of every micro-batch's loss of the step, summed in micro-batch order on every rank
// (the same double as one process's sum over them).
double mean_loss(const std::vector<double>& my_losses, const platform::World& world);

// Every quantiser of the model's quantised linear layers (what commit_quantizers takes: the list
// is the model's for its life, so a run gathers it once).
std::vector<quant::Quantizer*> model_quantizers(const nn::Gpt& model);
// Reduces the step's amax of each quantiser by maximum over the ranks, then commits the step on
// each (quant::Quantizer::commit_step).
void commit_quantizers(const std::vector<quant::Quantizer*>& quantizers, const platform::World& world);

// Throws, on every rank, naming the first parameter whose bits differ between rank 0 and another
// rank (a CRC-32C of its data and scale): drift between ranks stops the run instead of going on.
void check_parameters_agree(const std::vector<std::string>& names, const std::vector<Var>& params, int64_t step,
                            const platform::World& world);

// What every rank must hold alike before a run's first step, one item per config key and per
// recipe field, and a CRC-32C of the corpus' training and validation tokens: ranks given other
// arguments, files or a stale copy of the corpus stop with the item that differs.
std::vector<platform::Agreed> run_description(const TrainConfig& config, const Corpus& corpus);
// The parameters the run starts from at `step` (a new model, the --init model, or the checkpoint
// each rank read), as one CRC-32C over every parameter's data and scale.
platform::Agreed starting_parameters(const std::vector<Var>& params, int64_t step, const TrainConfig& config);

}  // namespace scalify::train
