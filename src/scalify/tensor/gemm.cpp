#include "scalify/tensor/gemm.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>

#include "scalify/error.hpp"

namespace scalify::gemm {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, float alpha) {
  if (M == 0 || N == 0) return;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                      lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw Error("sgemm: oneDNN failed (status " + std::to_string(int(st)) + ") for M=" +
                std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
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

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B,
               float* C, float alpha) {
  if (M == 0 || N == 0) return;
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

}  // namespace scalify::gemm
