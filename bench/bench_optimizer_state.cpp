// AdamW's step at GPT-2 size (124M parameters in GPT-2 small's tensor shapes) with f32 moments
// against low-precision ones (issue 48): the two optimizers step alternately in every iteration
// (alternating.hpp), and the ratio of their totals is the figure (docs/BENCHMARKS.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "alternating.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/quant/recipe.hpp"

namespace {

using namespace scalify;

// GPT-2 small: token and position embeddings, 12 blocks of qkv / proj / fc / out with biases and
// two norms, the final norm (the head is tied).
std::vector<Shape> gpt2_shapes() {
  std::vector<Shape> s = {{50257, 768}, {1024, 768}};
  for (int l = 0; l < 12; ++l)
    for (const Shape& t :
         std::vector<Shape>{{768}, {768}, {768, 2304}, {2304}, {768, 768}, {768}, {768}, {768}, {768, 3072}, {3072}, {3072, 768}, {768}})
      s.push_back(t);
  s.push_back({768});
  s.push_back({768});
  return s;
}

struct Run {
  std::vector<Var> params;
  std::vector<Tensor> grads;
  optim::AdamW opt;
  // The parameters in the recipe's master-weight storage (msamp_o2: the blocks' linear weights,
  // the matrices after the two embeddings, in scaled f16).
  Run(const std::vector<Shape>& shapes, const quant::Recipe& r, const optim::AdamWConfig& base)
      : params(make(shapes, r)), opt(params, quant::optimizer_config(r, base)) {
    for (size_t k = 0; k < shapes.size(); ++k) grads.push_back(Tensor::randn(shapes[k], 100 + k));
  }
  static std::vector<Var> make(const std::vector<Shape>& shapes, const quant::Recipe& r) {
    std::vector<Var> p;
    std::vector<bool> linear_weight;
    for (size_t k = 0; k < shapes.size(); ++k) {
      p.emplace_back(Tensor::randn(shapes[k], k), true);
      linear_weight.push_back(k >= 2 && shapes[k].size() == 2);
    }
    return quant::prepare_parameters(p, r, linear_weight);
  }
  void step() {
    for (size_t k = 0; k < params.size(); ++k) params[k].set_grad(ScaledTensor(grads[k]));
    opt.step(1.0, optim::Gradients::finite);
  }
};

void BM_AdamWStepVsF32State(benchmark::State& st, const char* recipe) {
  const std::vector<Shape> shapes = gpt2_shapes();
  optim::AdamWConfig base{.lr = 1e-4};
  Run f32(shapes, quant::preset("f32"), base), low(shapes, quant::preset(recipe), base);
  f32.step();  // past the first step's zero moments
  low.step();
  // The fastest step of each too: on a shared machine the least disturbed one is the steadiest figure.
  double f32_min = INFINITY, low_min = INFINITY;
  auto timed = [](Run& r, double& fastest) {
    const auto t0 = std::chrono::steady_clock::now();
    r.step();
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  const AlternatingSeconds t = time_alternately(
      st, [&] { timed(f32, f32_min); }, [&] { timed(low, low_min); });
  int64_t n = 0;
  for (const Shape& s : shapes) n += numel_of(s);
  st.counters["params"] = double(n);
  st.counters["ratio_vs_f32"] = t.second / t.first;
  st.counters["f32_ms_min"] = 1e3 * f32_min;
  st.counters["ms_min"] = 1e3 * low_min;
  st.counters["ratio_of_min"] = low_min / f32_min;
  st.counters["f32_state_B_per_param"] = double(8);
  int64_t bytes = 0;
  for (size_t k = 0; k < shapes.size(); ++k) bytes += low.opt.state_bytes(k);
  st.counters["state_B_per_param"] = double(bytes) / double(n);
}
BENCHMARK_CAPTURE(BM_AdamWStepVsF32State, msamp_o2, "msamp_o2")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_AdamWStepVsF32State, coat, "coat")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_AdamWStepVsF32State, fp8_adam_no_expansion, "fp8_adam_no_expansion")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
