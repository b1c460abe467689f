#pragma once
// The squared global norm of the parameters' gradients, for clipping.
#include <vector>

#include "scalify/autograd/var.hpp"

namespace scalify::optim {

// Sum over the parameters that have a gradient of its squared represented values, in f64. One
// parallel pass over all parameters; per-chunk partial sums are added in a fixed order, so the
// result is the same on any number of threads. A non-finite gradient makes the sum non-finite.
double gradient_sum_squares(const std::vector<Var>& params);

}  // namespace scalify::optim
