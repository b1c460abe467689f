#pragma once
// The random Hadamard transform of NVFP4's weight-gradient GEMM (arXiv 2509.25149), computed in
// f64 from its definition for the tests to pin quant::hadamard16_rows to: each 16 consecutive
// rows of x [rows, cols] become (1/4) H16 D times them, H16 by Sylvester's construction and D the
// committed sign vector; rows past the last whole 16 stay as they are.
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify::testing {

// D as drawn once for the project. Every NVFP4 run depends on it: changing it is a deliberate
// change of results, made here and in quant/hadamard.hpp together.
inline constexpr std::array<int, 16> kReferenceHadamardSigns = {1, -1, 1, 1, -1, 1, -1, -1, 1, 1, -1, -1, -1, 1, 1, -1};

// H1 = [1], H2n = [[Hn, Hn], [Hn, -Hn]], up to 16 x 16.
inline std::vector<std::vector<double>> sylvester_hadamard16() {
  std::vector<std::vector<double>> h = {{1.0}};
  while (h.size() < 16) {
    const size_t n = h.size();
    std::vector<std::vector<double>> next(2 * n, std::vector<double>(2 * n));
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        next[i][j] = next[i][j + n] = next[i + n][j] = h[i][j];
        next[i + n][j + n] = -h[i][j];
      }
    h = next;
  }
  return h;
}

// (1/4) H16 D along the rows of x [rows, cols] (row-major), in f64.
inline std::vector<double> hadamard16_rows_reference(const std::vector<float>& x, int64_t rows, int64_t cols) {
  const std::vector<std::vector<double>> h = sylvester_hadamard16();
  std::vector<double> out(x.begin(), x.end());
  for (int64_t b = 0; b + 16 <= rows; b += 16)
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < 16; ++j)
          sum += h[size_t(i)][size_t(j)] * kReferenceHadamardSigns[size_t(j)] * x[size_t((b + j) * cols + c)];
        out[size_t((b + i) * cols + c)] = 0.25 * sum;
      }
  return out;
}

// Values k / 2^shift, |k| <= 64, from `seed`: the transform of such values is exact in f32 (a sum
// of 16 of them needs at most 11 significant bits), so it must equal the reference bit for bit.
inline std::vector<float> dyadic_values(int64_t n, uint64_t seed, int shift) {
  const std::vector<double> r = Tensor::rand({n}, seed, -64.0, 64.0).to_vector();
  std::vector<float> v;
  for (double k : r) v.push_back(std::ldexp(float(std::round(k)), -shift));
  return v;
}

}  // namespace scalify::testing
