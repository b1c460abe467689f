#pragma once
// Bulk conversion over spans: quantise with a scale, decode with a scale, abs-max, and quantise
// fused with abs-max in one pass. SIMD (AVX-512 / AVX2, chosen at run time) and multi-threaded
// (OpenMP) for large inputs; results are identical whatever the ISA or thread count.
//
// Scale convention: quantize() stores encode(x * scale) and dequantize() returns
// decode(code) * scale. A scaled tensor X = X_d * X_s therefore round-trips as
// quantize(X, fmt, 1 / X_s) and dequantize(codes, fmt, X_s). A power-of-two scale is applied
// exactly (by exponent arithmetic, so no double rounding even outside the f32 range); any other
// finite positive scale multiplies in f32 first.
#include <cstddef>
#include <cstdint>
#include <span>

#include "scalify/formats/format.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify {

struct QuantizeOptions {
  Overflow overflow = kDefaultOverflow;  // training casts saturate; the same default as EncodeOptions
  Rounding rounding = Rounding::nearest_even;
  uint64_t seed = 0;    // stochastic rounding: element i draws random_bits(seed, offset + i)
  uint64_t offset = 0;  // index of src[0] in a larger tensor, so pieces draw distinct bits
};

// codes.size() must be src.size() * info(fmt).storage_bytes(). A NaN into a format without NaN
// (FP6/FP4, int8) throws scalify::Error.
void quantize(std::span<const float> src, Format fmt, float scale, std::span<std::byte> codes, const QuantizeOptions& opt = {});
// Same, returning max |src| (of the input, before scaling; NaN if src has a NaN).
float quantize_amax(std::span<const float> src, Format fmt, float scale, std::span<std::byte> codes, const QuantizeOptions& opt = {});
void dequantize(std::span<const std::byte> codes, Format fmt, float scale, std::span<float> out);
// The values quantize_amax's codes decode to (dequantize at scale 1), written as f32 without the
// codes: one pass where the active kernels have a fused form (round to nearest even into the FP8,
// FP6, FP4 and f16 formats), else encoded and decoded a chunk at a time. Returns max |src| as
// quantize_amax does; values.size() must be src.size().
float quantize_values_amax(std::span<const float> src, Format fmt, float scale, std::span<float> values, const QuantizeOptions& opt = {});
// max |x|; NaN if any element is NaN; 0 for an empty span.
float amax(std::span<const float> src);

// Writes each f32 value's upper half (its bf16 truncation) to out and returns whether every one
// was exact: no bits below bf16's mantissa, and no non-zero value below 2^-63 (bf16 dot products
// flush subnormals, so a product of two such values could leave f32's normal range). One thread:
// callers split large inputs.
bool truncate_to_bf16_exact(std::span<const float> in, std::span<uint16_t> out);

// Whether every value of `fmt` is a normal bf16 value whose pairwise products stay normal in f32,
// so bf16 dot products (which flush subnormals) multiply them exactly: the one-byte float formats
// (FP8, FP6, FP4) except E8M0, whose 2^-127 is a bf16 subnormal.
bool codes_fit_bf16(Format fmt);
// One-byte float codes as bf16 bit patterns of their values: decoded a cache-sized chunk at a
// time, then truncated (exact for the codes_fit_bf16 formats). Parallel for large inputs.
void codes_to_bf16(std::span<const std::byte> codes, Format fmt, std::span<uint16_t> out);

// Threads used by bulk kernels on large inputs (default: OpenMP's default).
void set_num_threads(int n);
int num_threads();

// Splits a positive finite scale into mantissa (1 <= m < 2) and exponent: scale = m * 2^e.
// Throws scalify::Error naming `what` for zero, negative, NaN or infinite scales.
void split_scale(float scale, float& mantissa, int& exponent, const char* what = "scale");

}  // namespace scalify
