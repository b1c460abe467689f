#pragma once
// `scalify inspect`: one training batch forward and backward through a checkpoint (any recipe),
// and the exponent histogram of every named tensor — activations and their gradients (the
// model's probe taps, in model order), weights and their gradients — against a chosen format.
// Scaled tensors are histogrammed by their data component, with their scale beside it.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/inspect/histogram.hpp"

namespace scalify::inspect {

// first_moment / second_moment: AdamW's moments where the recipe encodes them (optim/state_format),
// as the values their codes hold in the storage format (before the scale and COAT's expansion),
// judged against their own code layout (optim/state_layout.hpp), not the inspection's format.
enum class TensorKind : uint8_t { activation, activation_grad, weight, weight_grad, first_moment, second_moment };
const char* kind_name(TensorKind k);

struct InspectedTensor {
  std::string name;
  TensorKind kind;
  DType storage;      // the data's dtype
  double scale_log2;  // log2 of the scale (the largest, for per-block scales); NaN: unscaled
  double rms;         // of the data component
  ExponentHistogram histogram;
  // What the histogram's classes judge against: the inspection's format, or a moment's own layout
  // (e4m3, e5m2, e4m4 (unsigned), e5m3 (unsigned), f16 scaled, bf16, f32).
  std::string range_name;
  FormatRange range;
};

struct InspectOptions {
  Format format = Format::e4m3;  // the range the histograms are classified against (moments: their own layout's)
  std::string data;              // corpus ("": the run's)
  bool initial = false;          // the run's model at initialisation instead of the checkpoint's
  uint64_t batch = 0;            // which training batch (its index in the run's batch sequence)
};

struct Inspection {
  std::string recipe;
  int64_t step = 0;  // the checkpoint's step (0 with initial)
  Format format = Format::e4m3;
  std::vector<InspectedTensor> tensors;  // activations, activation gradients, weights, weight gradients
};

// `checkpoint` is a checkpoint file or a run folder.
Inspection inspect_checkpoint(const std::string& checkpoint, const InspectOptions& options);

// Writes tensors.csv (one row per tensor: storage, scale, RMS, fractions zero / underflow /
// subnormal / normal / clipped / non-finite, and the range they are judged against), histograms.csv (tensor, kind, exponent, count) and
// histograms.png (a heat map per kind, in the paper's layout). Returns "" or why the PNG is missing.
std::string write_inspection(const Inspection& inspection, const std::string& dir);

}  // namespace scalify::inspect
