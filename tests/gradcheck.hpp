#pragma once
// Gradient check against central finite differences in f64, with a tolerance derived per element:
// central differences have truncation error ~ c h^2 and rounding error ~ eps * S / h, where S is
// the magnitude of the summed loss terms. The truncation part is estimated from the data by
// Richardson: fd(h) - fd(h/2) ~ (3/4) c h^2. Tolerance = 4 |fd(h) - fd(h/2)| + 16 eps S / h.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "scalify/autograd/functions.hpp"

namespace scalify::testing {

using LossFn = std::function<Var(const std::vector<Var>&)>;

inline double eval(const LossFn& f, const std::vector<Tensor>& xs, const Tensor& weights, double* magnitude) {
  NoGrad ng;
  std::vector<Var> vs;
  for (const Tensor& x : xs) vs.emplace_back(x.clone(), false);
  const Tensor out = f(vs).value();
  const std::vector<double> o = out.to_vector(), w = weights.to_vector();
  double s = 0, m = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    s += o[i] * w[i];
    m += std::fabs(o[i] * w[i]);
  }
  if (magnitude) *magnitude = m;
  return s;
}

// Checks the gradient of sum(f(xs) * R) w.r.t. every element of every input (all f64), for a
// fixed random R, against finite differences.
inline void gradcheck(const std::string& name, const LossFn& f, const std::vector<Tensor>& inputs, uint64_t seed = 99) {
  std::vector<Var> vars;
  for (const Tensor& x : inputs) vars.emplace_back(x.to(DType::f64).clone(), true);
  const Var out = f(vars);
  ASSERT_EQ(out.value().dtype(), DType::f64) << name << ": f64 inputs must give an f64 result";
  const Tensor weights = Tensor::randn(out.shape(), seed, 1.0, DType::f64);
  out.backward(weights);
  std::vector<Tensor> xs;
  for (const Var& v : vars) xs.push_back(v.value());
  const double eps = std::numeric_limits<double>::epsilon();
  for (size_t k = 0; k < xs.size(); ++k) {
    ASSERT_TRUE(vars[k].grad().defined()) << name << ": no gradient for input " << k;
    const std::vector<double> analytic = vars[k].grad().to_vector();
    double* x = xs[k].data<double>();
    for (int64_t i = 0; i < xs[k].numel(); ++i) {
      const double x0 = x[i], h = 1e-5 * std::max(1.0, std::fabs(x0));
      auto central = [&](double step) {
        double m1, m2;
        x[i] = x0 + step;
        const double up = eval(f, xs, weights, &m1);
        x[i] = x0 - step;
        const double down = eval(f, xs, weights, &m2);
        x[i] = x0;
        return std::pair{(up - down) / (2 * step), std::max(m1, m2)};
      };
      const auto [fd, magnitude] = central(h);
      const double fd_half = central(h / 2).first;
      const double tol = 4 * std::fabs(fd - fd_half) + 16 * eps * (magnitude + 1) / h;
      ASSERT_NEAR(analytic[size_t(i)], fd, tol) << name << ": input " << k << " element " << i;
    }
  }
}

}  // namespace scalify::testing
