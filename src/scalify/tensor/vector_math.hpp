#pragma once
// Vectorised f32 kernels for the transcendental-heavy elementwise ops of a training step (GELU,
// the softmax's exponentials, the powers of COAT's state expansion in f64), in three tables with
// one interface: the plain loops over libm (`reference`, used for f64, on CPUs without AVX2 and
// with SCALIFY_ISA=scalar), AVX2 + FMA loops over SLEEF's vector functions (`avx2`, within 1 ulp
// of libm per function), and `avx512`, avx2's with SLEEF's 8-wide pow. Chosen by the format
// kernels' ISA (formats/kernels.hpp: the best the CPU has, or SCALIFY_ISA).
#include <cstdint>

namespace scalify::vecmath {

struct Table {
  // y = out_mul * gelu_tanh(in_mul * x)
  void (*gelu_tanh)(const float* x, float* y, int64_t n, float in_mul, float out_mul);
  // out = g * gelu_tanh'(x_mul * x)
  void (*gelu_tanh_backward)(const float* x, const float* g, float* out, int64_t n, float x_mul);
  // y = exp(mul * x - shift); returns the sum of y (softmax rows)
  float (*exp_shifted_sum)(const float* x, float* y, int64_t n, float mul, float shift);
  // y = pow(x, e) in f64, x >= 0 (optim/state_format's dynamic range expansion)
  void (*pow_f64)(const double* x, double e, double* y, int64_t n);
};

const Table& reference();
const Table& avx2();    // throws scalify::Error when the build or the CPU lacks AVX2
const Table& avx512();  // avx2's, with the f64 power over SLEEF's 8-wide AVX-512 pow; throws as avx2
const Table& active();  // the active format-kernel ISA's: avx512, avx2, or reference (scalar)

}  // namespace scalify::vecmath
