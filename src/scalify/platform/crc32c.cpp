#include "scalify/platform/crc32c.hpp"

#include <array>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace scalify::platform {

namespace {
constexpr uint32_t kPolynomial = 0x82F63B78;  // Castagnoli, bit-reversed

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? kPolynomial : 0);
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = uint32_t(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#endif
}  // namespace

uint32_t crc32c_reference(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return crc32c_sse42(static_cast<const uint8_t*>(data), size, crc);
#endif
  return crc32c_reference(data, size, crc);
}

std::string crc32c_text(uint32_t crc) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", crc);
  return s;
}

}  // namespace scalify::platform
