#pragma once
// What this CPU can run, read once from CPUID (and the OS's XSAVE state, which must enable the
// wide registers). The format kernels and the GEMM paths decide from this; `scalify info` prints it.
#include <string>
#include <vector>

namespace scalify::platform {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string model;   // the brand string, e.g. "AMD EPYC 7B13"
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;  // VDPBF16PS: bf16 dot products in AVX-512
  bool amx_bf16 = false;     // AMX tiles with bf16 (and the OS lets us use them)
  // The flags above that are set, in a fixed order, for printing.
  std::vector<std::string> names() const;
};

const CpuFeatures& cpu_features();

}  // namespace scalify::platform
