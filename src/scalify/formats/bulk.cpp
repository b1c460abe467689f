#include "scalify/formats/bulk.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"

namespace scalify {

namespace {

int g_threads = 0;  // 0: OpenMP default

// Inputs below this size run on one thread: thread start-up would cost more than it saves.
constexpr size_t kParallelMin = size_t(1) << 18;
constexpr size_t kChunk = size_t(1) << 16;

// Runs body(begin, end) over [0, n) in chunks, in parallel for large n; returns the max of the
// bodies' results. Chunks never cross a 2^32 boundary of the global index (offset + i), which the
// stochastic-rounding kernels rely on.
template <class Body>
uint32_t parallel_chunks(size_t n, uint64_t offset, Body body) {
  const int threads = g_threads > 0 ? g_threads : omp_get_max_threads();
  if (n < kParallelMin || threads <= 1) {
    uint32_t m = 0;
    size_t i = 0;
    while (i < n) {
      const uint64_t to_boundary = (uint64_t(1) << 32) - ((offset + i) & 0xFFFFFFFFu);
      const size_t end = size_t(std::min<uint64_t>(n, i + to_boundary));
      m = std::max(m, body(i, end));
      i = end;
    }
    return m;
  }
  const size_t chunks = (n + kChunk - 1) / kChunk;
  uint32_t m = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(max : m)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    // A chunk of 2^16 crosses a 2^32 index boundary only if offset is not chunk-aligned there.
    const uint64_t to_boundary = (uint64_t(1) << 32) - ((offset + begin) & 0xFFFFFFFFu);
    const size_t split = size_t(std::min<uint64_t>(end, begin + to_boundary));
    uint32_t r = body(begin, split);
    if (split < end) r = std::max(r, body(split, end));
    m = std::max(m, r);
  }
  return m;
}

kernels::QuantizeArgs make_args(Format fmt, float scale, const QuantizeOptions& opt) {
  kernels::QuantizeArgs a{};
  a.format = &info(fmt);
  split_scale(scale, a.mul, a.exp_shift, "quantize scale");
  a.overflow = opt.overflow;
  a.rounding = opt.rounding;
  a.seed = opt.seed;
  return a;
}

void check_sizes(size_t n, Format fmt, size_t code_bytes, const char* op) {
  const size_t need = n * size_t(info(fmt).storage_bytes());
  if (code_bytes != need)
    throw Error(std::string(op) + ": " + std::to_string(n) + " values of " + std::string(format_name(fmt)) + " need " +
                std::to_string(need) + " bytes of codes, got " + std::to_string(code_bytes));
}

// Formats without NaN (FP6/FP4, int8) reject a NaN input before anything is written: a caller's
// buffer is never left half-quantised by the error.
void reject_nan_if_unrepresentable(std::span<const float> src, Format fmt, const kernels::KernelTable& k) {
  if (info(fmt).has_nan()) return;
  const uint32_t m = parallel_chunks(src.size(), 0, [&](size_t b, size_t e) { return k.amax_bits(src.data() + b, e - b); });
  if (std::isnan(std::bit_cast<float>(m)))
    throw Error("quantize: input contains NaN, which " + std::string(format_name(fmt)) +
                " cannot represent (a NaN must not silently become a number)");
}

float quantize_impl(std::span<const float> src, Format fmt, float scale, std::span<std::byte> codes, const QuantizeOptions& opt,
                    bool want_amax) {
  check_sizes(src.size(), fmt, codes.size(), "quantize");
  kernels::QuantizeArgs args = make_args(fmt, scale, opt);
  const kernels::KernelTable& k = kernels::active_kernels();
  reject_nan_if_unrepresentable(src, fmt, k);
  const bool amax_needed = want_amax;
  const int cb = info(fmt).storage_bytes();
  const uint32_t m = parallel_chunks(src.size(), opt.offset, [&](size_t b, size_t e) -> uint32_t {
    kernels::QuantizeArgs a = args;
    a.offset = opt.offset + b;
    std::byte* out = codes.data() + b * size_t(cb);
    if (amax_needed) return k.quantize_amax(src.data() + b, e - b, out, a);
    k.quantize(src.data() + b, e - b, out, a);
    return 0;
  });
  return std::bit_cast<float>(m);
}

}  // namespace

bool truncate_to_bf16_exact(std::span<const float> in, std::span<uint16_t> out) {
  if (out.size() != in.size()) throw Error("truncate_to_bf16_exact: output size differs from input size");
  uint32_t low = 0, tiny = 0;               // ORs over the values: zero when all are bf16 values / >= 2^-63
  for (size_t i = 0; i < in.size(); ++i) {  // branch-free, so it vectorises
    const uint32_t bits = std::bit_cast<uint32_t>(in[i]), magnitude = bits & 0x7FFFFFFFu;
    low |= bits & 0xFFFFu;
    tiny |= uint32_t(magnitude != 0 && magnitude < (64u << 23));
    out[i] = uint16_t(bits >> 16);
  }
  return low == 0 && tiny == 0;
}

bool codes_fit_bf16(Format fmt) {
  const FormatInfo& f = info(fmt);
  return f.is_float() && f.storage_bytes() == 1 && f.man_bits <= 7 && f.exp_bits <= 5;
}

void codes_to_bf16(std::span<const std::byte> codes, Format fmt, std::span<uint16_t> out) {
  if (info(fmt).storage_bytes() != 1 || !info(fmt).is_float())
    throw Error("codes_to_bf16: needs one-byte float codes, got " + std::string(format_name(fmt)));
  if (out.size() != codes.size()) throw Error("codes_to_bf16: output size differs from the number of codes");
  constexpr size_t kChunk = 4096;  // 16 KB of f32: stays in L1 between the decode and the truncation
  const size_t n = codes.size(), chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > (size_t(1) << 16))
  for (int64_t c = 0; c < int64_t(chunks); ++c) {
    float buf[kChunk];
    const size_t begin = size_t(c) * kChunk, len = std::min(kChunk, n - begin);
    dequantize(codes.subspan(begin, len), fmt, 1.0f, std::span(buf, len));
    for (size_t i = 0; i < len; ++i) out[begin + i] = uint16_t(std::bit_cast<uint32_t>(buf[i]) >> 16);
  }
}

void split_scale(float scale, float& mantissa, int& exponent, const char* what) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    throw Error(std::string(what) + " must be a finite positive number, got " + std::to_string(scale));
  const float m = std::frexp(scale, &exponent);  // m in [0.5, 1)
  mantissa = m * 2.0f;
  exponent -= 1;
}

void quantize(std::span<const float> src, Format fmt, float scale, std::span<std::byte> codes, const QuantizeOptions& opt) {
  quantize_impl(src, fmt, scale, codes, opt, false);
}

float quantize_amax(std::span<const float> src, Format fmt, float scale, std::span<std::byte> codes, const QuantizeOptions& opt) {
  return quantize_impl(src, fmt, scale, codes, opt, true);
}

float quantize_values_amax(std::span<const float> src, Format fmt, float scale, std::span<float> values, const QuantizeOptions& opt) {
  if (values.size() != src.size())
    throw Error("quantize_values_amax: " + std::to_string(src.size()) + " values in, room for " + std::to_string(values.size()));
  const kernels::QuantizeArgs args = make_args(fmt, scale, opt);
  const kernels::KernelTable& k = kernels::active_kernels();
  reject_nan_if_unrepresentable(src, fmt, k);
  const FormatInfo& f = info(fmt);
  const uint32_t m = parallel_chunks(src.size(), opt.offset, [&](size_t b, size_t e) -> uint32_t {
    kernels::QuantizeArgs a = args;
    a.offset = opt.offset + b;
    uint32_t bits = 0;
    if (k.quantize_values_amax(src.data() + b, e - b, values.data() + b, a, &bits)) return bits;
    constexpr size_t kPiece = 4096;  // codes of a piece stay in L1 between the encode and the decode
    std::byte codes[kPiece * 4];
    for (size_t i = b; i < e; i += kPiece) {
      const size_t len = std::min(kPiece, e - i);
      a.offset = opt.offset + i;
      bits = std::max(bits, k.quantize_amax(src.data() + i, len, codes, a));
      k.dequantize(codes, len, values.data() + i, f, 1.0f);
    }
    return bits;
  });
  return std::bit_cast<float>(m);
}

void dequantize(std::span<const std::byte> codes, Format fmt, float scale, std::span<float> out) {
  check_sizes(out.size(), fmt, codes.size(), "dequantize");
  if (!(scale > 0.0f) || !std::isfinite(scale))  // as quantize: a zero or negative scale makes every value garbage
    throw Error("dequantize: scale must be a finite positive number, got " + std::to_string(scale));
  const kernels::KernelTable& k = kernels::active_kernels();
  const FormatInfo& f = info(fmt);
  parallel_chunks(out.size(), 0, [&](size_t b, size_t e) -> uint32_t {
    k.dequantize(codes.data() + b * size_t(f.storage_bytes()), e - b, out.data() + b, f, scale);
    return 0;
  });
}

float amax(std::span<const float> src) {
  const kernels::KernelTable& k = kernels::active_kernels();
  const uint32_t m = parallel_chunks(src.size(), 0, [&](size_t b, size_t e) { return k.amax_bits(src.data() + b, e - b); });
  return std::bit_cast<float>(m);
}

void set_num_threads(int n) { g_threads = std::max(n, 0); }
int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

}  // namespace scalify
