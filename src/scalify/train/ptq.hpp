#pragma once
// Post-training quantisation to FP8 (seed 003 §3.1, Figure 2) and FP4: the four linear layers of
// every block get e4m3 weights, scaled once when quantised — FP8-AMAX (per tensor, bias from its
// amax), FP8-CSCALE (one constant bias for every weight and activation) or MXFP8 (32-element
// blocks along the reduction dimension, E8M0 scales) — or e2m1 weights, NVFP4 (16-element blocks
// along the reduction, E4M3 block scales under an f32 tensor scale) or MXFP4 (32-element blocks,
// E8M0 scales); their input activations are cast at inference the same way (AMAX: per window from
// its amax, activation_scale_per_window; FP4 blocks along the rows), or stay f32 (weights only).
// Embeddings, norms, attention's batched matmuls and the head stay f32, as in training.
//
// A quantised checkpoint is a safetensors file: "param.<name>" holds the element codes (e4m3 or
// e2m1) of the linear weights, with "param.<name>.scale" (an f32 scalar decode scale 2^-bias;
// E8M0 block scales [K/32, N] for MX; E4M3 block scales [K/16, N] for NVFP4, whose f32 tensor
// scale is "param.<name>.tensor_scale"), and f32 values for every other parameter; metadata
// "config" (the source run's) and "scalify.ptq" (method, element, bias, activations, source
// step; or, from a pretrained model, its folder and evaluation context). `scalify eval` runs it.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "scalify/io/safetensors.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/evaluate.hpp"

namespace scalify::train {

enum class PtqMethod : uint8_t { amax, cscale, mx, nvfp4, mxfp4 };
const char* ptq_method_name(PtqMethod m);
PtqMethod parse_ptq_method(const std::string& name);  // throws listing the valid names

struct PtqOptions {
  PtqMethod method = PtqMethod::amax;
  int bias = 0;                   // cscale: the scaling bias b (x * 2^b is cast); in [-64, 64]
  bool activations = true;        // false: weights only, the activations stay f32
  Format element = Format::e4m3;  // amax and cscale: e4m3 (seed 003's inference format) or e5m2
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
// The same for a pretrained model folder (`scalify quantize --model DIR --out FILE`): its config
// is the model's with init = DIR (its tokenizer, files recorded as a fine-tune records them), and
// "scalify.ptq" adds "source_model" and "context" (tokens per window, 0: default_context), with
// which `scalify eval FILE --data D` gives the loss `quantize --model DIR --data D` prints.
std::vector<PtqWeight> quantize_pretrained(const std::string& model_dir, const std::string& out, const PtqOptions& options,
                                           int64_t context = 0);

// Whether a safetensors file's metadata marks it as a quantised checkpoint.
bool is_quantized_checkpoint(const io::SafeTensors& st);
// Validation loss of a quantised checkpoint (`file` names it in errors; data "": the run's corpus).
EvalResult evaluate_quantized(const io::SafeTensors& st, const std::string& file, const std::string& data);

// Seed 003 Table 3 on one model: the validation loss of the f32 checkpoint, its FP8-AMAX
// quantisations to e4m3 and e5m2, its MXFP8 one, its NVFP4 and MXFP4 ones (weights and
// activations, and weights only), each NaN when a weight's reduction dimension is not a multiple
// of its block, and FP8-CSCALE with every bias in [lo, hi] to e4m3 and to e5m2, all in memory.
struct PtqSweepRow {
  std::string method;  // "f32", "fp8_amax", "fp8_amax_e5m2", "mxfp8", "nvfp4", "nvfp4_weights", "mxfp4", "mxfp4_weights",
                       // "fp8_cscale", "fp8_cscale_e5m2"
  int bias = 0;        // the fp8_cscale rows only
  EvalResult eval;
  double relative = 0;  // (loss - f32 loss) / f32 loss
  std::string not_run;  // why the row was not evaluated (its loss NaN), "" when it was
};
// A sweep's progress: called before each evaluation with what it evaluates ("fp8_cscale bias -2"),
// its 1-based index and the sweep's number of evaluations (a row a model too narrow for skips
// its index).
using SweepProgress = std::function<void(const std::string& what, size_t index, size_t total)>;
std::vector<PtqSweepRow> ptq_sweep(const std::string& checkpoint, int lo, int hi, const std::string& data = "",
                                   const SweepProgress& progress = {});
// How many evaluations a sweep over [lo, hi] runs.
size_t ptq_sweep_evaluations(int lo, int hi);
// The same on any model: its f32 parameter values, the names of the weights to quantise, and how
// the model a recipe builds with given parameter values is evaluated (a pretrained model's on
// its tokens: train/pretrained.hpp).
using ModelEval = std::function<EvalResult(const quant::Recipe& recipe, const std::map<std::string, Tensor>& values)>;
std::vector<PtqSweepRow> ptq_sweep(const std::map<std::string, Tensor>& f32, const std::vector<std::string>& weights, int lo, int hi,
                                   const ModelEval& evaluate, const SweepProgress& progress = {});
// The number of evaluations ptq_sweep runs over [lo, hi]: f32, FP8-AMAX, five block-scaled rows, one per bias.
size_t ptq_sweep_evaluations(int lo, int hi);
// The weights PTQ quantises: the four linear layers of every block (h{l}.attn.qkv.w ...).
std::vector<std::string> ptq_weights(const nn::Gpt& model);
// The recipe a model whose weights hold quantised values is evaluated with: the weights cast
// nothing (their values are exact), the activations are quantised as the method says, in the
// model `trained` trains (its unit-scaled or u-μP variant: model_of).
quant::Recipe ptq_inference_recipe(const PtqOptions& options, const quant::Recipe& trained = {});
// `r` evaluating the model variant that `trained` trains: a unit-scaled or u-μP model's values
// mean nothing in the standard model.
quant::Recipe model_of(quant::Recipe r, const quant::Recipe& trained);
// Whether `recipe` scales each linear layer's input activation from a statistic of the whole
// tensor it is given (FP8-AMAX's bias, a current scale, NVFP4's f32 tensor scale). Seed 003 takes
// that statistic per data sample (Appendix G: the activation bias "varies depending on the data
// sample"), so an evaluation under such a recipe runs one window per forward pass: a window's loss
// then never depends on the windows that share its batch, nor on how many windows a batch holds.
bool activation_scale_per_window(const quant::Recipe& recipe);
// `f32` with each of `weights` replaced by its quantised values (exact in f32); what quantising
// each did is appended to `report` when given.
std::map<std::string, Tensor> ptq_quantize_values(const std::map<std::string, Tensor>& f32, const std::vector<std::string>& weights,
                                                  const PtqOptions& options, std::vector<PtqWeight>* report = nullptr);
// The contiguous range of CSCALE biases (the rows of `method`: "fp8_cscale" or "fp8_cscale_e5m2")
// around the best one whose loss is within `tolerance` (relative) of f32: {lo, hi}, or {1, 0} when
// none is.
std::pair<int, int> cscale_band(const std::vector<PtqSweepRow>& rows, double tolerance, const std::string& method = "fp8_cscale");
// The sweep as a Markdown table, and the band of each format within `tolerance` (relative) of f32
// in a sentence.
std::string ptq_sweep_markdown(const std::vector<PtqSweepRow>& rows, double tolerance = 0.01);

}  // namespace scalify::train
