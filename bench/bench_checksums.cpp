// What the checkpoint checksums cost: CRC-32C of a checkpoint's bytes (the SSE4.2 instruction and
// the table reference) timed alternately with reading the same checkpoint, which verifies them.
// Ratios of the alternating pairs are the figures (docs/BENCHMARKS.md).
#include <benchmark/benchmark.h>

#include <filesystem>
#include <unistd.h>

#include "alternating.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/platform/crc32c.hpp"

namespace {

using namespace scalify;

// A 16 MiB checkpoint-like file (four 1 MiB-element f32 tensors) in the temporary folder.
struct Checkpoint {
  std::string path = (std::filesystem::temp_directory_path() / ("scalify_bench_" + std::to_string(::getpid()) + ".safetensors")).string();
  io::SafeTensors content;
  Checkpoint() {
    for (int i = 0; i < 4; ++i)
      content.tensors.emplace_back(std::string("t").append(std::to_string(i)), Tensor::randn({1024, 1024}, uint64_t(i), 1.0));
    io::write_safetensors(path, content);
  }
  ~Checkpoint() { std::filesystem::remove(path); }
};

// Each iteration: the CRC of every tensor's bytes, then a whole read of the file (which checks them).
void crc_vs_read(benchmark::State& st, uint32_t (*crc)(const void*, size_t, uint32_t)) {
  const Checkpoint ck;
  uint32_t sink = 0;
  const AlternatingSeconds t = time_alternately(
      st,
      [&] {
        for (const auto& [name, x] : ck.content.tensors) sink ^= crc(x.raw_bytes(), size_t(x.numel()) * 4, 0);
      },
      [&] { benchmark::DoNotOptimize(io::read_safetensors(ck.path)); });
  benchmark::DoNotOptimize(sink);
  st.counters["crc_share_of_read"] = t.first / t.second;
  st.counters["crc_GB_per_s"] = double(st.iterations()) * 16.0 * 1024 * 1024 / t.first / 1e9;
}
void BM_Crc32cVsRead(benchmark::State& st) { crc_vs_read(st, platform::crc32c); }
void BM_Crc32cReferenceVsRead(benchmark::State& st) { crc_vs_read(st, platform::crc32c_reference); }
BENCHMARK(BM_Crc32cVsRead)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Crc32cReferenceVsRead)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
