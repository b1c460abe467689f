#pragma once
// What a run ran on: version, CPU and its features, the format-kernel ISA and the GEMM paths
// chosen here, the thread count. `scalify info` prints it; reports and benchmarks quote it.
#include <string>
#include <utility>
#include <vector>

namespace scalify::report {

// (key, value) rows in a fixed order.
std::vector<std::pair<std::string, std::string>> system_info();
// The rows whose values decide a run's bits (the build, the kernels and GEMM paths this CPU
// chose): the ranks of one data-parallel run must agree on them. The thread count does not.
std::vector<std::pair<std::string, std::string>> bit_deciding_info();
// The rows as "key: value" lines.
std::string system_info_text();

}  // namespace scalify::report
