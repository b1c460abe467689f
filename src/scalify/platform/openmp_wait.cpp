#include "scalify/platform/openmp_wait.hpp"

#include <cstdlib>

namespace scalify::platform {

bool choose_openmp_wait() {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return false;
  return setenv("GOMP_SPINCOUNT", kOpenmpSpinCount, 0) == 0;
}

std::string openmp_wait_description() {
  std::string out;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* value = std::getenv(name)) out += (out.empty() ? "" : ", ") + std::string(name) + "=" + value;
  return out.empty() ? "libgomp's default (spins about 300,000 times before it sleeps)" : out;
}

}  // namespace scalify::platform
