#include "scalify/tensor/gemm.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>

#include "scalify/error.hpp"
#include "scalify/platform/cpu.hpp"

namespace scalify::gemm {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
           float beta, float* C, int64_t ldc, float alpha) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta C (oneDNN would reject the zero leading dimensions)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw Error("sgemm: oneDNN failed (status " + std::to_string(int(st)) + ") for M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K));
}

namespace {
struct Bf16Gemm {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
};
dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
const Bf16Gemm& bf16_primitive(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  static std::mutex mutex;
  static std::map<std::tuple<bool, bool, int64_t, int64_t, int64_t>, Bf16Gemm> cache;
  std::lock_guard lock(mutex);
  auto key = std::make_tuple(ta, tb, M, N, K);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a({M, K}, dt::bf16, ta ? tag::ba : tag::ab), b({K, N}, dt::bf16, tb ? tag::ba : tag::ab),
      c({M, N}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});  // alpha, given at execution
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return cache.emplace(key, Bf16Gemm{dnnl::matmul(pd), a, b, c}).first->second;
}
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B, float* C, float alpha) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum
    std::fill(C, C + M * N, 0.0f);
    return;
  }
  try {
    const Bf16Gemm& g = bf16_primitive(trans_a, trans_b, M, N, K);
    dnnl::engine& e = cpu_engine();
    dnnl::memory a(g.a, e, const_cast<uint16_t*>(A)), b(g.b, e, const_cast<uint16_t*>(B)), c(g.c, e, C);
    dnnl::memory scale({{1}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::x}, e, &alpha);
    dnnl::stream s(e);
    g.prim.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_ATTR_OUTPUT_SCALES, scale}});
    s.wait();
  } catch (const dnnl::error& err) {
    throw Error(std::string("gemm_bf16: oneDNN failed: ") + err.what());
  }
}

namespace {
// oneDNN runs bf16 natively from avx512_core_bf16 up (AMX included); below it either emulates
// (slowly, AVX-512 without BF16) or refuses to create the primitive (AVX2).
bool onednn_bf16_native() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  const platform::CpuFeatures& f = platform::cpu_features();
  return (isa & bf16) == bf16 && (f.avx512_bf16 || f.amx_bf16);
}
CodeGemm initial_code_gemm() {
  if (const char* env = std::getenv("SCALIFY_GEMM")) {
    const std::string v = env;
    if (v != "bf16" && v != "f32") throw Error("SCALIFY_GEMM='" + v + "' is not one of bf16, f32");
    const CodeGemm path = v == "bf16" ? CodeGemm::onednn_bf16 : CodeGemm::f32;
    if (!code_gemm_supported(path)) throw Error("SCALIFY_GEMM=bf16: this CPU (or DNNL_MAX_CPU_ISA) has no native bf16 GEMM in oneDNN");
    return path;
  }
  return code_gemm_supported(CodeGemm::onednn_bf16) ? CodeGemm::onednn_bf16 : CodeGemm::f32;
}
std::atomic<CodeGemm>& current_code_gemm() {
  static std::atomic<CodeGemm> path{initial_code_gemm()};
  return path;
}
}  // namespace

const char* code_gemm_name(CodeGemm path) {
  return path == CodeGemm::onednn_bf16 ? "bf16 (oneDNN)" : "f32 (oneDNN sgemm on decoded values)";
}
bool code_gemm_supported(CodeGemm path) { return path == CodeGemm::f32 || onednn_bf16_native(); }
CodeGemm code_gemm() { return current_code_gemm().load(); }
void set_code_gemm(CodeGemm path) {
  if (!code_gemm_supported(path)) throw Error(std::string("GEMM path '") + code_gemm_name(path) + "' is not supported on this CPU");
  current_code_gemm().store(path);
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string onednn_isa() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::sse41: return "sse41";
    case isa::avx: return "avx";
    case isa::avx2: return "avx2";
    case isa::avx2_vnni: return "avx2_vnni";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace scalify::gemm
