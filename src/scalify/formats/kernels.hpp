#pragma once
// Bulk kernel tables: the plain scalar reference and the SIMD builds (AVX2, AVX-512) of the same
// operations, chosen at run time. Users call the checked API in bulk.hpp; tests and benchmarks
// reach the individual tables here to compare them.
#include <cstddef>
#include <cstdint>

#include "scalify/formats/format.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify::kernels {

// Counter-based random bits for stochastic rounding: element `index` of a call seeded with `seed`
// gets the same bits whatever the thread count, chunking or SIMD width.
constexpr uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}
// Key for all indices that share their top 32 bits; bits = mix32(low32(index) ^ key).
constexpr uint32_t random_key(uint64_t seed, uint64_t index) {
  return mix32(uint32_t(seed) ^ mix32(uint32_t(seed >> 32) ^ mix32(uint32_t(index >> 32) + 1u)));
}
constexpr uint32_t random_bits(uint64_t seed, uint64_t index) { return mix32(uint32_t(index) ^ random_key(seed, index)); }

struct QuantizeArgs {
  const FormatInfo* format;
  float mul;      // applied in f32 first (1 = skip): the non-power-of-two part of the scale
  int exp_shift;  // then an exact multiplication by 2^exp_shift
  Overflow overflow;
  Rounding rounding;
  uint64_t seed;
  uint64_t offset;  // global index of src[0] (stochastic rounding); a call never crosses 2^32
};

struct KernelTable {
  const char* name;
  // codes: storage_bytes() per element (uint8/uint16/uint32 little-endian)
  void (*quantize)(const float* src, size_t n, void* codes, const QuantizeArgs& args);
  // Same, and returns the abs-max of src as f32 bits (NaN bits if any NaN) in the same pass.
  uint32_t (*quantize_amax)(const float* src, size_t n, void* codes, const QuantizeArgs& args);
  // out = decode(code) * scale
  void (*dequantize)(const void* codes, size_t n, float* out, const FormatInfo& f, float scale);
  uint32_t (*amax_bits)(const float* src, size_t n);
  // values = decode(encode(src)) (the codes' values, decode scale 1) and *amax the abs-max of src
  // as f32 bits, in one pass without codes. Returns false, writing nothing, where this table has
  // no fused form for the arguments; the caller then encodes and decodes.
  bool (*quantize_values_amax)(const float* src, size_t n, float* values, const QuantizeArgs& args, uint32_t* amax);
};

const KernelTable& reference_kernels();
const KernelTable* avx2_kernels();    // nullptr when not built for this compiler/arch
const KernelTable* avx512_kernels();  // nullptr when not built for this compiler/arch

enum class Isa : uint8_t { scalar, avx2, avx512 };
bool isa_supported(Isa isa);  // built and supported by this CPU
// The table the bulk API uses: the best supported, unless overridden by set_isa() or the
// environment variable SCALIFY_ISA=scalar|avx2|avx512.
const KernelTable& active_kernels();
const KernelTable& kernels_for(Isa isa);  // throws scalify::Error when unsupported
void set_isa(Isa isa);
Isa active_isa();
const char* isa_name(Isa isa);

}  // namespace scalify::kernels
