#pragma once
// Two pieces of work timed alternately in every iteration of a Google Benchmark loop, so both see
// the same machine load (the machine is shared and noisy): ratios of the totals are what the
// benchmarks report. The iteration's time is the second piece's (run with UseManualTime).
#include <benchmark/benchmark.h>

#include <chrono>

struct AlternatingSeconds {
  double first = 0, second = 0;
};

template <class First, class Second>
AlternatingSeconds time_alternately(benchmark::State& st, First&& first, Second&& second) {
  using clock = std::chrono::steady_clock;
  AlternatingSeconds total;
  for (auto _ : st) {
    const auto t0 = clock::now();
    first();
    benchmark::ClobberMemory();
    const auto t1 = clock::now();
    second();
    benchmark::ClobberMemory();
    const auto t2 = clock::now();
    total.first += std::chrono::duration<double>(t1 - t0).count();
    const double s = std::chrono::duration<double>(t2 - t1).count();
    total.second += s;
    st.SetIterationTime(s);
  }
  return total;
}
