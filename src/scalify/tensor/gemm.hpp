#pragma once
// f32 GEMM through oneDNN (chosen by measurement, docs/BENCHMARKS.md), and a plain reference.
// Row-major: C[M x N] = alpha op(A)[M x K] * op(B)[K x N] + beta * C, op = transpose when requested.
#include <cstdint>
#include <string>

namespace scalify::gemm {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
           float beta, float* C, int64_t ldc, float alpha = 1.0f);

// bf16 operands (uint16 bit patterns), f32 output: C = alpha op(A) op(B), through oneDNN's matmul
// primitive (AMX / AVX512-BF16 where the CPU has them). Primitives are cached per shape.
// Operands are dense row-major [M, K] / [K, N], or their transposes when trans_* is set.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B, float* C,
               float alpha = 1.0f);

// How GEMMs on exactly decoded low-precision operands (FP8/FP6/FP4 codes, every value of which
// is a bf16 value) run. Both keep the numerics contract: exact products of the decoded values,
// f32 accumulation, the scales applied once as alpha.
//   onednn_bf16: the codes as bf16 through oneDNN's matmul; only where the CPU has bf16 dot
//                products (AVX512-BF16 or AMX), which oneDNN needs for a native bf16 kernel.
//   f32:         the codes decoded to f32 and sgemm; runs on any CPU.
enum class CodeGemm : uint8_t { onednn_bf16, f32 };
const char* code_gemm_name(CodeGemm path);
bool code_gemm_supported(CodeGemm path);
// Chosen once: SCALIFY_GEMM=bf16|f32 if set (an unsupported choice is an Error), else bf16 where
// supported. oneDNN's own DNNL_MAX_CPU_ISA (e.g. AVX2) also turns the bf16 path off.
CodeGemm code_gemm();
void set_code_gemm(CodeGemm path);  // throws scalify::Error when unsupported
// oneDNN's version and the instruction set it dispatches to here, for `scalify info`.
std::string onednn_version();
std::string onednn_isa();

// The plain triple loop (f64 accumulation), for tests and f64 tensors.
template <class T>
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T beta,
                    T* C, int64_t ldc, T alpha = T(1)) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(trans_a ? A[k * lda + i] : A[i * lda + k]) * double(trans_b ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * T(acc) + (beta == T(0) ? T(0) : beta * C[i * ldc + j]);
    }
}

}  // namespace scalify::gemm
