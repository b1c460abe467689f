#include "scalify/tensor/gemm.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <string>

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

}  // namespace scalify::gemm
