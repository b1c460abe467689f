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
  const float* src = in.data<float>();
  float* dst = out.data<float>();
  // (1/4) H16 D: the entries are ±1/4, exact; each output is a sum of 16 products in f32.
  float m[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) m[i][j] = 0.25f * float(hadamard16_entry(i, j) * kHadamardSigns[size_t(j)]);
#pragma omp parallel for if (rows * cols > platform::kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b)
    for (int i = 0; i < 16; ++i) {
      float* o = dst + (b * 16 + i) * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] = 0.0f;
      for (int j = 0; j < 16; ++j) {
        const float* s = src + (b * 16 + j) * cols;
        const float w = m[i][j];
        for (int64_t c = 0; c < cols; ++c) o[c] += w * s[c];
      }
    }
  ScaledTensor r = x;
  r.data = out;
  return r;
}

}  // namespace scalify::quant
