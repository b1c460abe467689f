#pragma once
// The one size threshold of the OpenMP loops over elements: a loop over more than kParallelGrain
// elements splits across the threads, a smaller one runs on the calling thread, where a fork and
// join (microseconds, the team spinning) would cost more than the second thread saves. At the
// smallest model size with 512 tokens per step an activation holds 2^16 elements: loops over it
// must split, or the other thread waits through them.
#include <cstdint>

namespace scalify::platform {

constexpr int64_t kParallelGrain = int64_t(1) << 15;

}  // namespace scalify::platform
