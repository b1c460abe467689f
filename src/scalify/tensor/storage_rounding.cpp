#include "scalify/tensor/storage_rounding.hpp"

#if SCALIFY_HAVE_X86_SIMD
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/formats/scalar.hpp"
#include "scalify/platform/parallel.hpp"

namespace scalify {

namespace {

#if SCALIFY_HAVE_X86_SIMD
// Eight f32 values into f16 with the F16C instruction: the whole rule in one pass (finite values
// clamped to +-65504 first; infinities stay; NaN becomes sign | 0x7E00, as the format codec does).
[[gnu::target("avx2,f16c")]] void f16_storage_8(const float* in, uint16_t* dst) {
  const __m256 top = _mm256_set1_ps(65504.0f), bottom = _mm256_set1_ps(-65504.0f), sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(INFINITY), quiet = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
  __m256 v = _mm256_loadu_ps(in);
  v = _mm256_blendv_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign), quiet), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256 infinite = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), inf, _CMP_EQ_OQ);
  v = _mm256_blendv_ps(_mm256_max_ps(bottom, _mm256_min_ps(top, v)), v, infinite);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
[[gnu::target("avx2,f16c")]] void f16_storage_f16c(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i + 8 <= n; i += 8) f16_storage_8(x + i, out + i);
  if (const int64_t done = n / 8 * 8; done < n) {
    float tmp[8] = {};
    uint16_t otmp[8];
    std::memcpy(tmp, x + done, size_t(n - done) * sizeof(float));
    f16_storage_8(tmp, otmp);
    std::memcpy(out + done, otmp, size_t(n - done) * sizeof(uint16_t));
  }
}
[[gnu::target("avx2,f16c")]] void f16_widen_f16c(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}
#endif

}  // namespace

void restore_infinities(const float* in, int64_t n, Format f, std::byte* codes) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(in);
  int64_t infinities = 0;  // counted on the bit patterns, which vectorises (isinf did not)
  for (int64_t i = 0; i < n; ++i) infinities += int64_t((bits[i] & 0x7fffffffu) == 0x7f800000u);
  if (infinities == 0) return;
  const int bytes = info(f).storage_bytes();
  const uint32_t plus = encode(f, INFINITY, {Overflow::non_saturating}), minus = encode(f, -INFINITY, {Overflow::non_saturating});
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(in[i]) == INFINITY) {
      const uint32_t code = in[i] > 0 ? plus : minus;
      std::memcpy(codes + i * bytes, &code, size_t(bytes));  // little-endian: the low bytes
    }
}

bool is_rounded_storage(DType storage) { return storage == DType::f16 || storage == DType::bf16; }

void round_into_storage(const float* in, int64_t n, DType storage, std::byte* out) {
  if (!is_rounded_storage(storage)) throw Error("round_into_storage: not a 16-bit float storage: " + std::string(dtype_name(storage)));
  uint16_t* codes = reinterpret_cast<uint16_t*>(out);
#if SCALIFY_HAVE_X86_SIMD
  if (storage == DType::f16 && kernels::active_isa() != kernels::Isa::scalar) return f16_storage_f16c(in, n, codes);
#endif
  const Format f = *dtype_format(storage);
  quantize(std::span(in, size_t(n)), f, 1.0f, std::span(out, size_t(n) * 2));
  restore_infinities(in, n, f, out);
}

void widen_for_compute(const std::byte* codes, int64_t n, DType storage, float* out) {
  if (!is_rounded_storage(storage)) throw Error("widen_for_compute: not a 16-bit float storage: " + std::string(dtype_name(storage)));
  const uint16_t* in = reinterpret_cast<const uint16_t*>(codes);
  if (storage == DType::bf16) {  // the top half of an f32
    for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t(in[i]) << 16);
    return;
  }
#if SCALIFY_HAVE_X86_SIMD
  if (kernels::active_isa() != kernels::Isa::scalar) return f16_widen_f16c(in, n, out);
#endif
  dequantize(std::span(codes, size_t(n) * 2), Format::f16, 1.0f, std::span(out, size_t(n)));
}

Tensor round_to_storage(const Tensor& values, DType storage) {
  if (values.dtype() != DType::f32 || !values.is_contiguous())
    throw Error("round_to_storage: needs contiguous f32 values, got " + std::string(dtype_name(values.dtype())));
  Tensor out = Tensor::empty(values.shape(), storage);
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = values.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float* in = values.data<float>();
  std::byte* o = out.raw_bytes();
#pragma omp parallel for if (n > platform::kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    round_into_storage(in + begin, std::min(kChunk, n - begin), storage, o + begin * 2);
  }
  return out;
}

}  // namespace scalify
