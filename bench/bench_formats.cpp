// Bulk format kernels on 64 MB of f32 against a plain f32 copy in the same run.
// Arguments: (isa: 0 scalar reference, 1 avx2, 2 avx512; threads).
// bytes_per_second counts the f32 bytes read (input side), so quantise is directly comparable
// with the copy's read bandwidth; items_per_second counts elements.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "alternating.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/tensor/storage_rounding.hpp"

namespace {

using namespace scalify;

constexpr size_t kN = size_t(16) << 20;  // 16 Mi floats = 64 MB

const std::vector<float>& input() {
  static const std::vector<float> v = [] {
    std::vector<float> x(kN);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (float& e : x) e = d(rng);
    return x;
  }();
  return v;
}

void setup(const benchmark::State& st) {
  kernels::set_isa(static_cast<kernels::Isa>(st.range(0)));
  set_num_threads(int(st.range(1)));
}

void finish(benchmark::State& st, size_t f32_bytes_per_elem) {
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kN * f32_bytes_per_elem));
  st.SetItemsProcessed(int64_t(st.iterations()) * int64_t(kN));
  st.SetLabel(std::string(kernels::isa_name(kernels::active_isa())) + " x" + std::to_string(st.range(1)));
}

void BM_CopyF32(benchmark::State& st) {
  const auto& x = input();
  std::vector<float> y(kN, 1.0f);
  const int threads = int(st.range(1));
  for (auto _ : st) {
#pragma omp parallel num_threads(threads)
    {
      const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
      const size_t b = kN * t / nt, e = kN * (t + 1) / nt;
      std::memcpy(y.data() + b, x.data() + b, (e - b) * sizeof(float));
    }
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(kN * 4));
  st.SetItemsProcessed(int64_t(st.iterations()) * int64_t(kN));
  st.SetLabel("memcpy x" + std::to_string(threads));
}

void BM_QuantizeE4m3(benchmark::State& st) {
  setup(st);
  const auto& x = input();
  std::vector<std::byte> codes(kN);
  for (auto _ : st) {
    quantize(x, Format::e4m3, 0.25f, codes);
    benchmark::DoNotOptimize(codes.data());
  }
  finish(st, 4);
}

void BM_QuantizeAmaxE4m3(benchmark::State& st) {
  setup(st);
  const auto& x = input();
  std::vector<std::byte> codes(kN);
  for (auto _ : st) benchmark::DoNotOptimize(quantize_amax(x, Format::e4m3, 0.25f, codes));
  finish(st, 4);
}

void BM_QuantizeE4m3Stochastic(benchmark::State& st) {
  setup(st);
  const auto& x = input();
  std::vector<std::byte> codes(kN);
  QuantizeOptions opt;
  opt.rounding = Rounding::stochastic;
  for (auto _ : st) {
    quantize(x, Format::e4m3, 0.25f, codes, opt);
    benchmark::DoNotOptimize(codes.data());
  }
  finish(st, 4);
}

void BM_DequantizeE4m3(benchmark::State& st) {
  setup(st);
  std::vector<std::byte> codes(kN);
  set_num_threads(0);
  quantize(input(), Format::e4m3, 0.25f, codes);
  setup(st);
  std::vector<float> out(kN);
  for (auto _ : st) {
    dequantize(codes, Format::e4m3, 4.0f, out);
    benchmark::DoNotOptimize(out.data());
  }
  finish(st, 4);  // f32 bytes written
}

void BM_Amax(benchmark::State& st) {
  setup(st);
  const auto& x = input();
  for (auto _ : st) benchmark::DoNotOptimize(amax(x));
  finish(st, 4);
}

// Quantise and a plain f32 copy of the same input, alternating inside every iteration, so the
// ratio of their read bandwidths is taken under the same machine load (the machine is shared and
// its bandwidth drifts by 2x between runs). Counters: read_vs_copy = kernel read bandwidth /
// copy read bandwidth; copy_GBps and kernel_GBps are the input bytes read per second.
template <bool FUSED_AMAX>
void BM_QuantizeVsCopy(benchmark::State& st) {
  setup(st);
  const auto& x = input();
  std::vector<std::byte> codes(kN);
  std::vector<float> y(kN, 1.0f);
  const int threads = int(st.range(1));
  const AlternatingSeconds s = time_alternately(
      st,
      [&] {
#pragma omp parallel num_threads(threads)
        {
          const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
          const size_t b = kN * t / nt, e = kN * (t + 1) / nt;
          std::memcpy(y.data() + b, x.data() + b, (e - b) * sizeof(float));
        }
      },
      [&] {
        if constexpr (FUSED_AMAX)
          benchmark::DoNotOptimize(quantize_amax(x, Format::e4m3, 0.25f, codes));
        else
          quantize(x, Format::e4m3, 0.25f, codes);
      });
  const double bytes = double(kN) * 4 * double(st.iterations());
  st.counters["copy_GBps"] = bytes / s.first / 1e9;
  st.counters["kernel_GBps"] = bytes / s.second / 1e9;
  st.counters["read_vs_copy"] = s.first / s.second;
  st.SetLabel(std::string(kernels::isa_name(kernels::active_isa())) + " x" + std::to_string(threads));
}

// Block quantisation of one [2048, 512] operand (the d = 128 model's MLP activations), alternating
// in every iteration with per-tensor quantise + amax of the same values: `blocks_vs_tensor` is the
// block quantiser's time over the per-tensor kernel's. Arguments: (isa, block kind): 0 MX along
// rows (1 x 32), 1 MX down columns (32 x 1), 2 rows of 128 with f32 scales, 3 128 x 128 f32 scales.
void BM_BlocksVsPerTensor(benchmark::State& st) {
  kernels::set_isa(static_cast<kernels::Isa>(st.range(0)));
  set_num_threads(0);
  constexpr size_t rows = 2048, cols = 512;
  const std::span<const float> x(input().data(), rows * cols);
  const BlockSpec specs[] = {mx_blocks(1), mx_blocks(0), {1, 128, BlockScaleRule::f32_amax}, {128, 128, BlockScaleRule::f32_amax}};
  const BlockSpec spec = specs[st.range(1)];
  std::vector<std::byte> codes(rows * cols);
  const AlternatingSeconds s = time_alternately(
      st, [&] { benchmark::DoNotOptimize(quantize_amax(x, Format::e4m3, 0.25f, codes)); },
      [&] { benchmark::DoNotOptimize(quantize_blocks(x, rows, cols, Format::e4m3, spec)); });
  st.counters["blocks_vs_tensor"] = s.second / s.first;
  st.SetLabel(std::string(kernels::isa_name(kernels::active_isa())) + " " + std::to_string(spec.rows) + "x" + std::to_string(spec.cols));
}

// An elementwise loop's f16 input chunk (4096 values, in L1) widened for computing against the
// checked dequantize it replaced (canonical NaNs, per-call checks), alternately.
void BM_WidenVsDequantizeF16(benchmark::State& st) {
  kernels::set_isa(static_cast<kernels::Isa>(st.range(0)));
  set_num_threads(1);
  constexpr size_t n = 4096, reps = 256;
  std::vector<std::byte> codes(2 * n);
  quantize(std::span(input().data(), n), Format::f16, 1.0f, codes);
  std::vector<float> out(n);
  const AlternatingSeconds s = time_alternately(
      st,
      [&] {
        for (size_t r = 0; r < reps; ++r) dequantize(codes, Format::f16, 1.0f, out);
      },
      [&] {
        for (size_t r = 0; r < reps; ++r) widen_for_compute(codes.data(), int64_t(n), DType::f16, out.data());
      });
  st.counters["dequantize_ns_per_value"] = s.first * 1e9 / double(st.iterations() * reps * n);
  st.counters["widen_ns_per_value"] = s.second * 1e9 / double(st.iterations() * reps * n);
  st.SetLabel(kernels::isa_name(kernels::active_isa()));
}

// FP8 GEMM operands as f32 values (the GEMM path without bf16 dot products): a 4096-value chunk,
// in L1, encoded then decoded (the way before) against the fused values kernel, alternately.
void BM_ValuesVsEncodeDecodeE4m3(benchmark::State& st) {
  kernels::set_isa(static_cast<kernels::Isa>(st.range(0)));
  set_num_threads(1);
  constexpr size_t n = 4096, reps = 256;
  const std::span<const float> in(input().data(), n);
  std::vector<std::byte> codes(n);
  std::vector<float> out(n);
  const AlternatingSeconds s = time_alternately(
      st,
      [&] {
        for (size_t r = 0; r < reps; ++r) {
          quantize_amax(in, Format::e4m3, 8.0f, codes);
          dequantize(codes, Format::e4m3, 1.0f, out);
        }
      },
      [&] {
        for (size_t r = 0; r < reps; ++r) quantize_values_amax(in, Format::e4m3, 8.0f, out);
      });
  st.counters["encode_decode_ns_per_value"] = s.first * 1e9 / double(st.iterations() * reps * n);
  st.counters["fused_ns_per_value"] = s.second * 1e9 / double(st.iterations() * reps * n);
  st.SetLabel(kernels::isa_name(kernels::active_isa()));
}

void IsaThreadArgs(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int isa : {0, 1, 2})
      if (kernels::isa_supported(static_cast<kernels::Isa>(isa)) && !(isa == 0 && threads == 2)) b->Args({isa, threads});
  b->Unit(benchmark::kMillisecond)->MinTime(0.5);
}
void Args(benchmark::internal::Benchmark* b) { IsaThreadArgs(b->UseRealTime()); }

BENCHMARK(BM_CopyF32)->Args({0, 1})->Args({0, 2})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_QuantizeE4m3)->Apply(Args);
BENCHMARK_TEMPLATE(BM_QuantizeVsCopy, false)->Apply(IsaThreadArgs)->UseManualTime();
BENCHMARK_TEMPLATE(BM_QuantizeVsCopy, true)->Apply(IsaThreadArgs)->UseManualTime();
BENCHMARK(BM_QuantizeAmaxE4m3)->Apply(Args);
BENCHMARK(BM_QuantizeE4m3Stochastic)->Apply(Args);
BENCHMARK(BM_DequantizeE4m3)->Apply(Args);
BENCHMARK(BM_Amax)->Apply(Args);
BENCHMARK(BM_WidenVsDequantizeF16)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int isa : {1, 2})
        if (kernels::isa_supported(static_cast<kernels::Isa>(isa))) b->Arg(isa);
    })
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);
BENCHMARK(BM_ValuesVsEncodeDecodeE4m3)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int isa : {1, 2})
        if (kernels::isa_supported(static_cast<kernels::Isa>(isa))) b->Arg(isa);
    })
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);
BENCHMARK(BM_BlocksVsPerTensor)->ArgsProduct({{1, 2}, {0, 1, 2, 3}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);

}  // namespace

BENCHMARK_MAIN();
