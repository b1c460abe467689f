// Run-time choice of the kernel table.
#include <atomic>
#include <cstdlib>
#include <string>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/platform/cpu.hpp"

namespace scalify::kernels {

#if SCALIFY_HAVE_X86_SIMD
namespace avx2 {
const KernelTable& table();
}
namespace avx512 {
const KernelTable& table();
}
const KernelTable* avx2_kernels() { return &avx2::table(); }
const KernelTable* avx512_kernels() { return &avx512::table(); }
#else
const KernelTable* avx2_kernels() { return nullptr; }
const KernelTable* avx512_kernels() { return nullptr; }
#endif

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if SCALIFY_HAVE_X86_SIMD
    case Isa::avx2: {
      const platform::CpuFeatures& f = platform::cpu_features();
      return f.avx2 && f.fma && f.f16c;
    }
    case Isa::avx512: {
      const platform::CpuFeatures& f = platform::cpu_features();
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
    }
#endif
    default: return false;
  }
}

const KernelTable& kernels_for(Isa isa) {
  if (!isa_supported(isa)) throw Error(std::string("instruction set '") + isa_name(isa) + "' is not supported by this CPU or build");
  switch (isa) {
    case Isa::avx512: return *avx512_kernels();
    case Isa::avx2: return *avx2_kernels();
    default: return reference_kernels();
  }
}

namespace {
Isa initial_isa() {
  if (const char* env = std::getenv("SCALIFY_ISA")) {
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
      if (std::string(env) == isa_name(isa)) {
        if (!isa_supported(isa)) throw Error(std::string("SCALIFY_ISA=") + env + " is not supported by this CPU or build");
        return isa;
      }
    throw Error(std::string("SCALIFY_ISA='") + env + "' is not one of scalar, avx2, avx512");
  }
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}
std::atomic<Isa>& current() {
  static std::atomic<Isa> isa{initial_isa()};
  return isa;
}
}  // namespace

Isa active_isa() { return current().load(); }
void set_isa(Isa isa) {
  kernels_for(isa);  // validates
  current().store(isa);
}
const KernelTable& active_kernels() { return kernels_for(active_isa()); }

}  // namespace scalify::kernels
