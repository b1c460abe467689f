#pragma once
// A tiny next-token task shared by the recipe tests: random token sequences from a few fixed
// seeds, so a model can fit them within a few dozen steps.
#include <cmath>
#include <cstdint>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify::testing {

struct TokenBatch {
  Tensor inputs, targets, positions;  // [B, T], [B * T], [B, T]
};

inline TokenBatch token_batch(uint64_t seed, int64_t B, int64_t T, int64_t V) {
  std::vector<int64_t> in, tg, pos;
  const std::vector<double> r = Tensor::rand({B * (T + 1)}, seed, -0.49, double(V) - 0.51).to_vector();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      in.push_back(std::lround(r[size_t(b * (T + 1) + t)]));
      tg.push_back(std::lround(r[size_t(b * (T + 1) + t + 1)]));
      pos.push_back(t);
    }
  return {Tensor::from_indices(in, {B, T}), Tensor::from_indices(tg, {B * T}), Tensor::from_indices(pos, {B, T})};
}

}  // namespace scalify::testing
