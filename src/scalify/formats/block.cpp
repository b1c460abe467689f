#include "scalify/formats/block.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/platform/parallel.hpp"

namespace scalify {

namespace {

// Exponent and 24-bit significand of a positive finite f32.
void split_f32(float x, int& e, uint32_t& sig) { detail::normalise(std::bit_cast<uint32_t>(x), sig, e); }

}  // namespace

namespace {
constexpr std::pair<BlockScaleRule, const char*> kRuleNames[] = {{BlockScaleRule::mx_floor, "mx_floor"},
                                                                 {BlockScaleRule::mx_ceil, "mx_ceil"},
                                                                 {BlockScaleRule::f32_amax, "f32_amax"},
                                                                 {BlockScaleRule::nvfp4, "nvfp4"},
                                                                 {BlockScaleRule::e4m3_amax, "e4m3_amax"}};
static_assert(std::size(kRuleNames) == size_t(BlockScaleRule::e4m3_amax) + 1, "a name for every BlockScaleRule");
}  // namespace

const char* block_rule_name(BlockScaleRule r) { return kRuleNames[size_t(r)].second; }

BlockScaleRule parse_block_rule(const std::string& name) {
  for (const auto& [r, n] : kRuleNames)
    if (name == n) return r;
  throw Error("block_scale must be mx_floor, mx_ceil, f32_amax, nvfp4 or e4m3_amax, got '" + name + "'");
}

BlockSpec mx_blocks(int axis, BlockScaleRule rule, size_t size) {
  if (axis != 0 && axis != 1) throw Error("MX block axis must be 0 or 1, got " + std::to_string(axis));
  return axis == 1 ? BlockSpec{1, size, rule} : BlockSpec{size, 1, rule};
}

namespace {
// 2^k as an f32: built from its bits for normal exponents (ldexp costs a libm call per block).
float pow2f(int k) { return k >= -126 && k <= 127 ? std::bit_cast<float>(uint32_t(k + 127) << 23) : std::ldexp(1.0f, k); }
}  // namespace

float e4m3_nearest(float v) {
  if (!(v < 448.0f)) return 448.0f;
  const int e = v < 0x1p-6f ? -6 : std::ilogb(v);  // the subnormals share the quantum 2^-9
  const float quantum = pow2f(e - 3);
  return std::nearbyint(v / quantum) * quantum;  // exact scalings around a rounding to nearest even
}

float nvfp4_tensor_encode(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  return std::min(448.0f * 6.0f / amax, std::numeric_limits<float>::max());
}

float block_scale(float amax, Format element, BlockScaleRule rule, float tensor_encode) {
  if (!std::isfinite(amax)) return std::numeric_limits<float>::quiet_NaN();
  if (rule == BlockScaleRule::nvfp4 || rule == BlockScaleRule::e4m3_amax) {
    const float s = rule == BlockScaleRule::nvfp4 ? tensor_encode : 1.0f;
    return e4m3_nearest(amax / float(max_value(element)) * s);
  }
  const FormatInfo& f = info(element);
  if (rule == BlockScaleRule::f32_amax) {
    if (amax == 0.0f) return 1.0f;
    const float s = amax / float(max_value(element));
    if (s >= std::numeric_limits<float>::min()) return s;
    rule = BlockScaleRule::mx_ceil;  // f32 scale would be subnormal: use the exact power of two
  }
  if (amax == 0.0f) return std::ldexp(1.0f, -127);
  int e;
  uint32_t sig;
  split_f32(amax, e, sig);
  int k = e - f.emax();  // OCP floor rule: floor(log2 amax) - emax_elem
  if (rule == BlockScaleRule::mx_ceil) {
    int em;
    uint32_t max_sig;
    split_f32(float(max_value(element)), em, max_sig);
    k = e - em + (sig > max_sig ? 1 : 0);  // amax / 2^k <= max exactly
  }
  return pow2f(std::clamp(k, -127, 127));
}

std::vector<uint8_t> BlockQuantized::e8m0_scales() const {
  if (!pow2_block_scales(block.rule)) throw Error("e8m0_scales: the rule's block scales are not powers of two");
  std::vector<uint8_t> out(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) out[i] = uint8_t(encode(Format::e8m0, scales[i]));
  return out;
}

namespace {
// How one block is quantised, from its amax (as |x| bits).
struct BlockPlan {
  float scale = 1;    // the decode factor stored for the block
  bool keep = true;   // false: a NaN/inf block, decoded as NaN; its codes stay 0
  bool exact = true;  // the pre-scale (x * mul) * 2^shift is exact in f32: one call for the whole row
  float mul = 1;
  int shift = 0;
  bool used() const { return keep && exact; }
};
[[gnu::always_inline]] inline BlockPlan plan_block(uint32_t block_amax, Format element, const BlockSpec& spec, int element_emax,
                                                   float tensor_encode) {
  BlockPlan p;
  if (spec.rule == BlockScaleRule::nvfp4 || spec.rule == BlockScaleRule::e4m3_amax) {
    // One f32 multiply by S / b (TransformerEngine's encode), then the element cast.
    p.scale = block_scale(std::bit_cast<float>(block_amax), element, spec.rule, tensor_encode);
    p.keep = !std::isnan(p.scale);
    // S / b is clamped as TransformerEngine clamps it: a tensor of amax below ~1e-32 has S near
    // the f32 maximum, where S / b would be inf (and 0 * inf NaN).
    p.mul = p.scale > 0 ? std::min((spec.rule == BlockScaleRule::nvfp4 ? tensor_encode : 1.0f) / p.scale, std::numeric_limits<float>::max())
                        : 0.0f;
    return p;
  }
  // MX floor rule on a normal amax (nearly every block): the scale's exponent straight from the
  // amax's bits, as block_scale computes it; everything else through block_scale.
  const int amax_exp = int(block_amax >> 23) - 127;
  const bool fast = spec.rule == BlockScaleRule::mx_floor && block_amax >= 0x00800000u && block_amax < 0x7F800000u;
  const int k = std::clamp(amax_exp - element_emax, -127, 127);
  p.scale = fast ? pow2f(k) : block_scale(std::bit_cast<float>(block_amax), element, spec.rule);
  p.keep = !std::isnan(p.scale);
  if (p.keep) {
    if (spec.rule == BlockScaleRule::f32_amax)
      split_scale(1.0f / p.scale, p.mul, p.shift);
    else  // power of two: divide by exponent arithmetic, exactly
      p.shift = fast ? -k : -std::ilogb(p.scale);
  }
  p.exact = !p.keep || (p.shift >= -126 && p.shift <= 127);
  return p;
}
// The block quantiser's row loops. The library's baseline is SSE2 (no unsigned 32-bit max), so
// each is also built for AVX2 and used when the format kernels' ISA is AVX2 or better (not under
// SCALIFY_ISA=scalar). Integer max, f32 multiplies and bit masks give the same results either way.
struct RowLoops {
  // amax[c] = max(amax[c], |x[c]| as bits): NaN orders above inf, as the kernels' amax_bits.
  [[gnu::always_inline]] static inline void column_amax(const float* __restrict x, uint32_t* __restrict amax, size_t n) {
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
    for (size_t c = 0; c < n; ++c) amax[c] = std::max(amax[c], bits[c] & 0x7FFFFFFFu);
  }
  // t = (x * mul) * pow2, masked to +0 where mask is 0 (branch-free, so it vectorises).
  [[gnu::always_inline]] static inline void prescale(const float* __restrict x, const float* __restrict mul, const float* __restrict pow2,
                                                     const uint32_t* __restrict mask, float* __restrict t, size_t n) {
    for (size_t c = 0; c < n; ++c) t[c] = std::bit_cast<float>(std::bit_cast<uint32_t>((x[c] * mul[c]) * pow2[c]) & mask[c]);
  }
  [[gnu::always_inline]] static inline void scale(float* __restrict row, const float* __restrict s, size_t n) {
    for (size_t c = 0; c < n; ++c) row[c] *= s[c];
  }
  // One row of row blocks (1 x spec.cols): each block's plan from its amax, its scale stored, and
  // its values pre-scaled into t ((x * mul) * 2^shift; +0 for NaN and inexact blocks). Returns
  // whether every block was exact.
  [[gnu::always_inline]] static inline bool row_blocks(const float* __restrict x, size_t cols, Format element, const BlockSpec& spec,
                                                       int element_emax, float tensor_encode, BlockPlan* __restrict plans,
                                                       float* __restrict scales, float* __restrict t) {
    bool all_exact = true;
    for (size_t c0 = 0, bc = 0; c0 < cols; c0 += spec.cols, ++bc) {
      const size_t len = std::min(cols - c0, spec.cols);
      const uint32_t* bits = reinterpret_cast<const uint32_t*>(x + c0);
      uint32_t m = 0;
      for (size_t c = 0; c < len; ++c) m = std::max(m, bits[c] & 0x7FFFFFFFu);
      const BlockPlan p = plan_block(m, element, spec, element_emax, tensor_encode);
      plans[bc] = p;
      scales[bc] = p.scale;
      all_exact = all_exact && p.exact;
      const float mul = p.used() ? p.mul : 0.0f, pow2 = p.used() ? pow2f(p.shift) : 0.0f;
      if (p.used()) {
        for (size_t c = 0; c < len; ++c) t[c0 + c] = (x[c0 + c] * mul) * pow2;
      } else {
        for (size_t c = 0; c < len; ++c) t[c0 + c] = 0.0f;
      }
    }
    return all_exact;
  }
};

#if SCALIFY_HAVE_X86_SIMD
#define SCALIFY_AVX2 [[gnu::target("avx2")]]
#else
#define SCALIFY_AVX2
#endif
SCALIFY_AVX2 void column_amax_avx2(const float* x, uint32_t* amax, size_t n) { RowLoops::column_amax(x, amax, n); }
SCALIFY_AVX2 void prescale_avx2(const float* x, const float* m, const float* p, const uint32_t* k, float* t, size_t n) {
  RowLoops::prescale(x, m, p, k, t, n);
}
SCALIFY_AVX2 void scale_avx2(float* row, const float* s, size_t n) { RowLoops::scale(row, s, n); }
SCALIFY_AVX2 bool row_blocks_avx2(const float* x, size_t cols, Format element, const BlockSpec& spec, int emax, float tensor_encode,
                                  BlockPlan* plans, float* scales, float* t) {
  return RowLoops::row_blocks(x, cols, element, spec, emax, tensor_encode, plans, scales, t);
}
#undef SCALIFY_AVX2

bool row_loops_avx2() { return SCALIFY_HAVE_X86_SIMD && kernels::active_isa() != kernels::Isa::scalar; }
void column_amax(const float* x, uint32_t* amax, size_t n) {
  row_loops_avx2() ? column_amax_avx2(x, amax, n) : RowLoops::column_amax(x, amax, n);
}
void prescale_row(const float* x, const float* m, const float* p, const uint32_t* k, float* t, size_t n) {
  row_loops_avx2() ? prescale_avx2(x, m, p, k, t, n) : RowLoops::prescale(x, m, p, k, t, n);
}
void scale_row(float* row, const float* s, size_t n) { row_loops_avx2() ? scale_avx2(row, s, n) : RowLoops::scale(row, s, n); }
bool row_blocks(const float* x, size_t cols, Format element, const BlockSpec& spec, int emax, float tensor_encode, BlockPlan* plans,
                float* scales, float* t) {
  return row_loops_avx2() ? row_blocks_avx2(x, cols, element, spec, emax, tensor_encode, plans, scales, t)
                          : RowLoops::row_blocks(x, cols, element, spec, emax, tensor_encode, plans, scales, t);
}

kernels::QuantizeArgs block_args(const FormatInfo& f, Rounding rounding, uint64_t seed, const BlockPlan& p) {
  kernels::QuantizeArgs a{};
  a.format = &f;
  a.overflow = Overflow::saturate;
  a.rounding = rounding;
  a.seed = seed;
  a.mul = p.mul;
  a.exp_shift = p.shift;
  return a;
}
}  // namespace

BlockQuantized quantize_blocks(std::span<const float> x, size_t rows, size_t cols, Format element, const BlockSpec& spec, Rounding rounding,
                               uint64_t seed, const BlockRowsDone& rows_done) {
  if (x.size() != rows * cols)
    throw Error("quantize_blocks: " + std::to_string(x.size()) + " values do not form a " + std::to_string(rows) + " x " +
                std::to_string(cols) + " tensor");
  if (spec.rows == 0 || spec.cols == 0) throw Error("quantize_blocks: block size must be positive");
  if (element == Format::e8m0) throw Error("quantize_blocks: e8m0 is a scale format, not an element format");
  BlockQuantized q;
  q.element = element;
  q.rows = rows;
  q.cols = cols;
  q.block = spec;
  const FormatInfo& f = info(element);
  const size_t cb = size_t(f.storage_bytes());
  q.codes.resize(rows * cols * cb);  // not zeroed: every code is written below
  q.scales.resize(q.scale_rows() * q.scale_cols());
  const kernels::KernelTable& k = kernels::active_kernels();
  const size_t scale_cols = q.scale_cols();

  // Whole rows per kernel call, for any block shape (a call per 32-element block spent most of
  // its time setting up): each row is pre-scaled per block into f32 -- x * mul, then an exact power of two, the arithmetic
  // the kernel applies to one block -- and quantised in one call at scale 1. (Where the pre-scaled
  // value would be an f32 subnormal it lies some 2^120 below its block's amax, and every format
  // rounds it to zero either way.) Blocks whose power of two is outside f32's normal range take
  // the per-element call with their own arguments. Block rows run in parallel.
  const int64_t block_rows = int64_t(q.scale_rows());
  const int element_emax = f.emax();
  kernels::QuantizeArgs one = block_args(f, rounding, seed, BlockPlan{});
  // nvfp4: the tensor's encode scale from its abs-max, first.
  float tensor_encode = 1.0f;
  if (spec.rule == BlockScaleRule::nvfp4) {
    const uint32_t amax_bits = k.amax_bits(x.data(), x.size());
    tensor_encode = nvfp4_tensor_encode(std::bit_cast<float>(amax_bits));
    q.tensor_scale = 1.0f / tensor_encode;
  }
  // Row r's codes from its pre-scaled copy t, in one call; blocks whose pre-scale is not exact
  // then take the per-element call with their own arguments.
  auto emit_row = [&](size_t r, const float* t, const BlockPlan* plans, bool all_exact) {
    const float* row = x.data() + r * cols;
    std::byte* out = q.codes.data() + r * cols * cb;  // pointer arithmetic: a [4, 0] tensor has no codes
    kernels::QuantizeArgs a = one;
    a.offset = r * cols;
    k.quantize(t, cols, out, a);
    if (all_exact) return;
    for (size_t bc = 0; bc < scale_cols; ++bc)
      if (plans[bc].keep && !plans[bc].exact) {
        const size_t c0 = bc * spec.cols, c1 = std::min(cols, c0 + spec.cols);
        kernels::QuantizeArgs e = block_args(f, rounding, seed, plans[bc]);
        e.offset = r * cols + c0;
        k.quantize(row + c0, c1 - c0, out + c0 * cb, e);
      }
  };
  if (spec.rows == 1) {
    // Row blocks (MX along K): each block's amax, plan and pre-scale straight from its own 32 (or
    // spec.cols) values, then the whole row quantised in one call.
#pragma omp parallel if (rows * cols > size_t(platform::kParallelGrain))
    {
      std::vector<float> tmp(cols);
      std::vector<BlockPlan> plans(scale_cols);
#pragma omp for schedule(static)
      for (int64_t ri = 0; ri < int64_t(rows); ++ri) {
        const size_t r = size_t(ri);
        const bool all_exact = row_blocks(x.data() + r * cols, cols, element, spec, element_emax, tensor_encode, plans.data(),
                                          q.scales.data() + r * scale_cols, tmp.data());
        emit_row(r, tmp.data(), plans.data(), all_exact);
        if (rows_done) rows_done(q, r, r + 1);
      }
    }
    return q;
  }
  // Taller blocks: a block row's amaxes come from one vectorised pass down its rows; each row is
  // then pre-scaled per column and quantised in one call.
#pragma omp parallel if (rows * cols > size_t(platform::kParallelGrain))
  {
    std::vector<uint32_t> amax(cols);
    std::vector<float> mul(cols), pow2(cols), tmp(cols);
    std::vector<uint32_t> mask(cols);  // all ones where the pre-scaled value is used, else 0
    std::vector<BlockPlan> plans(scale_cols);
#pragma omp for schedule(dynamic, 4)
    for (int64_t bri = 0; bri < block_rows; ++bri) {
      const size_t br = size_t(bri), r0 = br * spec.rows, r1 = std::min(rows, r0 + spec.rows);
      std::fill(amax.begin(), amax.end(), 0u);
      for (size_t r = r0; r < r1; ++r) column_amax(x.data() + r * cols, amax.data(), cols);
      bool all_exact = true;
      for (size_t bc = 0; bc < scale_cols; ++bc) {
        const size_t c0 = bc * spec.cols, c1 = std::min(cols, c0 + spec.cols);
        uint32_t block_max = amax[c0];
        for (size_t c = c0 + 1; c < c1; ++c) block_max = std::max(block_max, amax[c]);
        const BlockPlan p = plan_block(block_max, element, spec, element_emax, tensor_encode);
        plans[bc] = p;
        q.scales[br * scale_cols + bc] = p.scale;
        all_exact = all_exact && p.exact;
        const float mul_b = p.used() ? p.mul : 0.0f, pow2_b = p.used() ? pow2f(p.shift) : 0.0f;
        const uint32_t mask_b = p.used() ? 0xFFFFFFFFu : 0u;
        for (size_t c = c0; c < c1; ++c) {
          mul[c] = mul_b;
          pow2[c] = pow2_b;
          mask[c] = mask_b;
        }
      }
      for (size_t r = r0; r < r1; ++r) {
        // NaN and inexact blocks are masked to +0 (x * 0 would be NaN for an inf or NaN x).
        prescale_row(x.data() + r * cols, mul.data(), pow2.data(), mask.data(), tmp.data(), cols);
        emit_row(r, tmp.data(), plans.data(), all_exact);
      }
      if (rows_done) rows_done(q, r0, r1);
    }
  }
  return q;
}

void check_blocks(const BlockQuantized& q, size_t out_size, const char* op) {
  const std::string o(op);
  const size_t cb = size_t(info(q.element).storage_bytes());
  size_t n = 0, code_bytes = 0;
  if (__builtin_mul_overflow(q.rows, q.cols, &n) || __builtin_mul_overflow(n, cb, &code_bytes))
    throw Error(o + ": a " + std::to_string(q.rows) + " x " + std::to_string(q.cols) + " tensor is too large");
  if (q.block.rows == 0 || q.block.cols == 0) throw Error(o + ": block size must be positive");
  if (q.codes.size() != code_bytes)
    throw Error(o + ": " + std::to_string(q.codes.size()) + " bytes of codes, expected " + std::to_string(code_bytes) + " for a " +
                std::to_string(q.rows) + " x " + std::to_string(q.cols) + " tensor");
  if (q.scales.size() != q.scale_rows() * q.scale_cols())
    throw Error(o + ": " + std::to_string(q.scales.size()) + " scales, expected " + std::to_string(q.scale_rows()) + " x " +
                std::to_string(q.scale_cols()) + " for " + std::to_string(q.rows) + " x " + std::to_string(q.cols) + " in blocks of " +
                std::to_string(q.block.rows) + " x " + std::to_string(q.block.cols));
  if (out_size != n) throw Error(o + ": output has " + std::to_string(out_size) + " elements, the tensor " + std::to_string(n));
}

namespace {

// Decodes rows one at a time with the SIMD codec and multiplies each by its blocks' scales (v *
// scale in f32, as the kernels apply it): a kernel call per 32-element block spent most of its time
// setting up. col_scale holds the scales of one block row, one per column, expanded on demand.
class RowDecoder {
 public:
  explicit RowDecoder(const BlockQuantized& q) : q_(q), f_(info(q.element)), k_(kernels::active_kernels()), col_scale_(q.cols) {}
  void decode(size_t r, float* dest, bool with_tensor_scale) {
    const size_t br = r / q_.block.rows, cb = size_t(f_.storage_bytes());
    if (br != expanded_) {
      for (size_t bc = 0; bc < q_.scale_cols(); ++bc)
        std::fill(col_scale_.begin() + ptrdiff_t(bc * q_.block.cols),
                  col_scale_.begin() + ptrdiff_t(std::min(q_.cols, (bc + 1) * q_.block.cols)), q_.scales[br * q_.scale_cols() + bc]);
      expanded_ = br;
    }
    k_.dequantize(q_.codes.data() + r * q_.cols * cb, q_.cols, dest, f_, 1.0f);
    scale_row(dest, col_scale_.data(), q_.cols);
    if (with_tensor_scale && q_.tensor_scale != 1.0f)
      for (size_t c = 0; c < q_.cols; ++c) dest[c] *= q_.tensor_scale;
  }

 private:
  const BlockQuantized& q_;
  const FormatInfo& f_;
  const kernels::KernelTable& k_;
  std::vector<float> col_scale_;
  size_t expanded_ = SIZE_MAX;
};

// Decodes the rows in parallel (RowDecoder). A row goes to `out` when given, else to a per-thread
// buffer handed to row_fn(r, row).
template <class RowFn>
void for_decoded_rows(const BlockQuantized& q, float* out, bool with_tensor_scale, RowFn row_fn) {
  if (q.cols == 0) return;
#pragma omp parallel if (q.rows * q.cols > size_t(platform::kParallelGrain))
  {
    RowDecoder decoder(q);
    std::vector<float> row(out ? 0 : q.cols);
#pragma omp for
    for (int64_t ri = 0; ri < int64_t(q.rows); ++ri) {
      const size_t r = size_t(ri);
      float* dest = out ? out + r * q.cols : row.data();  // pointer arithmetic: an empty row must not index
      decoder.decode(r, dest, with_tensor_scale);
      if (!out) row_fn(r, dest);
    }
  }
}
}  // namespace

void dequantize_block_rows(const BlockQuantized& q, size_t r0, size_t r1, std::span<float> out) {
  check_blocks(q, q.rows * q.cols, "dequantize_block_rows");
  if (r0 > r1 || r1 > q.rows || out.size() != (r1 - r0) * q.cols)
    throw Error("dequantize_block_rows: rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") of " + std::to_string(q.rows) +
                " into " + std::to_string(out.size()) + " values");
  if (q.cols == 0) return;
  RowDecoder decoder(q);
  for (size_t r = r0; r < r1; ++r) decoder.decode(r, out.data() + (r - r0) * q.cols, true);
}

void dequantize_blocks(const BlockQuantized& q, std::span<float> out) {
  check_blocks(q, out.size(), "dequantize_blocks");
  for_decoded_rows(q, out.data(), true, [](size_t, const float*) {});
}

bool dequantize_blocks_bf16(const BlockQuantized& q, std::span<uint16_t> out) {
  check_blocks(q, out.size(), "dequantize_blocks_bf16");
  bool exact = true;  // rows run on several threads: each only ever clears it
  for_decoded_rows(q, nullptr, false, [&](size_t r, const float* row) {
    if (!truncate_to_bf16_exact(std::span(row, q.cols), std::span(out.data() + r * q.cols, q.cols))) {
#pragma omp atomic write
      exact = false;
    }
  });
  return exact;
}

}  // namespace scalify
