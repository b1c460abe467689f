#include "scalify/platform/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
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

namespace {
// A limit file's number ("max" and unreadable files: no limit).
int64_t limit_from(const char* path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 18)
    return std::numeric_limits<int64_t>::max();
  return std::stoll(text);
}
int64_t rlimit_of(int resource) {
  rlimit r{};
  if (::getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur > rlim_t(std::numeric_limits<int64_t>::max()))
    return std::numeric_limits<int64_t>::max();
  return int64_t(r.rlim_cur);
}
}  // namespace

int64_t memory_limit_bytes() {
  const int64_t pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  int64_t limit = pages > 0 && page > 0 ? pages * page : std::numeric_limits<int64_t>::max();
  for (const char* f : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) limit = std::min(limit, limit_from(f));
  return std::min({limit, rlimit_of(RLIMIT_AS), rlimit_of(RLIMIT_DATA)});
}

}  // namespace scalify::platform
