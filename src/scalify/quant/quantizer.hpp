#pragma once
// Quantisers: how one tensor role (weight, activation, gradient, ...) is stored in a low-precision
// format and scaled (SPEC §2, §4, §5; seeds 000, 003, 004). One interface, one rule per strategy,
// configured by plain data; the only state is the amax history of delayed scaling.
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "scalify/formats/block.hpp"
#include "scalify/scaled/scaled_tensor.hpp"

namespace scalify::quant {

enum class Scaling : uint8_t {
  none,           // plain cast, scale 1
  scalify,        // SCALIFY: cast the propagated data component, keep its scale (no statistics)
  current,        // per-tensor current: scale = (F / amax) / 2^margin from this tensor now
  delayed,        // per-tensor delayed: the same from an amax history of past steps
  amax_bias,      // FP8-AMAX: x * 2^b, b = floor(log2(F / amax)) - margin, every step
  constant_bias,  // FP8-CSCALE: x * 2^b with one constant b
  block,          // generic blocks (1 x K, K x K) with f32 scales
  mx,             // MX: 32-element blocks, E8M0 scales (OCP floor rule)
};
const char* scaling_name(Scaling s);
Scaling parse_scaling(const std::string& name);  // throws listing the valid names

enum class HistoryReduce : uint8_t { max, most_recent };
const char* reduce_name(HistoryReduce r);
HistoryReduce parse_reduce(const std::string& name);  // throws listing the valid names

// A transform of an operand before it is quantised, undone by its GEMM partner's: hadamard16
// multiplies each 16 consecutive elements along the GEMM's reduction by (1/4) H16 D (H16 the
// Sylvester Hadamard matrix, D one fixed random sign vector), an orthogonal map, so a GEMM of two
// transformed operands equals the plain GEMM up to rounding while outliers spread over 16
// elements before the cast (NVFP4's weight-gradient GEMM).
enum class Transform : uint8_t { none, hadamard16 };
const char* transform_name(Transform t);
Transform parse_transform(const std::string& name);  // throws listing the valid names

struct QuantizerConfig {
  Scaling scaling = Scaling::current;
  Format format = Format::e4m3;
  int margin = 0;    // current, delayed, amax_bias: powers of two of headroom
  int history = 16;  // delayed: amax history length
  HistoryReduce reduce = HistoryReduce::max;
  int update_interval = 1;                            // delayed: recompute the scale every N quantisations
  int bias = 0;                                       // constant_bias: the scaling bias b
  BlockSpec block{1, 128, BlockScaleRule::f32_amax};  // block; mx: 1 x 32 (32 x 1 if rows > 1), floor rule
                                                      // unless block.rule is mx_ceil
  Rounding rounding = Rounding::nearest_even;
  Transform transform = Transform::none;
  bool saturate = true;  // false: overflow gives inf (f16, e5m2) or NaN, as a plain cast on hardware
                         // does: what a loss scaler must see to skip a step
  bool operator==(const QuantizerConfig&) const = default;
  bool blockwise() const { return scaling == Scaling::block || scaling == Scaling::mx; }
};

// A block's rows and cols are each in [1, kMaxBlockSize]: throws naming both otherwise. The one
// check of a block's size that the Quantizer, Recipe::validate and the Python setter share.
constexpr size_t kMaxBlockSize = 4096;
void check_block_size(size_t rows, size_t cols);

// What a quantiser reports for each tensor it quantises (cheap enough to leave on).
struct QuantStats {
  float scale = 1;       // the decode factor (per-tensor), or the largest block's
  int bias = 0;          // the scaling bias for the *_bias strategies
  float amax = 0;        // max |x| of the input
  double underflow = 0;  // fraction of non-zero inputs that became zero
  // Their share of the input's squared norm: what the flushed values carried (the smallest
  // values underflow first, so a large fraction can carry almost nothing).
  double underflow_energy = 0;
  double clipped = 0;  // fraction of inputs beyond the format's range after scaling
};

// A quantised tensor: codes in the format's dtype (or their f32 values, Quantizer::quantize's
// as_values) and the decode scale(s).
struct Quantized {
  ScaledTensor per_tensor;  // codes + scalar decode scale (all strategies but block / mx)
  BlockQuantized blocks;    // block / mx
  bool blockwise = false;
  Tensor dequantize() const;  // the represented values, f32
  // The represented values as bf16 when each is exactly a bf16 value that bf16 dot products keep
  // (truncate_to_bf16_exact), else an undefined tensor. Block scaling skips the f32 copy, and
  // leaves out the tensor scale (blocks.tensor_scale), which a GEMM applies as its alpha.
  Tensor dequantize_bf16() const;
};

// Whether quantisers count underflow and clipping (an extra pass over every input; block/MX
// quantisers also measure amax for the report). On by default; the trainer turns it on only for
// the steps whose statistics it records, and the counts otherwise keep their last values.
// Scales never depend on it.
void set_collect_statistics(bool on);
bool collect_statistics();

// Training quantises and advances the quantiser: its step count, the last() statistics and
// delayed scaling's history and scale. Inference (evaluation, sampling) quantises with the state
// as it stands and changes none of it, so evaluating never alters the training that follows.
enum class QuantizeMode : uint8_t { training, inference };

// What a quantiser carries from step to step (delayed scaling's history and scale), for checkpoints.
struct QuantizerState {
  std::vector<float> history;
  float scale = 1;
  int64_t steps = 0;
};

// Gradient accumulation and data parallelism: while a MicroBatchScope lives on this thread, a
// training quantisation belongs to global micro-batch `index` of the current optimizer step. The
// quantiser then keeps the state it had at the step's start (delayed scaling's scale, the step
// count), draws stochastic-rounding bits from (stream, step, micro-batch, call), and gathers the
// step's amax per call (step_amax(), the maximum over its micro-batches) until commit_step(),
// which advances it once per call as if the step were one batch. So the micro-batches of a step
// can run in any order on any rank: N ranks reach the same state as one process that
// accumulates the same N micro-batches. Without a scope each quantisation is its own step.
class MicroBatchScope {
 public:
  explicit MicroBatchScope(int64_t index);
  ~MicroBatchScope();
  MicroBatchScope(const MicroBatchScope&) = delete;
  MicroBatchScope& operator=(const MicroBatchScope&) = delete;

 private:
  int64_t previous_;
};

class Quantizer;

// Inference quantisations change no quantiser; what they measure (FP8-AMAX's per-batch bias of
// each activation: seed 003's Figure 6) reaches the observer that lives on this thread, if any.
class InferenceObserver {
 public:
  using Fn = std::function<void(const Quantizer& quantizer, const QuantStats& stats)>;
  explicit InferenceObserver(Fn fn);
  ~InferenceObserver();
  InferenceObserver(const InferenceObserver&) = delete;
  InferenceObserver& operator=(const InferenceObserver&) = delete;

 private:
  Fn fn_;
  InferenceObserver* previous_;
  friend class Quantizer;
};

class Quantizer {
 public:
  // `stream` tells this quantiser's stochastic-rounding bits apart from every other's (a layer's
  // roles, the layers of a model): the bits are a function of (stream, step count, element).
  explicit Quantizer(QuantizerConfig config = {}, uint64_t stream = 0);
  // Quantises x (2-D [rows, cols] for block / mx; any shape otherwise). Per-tensor strategies
  // give codes, or with `as_values` the codes' values as f32 (decoded as they are made, in the
  // same pass): an f32 GEMM's operands, without the codes written and read back.
  Quantized quantize(const Tensor& x, bool as_values = false, QuantizeMode mode = QuantizeMode::training);
  // SCALIFY: x's data is cast and its scale kept; other strategies quantise x's value.
  Quantized quantize(const ScaledTensor& x, bool as_values = false, QuantizeMode mode = QuantizeMode::training);
  const QuantizerConfig& config() const { return c_; }
  const QuantStats& last() const { return stats_; }
  int64_t steps() const { return steps_; }
  float delayed_scale() const { return scale_; }  // the scale delayed scaling will use next
  QuantizerState state() const;
  void load_state(const QuantizerState& s);  // throws on a history longer than configured
  // Under MicroBatchScope: the amax of each of this step's calls so far (delayed scaling; empty
  // otherwise), for the ranks to reduce by maximum before commit_step() records it.
  std::vector<float>& step_amax() { return step_amax_; }
  void commit_step();

 private:
  float scale_from_amax(double amax, float previous) const;
  void observe(const QuantStats& stats) const;  // an inference quantisation's statistics, to this thread's observer
  // The quantisation itself, from the current state; fills `stats` and changes nothing else.
  Quantized quantize_with(const Tensor& x, bool as_values, QuantStats& stats, uint64_t seed) const;
  uint64_t rounding_seed() const;  // stochastic rounding's seed after the steps so far
  // A training quantisation's start: its rounding seed; advances the state unless in a scope.
  uint64_t begin_training_call();
  void end_training_call();      // records stats_.amax: into the history, or into step_amax()
  void record_amax(float amax);  // delayed scaling: one step's amax into the history and scale
  QuantizerConfig c_;
  uint64_t stream_ = 0;
  QuantStats stats_;
  std::deque<float> history_;
  float scale_ = 1;  // encode factor (x * scale before the cast), delayed scaling's state
  int64_t steps_ = 0;
  // Within a MicroBatchScope's step: the micro-batch being quantised, its calls so far, the most
  // calls of any micro-batch, and the open call's index.
  int64_t micro_ = -1, micro_calls_ = 0, step_calls_ = 0, call_ = -1;
  std::vector<float> step_amax_;
};

}  // namespace scalify::quant
