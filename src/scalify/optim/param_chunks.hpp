#pragma once
// Work over all parameters as one parallel loop. Each parameter's elements are cut into chunks of
// at most kParamChunk, and the chunks of every parameter share the threads: a model's many small
// tensors (biases, gains, embeddings below the per-tensor parallel threshold) no longer run one
// after another on one thread while the others wait.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace scalify::optim {

constexpr int64_t kParamChunk = int64_t(1) << 13;  // 32 KB of f32: a chunk's buffers stay in L1/L2

struct ParamChunk {
  size_t param;        // index into the caller's list
  int64_t begin, end;  // element range within that parameter
};

// chunk: the chunks' length (the last of a parameter may be shorter).
inline std::vector<ParamChunk> param_chunks(const std::vector<int64_t>& sizes, int64_t chunk = kParamChunk) {
  std::vector<ParamChunk> chunks;
  for (size_t k = 0; k < sizes.size(); ++k)
    for (int64_t b = 0; b < sizes[k]; b += chunk) chunks.push_back({k, b, std::min(sizes[k], b + chunk)});
  return chunks;
}

// Runs f(chunk, index of the chunk) for every chunk, in parallel when there are several. f must
// not throw (it runs inside an OpenMP loop).
template <class F>
void for_each_chunk(const std::vector<ParamChunk>& chunks, F&& f) {
  const auto n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) if (n > 4)
  for (int64_t i = 0; i < n; ++i) f(chunks[size_t(i)], size_t(i));
}

}  // namespace scalify::optim
