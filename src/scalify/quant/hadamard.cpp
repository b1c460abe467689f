#include "scalify/quant/hadamard.hpp"

#include "scalify/error.hpp"
#include "scalify/platform/parallel.hpp"

namespace scalify::quant {

ScaledTensor hadamard16_rows(const ScaledTensor& x) {
  if (x.data.dim() != 2) throw Error("hadamard16_rows: needs a 2-D tensor, got " + shape_str(x.shape()));
  if (x.any_scale || (x.scale.defined() && x.scale.numel() != 1))
    throw Error("hadamard16_rows: needs one scale (rows of different scales would mix)");
  const Tensor in = x.data.to(DType::f32).contiguous();
  Tensor out = in.clone();
  const int64_t rows = in.size(0), cols = in.size(1), blocks = rows / 16;
  float* dst = out.data<float>();
  // Per block of 16 rows: the signs D, then H16 as the fast Walsh-Hadamard transform (4 stages of
  // sums and differences of row pairs, natural order: H16[i][j] = (-1)^popcount(i & j)), then 1/4.
#pragma omp parallel for if (rows * cols > platform::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    float* o = dst + b * 16 * cols;
    for (int i = 0; i < 16; ++i)
      if (kHadamardSigns[size_t(i)] < 0)
        for (int64_t c = 0; c < cols; ++c) o[i * cols + c] = -o[i * cols + c];
    for (int h = 1; h < 16; h *= 2)
      for (int i = 0; i < 16; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          float* u = o + j * cols;
          float* v = o + (j + h) * cols;
          for (int64_t c = 0; c < cols; ++c) {
            const float a = u[c], d = v[c];
            u[c] = a + d;
            v[c] = a - d;
          }
        }
    for (int64_t k = 0; k < 16 * cols; ++k) o[k] *= 0.25f;
  }
  ScaledTensor r = x;
  r.data = out;
  return r;
}

}  // namespace scalify::quant
