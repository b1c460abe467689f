// Scale propagation overhead: one transformer block's training step (forward + backward) on
// unscaled f32 parameters and on scaled f32 parameters, alternating in every iteration.
#include <benchmark/benchmark.h>

#include <chrono>

#include "scalify/autograd/functions.hpp"
#include "scalify/nn/gpt.hpp"

namespace {

using namespace scalify;

// One standard pre-LN GPT block (the trainer's, at GPT-2 initialisation).
nn::GptBlock make_block(int64_t d, int heads) {
  nn::Init init{false, 1, 1};
  nn::GptConfig c;
  c.d_model = d;
  c.heads = heads;
  return nn::GptBlock::make(c.block(), init);
}

nn::GptBlock scaled_params(const nn::GptBlock& p) {
  nn::GptBlock s = p;
  for (Var* f : {&s.ln1.w, &s.ln1.b, &s.attn.qkv.w, &s.attn.qkv.b, &s.attn.proj.w, &s.attn.proj.b, &s.ln2.w, &s.ln2.b, &s.mlp.fc.w,
                 &s.mlp.fc.b, &s.mlp.out.w, &s.mlp.out.b})
    *f = Var(as_scaled(f->value()), true);
  return s;
}

double step(const nn::GptBlock& p, const Var& x) {
  const auto t0 = std::chrono::steady_clock::now();
  nn::LayerOptions o;
  o.unit_scaled = false;
  Var y = p(x, unit::Residual{unit::Residual::Kind::plain, 0.0, 1, false}, o);
  sum(y).backward();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_ScaledVsUnscaledBlockStep(benchmark::State& st) {
  const int64_t B = 16, T = 128, D = 256;
  const nn::GptBlock plain = make_block(D, 4), scaled = scaled_params(plain);
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
