// The general linear layer's forward + backward under FP8 recipes against the f32 layer, at
// transformer shapes, alternating in every iteration (ratio under the same load). Also reports
// the share of the FP8 step spent quantising its three operands.
#include <benchmark/benchmark.h>

#include <chrono>

#include "scalify/autograd/functions.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/recipe.hpp"

namespace {

using namespace scalify;
using clock_type = std::chrono::steady_clock;

double seconds(clock_type::time_point a, clock_type::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void BM_Fp8LinearVsF32(benchmark::State& st, const char* recipe) {
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  const Tensor x = Tensor::randn({M, K}, 1), w = Tensor::randn({K, N}, 2, 0.02), g = Tensor::randn({M, N}, 3, 1e-3);
  const quant::QLinear f32, fp8(quant::preset(recipe).linear);
  quant::Quantizer qx(fp8.recipe().forward.activation), qw(fp8.recipe().forward.weight), qg(fp8.recipe().input_grad.gradient);
  double t_f32 = 0, t_fp8 = 0, t_quant = 0;
  auto step = [&](const quant::QLinear& layer) {
    Var xv(x, true), wv(w, true);
    layer(xv, wv).backward(g);
  };
  for (auto _ : st) {
    const auto t0 = clock_type::now();
    step(f32);
    const auto t1 = clock_type::now();
    step(fp8);
    const auto t2 = clock_type::now();
    qx.quantize(x);
    qw.quantize(w);
    qg.quantize(g);
    const auto t3 = clock_type::now();
    t_f32 += seconds(t0, t1);
    t_fp8 += seconds(t1, t2);
    t_quant += seconds(t2, t3);
    st.SetIterationTime(seconds(t1, t2));
  }
  const double n = double(st.iterations());
  st.counters["f32_ms"] = 1e3 * t_f32 / n;
  st.counters["fp8_ms"] = 1e3 * t_fp8 / n;
  st.counters["speedup_vs_f32"] = t_f32 / t_fp8;
  st.counters["quant_share"] = t_quant / t_fp8;
  st.SetLabel(recipe);
}

void Shapes(benchmark::internal::Benchmark* b) {
  // GPT-2's MLP; the d = 128 trainer model's QKV projection and MLP (2048 tokens per step).
  b->Args({2048, 768, 3072})->Args({2048, 3072, 768})->Args({2048, 128, 384})->Args({2048, 128, 512})->Args({2048, 512, 128});
  b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
}

BENCHMARK_CAPTURE(BM_Fp8LinearVsF32, current, "current")->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Fp8LinearVsF32, delayed, "delayed")->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Fp8LinearVsF32, scalify_fp8_3, "scalify_fp8_3")->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Fp8LinearVsF32, mxfp8, "mxfp8")->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Fp8LinearVsF32, blockwise, "blockwise")->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
