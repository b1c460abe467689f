#include "scalify/platform/cpu.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define SCALIFY_X86 1
#endif

namespace scalify::platform {

#if SCALIFY_X86
namespace {
struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}
bool bit(uint32_t r, int i) { return (r >> i) & 1u; }

CpuFeatures detect() {
  CpuFeatures f;
  const Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    f.model = brand;
    f.model.erase(0, f.model.find_first_not_of(' '));
    f.model.erase(f.model.find_last_not_of(' ') + 1);
  }
  const uint32_t max_leaf = v.a;
  const Regs l1 = cpuid(1);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xE0) == 0xE0;   // opmask, ZMM0-15 high halves, ZMM16-31
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // AMX TILECFG and TILEDATA
  f.fma = ymm && bit(l1.c, 12);
  f.f16c = ymm && bit(l1.c, 29);
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7), l7_1 = l7.a >= 1 ? cpuid(7, 1) : Regs{};
    f.avx2 = ymm && bit(l7.b, 5);
    f.avx512f = zmm && bit(l7.b, 16);
    f.avx512dq = zmm && bit(l7.b, 17);
    f.avx512bw = zmm && bit(l7.b, 30);
    f.avx512vl = zmm && bit(l7.b, 31);
    f.avx512_bf16 = zmm && bit(l7_1.a, 5);
    f.amx_bf16 = tiles && bit(l7.d, 22);
  }
  return f;
}
}  // namespace
#else
namespace {
CpuFeatures detect() { return {}; }
}  // namespace
#endif

std::vector<std::string> CpuFeatures::names() const {
  std::vector<std::string> out;
  const std::pair<bool, const char*> all[] = {
      {avx2, "avx2"},         {fma, "fma"},           {f16c, "f16c"},         {avx512f, "avx512f"},
      {avx512bw, "avx512bw"}, {avx512vl, "avx512vl"}, {avx512dq, "avx512dq"}, {avx512_bf16, "avx512_bf16"},
      {amx_bf16, "amx_bf16"}};
  for (const auto& [on, name] : all)
    if (on) out.emplace_back(name);
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace scalify::platform
