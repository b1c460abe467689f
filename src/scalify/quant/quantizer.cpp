#include "scalify/quant/quantizer.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/convert.hpp"
#include "scalify/tensor/dense.hpp"

namespace scalify::quant {

namespace {
constexpr int kMaxShift = 64;
constexpr const char* kNames[] = {"none", "scalify", "current", "delayed", "amax_bias", "constant_bias", "block", "mx"};
static_assert(std::size(kNames) == size_t(Scaling::mx) + 1, "a name for every Scaling, in the enum's order");

std::atomic<bool> g_collect_statistics{true};

// Encodes x * encode_scale into `fmt` (saturating unless the config says not), returning the
// codes tensor; fills the stats. Works in chunks that stay in L1: low-precision data (SCALIFY's
// f16) is decoded a chunk at a time instead of into a full f32 copy, and the statistics are
// counted from the chunk just quantised, so the input is read once. Chunk c quantises with its
// global offset, so stochastic rounding draws the same bits as one whole-tensor call.
Tensor encode(const Tensor& x, Format fmt, float encode_scale, const QuantizerConfig& c, QuantStats& st, bool as_values, uint64_t seed) {
  constexpr int64_t kChunk = 4096;
  const ChunkSource<float> src(x, x.shape());
  Tensor codes = Tensor::empty(x.shape(), as_values ? DType::f32 : dtype_of(fmt));
  const int64_t out_bytes = info(fmt).storage_bytes();
  QuantizeOptions opt;
  opt.rounding = c.rounding;
  opt.overflow = c.saturate ? Overflow::saturate : Overflow::non_saturating;
  opt.seed = seed;  // stochastic rounding: fresh bits for every quantisation step of the quantiser
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  // Statistics from the input alone: a non-zero input underflows when |x| s is at most half the
  // smallest subnormal (round-to-nearest-even makes that tie zero), and clips beyond max.
  const bool stats = collect_statistics();
  const float under_limit = float(0.5 * min_subnormal(fmt) / encode_scale), clip_limit = float(max_value(fmt) / encode_scale);
  uint32_t amax_bits = 0;  // max |x| as bits: a NaN orders above infinity
  int64_t under = 0, clip = 0, nonzero = 0;
  double energy = 0, under_energy = 0;  // sums of x^2: all inputs, and those that underflow
  std::exception_ptr error;             // a NaN into a format without NaN throws; rethrown after the loop
#pragma omp parallel for num_threads(num_threads()) reduction(max : amax_bits) reduction(+ : under, clip, nonzero, energy, under_energy) \
    if (n > platform::kParallelGrain)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    float buf[kChunk];
    const int64_t begin = ch * kChunk, len = std::min(kChunk, n - begin);
    const float* p = nullptr;
    try {
      p = src.read(begin, len, buf);
      QuantizeOptions o = opt;
      o.offset = uint64_t(begin);
      const std::span<const float> in(p, size_t(len));
      const float a =
          as_values ? quantize_values_amax(in, fmt, encode_scale, std::span(codes.data<float>() + begin, size_t(len)), o)
                    : quantize_amax(in, fmt, encode_scale, std::span(codes.raw_bytes() + begin * out_bytes, size_t(len * out_bytes)), o);
      amax_bits = std::max(amax_bits, std::bit_cast<uint32_t>(std::fabs(a)));
    } catch (...) {
#pragma omp critical(scalify_encode_error)
      if (!error) error = std::current_exception();
      continue;
    }
    if (!stats) continue;
    double e = 0, eu = 0;
    for (int64_t i = 0; i < len; ++i) {  // branch-free, so it vectorises
      const float a = std::fabs(p[i]);
      nonzero += int64_t(a != 0);
      under += int64_t(a != 0) & int64_t(a <= under_limit);
      clip += int64_t(a > clip_limit);
      const double a2 = double(a) * double(a);
      e += a2;
      eu += a <= under_limit ? a2 : 0.0;
    }
    energy += e;
    under_energy += eu;
  }
  if (error) std::rethrow_exception(error);
  st.amax = std::bit_cast<float>(amax_bits);
  if (!stats) return codes;
  st.underflow = nonzero ? double(under) / double(nonzero) : 0.0;
  st.underflow_energy = energy > 0 ? under_energy / energy : 0.0;
  st.clipped = n ? double(clip) / double(n) : 0.0;
  return codes;
}
// A block quantisation's statistics over some rows: the |x| bits' max, and over the finite
// non-zero inputs their count, those decoded as 0 (underflow) or beyond their block's largest value
// (clipped, saturated to it), and sums of x^2 over both.
struct BlockCounts {
  uint32_t amax_bits = 0;  // NaN orders above infinity
  int64_t nonzero = 0, underflow = 0, clipped = 0;
  double energy = 0, under_energy = 0;
};

// One row: x, its decoded values `back`, each column's clip limit (|x| > limit clips), counted
// branch-free so it vectorises; AVX2 where the format kernels run AVX2 or better (the library's
// baseline is SSE2), as the block quantiser's row loops. 32-bit counters per stretch of 2^20.
struct StatisticsLoop {
  [[gnu::always_inline]] static inline void count(const float* __restrict x, const float* __restrict back, const float* __restrict limit,
                                                  size_t n, BlockCounts& t) {
    for (size_t c0 = 0; c0 < n; c0 += size_t(1) << 20) {
      const size_t c1 = std::min(n, c0 + (size_t(1) << 20));
      uint32_t amax = t.amax_bits;
      int32_t nonzero = 0, underflow = 0, clipped = 0;
      double energy = 0, under_energy = 0;
#pragma omp simd reduction(max : amax) reduction(+ : nonzero, underflow, clipped, energy, under_energy)
      for (size_t c = c0; c < c1; ++c) {
        const uint32_t bits = std::bit_cast<uint32_t>(x[c]) & 0x7FFFFFFFu;
        amax = std::max(amax, bits);
        const uint32_t counted = uint32_t(bits - 1u < 0x7F7FFFFFu);  // finite, non-zero: bits in [1, max]
        const uint32_t under = counted & uint32_t(back[c] == 0.0f);
        nonzero += int32_t(counted);
        underflow += int32_t(under);
        clipped += int32_t(counted & uint32_t(std::bit_cast<float>(bits) > limit[c]));
        // |x| where counted (where under), else +0: selected in 32 bits, squared and summed in double.
        const double v = std::bit_cast<float>(bits & (0u - counted)), u = std::bit_cast<float>(bits & (0u - under));
        energy += v * v;
        under_energy += u * u;
      }
      t.amax_bits = amax;
      t.nonzero += nonzero;
      t.underflow += underflow;
      t.clipped += clipped;
      t.energy += energy;
      t.under_energy += under_energy;
    }
  }
};
#if SCALIFY_HAVE_X86_SIMD
[[gnu::target("avx2")]] void count_row_avx2(const float* x, const float* back, const float* limit, size_t n, BlockCounts& t) {
  StatisticsLoop::count(x, back, limit, n, t);
}
#endif
void count_row(const float* x, const float* back, const float* limit, size_t n, BlockCounts& t) {
#if SCALIFY_HAVE_X86_SIMD
  if (kernels::active_isa() != kernels::Isa::scalar) return count_row_avx2(x, back, limit, n, t);
#endif
  StatisticsLoop::count(x, back, limit, n, t);
}

// The f32 limit whose comparison with an f32 |x| is the comparison with `limit` (a positive
// double): the largest f32 not above it (+inf stays +inf). One step down is one bit pattern down.
float f32_limit(double limit) {
  const float f = float(limit);
  return double(f) > limit ? std::bit_cast<float>(std::bit_cast<uint32_t>(f) - 1) : f;
}

// A block quantisation's amax, underflow (non-zero inputs decoded as 0) and clipping (inputs
// beyond their block's largest value, which they saturated to), counted as quantize_blocks writes
// each row or block row (its rows_done hook: the inputs still in cache), from those rows decoded
// as dequantize_blocks decodes them. Each call's counts keep their own slot and add up in row
// order, so the statistics do not depend on the threads.
class BlockStatistics {
 public:
  BlockStatistics(const float* x, size_t rows) : x_(x), counts_(rows) {}
  void operator()(const BlockQuantized& q, size_t r0, size_t r1) {
    thread_local std::vector<float> back, limit;  // rows [r0, r1) decoded; each column's clip limit
    const size_t cols = q.cols, scale_cols = q.scale_cols();
    back.resize((r1 - r0) * cols);
    limit.resize(cols);
    dequantize_block_rows(q, r0, r1, back);
    const double top = max_value(q.element);
    size_t expanded = SIZE_MAX;
    BlockCounts& part = counts_[r0];
    for (size_t r = r0; r < r1; ++r) {
      const size_t br = r / q.block.rows;
      if (br != expanded) {
        // The block's largest value, computed in double: a relative 2^-20 allows for the f32
        // rounding of an amax-derived scale (f32_amax: amax / 448 * 448 may fall an ulp short).
        // A block whose scale is 0 (E4M3 scales that underflowed) or NaN never clips.
        for (size_t bc = 0; bc < scale_cols; ++bc) {
          const double block_top = top * q.scales[br * scale_cols + bc] * q.tensor_scale;
          const float l = f32_limit(block_top > 0 ? block_top * (1 + 0x1p-20) : std::numeric_limits<double>::infinity());
          std::fill(limit.begin() + ptrdiff_t(bc * q.block.cols), limit.begin() + ptrdiff_t(std::min(cols, (bc + 1) * q.block.cols)), l);
        }
        expanded = br;
      }
      count_row(x_ + r * cols, back.data() + (r - r0) * cols, limit.data(), cols, part);
    }
  }
  void report(QuantStats& st) const {
    BlockCounts all;
    for (const BlockCounts& p : counts_) {
      all.amax_bits = std::max(all.amax_bits, p.amax_bits);
      all.nonzero += p.nonzero;
      all.underflow += p.underflow;
      all.clipped += p.clipped;
      all.energy += p.energy;
      all.under_energy += p.under_energy;
    }
    st.amax = all.amax_bits > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(all.amax_bits);
    st.underflow = all.nonzero ? double(all.underflow) / double(all.nonzero) : 0.0;
    st.underflow_energy = all.energy > 0 ? all.under_energy / all.energy : 0.0;
    st.clipped = all.nonzero ? double(all.clipped) / double(all.nonzero) : 0.0;
  }

 private:
  const float* x_;
  std::vector<BlockCounts> counts_;  // by the first row of each call
};

// max |x| with the SIMD kernel (NaN if x holds one).
double amax_of(const Tensor& x) {
  const Tensor xs = x.dtype() == DType::f32 && x.is_contiguous() ? x : x.to(DType::f32).contiguous();
  return amax(std::span<const float>(xs.data<float>(), size_t(xs.numel())));
}
}  // namespace

void set_collect_statistics(bool on) { g_collect_statistics = on; }
bool collect_statistics() { return g_collect_statistics; }

const char* scaling_name(Scaling s) { return kNames[static_cast<int>(s)]; }

namespace {
constexpr const char* kTransformNames[] = {"none", "hadamard16"};
static_assert(std::size(kTransformNames) == size_t(Transform::hadamard16) + 1, "a name for every Transform");
}  // namespace
const char* transform_name(Transform t) { return kTransformNames[static_cast<int>(t)]; }
Transform parse_transform(const std::string& name) {
  for (size_t i = 0; i < std::size(kTransformNames); ++i)
    if (name == kTransformNames[i]) return Transform(i);
  throw Error("unknown transform '" + name + "' (valid: none, hadamard16)");
}

namespace {
constexpr const char* kReduceNames[] = {"max", "most_recent"};
static_assert(std::size(kReduceNames) == size_t(HistoryReduce::most_recent) + 1, "a name for every HistoryReduce");
}  // namespace
const char* reduce_name(HistoryReduce r) { return kReduceNames[static_cast<int>(r)]; }
HistoryReduce parse_reduce(const std::string& name) {
  for (size_t i = 0; i < std::size(kReduceNames); ++i)
    if (name == kReduceNames[i]) return HistoryReduce(i);
  throw Error("reduce must be max or most_recent, got '" + name + "'");
}

Scaling parse_scaling(const std::string& name) {
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (name == kNames[i]) return static_cast<Scaling>(i);
  std::string valid;
  for (const char* n : kNames) valid += (valid.empty() ? "" : ", ") + std::string(n);
  throw Error("unknown scaling strategy '" + name + "'; valid strategies: " + valid);
}

Tensor Quantized::dequantize() const {
  if (blockwise) {
    Tensor out = Tensor::empty({int64_t(blocks.rows), int64_t(blocks.cols)});
    dequantize_blocks(blocks, std::span(out.data<float>(), size_t(out.numel())));
    return out;
  }
  return per_tensor.value();
}

Tensor Quantized::dequantize_bf16() const {
  if (!blockwise) return exact_bf16(per_tensor.value().contiguous());
  Tensor out = Tensor::empty({int64_t(blocks.rows), int64_t(blocks.cols)}, DType::bf16);
  return dequantize_blocks_bf16(blocks, std::span(out.data<uint16_t>(), size_t(out.numel()))) ? out : Tensor();
}

Quantizer::Quantizer(QuantizerConfig config, uint64_t stream) : c_(config), stream_(stream) {
  if (c_.history < 1) throw Error("quantizer: amax history length must be at least 1");
  if (c_.update_interval < 1) throw Error("quantizer: update interval must be at least 1");
  // 2^±64 is far beyond any format's range; the limits keep 2^margin, 2^bias and -bias exact.
  if (c_.margin < -kMaxShift || c_.margin > kMaxShift)
    throw Error("quantizer: margin must be in [-64, 64], got " + std::to_string(c_.margin));
  if (c_.bias < -kMaxShift || c_.bias > kMaxShift) throw Error("quantizer: bias must be in [-64, 64], got " + std::to_string(c_.bias));
  try {
    check_block_size(c_.block.rows, c_.block.cols);
  } catch (const Error& e) {
    throw Error(std::string("quantizer: ") + e.what());
  }
}

void check_block_size(size_t rows, size_t cols) {
  if (rows < 1 || rows > kMaxBlockSize || cols < 1 || cols > kMaxBlockSize)
    throw Error("block must be [rows, cols] with each in [1, " + std::to_string(kMaxBlockSize) + "], got [" + std::to_string(rows) + ", " +
                std::to_string(cols) + "]");
}

// The encode factor (F / amax) / 2^margin; the previous one when amax is 0 or not finite.
float Quantizer::scale_from_amax(double amax, float previous) const {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const double s = max_value(c_.format) / amax / std::ldexp(1.0, c_.margin);
  // A tiny amax (an all-subnormal tensor) asks for a scale beyond f32: saturate to the largest
  // power of two, as TransformerEngine does; likewise the smallest normal one at the other end.
  return float(std::clamp(s, 0x1p-126, 0x1p127));
}

namespace {
thread_local int64_t g_micro_batch = -1;
}

namespace {
thread_local InferenceObserver* g_observer = nullptr;
}

InferenceObserver::InferenceObserver(Fn fn) : fn_(std::move(fn)), previous_(g_observer) { g_observer = this; }
InferenceObserver::~InferenceObserver() { g_observer = previous_; }

void Quantizer::observe(const QuantStats& stats) const {
  if (g_observer) g_observer->fn_(*this, stats);
}

MicroBatchScope::MicroBatchScope(int64_t index) : previous_(g_micro_batch) {
  if (index < 0) throw Error("MicroBatchScope: the micro-batch index must be >= 0");
  g_micro_batch = index;
}
MicroBatchScope::~MicroBatchScope() { g_micro_batch = previous_; }

uint64_t Quantizer::begin_training_call() {
  if (g_micro_batch < 0) {
    ++steps_;
    return rounding_seed();
  }
  if (g_micro_batch != micro_) {
    micro_ = g_micro_batch;
    micro_calls_ = 0;
  }
  call_ = micro_calls_++;
  step_calls_ = std::max(step_calls_, micro_calls_);
  // Micro-batch 0's bits are those of the same call without a scope; others move to their own
  // range (2^40 steps apart).
  return rounding_seed() + uint64_t(call_ + 1) + (uint64_t(g_micro_batch) << 40);
}

void Quantizer::end_training_call() {
  if (c_.scaling != Scaling::delayed) return;
  if (g_micro_batch < 0) return record_amax(stats_.amax);
  if (step_amax_.size() <= size_t(call_)) step_amax_.resize(size_t(call_) + 1, 0.0f);
  float& a = step_amax_[size_t(call_)];
  if (!std::isnan(a) && (std::isnan(stats_.amax) || stats_.amax > a)) a = stats_.amax;  // the maximum; a NaN stays
}

void Quantizer::record_amax(float amax) {
  history_.push_back(amax);
  if (int(history_.size()) > c_.history) history_.pop_front();
  if (steps_ % c_.update_interval == 0) {
    const double h = c_.reduce == HistoryReduce::max ? *std::max_element(history_.begin(), history_.end()) : history_.back();
    scale_ = scale_from_amax(h, scale_);
  }
}

void Quantizer::commit_step() {
  for (int64_t k = 0; k < step_calls_; ++k) {
    ++steps_;
    if (c_.scaling == Scaling::delayed) record_amax(step_amax_.at(size_t(k)));
  }
  micro_ = -1;
  micro_calls_ = step_calls_ = 0;
  step_amax_.clear();
}

Quantized Quantizer::quantize(const ScaledTensor& x, bool as_values, QuantizeMode mode) {
  if (c_.scaling != Scaling::scalify) return quantize(x.is_scaled() ? x.value() : x.data, as_values, mode);
  QuantStats scratch;
  QuantStats& st = mode == QuantizeMode::training ? stats_ : scratch;
  const uint64_t seed = mode == QuantizeMode::training ? begin_training_call() : rounding_seed();
  Quantized q;
  q.per_tensor = x;
  const float s = x.any_scale ? 1.0f : x.scalar_scale();
  q.per_tensor.data = encode(x.data, c_.format, 1.0f, c_, st, as_values, seed);
  st.scale = s;
  st.amax = float(st.amax * s);
  if (mode == QuantizeMode::inference) observe(scratch);
  return q;
}

Quantized Quantizer::quantize(const Tensor& x, bool as_values, QuantizeMode mode) {
  if (mode == QuantizeMode::inference) {
    QuantStats scratch = stats_;  // amax_bias falls back to the last bias when amax is 0
    Quantized q = quantize_with(x, as_values, scratch, rounding_seed());
    observe(scratch);
    return q;
  }
  const uint64_t seed = begin_training_call();
  if (c_.scaling != Scaling::none && c_.scaling != Scaling::scalify && c_.scaling != Scaling::constant_bias) count_scale_statistic();
  Quantized q = quantize_with(x, as_values, stats_, seed);
  end_training_call();  // this step's amax (measured in the same pass)
  return q;
}

Quantized Quantizer::quantize_with(const Tensor& x, bool as_values, QuantStats& st, uint64_t seed) const {
  Quantized q;
  const Format f = c_.format;
  switch (c_.scaling) {
    case Scaling::none:
    case Scaling::scalify: {
      q.per_tensor = ScaledTensor(encode(x, f, 1.0f, c_, st, as_values, seed), 1.0f);
      st.scale = 1;
      return q;
    }
    case Scaling::current: {
      const float s = scale_from_amax(amax_of(x), 1.0f);
      q.per_tensor = ScaledTensor(encode(x, f, s, c_, st, as_values, seed), 1.0f / s);
      st.scale = 1.0f / s;
      return q;
    }
    case Scaling::delayed: {  // the scale from past steps
      const float s = scale_;
      q.per_tensor = ScaledTensor(encode(x, f, s, c_, st, as_values, seed), 1.0f / s);
      st.scale = 1.0f / s;
      return q;
    }
    case Scaling::amax_bias:
    case Scaling::constant_bias: {
      int b = c_.bias;
      if (c_.scaling == Scaling::amax_bias) {
        const double amax = amax_of(x);
        b = amax > 0 && std::isfinite(amax) ? int(std::floor(std::log2(max_value(f) / amax))) - c_.margin : st.bias;
        b = std::clamp(b, -126, 127);  // 2^b and 2^-b stay finite and non-zero in f32 (tiny amax)
      }
      const float s = std::ldexp(1.0f, b);  // x * 2^b before the cast: exact
      q.per_tensor = ScaledTensor(encode(x, f, s, c_, st, as_values, seed), std::ldexp(1.0f, -b));
      st.scale = std::ldexp(1.0f, -b);
      st.bias = b;
      return q;
    }
    case Scaling::block:
    case Scaling::mx: {
      if (x.dim() != 2) throw Error("quantizer: block scaling needs a 2-D tensor, got " + shape_str(x.shape()));
      // MX: 32 elements along the rows (or down the columns when the block is configured tall),
      // the OCP floor rule unless the config asks for mx_ceil.
      const BlockSpec spec = c_.scaling == Scaling::mx
                                 ? mx_blocks(c_.block.rows > 1 ? 0 : 1,
                                             c_.block.rule == BlockScaleRule::mx_ceil ? BlockScaleRule::mx_ceil : BlockScaleRule::mx_floor)
                                 : c_.block;
      const Tensor xs = x.to(DType::f32).contiguous();
      std::optional<BlockStatistics> stats;
      if (collect_statistics()) stats.emplace(xs.data<float>(), size_t(x.size(0)));
      q.blocks = quantize_blocks(std::span(xs.data<float>(), size_t(xs.numel())), size_t(x.size(0)), size_t(x.size(1)), f, spec,
                                 c_.rounding, seed, stats ? BlockRowsDone(std::ref(*stats)) : BlockRowsDone());
      q.blockwise = true;
      if (stats) stats->report(st);
      // An empty tensor ([0, n] or [n, 0]) has no blocks and no scales.
      // The largest block's decode factor; 1 when there is none (an empty tensor, or E4M3 block
      // scales that are all 0: every block zero).
      const float top =
          q.blocks.scales.empty() ? 0.0f : *std::max_element(q.blocks.scales.begin(), q.blocks.scales.end()) * q.blocks.tensor_scale;
      st.scale = top > 0 ? top : 1.0f;
      return q;
    }
  }
  return q;
}

uint64_t Quantizer::rounding_seed() const { return stream_ * 0x9E3779B97F4A7C15ull + uint64_t(steps_); }

QuantizerState Quantizer::state() const { return {std::vector<float>(history_.begin(), history_.end()), scale_, steps_}; }

void Quantizer::load_state(const QuantizerState& s) {
  if (s.history.size() > size_t(std::max(c_.history, 0)) || s.steps < 0 || !(s.scale > 0) || !std::isfinite(s.scale))
    throw Error("quantizer: state does not fit its configuration (history " + std::to_string(s.history.size()) + " of at most " +
                std::to_string(c_.history) + ", scale " + std::to_string(s.scale) + ")");
  history_.assign(s.history.begin(), s.history.end());
  scale_ = s.scale;
  steps_ = s.steps;
  micro_ = -1;  // no step open
  micro_calls_ = step_calls_ = 0;
  step_amax_.clear();
}

}  // namespace scalify::quant
