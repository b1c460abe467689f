// For executables only (the object library scalify_openmp_wait, linked into the CLI, the tests and
// the benchmarks; never into the Python extension, which must not start its interpreter again).
// This constructor runs after those of the shared libraries: libgomp has read its environment but
// started no thread. When choose_openmp_wait sets the spin count, the process starts again as
// itself, with the same arguments, so that libgomp reads it (platform/openmp_wait.hpp).
#include <unistd.h>

#include "scalify/platform/openmp_wait.hpp"

namespace {

__attribute__((constructor)) void restart_with_openmp_wait(int, char** argv, char**) {
  // If the exec fails the process goes on, its threads spinning as libgomp chose.
  if (scalify::platform::choose_openmp_wait()) execv("/proc/self/exe", argv);
}

}  // namespace
