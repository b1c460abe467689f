#include "scalify/platform/memory.hpp"

#include <fstream>
#include <string>

namespace scalify::platform {

bool reset_peak_memory() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

int64_t peak_memory_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      int64_t kib = 0;
      f >> kib;
      return kib * 1024;
    }
    f.ignore(1 << 12, '\n');
  }
  return 0;
}

}  // namespace scalify::platform
