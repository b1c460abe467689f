#include "scalify/optim/grad_norm.hpp"

#include "scalify/optim/param_chunks.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::optim {

double gradient_sum_squares(const std::vector<Var>& params) {
  // Each gradient as data read in place (f16 decoded a chunk at a time) times a factor: a single
  // scale s gives (d s)^2 = d^2 s^2, exact in f64; per-block scales are applied first.
  std::vector<Tensor> data;
  std::vector<double> factor;
  std::vector<int64_t> sizes;
  for (const Var& p : params) {
    const ScaledTensor& g = p.scaled_grad();
    if (!g.data.defined()) continue;
    const bool one_scale = g.has_single_scale();
    data.push_back(one_scale || !g.is_scaled() ? g.data : p.grad());
    const double s = one_scale ? double(g.scalar_scale()) : 1.0;
    factor.push_back(s * s);
    sizes.push_back(data.back().numel());
  }
  std::vector<ChunkSource<float>> sources;
  sources.reserve(data.size());
  for (const Tensor& t : data) sources.emplace_back(t, t.shape());
  const std::vector<ParamChunk> chunks = param_chunks(sizes);
  std::vector<double> partial(chunks.size());
  for_each_chunk(chunks, [&](const ParamChunk& c, size_t i) {
    float buf[kParamChunk];
    const float* x = sources[c.param].read(c.begin, c.end - c.begin, buf);
    partial[i] = ops::sum_squares(std::span(x, size_t(c.end - c.begin))) * factor[c.param];
  });
  double sum = 0;
  for (double v : partial) sum += v;
  return sum;
}

}  // namespace scalify::optim
