#include "scalify/nn/rope.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "scalify/error.hpp"

namespace scalify::nn {

Var rotary(const Var& x, double theta, int64_t start) {
  const Shape& sh = x.shape();
  if (sh.size() != 4 || sh[3] % 2 != 0 || !(theta > 1) || start < 0)
    throw Error("rotary: x must be [B, T, H, hd] with hd even, theta > 1 and start >= 0, got " + shape_str(sh) + ", theta " +
                std::to_string(theta) + ", start " + std::to_string(start));
  const int64_t T = sh[1], hd = sh[3], half = hd / 2;
  // The angles as Hugging Face computes them, in f32: inv_freq = 1 / theta^(2i / hd), t * inv_freq;
  // cos and sin of that f32 angle, rounded once.
  std::vector<float> cos_v(size_t(T * hd)), sin_v(size_t(T * hd));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(hd);
    const float inv_freq = 1.0f / std::pow(float(theta), exponent);
    for (int64_t t = 0; t < T; ++t) {
      const float angle = float(start + t) * inv_freq;
      for (int64_t at : {t * hd + i, t * hd + i + half}) {
        cos_v[size_t(at)] = float(std::cos(double(angle)));
        sin_v[size_t(at)] = float(std::sin(double(angle)));
      }
    }
  }
  const bool f64 = x.scaled().data.dtype() == DType::f64;
  auto table = [&](const std::vector<float>& v) {
    Tensor t = Tensor::from_vector(v, {T, 1, hd});
    return Var(f64 ? t.to(DType::f64) : t);
  };
  const Var rotated_half = concat({-slice(x, 3, half, hd), slice(x, 3, 0, half)}, 3);
  return x * table(cos_v) + rotated_half * table(sin_v);
}

}  // namespace scalify::nn
