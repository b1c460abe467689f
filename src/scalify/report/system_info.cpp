#include "scalify/report/system_info.hpp"

#include <omp.h>

#include "scalify/formats/kernels.hpp"
#include "scalify/platform/cpu.hpp"
#include "scalify/platform/openmp_wait.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/tensor/gemm.hpp"

namespace scalify::report {

std::vector<std::pair<std::string, std::string>> system_info() {
  const platform::CpuFeatures& cpu = platform::cpu_features();
  std::string features;
  for (const std::string& f : cpu.names()) features += (features.empty() ? "" : " ") + f;
  return {
      {"scalify", SCALIFY_VERSION},
      {"cpu", cpu.model.empty() ? cpu.vendor : cpu.model},
      {"cpu features", features.empty() ? "(none of avx2, fma, f16c, avx512*, amx)" : features},
      {"format kernels", kernels::isa_name(kernels::active_isa())},
      {"oneDNN", gemm::onednn_version() + ", ISA " + gemm::onednn_isa()},
      {"gemm f32", "oneDNN sgemm"},
      {"gemm fp8 codes", gemm::code_gemm_name(gemm::code_gemm())},
      {"threads", std::to_string(omp_get_max_threads())},
      {"openmp wait", platform::openmp_wait_description()},
      {"processes", platform::world_description()},
  };
}

std::vector<std::pair<std::string, std::string>> bit_deciding_info() {
  std::vector<std::pair<std::string, std::string>> rows;
  for (auto& row : system_info())
    if (row.first == "scalify" || row.first == "format kernels" || row.first == "oneDNN" || row.first.starts_with("gemm "))
      rows.push_back(std::move(row));
  return rows;
}

std::string system_info_text() {
  std::string out;
  for (const auto& [k, v] : system_info()) out += k + ": " + v + "\n";
  return out;
}

}  // namespace scalify::report
