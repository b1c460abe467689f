// Scale propagation overhead: one transformer block's training step (forward + backward) on
// unscaled f32 parameters and on scaled f32 parameters, alternating in every iteration.
#include <benchmark/benchmark.h>

#include <chrono>

#include "scalify/autograd/functions.hpp"
#include "scalify/nn/transformer.hpp"

namespace {

using namespace scalify;

nn::BlockParams scaled_params(const nn::BlockParams& p) {
  nn::BlockParams s = p;
  Var* fields[] = {&s.ln1_w, &s.ln1_b, &s.w_qkv, &s.b_qkv, &s.w_proj, &s.b_proj, &s.ln2_w, &s.ln2_b, &s.w_fc, &s.b_fc, &s.w_out, &s.b_out};
  for (Var* f : fields) *f = Var(as_scaled(f->value()), true);
  return s;
}

double step(const nn::BlockParams& p, const Var& x) {
  const auto t0 = std::chrono::steady_clock::now();
  Var y = nn::transformer_block(x, p, 4);
  sum(y).backward();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_ScaledVsUnscaledBlockStep(benchmark::State& st) {
  const int64_t B = 16, T = 128, D = 256;
  const nn::BlockParams plain = nn::init_block(D, 1, 1), scaled = scaled_params(plain);
  const Tensor x = Tensor::randn({B, T, D}, 2);
  double t_plain = 0, t_scaled = 0;
  for (auto _ : st) {
    t_plain += step(plain, Var(x, true));
    const double s = step(scaled, Var(as_scaled(x), true));
    t_scaled += s;
    st.SetIterationTime(s);
  }
  st.counters["unscaled_ms"] = 1e3 * t_plain / double(st.iterations());
  st.counters["scaled_ms"] = 1e3 * t_scaled / double(st.iterations());
  st.counters["overhead"] = t_scaled / t_plain - 1;
}
BENCHMARK(BM_ScaledVsUnscaledBlockStep)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
