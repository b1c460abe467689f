#pragma once
// AdamW (decoupled weight decay) over named parameters, with f32 state. The scale-propagation
// issue extends it to scaled low-precision state.
#include <string>
#include <utility>
#include <vector>

#include "scalify/autograd/var.hpp"

namespace scalify::optim {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

class AdamW {
 public:
  AdamW(std::vector<Var> params, AdamWConfig config);
  // One update from the parameters' .grad (parameters without a gradient are skipped), then
  // clears the gradients. A non-finite gradient is an error naming the parameter index.
  void step();
  int64_t steps() const { return t_; }

 private:
  std::vector<Var> params_;
  std::vector<Tensor> m_, v_;
  AdamWConfig c_;
  int64_t t_ = 0;
};

// Plain SGD: p -= lr * grad, then clears gradients.
void sgd_step(const std::vector<Var>& params, double lr);

}  // namespace scalify::optim
