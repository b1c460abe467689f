#include "scalify/tensor/vector_math.hpp"

#include <cmath>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"

namespace scalify::vecmath {

#if SCALIFY_HAVE_X86_SIMD
extern const Table kAvx2;                                              // vector_math_avx2.cpp
void pow_f64_avx512(const double* x, double e, double* y, int64_t n);  // vector_math_avx512.cpp
#endif

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

void gelu_tanh(const float* x, float* y, int64_t n, float in_mul, float out_mul) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = in_mul * x[i];
    y[i] = out_mul * (0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v))));
  }
}

void gelu_tanh_backward(const float* x, const float* g, float* out, int64_t n, float x_mul) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x_mul * x[i];
    // Beyond |v| = 30 tanh is exactly +-1 and sech^2 exactly 0, but v^3 may overflow: the limit.
    float d;
    if (std::fabs(v) > 30.0f) {
      d = v > 0 ? 1.0f : 0.0f;
    } else {
      const float t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
      d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    }
    out[i] = g[i] * d;
  }
}

float exp_shifted_sum(const float* x, float* y, int64_t n, float mul, float shift) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(mul * x[i] - shift);
    sum += y[i];
  }
  return float(sum);
}

void pow_f64(const double* x, double e, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::pow(x[i], e);
}

const Table kReference{gelu_tanh, gelu_tanh_backward, exp_shifted_sum, pow_f64};

}  // namespace

const Table& reference() { return kReference; }

const Table& avx2() {
#if SCALIFY_HAVE_X86_SIMD
  if (kernels::isa_supported(kernels::Isa::avx2)) return kAvx2;
#endif
  throw Error("vector math: AVX2 is not supported by this CPU or build");
}

const Table& avx512() {
#if SCALIFY_HAVE_X86_SIMD
  if (kernels::isa_supported(kernels::Isa::avx512)) {
    static const Table t = [] {
      Table with_pow = kAvx2;
      with_pow.pow_f64 = pow_f64_avx512;
      return with_pow;
    }();
    return t;
  }
#endif
  throw Error("vector math: AVX-512 is not supported by this CPU or build");
}

const Table& active() {
  switch (kernels::active_isa()) {
    case kernels::Isa::avx512: return avx512();
    case kernels::Isa::avx2: return avx2();
    default: return reference();
  }
}

}  // namespace scalify::vecmath
