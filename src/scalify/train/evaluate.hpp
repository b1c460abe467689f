#pragma once
// Using a trained model: its validation loss (any checkpoint: training, run folder, or quantised)
// and text sampled from it. Neither changes the checkpoint or any training state.
#include <cstdint>
#include <string>

namespace scalify::train {

struct EvalResult {
  double loss = 0, bits_per_byte = 0;
  size_t windows = 0;
};
// Validation loss of a checkpoint (a checkpoint file, a run folder, or a quantised checkpoint
// of train/ptq.hpp) on `data` ("" = the run's).
EvalResult evaluate(const std::string& checkpoint, const std::string& data = "");

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;  // 0: all
  uint64_t seed = 1;
};
std::string sample(const std::string& checkpoint, const std::string& prompt, const SampleOptions& options);

}  // namespace scalify::train
