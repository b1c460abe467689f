// GEMM libraries on this machine, and the engine's matmul against calling the library directly.
// Arguments: M, K, N. FLOP/s counter = 2 M N K per call. Run with OMP_NUM_THREADS=1 or 2.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <immintrin.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "alternating.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/platform/cpu.hpp"
#include "scalify/tensor/gemm.hpp"
#include "scalify/tensor/ops.hpp"

namespace {

using namespace scalify;

void flops(benchmark::State& st) {
  const double f = 2.0 * double(st.range(0)) * double(st.range(1)) * double(st.range(2));
  st.counters["FLOPS"] = benchmark::Counter(f * double(st.iterations()), benchmark::Counter::kIsRate);
}

void BM_OneDnnSgemm(benchmark::State& st) {
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  std::vector<float> a(size_t(M * K), 0.5f), b(size_t(K * N), 0.25f), c(size_t(M * N));
  for (auto _ : st) dnnl_sgemm('N', 'N', M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  flops(st);
}

void BM_OpenBlasSgemm(benchmark::State& st) {
  const int M = int(st.range(0)), K = int(st.range(1)), N = int(st.range(2));
  std::vector<float> a(size_t(M) * K, 0.5f), b(size_t(K) * N, 0.25f), c(size_t(M) * N);
  for (auto _ : st) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  st.SetLabel(openblas_get_corename());
  flops(st);
}

template <dnnl::memory::data_type In>
void BM_OneDnnMatmul(benchmark::State& st) {
  using namespace dnnl;
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::desc a_md({M, K}, In, memory::format_tag::ab);
  const memory::desc b_md({K, N}, In, memory::format_tag::ab);
  const memory::desc c_md({M, N}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  } catch (const dnnl::error&) {  // e.g. bf16 on a CPU without AVX-512
    st.SkipWithError(("oneDNN has no matmul for this type on ISA " + gemm::onednn_isa()).c_str());
    return;
  }
  memory a(a_md, eng), b(b_md, eng), c(c_md, eng);
  std::memset(a.get_data_handle(), 0, a_md.get_size());  // values do not change the speed
  std::memset(b.get_data_handle(), 0, b_md.get_size());
  const dnnl::matmul mm(pd);
  for (auto _ : st) {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  }
  st.SetLabel(pd.impl_info_str());
  flops(st);
}

void BM_EngineMatmul(benchmark::State& st) {
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  const Tensor a = Tensor::full({M, K}, 0.5), b = Tensor::full({K, N}, 0.25);
  for (auto _ : st) benchmark::DoNotOptimize(ops::matmul(a, b));
  flops(st);
}

// The engine's matmul and a direct dnnl_sgemm on the same shape, alternating in every iteration
// so both see the same machine load; engine_vs_library = library time / engine time.
void BM_EngineVsLibrary(benchmark::State& st) {
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  const Tensor a = Tensor::full({M, K}, 0.5), b = Tensor::full({K, N}, 0.25);
  std::vector<float> c(size_t(M * N));
  const AlternatingSeconds s = time_alternately(
      st, [&] { dnnl_sgemm('N', 'N', M, N, K, 1.0f, a.data<float>(), K, b.data<float>(), N, 0.0f, c.data(), N); },
      [&] { benchmark::DoNotOptimize(ops::matmul(a, b)); });
  st.counters["engine_vs_library"] = s.first / s.second;
  flops(st);
}

// The machine's f32 FMA peak in the same run: 12 independent FMA chains per thread, in the
// widest vectors the CPU has (AVX-512 or AVX2; skipped with a message on a CPU with neither).
// One body per ISA (a function's target attribute does not reach lambdas or templates).
#define SCALIFY_FMA_CHAINS(V, LANES, SET1, FMADD, ADD, STOREU) \
  V acc[12];                                                   \
  for (int i = 0; i < 12; ++i) acc[i] = SET1(float(i));        \
  const V a = SET1(0.999f), b = SET1(0.001f);                  \
  for (int64_t it = 0; it < iterations; ++it)                  \
    for (int i = 0; i < 12; ++i) acc[i] = FMADD(acc[i], a, b); \
  V s = acc[0];                                                \
  for (int i = 1; i < 12; ++i) s = ADD(s, acc[i]);             \
  float lanes[LANES];                                          \
  STOREU(lanes, s);                                            \
  double total = 0;                                            \
  for (float l : lanes) total += l;                            \
  return total;
__attribute__((target("avx512f"))) double fma_chains_avx512(int64_t iterations) {
  SCALIFY_FMA_CHAINS(__m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps)
}
__attribute__((target("avx2,fma"))) double fma_chains_avx2(int64_t iterations) {
  SCALIFY_FMA_CHAINS(__m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps)
}

void BM_FmaPeak(benchmark::State& st) {
  const platform::CpuFeatures& cpu = platform::cpu_features();
  if (!cpu.fma || !cpu.avx2) {
    st.SkipWithError("no AVX2/FMA on this CPU: no FMA peak to measure");
    return;
  }
  const bool wide = cpu.avx512f;
  const int64_t iterations = 1 << 22;
  int threads = 1;
  for (auto _ : st) {
#pragma omp parallel
    {
#pragma omp single
      threads = omp_get_num_threads();
      benchmark::DoNotOptimize(wide ? fma_chains_avx512(iterations) : fma_chains_avx2(iterations));
    }
  }
  st.SetLabel(wide ? "avx512" : "avx2");
  st.counters["FLOPS"] =
      benchmark::Counter(double(st.iterations()) * threads * iterations * 12 * (wide ? 16 : 8) * 2, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);

void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t s : {256, 512, 1024}) b->Args({s, s, s});
  b->Args({2048, 768, 3072})->Args({2048, 3072, 768})->Args({4096, 768, 3072});
  b->Unit(benchmark::kMillisecond)->MinTime(0.5);
}
void RealTimeShapes(benchmark::internal::Benchmark* b) { Shapes(b->UseRealTime()); }

BENCHMARK(BM_OneDnnSgemm)->Apply(RealTimeShapes);
BENCHMARK(BM_EngineMatmul)->Apply(RealTimeShapes);
BENCHMARK(BM_EngineVsLibrary)->Apply(Shapes)->UseManualTime();
BENCHMARK(BM_OpenBlasSgemm)->Apply(RealTimeShapes);
BENCHMARK_TEMPLATE(BM_OneDnnMatmul, dnnl::memory::data_type::f32)->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_OneDnnMatmul, dnnl::memory::data_type::bf16)->Apply(Shapes);

// One pre-LN transformer block, forward + backward (d=256, T=128, B=16, 4 heads).
void BM_TransformerBlockStep(benchmark::State& st) {
  const int64_t B = 16, T = 128, D = 256;
  nn::Init init{false, 1, 1};
  nn::GptConfig c;
  c.d_model = D;
  const nn::GptBlock block = nn::GptBlock::make(c.block(), init);
  nn::LayerOptions o;
  o.unit_scaled = false;
  const Tensor x = Tensor::randn({B, T, D}, 2);
  for (auto _ : st) {
    Var in(x, true);
    Var y = block(in, unit::Residual{unit::Residual::Kind::plain, 0.0, 1, false}, o);
    sum(y).backward();
  }
  // Matmul FLOPs: forward 2BT(12 D^2) + attention 2 * 2 B T^2 D; backward twice that.
  const double fwd = 2.0 * B * T * 12 * D * D + 4.0 * B * T * T * D;
  st.counters["matmul_FLOPS"] = benchmark::Counter(3 * fwd * double(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TransformerBlockStep)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
