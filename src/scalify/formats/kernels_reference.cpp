// The plain scalar reference of every bulk kernel: a loop over the scalar codec.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "scalify/formats/kernels.hpp"

namespace scalify::kernels {
namespace {

void store_code(void* codes, size_t i, int bytes, uint32_t c) {
  auto* p = static_cast<uint8_t*>(codes) + i * size_t(bytes);
  for (int b = 0; b < bytes; ++b) p[b] = uint8_t(c >> (8 * b));
}

uint32_t load_code(const void* codes, size_t i, int bytes) {
  const auto* p = static_cast<const uint8_t*>(codes) + i * size_t(bytes);
  uint32_t c = 0;
  for (int b = bytes - 1; b >= 0; --b) c = (c << 8) | p[b];
  return c;
}

uint32_t quantize_amax_ref(const float* src, size_t n, void* codes, const QuantizeArgs& a) {
  const FormatInfo& f = *a.format;
  uint32_t amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(src[i]);
    amax = std::max(amax, bits & 0x7FFFFFFFu);  // integer order = |x| order, NaN above inf
    const float x = a.mul == 1.0f ? src[i] : src[i] * a.mul;
    const uint32_t rnd = a.rounding == Rounding::stochastic ? random_bits(a.seed, a.offset + i) : 0;
    store_code(codes, i, f.storage_bytes(), detail::encode_bits(f, std::bit_cast<uint32_t>(x), a.exp_shift, a.overflow, a.rounding, rnd));
  }
  return amax;
}

void quantize_ref(const float* src, size_t n, void* codes, const QuantizeArgs& a) { quantize_amax_ref(src, n, codes, a); }

void dequantize_ref(const void* codes, size_t n, float* out, const FormatInfo& f, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const float v = std::bit_cast<float>(detail::decode_bits(f, load_code(codes, i, f.storage_bytes())));
    out[i] = scale == 1.0f ? v : v * scale;
  }
}

uint32_t amax_ref(const float* src, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(src[i]) & 0x7FFFFFFFu);
  return m;
}

bool quantize_values_ref(const float* src, size_t n, float* values, const QuantizeArgs& a, uint32_t* amax) {
  std::vector<std::byte> codes(n * size_t(a.format->storage_bytes()));
  *amax = quantize_amax_ref(src, n, codes.data(), a);
  dequantize_ref(codes.data(), n, values, *a.format, 1.0f);
  return true;
}

}  // namespace

const KernelTable& reference_kernels() {
  static const KernelTable t{"scalar", quantize_ref, quantize_amax_ref, dequantize_ref, amax_ref, quantize_values_ref};
  return t;
}

}  // namespace scalify::kernels
