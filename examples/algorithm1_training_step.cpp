// The C++ counterpart of Algorithm 1 of the SCALIFY paper (seed 000): a model written once
// against ordinary ops, its state turned into scaled f16 arrays, and a training loop whose forward
// pass, backward pass and optimizer update all propagate power-of-two scales.
#include <cstdio>

#include "scalify/autograd/functions.hpp"
#include "scalify/autograd/scaling.hpp"
#include "scalify/optim/adamw.hpp"

using namespace scalify;

// The model: a two-layer MLP regression. Nothing in it knows about scales.
Var model(const std::vector<Var>& p, const Var& x, const Var& y) {
  const Var pred = matmul(gelu(matmul(x, p[0]) + p[1]), p[2]) + p[3];
  return mean(pow_scalar(pred - y, 2));
}

int main() {
  // Model + optimizer state, initialised as usual.
  std::vector<Var> state = {Var(Tensor::randn({16, 64}, 1, 0.25)), Var(Tensor::zeros({64})), Var(Tensor::randn({64, 4}, 2, 0.125)),
                            Var(Tensor::zeros({4}))};
  // Transform the state to scaled arrays: f16 data, power-of-two f32 scales.
  for (Var& p : state) p = Var(as_scaled(p.value(), DType::f16), true);
  // Scaled optimizer state in f16; optional dynamic rescaling of the state every 50 steps.
  optim::AdamW optimizer(state, {.lr = 3e-3, .state_dtype = DType::f16, .rescale_every = 50});

  const Tensor teacher = Tensor::randn({16, 4}, 3, 0.5);
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    const Tensor inputs = Tensor::randn({128, 16}, 100 + step);
    const Tensor labels = ops::unary(ops::Unary::tanh, ops::matmul(inputs, teacher));
    const Var data(as_scaled(inputs));                 // if necessary, scale input data
    const Var loss = model(state, data, Var(labels));  // forward: scales propagate
    loss.backward();                                   // backward: scaled gradients
    optimizer.step();                                  // update of the scaled state
    (step == 0 ? first : last) = loss.value().item();
    if (step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, loss.value().item());
  }
  std::printf("loss %.4f -> %.4f; weights stored as %s with scale %g\n", first, last,
              std::string(dtype_name(state[0].scaled().data.dtype())).c_str(), state[0].scaled().scalar_scale());
  return last < 0.2 * first ? 0 : 1;  // the scaled run must learn
}
