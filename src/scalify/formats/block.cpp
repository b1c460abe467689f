#include "scalify/formats/block.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cstring>
#include <string>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"

namespace scalify {

namespace {

// Exponent and 24-bit significand of a positive finite f32.
void split_f32(float x, int& e, uint32_t& sig) { detail::normalise(std::bit_cast<uint32_t>(x), sig, e); }

}  // namespace

BlockSpec mx_blocks(int axis, BlockScaleRule rule, size_t size) {
  if (axis != 0 && axis != 1) throw Error("MX block axis must be 0 or 1, got " + std::to_string(axis));
  return axis == 1 ? BlockSpec{1, size, rule} : BlockSpec{size, 1, rule};
}

float block_scale(float amax, Format element, BlockScaleRule rule) {
  if (!std::isfinite(amax)) return std::numeric_limits<float>::quiet_NaN();
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
  return std::ldexp(1.0f, std::clamp(k, -127, 127));
}

std::vector<uint8_t> BlockQuantized::e8m0_scales() const {
  if (block.rule == BlockScaleRule::f32_amax)
    throw Error("e8m0_scales: f32_amax block scales are not powers of two");
  std::vector<uint8_t> out(scales.size());
  for (size_t i = 0; i < scales.size(); ++i)
    out[i] = uint8_t(encode(Format::e8m0, scales[i]));
  return out;
}

namespace {
// Column blocks (K x 1) without transposing: a block row's amaxes come from one vectorised pass
// down its rows; then each row is scaled per column into f32 -- x * mul, then an exact power of
// two, the arithmetic the kernel applies to one block -- and quantised in one kernel call at
// scale 1. (Where the pre-scaled value would be an f32 subnormal it lies some 2^120 below the
// block's amax, and any format rounds it to zero either way.) A column whose power of two is
// outside f32's normal range takes the per-element kernel call with its own arguments.
BlockQuantized quantize_column_blocks(std::span<const float> x, size_t rows, size_t cols, Format element,
                                      const BlockSpec& spec, Rounding rounding) {
  BlockQuantized q;
  q.element = element;
  q.rows = rows;
  q.cols = cols;
  q.block = spec;
  const FormatInfo& f = info(element);
  const size_t cb = size_t(f.storage_bytes());
  q.codes.assign(rows * cols * cb, std::byte{0});
  q.scales.resize(q.scale_rows() * cols);
  const kernels::KernelTable& k = kernels::active_kernels();
  const int64_t block_rows = int64_t(q.scale_rows());
#pragma omp parallel if (rows * cols > (size_t(1) << 15))
  {
    std::vector<uint32_t> amax(cols);
    std::vector<float> mul(cols), pow2(cols), tmp(cols);
    std::vector<kernels::QuantizeArgs> args(cols);
    std::vector<uint8_t> keep(cols), exact(cols);
#pragma omp for schedule(dynamic, 4)
    for (int64_t bri = 0; bri < block_rows; ++bri) {
      const size_t br = size_t(bri), r0 = br * spec.rows, r1 = std::min(rows, r0 + spec.rows);
      std::fill(amax.begin(), amax.end(), 0u);
      for (size_t r = r0; r < r1; ++r) {  // |x| as bits: NaN orders above inf, as amax_bits
        const uint32_t* bits = reinterpret_cast<const uint32_t*>(x.data() + r * cols);
        for (size_t c = 0; c < cols; ++c) amax[c] = std::max(amax[c], bits[c] & 0x7FFFFFFFu);
      }
      bool all_exact = true;
      for (size_t c = 0; c < cols; ++c) {
        const float scale = block_scale(std::bit_cast<float>(amax[c]), element, spec.rule);
        q.scales[br * cols + c] = scale;
        kernels::QuantizeArgs& a = args[c];
        a = kernels::QuantizeArgs{};
        a.format = &f;
        a.overflow = Overflow::saturate;
        a.rounding = rounding;
        keep[c] = !std::isnan(scale);  // a NaN block decodes as NaN; its element codes stay 0
        if (!keep[c]) {
          mul[c] = pow2[c] = 0.0f;
          exact[c] = 1;
          continue;
        }
        if (spec.rule == BlockScaleRule::f32_amax) {
          split_scale(1.0f / scale, a.mul, a.exp_shift);
        } else {
          a.mul = 1.0f;
          a.exp_shift = -std::ilogb(scale);
        }
        exact[c] = a.exp_shift >= -126 && a.exp_shift <= 127;
        all_exact = all_exact && exact[c];
        mul[c] = a.mul;
        pow2[c] = exact[c] ? std::ldexp(1.0f, a.exp_shift) : 0.0f;
      }
      for (size_t r = r0; r < r1; ++r) {
        const float* row = x.data() + r * cols;
        for (size_t c = 0; c < cols; ++c) tmp[c] = keep[c] ? (row[c] * mul[c]) * pow2[c] : 0.0f;
        kernels::QuantizeArgs one{};
        one.format = &f;
        one.mul = 1.0f;
        one.overflow = Overflow::saturate;
        one.rounding = rounding;
        one.offset = r * cols;
        std::byte* out = &q.codes[r * cols * cb];
        k.quantize(tmp.data(), cols, out, one);
        if (all_exact) continue;
        for (size_t c = 0; c < cols; ++c)
          if (!exact[c]) {
            args[c].offset = r * cols + c;
            k.quantize(row + c, 1, out + c * cb, args[c]);
          }
      }
    }
  }
  return q;
}
}  // namespace

BlockQuantized quantize_blocks(std::span<const float> x, size_t rows, size_t cols, Format element,
                               const BlockSpec& spec, Rounding rounding) {
  if (spec.cols == 1 && spec.rows > 1 && x.size() == rows * cols && element != Format::e8m0)
    return quantize_column_blocks(x, rows, cols, element, spec, rounding);
  if (x.size() != rows * cols)
    throw Error("quantize_blocks: " + std::to_string(x.size()) + " values do not form a " +
                std::to_string(rows) + " x " + std::to_string(cols) + " tensor");
  if (spec.rows == 0 || spec.cols == 0) throw Error("quantize_blocks: block size must be positive");
  if (element == Format::e8m0) throw Error("quantize_blocks: e8m0 is a scale format, not an element format");
  BlockQuantized q;
  q.element = element;
  q.rows = rows;
  q.cols = cols;
  q.block = spec;
  const FormatInfo& f = info(element);
  const size_t cb = size_t(f.storage_bytes());
  q.codes.assign(rows * cols * cb, std::byte{0});
  q.scales.resize(q.scale_rows() * q.scale_cols());
  const kernels::KernelTable& k = kernels::active_kernels();

  // Block rows in parallel: each writes its own codes and scales.
  const int64_t block_rows = int64_t(q.scale_rows());
#pragma omp parallel for schedule(dynamic, 16) if (rows * cols > (size_t(1) << 15))
  for (int64_t bri = 0; bri < block_rows; ++bri) {
    const size_t br = size_t(bri);
    const size_t r0 = br * spec.rows, r1 = std::min(rows, r0 + spec.rows);
    for (size_t bc = 0; bc < q.scale_cols(); ++bc) {
      const size_t c0 = bc * spec.cols, c1 = std::min(cols, c0 + spec.cols);
      uint32_t amax_bits = 0;
      for (size_t r = r0; r < r1; ++r)
        amax_bits = std::max(amax_bits, k.amax_bits(&x[r * cols + c0], c1 - c0));
      const float scale = block_scale(std::bit_cast<float>(amax_bits), element, spec.rule);
      q.scales[br * q.scale_cols() + bc] = scale;
      if (std::isnan(scale)) continue;  // the block decodes as NaN; its element codes stay 0
      kernels::QuantizeArgs a{};
      a.format = &f;
      if (spec.rule == BlockScaleRule::f32_amax) {
        split_scale(1.0f / scale, a.mul, a.exp_shift);
      } else {  // power of two: divide by exponent arithmetic, exactly
        a.mul = 1.0f;
        a.exp_shift = -std::ilogb(scale);
      }
      a.overflow = Overflow::saturate;
      a.rounding = rounding;
      for (size_t r = r0; r < r1; ++r) {
        a.offset = r * cols + c0;
        k.quantize(&x[r * cols + c0], c1 - c0, &q.codes[(r * cols + c0) * cb], a);
      }
    }
  }
  return q;
}

void dequantize_blocks(const BlockQuantized& q, std::span<float> out) {
  // The struct is plain data: check it is consistent before indexing codes and scales with it.
  const FormatInfo& f = info(q.element);
  const size_t cb = size_t(f.storage_bytes());
  size_t n = 0, code_bytes = 0;
  if (__builtin_mul_overflow(q.rows, q.cols, &n) || __builtin_mul_overflow(n, cb, &code_bytes))
    throw Error("dequantize_blocks: a " + std::to_string(q.rows) + " x " + std::to_string(q.cols) + " tensor is too large");
  if (q.block.rows == 0 || q.block.cols == 0) throw Error("dequantize_blocks: block size must be positive");
  if (q.codes.size() != code_bytes)
    throw Error("dequantize_blocks: " + std::to_string(q.codes.size()) + " bytes of codes, expected " +
                std::to_string(code_bytes) + " for a " + std::to_string(q.rows) + " x " + std::to_string(q.cols) + " tensor");
  if (q.scales.size() != q.scale_rows() * q.scale_cols())
    throw Error("dequantize_blocks: " + std::to_string(q.scales.size()) + " scales, expected " +
                std::to_string(q.scale_rows()) + " x " + std::to_string(q.scale_cols()) + " for " +
                std::to_string(q.rows) + " x " + std::to_string(q.cols) + " in blocks of " +
                std::to_string(q.block.rows) + " x " + std::to_string(q.block.cols));
  if (out.size() != n)
    throw Error("dequantize_blocks: output has " + std::to_string(out.size()) +
                " elements, the tensor " + std::to_string(n));
  // One SIMD decode per row, then each block's scale as the kernels apply it (v * scale in f32):
  // a kernel call per 32-element block spent most of its time setting up.
  // Pointer arithmetic, not &out[i]: an empty row ([4, 0]) must not index an empty span.
  const kernels::KernelTable& k = kernels::active_kernels();
  if (q.cols == 0) return;
#pragma omp parallel for if (n > (size_t(1) << 15))
  for (int64_t ri = 0; ri < int64_t(q.rows); ++ri) {
    const size_t r = size_t(ri);
    float* row = out.data() + r * q.cols;
    k.dequantize(q.codes.data() + r * q.cols * cb, q.cols, row, f, 1.0f);
    for (size_t bc = 0; bc < q.scale_cols(); ++bc) {
      const float scale = q.scales[(r / q.block.rows) * q.scale_cols() + bc];
      if (scale == 1.0f) continue;
      for (size_t c = bc * q.block.cols, end = std::min(q.cols, c + q.block.cols); c < end; ++c) row[c] *= scale;
    }
  }
}

}  // namespace scalify
