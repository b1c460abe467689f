#pragma once
// How OpenMP's threads wait (issue 42). At each barrier libgomp's waiting thread spins 300,000
// times (milliseconds) before it sleeps. On shared cores the spinner burns the time slice that
// its descheduled partner needs to reach the barrier: beside 1 to 4 busy processes on 2 cores a
// training step ran up to 50-fold slower where an even share of the cores explains 1.5- to
// 3-fold. scalify's threads spin kOpenmpSpinCount times (microseconds; a quiet host's step within
// 2 %, docs/BENCHMARKS.md) and then sleep, unless the user chose with OMP_WAIT_POLICY or GOMP_SPINCOUNT.
// libgomp reads both once, as it loads, so the choice is made before: the executables start
// again with it set (openmp_wait_restart.cpp), the Python package sets it from a module that it
// imports before the extension (python/src/openmp_wait_module.cpp).
#include <string>

namespace scalify::platform {

inline constexpr const char* kOpenmpSpinCount = "1000";

// Sets GOMP_SPINCOUNT to kOpenmpSpinCount unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set;
// returns whether it did.
bool choose_openmp_wait();

// The wait in force, for `scalify info`: "GOMP_SPINCOUNT=1000", "OMP_WAIT_POLICY=passive", or
// libgomp's default.
std::string openmp_wait_description();

}  // namespace scalify::platform
