#pragma once
// Post-training quantisation to FP8 (seed 003 §3.1, Figure 2): the four linear layers of every
// block get e4m3 weights, scaled once when quantised — FP8-AMAX (per tensor, bias from its amax),
// FP8-CSCALE (one constant bias for every weight and activation) or MXFP8 (32-element blocks
// along the reduction dimension, E8M0 scales) — and their input activations are cast to e4m3
// at inference the same way (AMAX: per batch from its amax). Embeddings, norms, attention's
// batched matmuls and the head stay f32, as in training.
//
// A quantised checkpoint is a safetensors file: "param.<name>" holds e4m3 codes for the linear
// weights (with "param.<name>.scale": an f32 scalar decode scale 2^-bias, or E8M0 block scales
// [K/32, N] for MX) and f32 values for every other parameter; metadata "config" (the source
// run's) and "scalify.ptq" (method, bias, source step). `scalify eval` runs it.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/io/safetensors.hpp"
#include "scalify/train/evaluate.hpp"

namespace scalify::train {

enum class PtqMethod : uint8_t { amax, cscale, mx };
const char* ptq_method_name(PtqMethod m);
PtqMethod parse_ptq_method(const std::string& name);  // throws listing the valid names

struct PtqOptions {
  PtqMethod method = PtqMethod::amax;
  int bias = 0;  // cscale: the scaling bias b (x * 2^b is cast); in [-64, 64]
};

// What quantising one weight did.
struct PtqWeight {
  std::string name;
  double bias;                // -log2 of its decode scale (MX: of its largest block scale)
  double underflow, clipped;  // fractions of its values that became zero / exceeded the range
};

// Quantises a training checkpoint (file or run folder; any recipe: the represented values are
// used) and writes the quantised checkpoint atomically to `out`.
std::vector<PtqWeight> quantize_checkpoint(const std::string& checkpoint, const std::string& out, const PtqOptions& options);

// Whether a safetensors file's metadata marks it as a quantised checkpoint.
bool is_quantized_checkpoint(const io::SafeTensors& st);
// Validation loss of a quantised checkpoint (`file` names it in errors; data "": the run's corpus).
EvalResult evaluate_quantized(const io::SafeTensors& st, const std::string& file, const std::string& data);

// Seed 003 Table 3 on one model: the validation loss of the f32 checkpoint, its FP8-AMAX and
// MXFP8 quantisations (NaN when a weight's reduction dimension is not a multiple of 32) and
// FP8-CSCALE with every bias in [lo, hi], all in memory.
struct PtqSweepRow {
  std::string method;  // "f32", "fp8_amax", "mxfp8", "fp8_cscale"
  int bias = 0;        // fp8_cscale only
  EvalResult eval;
  double relative = 0;  // (loss - f32 loss) / f32 loss
  std::string not_run;  // why the row was not evaluated (its loss NaN), "" when it was
};
std::vector<PtqSweepRow> ptq_sweep(const std::string& checkpoint, int lo, int hi, const std::string& data = "");
// The contiguous range of CSCALE biases around the best one whose loss is within `tolerance`
// (relative) of f32: {lo, hi}, or {1, 0} when none is.
std::pair<int, int> cscale_band(const std::vector<PtqSweepRow>& rows, double tolerance);
// The sweep as a Markdown table, and the band within 1 % of f32 in a sentence.
std::string ptq_sweep_markdown(const std::vector<PtqSweepRow>& rows);

}  // namespace scalify::train
