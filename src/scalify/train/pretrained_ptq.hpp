#pragma once
// Seed 003's FP8 inference study on a pretrained model (`scalify quantize --model DIR --data FILE
// --sweep LO:HI`): its Table 3 (the loss of f32, FP8-AMAX, MXFP8, NVFP4, MXFP4 and FP8-CSCALE at
// every bias of a sweep, and the biases within 99.5 % of f32) and its Figure 6 (FP8-AMAX's scaling
// bias of every quantised weight and, the most frequent over the windows, of its input
// activation, by decoder layer and linear-layer kind).
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/train/pretrained.hpp"
#include "scalify/train/ptq.hpp"

namespace scalify::train {

struct LayerScalingBias {
  int layer = 0;       // decoder layer
  std::string kind;    // "attn qkv", "attn out", "ff intermediate", "ff output" (the seed's names)
  int weight = 0;      // the weight's FP8-AMAX bias: x * 2^b is cast
  int activation = 0;  // the input activation's bias, the most frequent over the windows
};

struct PretrainedPtq {
  std::vector<PtqSweepRow> rows;         // ptq_sweep's, on the tokens
  std::vector<LayerScalingBias> biases;  // in model order
  double tolerance = 0.005;              // the band: within 0.5 % of f32 (Table 3's 99.5 %)
};

// The study on `tokens` (windows as evaluate_tokens takes them); `progress` before each
// evaluation (ptq_sweep's, then "FP8-AMAX biases", the pass that counts the activations' biases).
PretrainedPtq pretrained_ptq(const Pretrained& p, const std::vector<int32_t>& tokens, int64_t context, size_t max_windows, int lo, int hi,
                             const SweepProgress& progress = {});
// The Markdown report (the sweep table, the band, the bias table).
std::string pretrained_ptq_markdown(const PretrainedPtq& study);
// DIR/report.md, sweep.csv, scaling_biases.csv and scaling_biases.png (gnuplot: a panel each for
// weights and activations, a line per kind over the decoder layers); returns "" or why the plot
// was not drawn (the CSV files are written either way).
std::string write_pretrained_ptq(const std::string& dir, const PretrainedPtq& study);

}  // namespace scalify::train
