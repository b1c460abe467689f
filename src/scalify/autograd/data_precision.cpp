#include "scalify/autograd/data_precision.hpp"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "scalify/formats/format.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify {

namespace {
thread_local StorageCastRecorder* g_recorder = nullptr;

bool is_float(DType t) { return !is_integer(t); }

// Saturation is for finite values past the format's largest; an infinity (a mask's -inf fill) is
// exact in a format that has one and must stay infinite, or masked scores would become -65504
// times their scale and leak attention at small scales.
void keep_infinities(const Tensor& in, Tensor& out, Format f) {
  const float* x = in.data<float>();
  const int64_t n = in.numel();
  // Counted on the bit patterns: an integer compare and add, which vectorises (isinf did not).
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
  int64_t infinities = 0;
#pragma omp parallel for reduction(+ : infinities) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) infinities += int64_t((bits[i] & 0x7fffffffu) == 0x7f800000u);
  if (infinities == 0) return;
  const int bytes = info(f).storage_bytes();
  const uint32_t plus = encode(f, INFINITY, {Overflow::non_saturating}), minus = encode(f, -INFINITY, {Overflow::non_saturating});
  std::byte* codes = out.raw_bytes();
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(x[i]) == INFINITY) {  // half of a masked score matrix
      const uint32_t code = x[i] > 0 ? plus : minus;
      std::memcpy(codes + i * bytes, &code, size_t(bytes));  // little-endian: the low bytes
    }
}
#if SCALIFY_HAVE_X86_SIMD
// f32 -> f16 storage in one pass with the F16C instruction: what to(f16) and keep_infinities do
// together (round to nearest even; finite values saturate at +-65504; infinities stay; NaN becomes
// sign | 0x7E00), without the separate scan. Used where the format kernels' ISA has AVX2.
[[gnu::target("avx2,f16c")]] void f16_storage_8(const float* in, uint16_t* dst) {
  const __m256 top = _mm256_set1_ps(65504.0f), bottom = _mm256_set1_ps(-65504.0f), sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(INFINITY), quiet = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
  __m256 v = _mm256_loadu_ps(in);
  v = _mm256_blendv_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign), quiet), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256 infinite = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), inf, _CMP_EQ_OQ);
  v = _mm256_blendv_ps(_mm256_max_ps(bottom, _mm256_min_ps(top, v)), v, infinite);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
[[gnu::target("avx2,f16c")]] void f16_storage_f16c(const float* x, uint16_t* out, int64_t n) {
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n / 8; ++i) f16_storage_8(x + 8 * i, out + 8 * i);
  if (const int64_t done = n / 8 * 8; done < n) {
    float tmp[8] = {};
    uint16_t otmp[8];
    std::memcpy(tmp, x + done, size_t(n - done) * sizeof(float));
    f16_storage_8(tmp, otmp);
    std::memcpy(out + done, otmp, size_t(n - done) * sizeof(uint16_t));
  }
}
#endif

// to_storage's f32 -> f16 cast: the one-pass F16C form when the ISA allows, else the bulk encoder
// followed by the infinity fix-up.
Tensor to_f16_storage(const Tensor& data) {
#if SCALIFY_HAVE_X86_SIMD
  if (data.dtype() == DType::f32 && data.is_contiguous() && kernels::active_isa() != kernels::Isa::scalar) {
    Tensor out = Tensor::empty(data.shape(), DType::f16);
    f16_storage_f16c(data.data<float>(), out.data<uint16_t>(), data.numel());
    return out;
  }
#endif
  Tensor out = data.to(DType::f16);
  if (data.dtype() == DType::f32 && data.is_contiguous()) keep_infinities(data, out, Format::f16);
  return out;
}
}  // namespace

DType promoted_storage(const std::vector<DType>& inputs) {
  bool any = false, mixed = false;
  DType low = DType::f32;
  for (DType t : inputs) {
    if (!is_float(t)) continue;
    if (t == DType::f64) return DType::f64;
    if (!any) low = t;
    mixed = mixed || t != low;
    any = true;
  }
  for (DType t : inputs)
    if (t == DType::f32) return DType::f32;
  return !any || mixed ? DType::f32 : low;
}

Tensor to_storage(const Tensor& data, DType storage, const std::string& what) {
  if (!data.defined() || data.dtype() == storage || !is_float(data.dtype()) || !is_float(storage)) return data;
  const std::optional<Format> f = dtype_format(storage);
  Tensor out;
  if (storage == DType::f16) {
    out = to_f16_storage(data);
  } else {
    out = data.to(storage);
    if (f && info(*f).specials == Specials::ieee && data.dtype() == DType::f32 && data.is_contiguous() && out.is_contiguous())
      keep_infinities(data, out, *f);
  }
  if (g_recorder && f && storage != DType::f32) {
    const double top = max_value(*f);
    const std::vector<float> in = data.to_floats(), rounded = out.to_floats();
    StorageCastStats& s = g_recorder->stats_[what];
    s.values += int64_t(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      s.underflowed += in[i] != 0 && rounded[i] == 0 && !std::isnan(in[i]);
      s.saturated += std::isfinite(in[i]) && std::fabs(double(in[i])) > top;
    }
  }
  return out;
}

StorageCastRecorder::StorageCastRecorder() : previous_(g_recorder) { g_recorder = this; }
StorageCastRecorder::~StorageCastRecorder() { g_recorder = previous_; }

StorageCastStats StorageCastRecorder::total() const {
  StorageCastStats t;
  for (const auto& [name, s] : stats_) {
    t.values += s.values;
    t.underflowed += s.underflowed;
    t.saturated += s.saturated;
  }
  return t;
}

}  // namespace scalify
