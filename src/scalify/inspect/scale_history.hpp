#pragma once
// Scale evolution: the scale of every quantised tensor of a run over its steps, read back from
// the run's metrics.jsonl ("quant" lines, every stats_every steps), drawn per layer and role like
// seed 003's Figures 7-9, with the underflow and clipped fractions beside.
#include <cstdint>
#include <string>
#include <vector>

namespace scalify::inspect {

struct ScalePoint {
  int64_t step;
  double bias;  // the scaling bias, -log2(decode scale): the cast sees x * 2^bias (the largest block scale's for MX / blocks)
  double underflow, clipped;
  double underflow_energy;  // the underflowed values' share of the tensor's squared norm (NaN in runs that predate it)
};

struct ScaleSeries {
  std::string layer;  // "h0.attn.qkv"
  std::string role;   // "weight", "activation", "gradient"
  std::vector<ScalePoint> points;
};

// Every quantised tensor's series, in first-seen order; empty for a recipe that quantises
// nothing. Throws naming the file when metrics.jsonl is missing or a line is corrupt.
std::vector<ScaleSeries> read_scale_history(const std::string& run_dir);

// scales.csv (step, layer, role, bias, underflow, clipped), scales.png (bias per layer over
// steps, a panel per role and linear layer kind) and quant_fractions.png (largest underflow and
// clipped fraction over the layers, per role and kind). Returns "" or why a PNG is missing.
std::string write_scale_history(const std::vector<ScaleSeries>& series, const std::string& dir, const std::string& title);

}  // namespace scalify::inspect
